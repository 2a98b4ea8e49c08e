"""Plan before spending GPU hours: per-GPU memory and throughput estimates for any config (no GPU, no torch).

Entry points (called from primus/run.py):
    run_plan(cfg, ctx) -> int           `mode=plan`: print the plan, return 0 (fits or not: the plan is the output)
    check_fits(cfg, ctx) -> ConfigIssue | None
                                        before a real run: an issue when the estimate does not fit the GPU, or on
                                        CPU this machine's memory (None with plan.enforce=false); it is the plan
                                        feature's rule (primus/features/plan.py)
    plan(cfg, ctx) -> Plan              the estimate, variants and the text, for programs and tests

Modules: `memory` (the formulas and the breakdown), `advice` (what-if variants), `report` (the table), `gpus`
(capacity by GPU name).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.features.plan import check_fits  # noqa: F401 - the plan feature's refusal, run by primus/run.py


@dataclass
class Plan:
    breakdown: "object"  # memory.MemoryBreakdown
    throughput: "object"  # memory.Throughput
    variants: List["object"]  # advice.Variant
    bigger_gpus: List[str]
    text: str

    @property
    def fits(self) -> bool:
        return self.breakdown.fits


def target_gpu(cfg: PrimusConfig, ctx: Optional[RunContext] = None):
    """plan.gpu_memory_gb, else plan.gpu, else the local GPU, else H200."""
    from primus.plan.gpus import resolve_gpu
    from primus.plan.memory import target_gpu_name

    detect = ctx is None or ctx.device == "cuda"
    return resolve_gpu(target_gpu_name(cfg), cfg.plan.gpu_memory_gb, allow_detect=detect)


def plan(cfg: PrimusConfig, ctx: Optional[RunContext] = None, world: Optional[int] = None, advise: bool = True) -> Plan:
    from primus.features.training import global_batch
    from primus.plan.advice import bigger_gpus, variants
    from primus.plan.memory import estimate_memory, estimate_throughput, layout_of
    from primus.plan.report import format_plan

    world = world or (ctx.world_size if ctx is not None else None)
    gpu = target_gpu(cfg, ctx)
    lay = layout_of(cfg, world)
    bd = estimate_memory(cfg, gpu, lay.world)
    tp = estimate_throughput(cfg, gpu, lay.world)
    vs = variants(cfg, gpu, lay.world) if (advise and not bd.fits) else []
    big = bigger_gpus(cfg, gpu, lay.world) if (advise and not bd.fits) else []
    title = (f"{cfg.backend.name.value} / {cfg.model.name}, micro batch {cfg.training.micro_batch_size} x seq "
             f"{cfg.training.seq_length}, global batch {global_batch(cfg, lay.world)}")
    return Plan(bd, tp, vs, big, format_plan(title, lay, bd, tp, vs, big))


def run_plan(cfg: PrimusConfig, ctx: Optional[RunContext] = None) -> int:
    p = plan(cfg, ctx)
    print(p.text, flush=True)
    return 0


def host_memory_bytes() -> Optional[float]:
    """What this machine (or its cgroup, when that is smaller) lets processes allocate; None when unknown."""
    import os

    try:
        total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, float(text))
    return total
