"""The plan feature: the memory / throughput estimate's target and whether it may refuse a run (see
primus/features/__init__.py). The estimate is primus/plan/; its refusal before a real run (`check_fits`) needs the
estimate itself and runs from primus/run.py, after validation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from primus.config.errors import ConfigIssue
from primus.features import rule


@dataclass
class PlanConfig:
    gpu: str = "auto"  # target GPU for the estimate: auto (this machine's, else H200), H100, H200, MI300X, MI325X, MI355X
    gpu_memory_gb: Optional[float] = None  # override the target's memory (GB)
    assumed_mfu: float = 0.45  # MFU used to turn FLOPs into step time and tokens/s
    enforce: bool = True  # refuse to start a run the estimate says cannot fit


@rule
def plan_values(cfg, ctx):
    from primus.plan.gpus import KNOWN, lookup

    p, out = cfg.plan, []
    if p.gpu_memory_gb is not None and p.gpu_memory_gb <= 0:
        out.append(ConfigIssue(["plan.gpu_memory_gb"], p.gpu_memory_gb, "a GPU's memory must be > 0 GiB",
                               "set the capacity in GiB (e.g. 141), or null to take plan.gpu's"))
    elif p.gpu_memory_gb is None and p.gpu and p.gpu.lower() != "auto" and lookup(p.gpu) is None:
        out.append(ConfigIssue(["plan.gpu"], p.gpu, f"not a GPU the planner knows ({', '.join(KNOWN)})",
                               "use one of those or auto, or give the size: plan.gpu_memory_gb=<GiB>"))
    if not 0 < p.assumed_mfu <= 1:
        out.append(ConfigIssue(["plan.assumed_mfu"], p.assumed_mfu, "an MFU is a fraction in (0, 1]",
                               "e.g. plan.assumed_mfu=0.45"))
    return out
