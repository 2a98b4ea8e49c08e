"""What a run resolved about where it runs: device, world size, ranks, run dir, GPU peak. Cheap: no heavy imports."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

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
    # what validate() found besides errors (primus/config/errors.py): warnings (settings ignored where they do not
    # apply), values implied by other settings or by the exported env, and, in a planned dry run, what the target
    # machine needs installed
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    needed_on_target: list = field(default_factory=list)
    # dotted keys set on the command line (hydra overrides): an exported variable does not override them
    explicit: frozenset = frozenset()

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
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    if "SLURM_NTASKS" in os.environ and "SLURM_JOB_ID" in os.environ and os.environ.get("SUBMITIT_EXECUTOR"):
        return int(os.environ["SLURM_NTASKS"])
    return cfg.launcher.nproc_per_node * cfg.launcher.nnodes


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
    return RunContext(
        device=device,
        world_size=world_size_of(cfg),
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        run_dir=run_dir,
        gpu_name=gpu_name,
        rocm=rocm,
        dist_backend="nccl" if device == "cuda" else "gloo",
    )
