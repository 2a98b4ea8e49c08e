"""No setting is silently ignored: every scalar field of the schema, set away from its value in a dry run of the
debug model on each backend, either changes what the backend is given (its arguments or the env the run sets), or
is reported (an error, or a warning that names it), or is one the run itself reads while it trains (RUN_TIME, with
where). A field added without a mapping, a rule or a run-time reader fails here."""
import enum
import json

import pytest

from conftest import compose_dict
from primus.config.errors import ConfigError

BACKENDS = ("megatron", "torchtitan")

# field -> where the run reads it (none of these reaches a backend's arguments)
RUN_TIME = {
    "dry_run": "primus/run.py: describes the run instead of starting it",
    "mode": "primus/run.py: mode=plan prints the plan instead of training",
    "training.log_interval": "primus/train_loop.py: steps between log lines",
    "training.timing_warmup_steps": "primus/metrics/meter.py: steps left out of the step-time statistics",
    "training.on_nonfinite": "primus/train_loop.py: skip the update or stop",
    "training.optimizer": "adam and adamw are one optimizer (AdamW, as megatron-core's adam): the same arguments",
    "model.max_position_embeddings": "a bound (training.seq_length must fit it, as Megatron-LM asserts); RoPE is "
                                     "computed per position",
    "data.eod_mask_loss": "torchtitan: primus/backends/torchtitan/trainer.py masks the labels at run time",
    "launcher.master_port": "primus/launch/: the rendezvous port",
    "logging.tensorboard": "primus/metrics/sinks.py",
    "logging.wandb": "primus/metrics/sinks.py",
    "logging.console_level": "primus/features/logging.py apply_levels",
    "logging.file_level": "primus/features/logging.py apply_levels",
    "profile.enabled": "primus/metrics/profiler.py",
    "profile.memory_snapshot": "primus/metrics/profiler.py",
    "checkpoint.interval": "primus/checkpoint.py",
    "checkpoint.save_at_end": "primus/checkpoint.py",
    "checkpoint.keep_last": "primus/checkpoint.py (pruning, also of a preemption save)",
    "checkpoint.no_save_optim": "torchtitan: primus/backends/torchtitan/checkpoint.py",
    "checkpoint.no_load_optim": "torchtitan: primus/backends/torchtitan/checkpoint.py (also a requeued job's resume)",
    "checkpoint.no_save_rng": "primus/checkpoint.py",
    "checkpoint.no_load_rng": "primus/checkpoint.py (also a requeued job's resume)",
    "plan.enforce": "primus/features/plan.py check_fits, just before launching",
    "plan.assumed_mfu": "primus/plan/: the estimate's tokens/s (mode=plan, a sweep's report)",
    "plan.gpu_memory_gb": "primus/plan/: the estimate's target, and check_fits just before launching",
    "sweep.objective": "primus/sweep.py",
    "sweep.direction": "primus/sweep.py",
}


def _judge(overrides):
    """(error text or None, keys warned, the backend's arguments and env, the config) for a dry run of these
    overrides."""
    from primus.backends import backend_args
    from primus.run import checked

    try:
        cfg, ctx = checked(compose_dict(overrides), overrides)
    except ConfigError as e:
        return str(e), set(), None, None
    from primus.tuning_env import tuning_env

    args = json.loads(json.dumps(backend_args(cfg, ctx), default=str, sort_keys=True))
    env = (tuning_env(cfg, ctx.rocm), ctx.env_decided)  # with args["env"]: what primus/run.py exports, and why
    return None, {k for w in ctx.warnings for k in w.keys}, (args, env), cfg


_BASE = {}


def _base(backend):
    """The debug model's dry run on this backend: (overrides, what the backend is given, each scalar's value)."""
    if backend not in _BASE:
        overrides = [f"backend={backend}", "dry_run=true"]
        error, _, given, cfg = _judge(overrides)
        assert error is None, error
        _BASE[backend] = (overrides, given, dict(_scalars(cfg)))
    return _BASE[backend]


def _scalars(obj, prefix=""):
    """(key, value) of every bool, int, float or enum field, unset ones (None) too: their type from the schema."""
    import typing

    hints = typing.get_type_hints(type(obj))
    for name in type(obj).__dataclass_fields__:
        value = getattr(obj, name)
        if hasattr(type(value), "__dataclass_fields__"):
            yield from _scalars(value, f"{prefix}{name}.")
            continue
        kinds = [t for t in typing.get_args(hints[name]) if t is not type(None)] or [hints[name]]
        if value is not None and isinstance(value, (bool, int, float, enum.Enum)):
            yield f"{prefix}{name}", value
        elif value is None and len(kinds) == 1 and isinstance(kinds[0], type) and (
                kinds[0] in (bool, int, float) or issubclass(kinds[0], enum.Enum)):
            yield f"{prefix}{name}", kinds[0]  # unset: set it to a value of its type


def _others(value):
    """Values to set instead: the other bool, the next enum member, a larger number; for an unset field (its type)
    each value of a bool or enum, where one of them may be what unset already resolves to."""
    if isinstance(value, type):
        if issubclass(value, enum.Enum):
            return [m.value for m in value]
        return {bool: ["true", "false"], int: [2], float: [0.5]}[value]
    if isinstance(value, bool):
        return [str(not value).lower()]
    if isinstance(value, enum.Enum):
        return [next(m.value for m in type(value) if m != value)]
    if isinstance(value, int):
        return [value + 1 if value else 1]
    return [value * 0.5 if value else 0.5]


def _fields():
    from primus.config.schema import PrimusConfig

    return [k for k, _ in _scalars(PrimusConfig())]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", _fields())
def test_a_setting_changes_the_run_or_is_reported(backend, key):
    overrides, given, values = _base(backend)
    tried = []
    for other in _others(values[key]):
        error, warned, now, _ = _judge(overrides + [f"{key}={other}"])
        if error is not None or key in warned or now != given:
            return
        tried.append(f"{key}={other}")
    assert key in RUN_TIME, (
        f"{', '.join(tried)} on {backend}: no error, no warning naming it, and the backend's arguments and env "
        f"are unchanged. Map it to the backend, report where it has no effect (an ACTS_ONLY_WITH row or a rule), "
        f"or list where the run reads it in RUN_TIME")


def test_every_run_time_setting_is_a_field_and_really_reaches_no_argument():
    fields = set(_fields())
    assert set(RUN_TIME) <= fields, set(RUN_TIME) - fields
    overrides, given, values = _base("megatron")
    for key in ("training.log_interval", "checkpoint.interval", "profile.enabled"):
        error, warned, now, _ = _judge(overrides + [f"{key}={_others(values[key])[0]}"])
        assert error is None and key not in warned and now == given, key
