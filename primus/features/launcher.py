"""The launcher feature: how many processes on how many nodes, and their rendezvous (see
primus/features/__init__.py). The launch itself is primus/launch/."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict

from primus.config.errors import ConfigIssue
from primus.features import rule


@dataclass
class LauncherConfig:
    nproc_per_node: int = 1  # worker processes per node (one per GPU)
    nnodes: int = 1  # nodes
    master_addr: str = "127.0.0.1"  # the local launcher's rendezvous host (Slurm jobs take the first node's)
    master_port: int = 0  # 0 = pick a free port
    env: Dict[str, str] = field(default_factory=dict)  # extra env vars set for every worker


@rule
def launcher_values(cfg, ctx):
    lc, out = cfg.launcher, []
    if not 0 <= lc.master_port <= 65535:
        out.append(ConfigIssue(["launcher.master_port"], lc.master_port, "a TCP port is 1..65535 (0 = pick a free one)",
                               "use 0, or a free port such as 29500"))
    launching = not (cfg.dry_run or cfg.mode.value == "plan")
    # a world from Slurm (inside the job, or judged before submission) spans the job's nodes
    from_slurm = ctx.world_from.startswith("Slurm")
    if lc.nnodes > 1 and launching and not from_slurm and "WORLD_SIZE" not in os.environ and "SLURM_JOB_ID" not in os.environ:
        out.append(ConfigIssue(["launcher.nnodes"], lc.nnodes,
                               "the local launcher starts processes on this node only; several nodes run through Slurm",
                               "submit with -m hydra/launcher=slurm (see docs/launching.md), or set launcher.nnodes=1"))
    if ctx.device == "cuda" and not ctx.planned and lc.nproc_per_node > 1:  # a dry run plans for its GPUs
        import torch

        n = torch.cuda.device_count()
        if lc.nproc_per_node > n:
            out.append(ConfigIssue(["launcher.nproc_per_node"], lc.nproc_per_node,
                                   f"one process per GPU: this node has {n}", f"use launcher.nproc_per_node<={n}"))
    return out
