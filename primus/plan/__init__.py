"""Plan before spending GPU hours: per-GPU memory and throughput estimates for any config (no GPU, no torch).

Entry points (called from primus/run.py):
    run_plan(cfg, ctx) -> int           `mode=plan`: print the plan, return 0 (fits or not: the plan is the output)
    check_fits(cfg, ctx) -> ConfigIssue | None
                                        before a real run: an issue when the estimate does not fit the GPU, or on
                                        CPU this machine's memory (None with plan.enforce=false)
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


def check_fits(cfg: PrimusConfig, ctx: RunContext) -> Optional[ConfigIssue]:
    """The refusal before a real run: None when it fits or with plan.enforce=false. On a GPU the estimate is set
    against the GPU; on CPU every local process holds its share in host memory, and a run that cannot fit there
    would be killed by the kernel's OOM killer minutes in, after building the model."""
    from primus.plan.memory import plan_settings

    if getattr(ctx, "planned", False) or not plan_settings(cfg).enforce:
        return None
    if ctx.device != "cuda":
        return _check_fits_host(cfg, ctx)
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


def _check_fits_host(cfg: PrimusConfig, ctx: RunContext) -> Optional[ConfigIssue]:
    """CPU: the GPU-shaped estimate (bf16 weights, fp32 optimizer states, activations) times the processes on this
    node against the host's memory. CPU runs keep weights in fp32 and host offload shares count too, so the
    estimate is a floor: only a run that cannot fit even then is refused."""
    host = host_memory_bytes()
    if host is None:
        return None
    bd = plan(cfg, ctx, advise=False).breakdown
    procs = max(1, cfg.launcher.nproc_per_node)
    need = (bd.total + bd.optimizer_cpu) * procs
    if need <= host:
        return None
    G = float(1 << 30)
    return ConfigIssue(
        ["model.name", "launcher.nproc_per_node", "plan.enforce"],
        {"model": cfg.model.name, "processes": procs, "estimated_gib_per_process": round(need / procs / G, 1),
         "host_memory_gib": round(host / G, 1)},
        f"on CPU this run needs at least {need / G:.1f} GiB of host memory ({procs} process(es) x "
        f"{need / procs / G:.1f} GiB: weights, gradients, optimizer states, activations), and this machine has "
        f"{host / G:.1f} GiB: it would be killed for memory after building the model",
        "run it on a GPU machine, or choose a smaller model (model=debug, model=debug_moe) or fewer processes; "
        "`python train.py <same overrides> mode=plan` shows the estimate; plan.enforce=false starts anyway")
