"""The plan feature: the memory / throughput estimate's target and whether it may refuse a run (see
primus/features/__init__.py). The estimate is primus/plan/; the refusal before a real run (`check_fits` below)
needs the estimate itself, so primus/run.py runs it after validation, just before launching."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from primus.config.errors import ConfigError, ConfigIssue
from primus.features import rule


@dataclass
class PlanConfig:
    gpu: str = "auto"  # target GPU for the estimate: auto (this machine's, else H200), H100, H200, MI300X, MI325X, MI355X
    gpu_memory_gb: Optional[float] = None  # override the target's memory (GB)
    # MFU that turns FLOPs into step time and tokens/s; null: what the presets measured for this backend, precision,
    # dense or MoE, and recompute (primus.plan.memory.MEASURED_MFU)
    assumed_mfu: Optional[float] = None
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
    if p.assumed_mfu is not None and not 0 < p.assumed_mfu <= 1:
        out.append(ConfigIssue(["plan.assumed_mfu"], p.assumed_mfu, "an MFU is a fraction in (0, 1]",
                               "e.g. plan.assumed_mfu=0.45, or null for the measured figure"))
    return out


def _estimate():
    import primus.plan  # the estimate (no torch); imported when a run is judged, not when the config is

    return primus.plan


def check_fits(cfg, ctx) -> Optional[ConfigIssue]:
    """The refusal before a real run: None when it fits or with plan.enforce=false. On a GPU the estimate is set
    against the GPU; on CPU every local process holds its share in host memory, and a run that cannot fit there
    would be killed by the kernel's OOM killer minutes in, after building the model."""
    P = _estimate()
    if getattr(ctx, "planned", False) or not cfg.plan.enforce:
        return None
    if ctx.device != "cuda":
        return _check_fits_host(cfg, ctx)
    p = P.plan(cfg, ctx)
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


class Pruned(ConfigError):
    """A sweep point the memory estimate says cannot fit: the sweep records it as pruned and runs nothing."""

    def __init__(self, issue: ConfigIssue):
        super().__init__(issue)
        v = issue.value if isinstance(issue.value, dict) else {}
        where = v.get("gpu") or "host memory"
        self.summary = f"pruned: needs {v.get('needed_gib')} GiB of {v.get('capacity_gib')} GiB ({where})"

    def __str__(self) -> str:
        return f"{self.summary}. {' '.join(str(self.issues[0]).split())}"


def _check_fits_host(cfg, ctx) -> Optional[ConfigIssue]:
    """CPU: the GPU-shaped estimate (bf16 weights, fp32 optimizer states, activations) times the processes on this
    node against the host's memory. CPU runs keep weights in fp32 and host offload shares count too, so the
    estimate is a floor: only a run that cannot fit even then is refused."""
    P = _estimate()
    host = P.host_memory_bytes()
    if host is None:
        return None
    bd = P.plan(cfg, ctx, advise=False).breakdown
    procs = max(1, cfg.launcher.nproc_per_node)
    need = (bd.total + bd.optimizer_cpu) * procs
    if need <= host:
        return None
    G = float(1 << 30)
    return ConfigIssue(
        ["model.name", "launcher.nproc_per_node", "plan.enforce"],
        {"model": cfg.model.name, "processes": procs, "estimated_gib_per_process": round(need / procs / G, 1),
         "needed_gib": round(need / G, 1), "capacity_gib": round(host / G, 1)},
        f"on CPU this run needs at least {need / G:.1f} GiB of host memory ({procs} process(es) x "
        f"{need / procs / G:.1f} GiB: weights, gradients, optimizer states, activations), and this machine has "
        f"{host / G:.1f} GiB: it would be killed for memory after building the model",
        "run it on a GPU machine, or choose a smaller model (model=debug, model=debug_moe) or fewer processes; "
        "`python train.py <same overrides> mode=plan` shows the estimate; plan.enforce=false starts anyway")
