"""The logging feature (observability): metric sinks, the levels of the run log's two sinks (console and
<run_dir>/train.log) and the profiler window (the `profile` group), see primus/features/__init__.py. The sinks are
primus/metrics/; the shared loop records every step itself, so each backend's own logging is turned down to what the
loop needs."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Tuple


from primus.config.errors import WARNING, ConfigIssue
from primus.features import rule


class LogLevel(str, Enum):
    # Python's logging levels; the run's own lines are INFO (steps, checkpoints, findings) or WARNING
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


@dataclass
class LoggingConfig:
    tensorboard: bool = True  # event files in <run_dir>/tensorboard (rank 0)
    wandb: bool = False  # Weights & Biases, offline mode (needs the wandb package)
    wandb_project: str = "primus-hydra"
    # the least severe line each sink shows: WARNING keeps the console to warnings while train.log keeps every step
    console_level: LogLevel = LogLevel.INFO
    file_level: LogLevel = LogLevel.INFO


@dataclass
class ProfileConfig:
    enabled: bool = False  # torch.profiler trace for a window of steps
    start_step: int = 3  # first profiled step (1-based); earlier steps warm up
    steps: int = 2  # profiled steps
    ranks: List[int] = field(default_factory=lambda: [0])  # ranks that record
    record_shapes: bool = True  # operator input shapes in the trace
    with_stack: bool = False  # Python stacks (large traces)
    top_kernels: int = 15  # rows of the printed kernel table
    memory_snapshot: bool = False  # CUDA allocator history -> memory_snapshot.pickle (pytorch.org/memory_viz)
    memory_snapshot_steps: int = 2  # steps recorded from start_step


# Fields that act only under another setting (primus.features.idle_settings): warned, as a window or a project name
# left behind by switching the profiler or the sink off is harmless, and listed in result.json's ignored_settings
ACTS_ONLY_WITH = (
    (("profile.start_step", "profile.ranks"), "the profiler or the memory snapshot (profile.enabled=true or "
     "profile.memory_snapshot=true)", lambda c: c.profile.enabled or c.profile.memory_snapshot,
     "set profile.enabled=true, or drop them", WARNING),
    (("profile.steps", "profile.record_shapes", "profile.with_stack", "profile.top_kernels"),
     "the profiler (profile.enabled=true)", lambda c: c.profile.enabled, "set profile.enabled=true, or drop them",
     WARNING),
    (("profile.memory_snapshot_steps",), "the memory snapshot (profile.memory_snapshot=true)",
     lambda c: c.profile.memory_snapshot, "set profile.memory_snapshot=true, or drop it", WARNING),
    (("wandb_project",), "the Weights & Biases sink (logging.wandb=true)", lambda c: c.logging.wandb,
     "set logging.wandb=true, or drop it", WARNING),
)


@rule
def profile_window(cfg, ctx):
    p, out = cfg.profile, []
    if not (p.enabled or p.memory_snapshot):
        return []
    n = cfg.training.train_iters
    if p.start_step < 1 or p.start_step > n:
        out.append(ConfigIssue(["profile.start_step"], p.start_step, f"must be a step of the run (1..{n})",
                               f"use profile.start_step between 1 and training.train_iters ({n})"))
    if p.steps < 1:
        out.append(ConfigIssue(["profile.steps"], p.steps, "must be >= 1", "profile at least one step"))
    elif p.enabled and p.start_step + p.steps - 1 > n:
        out.append(ConfigIssue(["profile.start_step", "profile.steps"], [p.start_step, p.steps],
                               f"the window ends after the run's last step ({n})", "start earlier or profile fewer steps"))
    if p.memory_snapshot:
        if ctx.device != "cuda":
            out.append(ConfigIssue(["profile.memory_snapshot"], True, "records the CUDA allocator: needs a GPU",
                                   "set profile.memory_snapshot=false on CPU"))
        if p.memory_snapshot_steps < 1:
            out.append(ConfigIssue(["profile.memory_snapshot_steps"], p.memory_snapshot_steps, "must be >= 1", "use 1 or more"))
    bad = [r for r in p.ranks if r < 0 or r >= ctx.world_size]
    if bad:
        out.append(ConfigIssue(["profile.ranks"], bad, f"ranks must be in 0..{ctx.world_size - 1}", "list existing ranks"))
    return out


@rule
def wandb_installed(cfg, ctx):
    if not cfg.logging.wandb:
        return []
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return [ConfigIssue(["logging.wandb"], True, "the Weights & Biases sink needs the wandb package",
                            "pip install wandb==0.31.0 (pinned in requirements.lock), or set logging.wandb=false")]
    return []


def torchtitan(cfg, ctx) -> dict:
    return {
        "metrics": {
            # TorchTitan computes the global loss only on logging steps; the shared loop needs it every step
            # (our MetricsProcessor subclass in spec.py records instead of printing)
            "log_freq": 1, "enable_tensorboard": False, "enable_wandb": False, "disable_color_printing": True,
        },
        "comm": {"trace_buf_size": 0},  # no flight-recorder files in the run dir
    }


def levels(cfg) -> Tuple[int, int]:
    """(console, file) as Python logging levels."""
    lg = cfg.logging
    return logging.getLevelName(lg.console_level.value), logging.getLevelName(lg.file_level.value)


def apply_levels(cfg) -> None:
    """The levels on the run's Python logging: Hydra's job logging gives the root logger a console and a
    train.log handler (in the launching process). DEBUG on either sink lets the `primus` loggers emit their DEBUG
    records (other libraries' stay at their own level); otherwise they inherit the root's level, as before."""
    console, file = levels(cfg)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.setLevel(file)
        elif isinstance(h, logging.StreamHandler):
            h.setLevel(console)
    low = min(console, file)
    logging.getLogger("primus").setLevel(low if low < logging.INFO else logging.NOTSET)
