"""The guide's environment interface: each variable it tells the user to export, the config key it sets, and how
its text reads. One table, applied once when the config is composed (primus/run.py), before validation.

A variable sets its key when the key was left at its default; a key set away from its default, or given on the
command line, wins over the variable. Either way the run says which one won (a log line, and the dry run's
`env` entry), so an exported variable is never ignored silently.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional


def _bool01(text: str) -> bool:
    if text.strip() not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return text.strip() == "1"


def _stage(text: str) -> int:
    if text.strip() not in ("0", "1", "2", "3"):
        raise ValueError("must be 0, 1, 2 or 3")
    return int(text)


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError("must be a path")
    return text


@dataclass(frozen=True)
class EnvKey:
    var: str
    key: str  # dotted config key
    parse: Callable[[str], Any]
    meaning: str


ENV_KEYS = (
    EnvKey("PRIMUS_HIPBLASLT_TUNING", "tuning.enabled", _bool01,
           "the GEMM-tuning master switch: the stage is honoured only with it on"),
    EnvKey("PRIMUS_HIPBLASLT_TUNING_STAGE", "tuning.stage", _stage,
           "0 none, 1 dump GEMM shapes, 2 tune offline, 3 train with the tuned GEMMs"),
    EnvKey("HIPBLASLT_TUNING_OVERRIDE_FILE", "tuning.override_file", _path, "stage 3's tuned-GEMM results file"),
    EnvKey("PRIMUS_DETERMINISTIC", "training.deterministic", _bool01,
           "bitwise-reproducible runs: no torch.compile, no GEMM tuning"),
)


def _get(cfg, key: str):
    group, name = key.split(".", 1)
    return getattr(getattr(cfg, group), name)


def _default(cfg, key: str):
    group, name = key.split(".", 1)
    f = type(getattr(cfg, group)).__dataclass_fields__[name]
    return f.default_factory() if callable(f.default_factory) else f.default


GROUP_KEYS = {"tuning_stage": "tuning.stage"}  # config groups that stand for one key (conf/tuning_stage/<N>.yaml)


def explicit_keys(overrides: List[str]) -> frozenset:
    """The dotted keys a command line's Hydra overrides set (`key=v`, `+key=v`, and GROUP_KEYS' group choices)."""
    out = set()
    for o in overrides:
        if "=" not in o:
            continue
        k = o.split("=", 1)[0].lstrip("+~")
        if "." in k:
            out.add(k)
        elif k in GROUP_KEYS:
            out.add(GROUP_KEYS[k])
    return frozenset(out)


def apply_env(cfg, explicit: frozenset = frozenset(), environ: Optional[Mapping[str, str]] = None):
    """Set each ENV_KEYS key from its exported variable where the config left it at its default. Returns (what was
    decided: one dict per exported variable, issues: a variable whose text has no meaning)."""
    from primus.config.errors import ConfigIssue

    env = os.environ if environ is None else environ
    decided: List[Dict[str, Any]] = []
    issues: List[ConfigIssue] = []
    for e in ENV_KEYS:
        if e.var not in env:
            continue
        text = env[e.var]
        try:
            value = e.parse(text)
        except ValueError as why:
            issues.append(ConfigIssue([e.var, e.key], text, f"the exported {e.var} {why} ({e.meaning})",
                                      f"export {e.var} with such a value, unset it, or set {e.key} instead"))
            continue
        current = _get(cfg, e.key)
        current_v = getattr(current, "value", current)
        if current_v == value:
            decided.append({"var": e.var, "value": text, "key": e.key, "won": "both agree"})
        elif e.key in explicit or current != _default(cfg, e.key):
            decided.append({"var": e.var, "value": text, "key": e.key, "config": current_v, "won": "config"})
        else:
            group, name = e.key.split(".", 1)
            setattr(getattr(cfg, group), name, value)
            decided.append({"var": e.var, "value": text, "key": e.key, "won": "env"})
    return decided, issues


def describe(d: Dict[str, Any]) -> str:
    """One log line for a decision of apply_env."""
    if d["won"] == "env":
        return f"{d['var']}={d['value']} (exported) sets {d['key']}={d['value']}"
    if d["won"] == "config":
        return (f"{d['key']}={d['config']!r} (config) wins over the exported {d['var']}={d['value']}; unset the "
                f"variable or drop the key to silence this")
    return f"{d['var']}={d['value']} (exported) and {d['key']} agree"
