"""Backend registry: backend name -> (argument mapping for dry runs, trainer class), imported lazily.

The mapping modules import nothing heavy (no megatron, no torchtitan), so `dry_run=true` stays fast; the trainer
modules import the real libraries.
"""
import importlib
from typing import Any, Dict, Type

from primus.config.schema import PrimusConfig
from primus.context import RunContext

_REGISTRY = {
    "megatron": ("primus.backends.megatron.args", "primus.backends.megatron.trainer:MegatronTrainer"),
    "torchtitan": ("primus.backends.torchtitan.args", "primus.backends.torchtitan.trainer:TorchTitanTrainer"),
}


def _name(cfg: PrimusConfig) -> str:
    return cfg.backend.name.value


def backend_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    """The exact arguments the backend will be given (JSON-able), for dry runs and tests."""
    return importlib.import_module(_REGISTRY[_name(cfg)][0]).build_args(cfg, ctx)


def backend_env(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, str]:
    """Env vars the backend's settings need before any GPU work (its build_args' "env" entry)."""
    return {k: str(v) for k, v in (backend_args(cfg, ctx).get("env") or {}).items()}


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> list:
    """Backend-specific rules (what the installed library / this device cannot honour) as ConfigIssues."""
    return importlib.import_module(_REGISTRY[_name(cfg)][0]).capability_issues(cfg, ctx)


def trainer_class(cfg: PrimusConfig) -> Type:
    mod, cls = _REGISTRY[_name(cfg)][1].split(":")
    return getattr(importlib.import_module(mod), cls)
