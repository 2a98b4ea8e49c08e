"""The sweep feature: the number a job returns to Hydra's sweeper (see primus/features/__init__.py).

`python train.py -m ...` runs one job per point; the job function (train.py's main) returns `sweep.objective`
read from the point's result.json, so Hydra's Optuna, Nevergrad and Ax sweepers optimise it unchanged. A point that
failed, was refused or was pruned by the planner returns the worst value in the objective's direction (-inf when
maximising, +inf when minimising): optuna 2.10 refuses a NaN (its tell() raises and the sweep dies) but records
an infinite value as a completed, worst trial, and the sweep goes on. The sweep table is primus/sweep.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Optional, Tuple

from primus.config.errors import ConfigIssue
from primus.features import rule


class Objective(str, Enum):
    tokens_per_s_per_gpu = "tokens_per_s_per_gpu"  # result.json's throughput per GPU (the default)
    mfu = "mfu"  # model FLOPs utilisation, a fraction
    final_loss = "final_loss"  # training loss of the last step
    val_loss = "val_loss"  # validation loss (needs a run with evaluation)


class Direction(str, Enum):
    maximize = "maximize"
    minimize = "minimize"


DEFAULT_DIRECTION = {Objective.tokens_per_s_per_gpu: Direction.maximize, Objective.mfu: Direction.maximize,
                     Objective.final_loss: Direction.minimize, Objective.val_loss: Direction.minimize}


@dataclass
class SweepConfig:
    objective: Objective = Objective.tokens_per_s_per_gpu  # what a sweep job returns to the sweeper
    direction: Optional[Direction] = None  # null = the objective's own: maximize throughput / MFU, minimize losses


@rule
def objective_is_measured(cfg, ctx):
    """val_loss is written only by a run that evaluates (training.eval_interval, training.eval_iters): without it
    every point of the sweep would return the failure value after training."""
    t = cfg.training
    if objective_of(cfg.sweep) == Objective.val_loss and not (t.eval_interval and t.eval_iters):
        return [ConfigIssue(["sweep.objective", "training.eval_interval", "training.eval_iters"],
                            {"objective": "val_loss", "eval_interval": t.eval_interval, "eval_iters": t.eval_iters},
                            "sweep.objective=val_loss needs a run that evaluates",
                            "set training.eval_interval and training.eval_iters above 0 (e.g. eval_interval="
                            f"{t.train_iters} eval_iters=10), or choose sweep.objective=final_loss")]
    return []


def _enum(cls, v):
    return v if isinstance(v, cls) else cls(str(getattr(v, "value", v)))


def objective_of(sweep: Any) -> Objective:
    return _enum(Objective, getattr(sweep, "objective", Objective.tokens_per_s_per_gpu))


def direction_of(sweep: Any) -> Direction:
    """The effective direction of a sweep config (a SweepConfig or the composed DictConfig node)."""
    objective = objective_of(sweep)
    d = getattr(sweep, "direction", None)
    return _enum(Direction, d) if d is not None else DEFAULT_DIRECTION[objective]


def failure_value(direction: Direction) -> float:
    return -math.inf if _enum(Direction, direction) == Direction.maximize else math.inf


def objective_value(result: Dict[str, Any], sweep: Any) -> Tuple[float, Optional[str]]:
    """(the number the sweeper gets, why it is the failure value or None) for a point's result.json."""
    objective = objective_of(sweep)
    direction = direction_of(sweep)
    worst = failure_value(direction)
    status = result.get("status")
    if status != "ok":
        return worst, f"the point ended {status!r}: {result.get('error') or 'no result'}"
    v = result.get(objective.value)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v), None
    if objective == Objective.val_loss:
        return worst, ("sweep.objective=val_loss, but this run wrote no val_loss: it ran without evaluation. "
                       "Turn evaluation on for the sweep, or choose sweep.objective=final_loss (or "
                       "tokens_per_s_per_gpu, mfu)")
    return worst, (f"sweep.objective={objective.value}, but this run's result.json has {objective.value}={v!r}: "
                   f"choose another sweep.objective ({', '.join(o.value for o in Objective)})")


def sweeper_direction_issue(sweeper: Any, sweep: Any) -> Optional[str]:
    """A sweeper that takes a direction (Optuna: hydra.sweeper.direction; Nevergrad: hydra.sweeper.optim.maximize)
    must optimise the objective the way sweep.direction says, or it would hunt for the worst point."""
    want = direction_of(sweep)
    objective = objective_of(sweep).value
    have = None
    d = sweeper.get("direction") if hasattr(sweeper, "get") else None
    d = getattr(d, "name", d)  # optuna's sweeper config holds its own Direction enum
    if isinstance(d, str):
        have, key = d, "hydra.sweeper.direction"
    optim = sweeper.get("optim") if hasattr(sweeper, "get") else None
    if have is None and optim is not None and optim.get("maximize") is not None:
        have, key = ("maximize" if optim.get("maximize") else "minimize"), "hydra.sweeper.optim.maximize"
    if have is None or have == want.value:
        return None
    fix = f"hydra.sweeper.direction={want.value}" if key == "hydra.sweeper.direction" else \
        f"hydra.sweeper.optim.maximize={str(want == Direction.maximize).lower()}"
    return (f"{key} asks the sweeper to {have} while sweep.objective={objective} is to be {want.value}d "
            f"(sweep.direction): set {fix}, or sweep.direction={have} if that is meant")
