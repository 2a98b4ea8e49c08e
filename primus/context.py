"""What a run resolved about where it runs: device, world size, ranks, run dir, GPU peak. Cheap: no heavy imports."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Optional, Tuple

from primus.config.schema import Device, PrimusConfig


@dataclass
class RunContext:
    device: str  # "cpu" or "cuda" (ROCm reports "cuda" in torch too)
    world_size: int
    rank: int = 0
    local_rank: int = 0
    run_dir: str = "."
    gpu_name: Optional[str] = None  # torch.cuda.get_device_name, None on CPU
    rocm: bool = False
    dist_backend: str = "gloo"  # gloo on CPU, nccl (RCCL on ROCm) on GPU
    env: dict = field(default_factory=dict)  # env vars this run sets (recorded in result.json)
    planned: bool = False  # True in a dry run judged for a GPU this machine does not have: skip hardware probes
    # where world_size came from, in words (the dry run and result.json state it): the launcher's keys, torchrun's
    # WORLD_SIZE, or the Slurm job's tasks
    world_from: str = ""
    # what validate() found besides errors (primus/config/errors.py): warnings (settings ignored where they do not
    # apply), values implied by other settings or by the exported env, and, in a planned dry run, what the target
    # machine needs installed
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    needed_on_target: list = field(default_factory=list)
    # dotted keys set on the command line (hydra overrides): an exported variable does not override them
    explicit: frozenset = frozenset()
    # the guide's exported variables and what each decided (primus/config/env.py), for the dry run and result.json
    env_decided: list = field(default_factory=list)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def gpu_present() -> bool:
    """True when a GPU is usable, without importing torch when there is clearly none (fast dry runs)."""
    if not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
        return False
    import torch

    return torch.cuda.is_available()


def resolve_device(cfg: PrimusConfig) -> str:
    if cfg.device == Device.cpu:
        return "cpu"
    if cfg.device == Device.cuda:
        return "cuda"
    return "cuda" if gpu_present() else "cpu"


def world_size_of(cfg: PrimusConfig) -> int:
    """World size the run will have: the launcher's, or the one an outer launcher (Slurm, torchrun) set."""
    return world_size_and_source(cfg)[0]


def world_size_and_source(cfg: PrimusConfig) -> Tuple[int, str]:
    """(world size, where it came from in words). An outer launcher's count wins: torchrun's WORLD_SIZE, then the
    tasks of the submitit Slurm job this process is a task of (SLURM_NTASKS, or SLURM_JOB_NUM_NODES x
    SLURM_NTASKS_PER_NODE); otherwise the launcher's own keys."""
    env = os.environ
    slurm = "SLURM_JOB_ID" in env and env.get("SUBMITIT_EXECUTOR")
    if "WORLD_SIZE" in env:
        if slurm and env.get("SLURM_NTASKS") == env["WORLD_SIZE"]:  # a task's rank env, taken from Slurm's
            return int(env["WORLD_SIZE"]), f"Slurm: SLURM_NTASKS={env['SLURM_NTASKS']}"
        return int(env["WORLD_SIZE"]), f"WORLD_SIZE={env['WORLD_SIZE']} (set by the launcher that started this process)"
    if slurm:
        if "SLURM_NTASKS" in env:
            return int(env["SLURM_NTASKS"]), f"Slurm: SLURM_NTASKS={env['SLURM_NTASKS']}"
        nodes, per_node = env.get("SLURM_JOB_NUM_NODES"), env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        if nodes and per_node.isdigit():
            return (int(nodes) * int(per_node),
                    f"Slurm: SLURM_JOB_NUM_NODES x SLURM_NTASKS_PER_NODE = {nodes} x {per_node}")
    lc = cfg.launcher
    return (lc.nnodes * lc.nproc_per_node,
            f"launcher.nnodes x launcher.nproc_per_node = {lc.nnodes} x {lc.nproc_per_node}")


def data_parallel_size(cfg: PrimusConfig, world_size: int) -> int:
    p = cfg.parallel
    denom = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
    if p.data_parallel_size is not None:
        return p.data_parallel_size
    return max(1, world_size // denom) if world_size % denom == 0 else 0


def resolve(cfg: PrimusConfig, run_dir: str = ".") -> RunContext:
    device = resolve_device(cfg)
    gpu_name, rocm = None, False
    if device == "cuda" and gpu_present():  # device=cuda without a GPU: run.py plans it or refuses it
        import torch

        gpu_name = torch.cuda.get_device_name(0)
        rocm = torch.version.hip is not None
    world, world_from = world_size_and_source(cfg)
    return RunContext(
        device=device,
        world_size=world,
        world_from=world_from,
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        run_dir=run_dir,
        gpu_name=gpu_name,
        rocm=rocm,
        dist_backend="nccl" if device == "cuda" else "gloo",
    )
