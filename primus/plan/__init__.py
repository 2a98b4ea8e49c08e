"""Plan before spending GPU hours: per-GPU memory and throughput estimates for any config (no GPU, no torch).

Entry points (called from primus/run.py):
    run_plan(cfg, ctx) -> int           `mode=plan`: print the plan, return 0 (fits or not: the plan is the output)
    check_fits(cfg, ctx) -> ConfigIssue | None
                                        before a real GPU run: an issue when the estimate does not fit the GPU
                                        (None on CPU, or with plan.enforce=false)
    plan(cfg, ctx) -> Plan              the estimate, variants and the text, for programs and tests

Modules: `memory` (the formulas and the breakdown), `advice` (what-if variants), `report` (the table), `gpus`
(capacity by GPU name).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from primus.config.errors import ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext


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
    from primus.plan.memory import plan_settings

    s = plan_settings(cfg)
    detect = ctx is None or ctx.device == "cuda"
    return resolve_gpu(s.gpu, s.gpu_memory_gb, allow_detect=detect)


def plan(cfg: PrimusConfig, ctx: Optional[RunContext] = None, world: Optional[int] = None, advise: bool = True) -> Plan:
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
             f"{cfg.training.seq_length}, global batch {cfg.training.global_batch_size}")
    return Plan(bd, tp, vs, big, format_plan(title, lay, bd, tp, vs, big))


def run_plan(cfg: PrimusConfig, ctx: Optional[RunContext] = None) -> int:
    p = plan(cfg, ctx)
    print(p.text, flush=True)
    return 0


def check_fits(cfg: PrimusConfig, ctx: RunContext) -> Optional[ConfigIssue]:
    """The refusal before a real run: None when it fits, on CPU, or with plan.enforce=false."""
    from primus.plan.memory import plan_settings

    if ctx.device != "cuda" or getattr(ctx, "planned", False) or not plan_settings(cfg).enforce:
        return None
    p = plan(cfg, ctx)
    if p.fits:
        return None
    bd = p.breakdown
    G = float(1 << 30)
    fitting = [v for v in p.variants if v.fits]
    fix = "; ".join(f"{v.label} ({' '.join(v.overrides)}: {v.breakdown.needed / G:.1f} GiB)" for v in fitting[:4])
    fix = (f"try {fix}; " if fix else "") + "see `python train.py <same overrides> mode=plan`; " \
        "or set plan.enforce=false to start anyway"
    return ConfigIssue(
        ["plan.enforce", "training.micro_batch_size", "recompute.recompute_granularity",
         "memory.use_distributed_optimizer", "parallel.tensor_model_parallel_size"],
        {"estimated_peak_gib": round(bd.total / G, 1), "needed_gib": round(bd.needed / G, 1),
         "capacity_gib": round(bd.capacity / G, 1), "gpu": bd.gpu},
        f"the memory estimate does not fit the GPU ({bd.needed / G:.1f} GiB needed, {bd.capacity / G:.1f} GiB available)",
        fix)
