"""Inside a Slurm job started by Hydra's submitit launcher: one Slurm task per GPU, each task runs the Hydra job.

`python train.py -m hydra/launcher=slurm ...` submits one Slurm job per sweep point with `tasks_per_node` tasks on each
of `nodes` nodes. submitit runs the pickled Hydra job function in every task, so every task composes the same config
and gets the same job dir (hydra.sweep.dir/<job num>): the run dir is shared and rank 0 alone writes outputs.

`slurm_task_env()` turns Slurm's view of the task (through submitit's TorchDistributedEnvironment) into the env://
rendezvous variables torch.distributed reads. It never touches CUDA_VISIBLE_DEVICES: Slurm gives every task of a node
all the node's GPUs (gpus_per_node / gres), and the trainer picks its own with set_device(LOCAL_RANK); masking to one
device per task would make LOCAL_RANK point past the only visible device.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Dict, Optional


def under_submitit_slurm() -> bool:
    """True inside a task of a Slurm job that submitit started (its Slurm executor sets SUBMITIT_EXECUTOR=slurm)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_JOB_ID" in os.environ


def task_rank() -> int:
    """This task's global rank in a submitit Slurm job (0 outside one). Cheap: reads Slurm's env only."""
    if under_submitit_slurm():
        return int(os.environ.get("SLURM_PROCID", "0"))
    return int(os.environ.get("RANK", "0"))


def node_address(name: str) -> str:
    """An address for Slurm node `name`: the name itself when it resolves, else the node's NodeAddr from scontrol.
    A node name is a label in slurm.conf, not necessarily a host name (several slurmd daemons on one machine, nodes
    named after rack positions): NodeAddr is where Slurm itself reaches it."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", name], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return name
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or name
    return name


def slurm_task_env() -> Optional[Dict[str, str]]:
    """Rendezvous env for this Slurm task, or None when not a multi-task submitit Slurm job.

    None for a job of one task too: then run.py treats it like a local run, so `launcher.nproc_per_node=N` inside a
    one-task job still starts N workers through the elastic launch API.
    MASTER_ADDR is the first host of the job (its NodeAddr when the node name is no host name), MASTER_PORT is derived from the job id (same in every task of the job,
    different between array jobs), unless MASTER_PORT is already set in the job's env.
    """
    if not under_submitit_slurm():
        return None
    from submitit.helpers import TorchDistributedEnvironment

    de = TorchDistributedEnvironment()
    if de.world_size <= 1:
        return None
    env = {
        "MASTER_ADDR": node_address(de.master_addr),
        "MASTER_PORT": str(de.master_port),
        "RANK": str(de.rank),
        "WORLD_SIZE": str(de.world_size),
        "LOCAL_RANK": str(de.local_rank),
        "LOCAL_WORLD_SIZE": str(de.local_world_size),
        "GROUP_RANK": os.environ.get("SLURM_NODEID", "0"),
    }
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd and de.local_world_size > 1 and len(cvd.split(",")) == 1:
        print(f"[primus] warning: CUDA_VISIBLE_DEVICES={cvd} shows one GPU to each of {de.local_world_size} tasks on "
              "this node; set_device(LOCAL_RANK) needs them all: request GPUs with gpus_per_node (or gres), not "
              "gpus_per_task", file=sys.stderr, flush=True)
    return env
