"""One module per feature of the performance tuning guide.

Each module (`precision`, `recompute`, `turbo`, `moe`, `parallel`, `overlap`, `memory`, `training`, `data`,
`tuning`, `launcher`, ...) holds, for its feature:

- its config dataclass and enums (the Hydra group's schema; field names are the guide's);
- its rules, registered with `@rule` below and run by `primus.config.validate.validate`;
- its mapping to each backend: `megatron(cfg, ctx)` (megatron-core arguments, by section) and
  `torchtitan(cfg, ctx)` (TorchTitan JobConfig keys), read by `primus/backends/<name>/args.py`; and what each
  backend, as installed, cannot honour: `megatron_issues(cfg, ctx)` / `torchtitan_issues(cfg, ctx)`;
- its fields that only one backend reads: `megatron_only(cfg)` / `torchtitan_only(cfg)` (set away from its
  default under the other backend, such a field is an issue: that backend has no such setting);
- its fields that act only under another setting: `ACTS_ONLY_WITH` rows (set away from its default while that
  setting is off, such a field would be dropped, so it is an issue: `idle_settings` below);
- its in-model application where one exists.

Facts that several rules or mappings need (which fp8 recipe runs on which backend and device, which Turbo flag
serves which backend) are data in the one feature module that owns them; everything else reads them from there.
So `git grep <flag>` finds where a flag is defined, checked and applied.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Tuple

Rule = Callable[..., list]  # (cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]
RULES: List[Rule] = []  # every feature's rules, in import order; validate() runs them all


RESOLVERS: List[Rule] = []  # run before every rule: settings that imply others (a sync-free stage, an alias)


def resolver(fn: Rule) -> Rule:
    """Register a resolver: it sets the values other settings imply, in place, before any rule judges the config,
    and returns issues like a rule (a NOTE for each value it set, an error for a contradiction)."""
    RESOLVERS.append(fn)
    return fn


def rule(fn: Rule) -> Rule:
    """Register a cross-field rule. It returns ConfigIssues (keys, value, what is allowed, the fix), never raises;
    an issue of severity WARNING (primus.config.errors.warning) lets the run go on and is reported."""
    RULES.append(fn)
    return fn


def unmet(rows, cfg) -> List[Tuple[Tuple[str, ...], str]]:
    """A path's preconditions as data, rows of (config keys, what it needs, holds(cfg)) (turbo.SYNC_FREE_DISPATCH,
    training.EXPERTS_GRAD_ACCUM_FUSION): the (keys, need) of the rows this config misses, in the rows' order."""
    return [(keys, need) for keys, need, holds in rows if not holds(cfg)]


# Every feature module, in the order their rules run and their backend mappings merge.
FEATURES = ("backend", "model", "precision", "recompute", "moe", "turbo", "tuning", "parallel", "overlap", "memory",
            "training", "data", "launcher", "logging", "checkpoint", "plan", "sweep")


def modules():
    """The feature modules, imported (importing one registers its rules)."""
    import importlib

    return [importlib.import_module(f"primus.features.{name}") for name in FEATURES]


def merged(parts: Iterable[Dict[str, Any]], where: str = "") -> Dict[str, Any]:
    """Deep-merge the backend mappings of several features. Each feature owns its leaves: two features setting the
    same leaf is a bug in the mapping, raised here rather than one silently winning."""
    out: Dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            path = f"{where}.{key}" if where else key
            if key not in out:
                out[key] = value
            elif isinstance(out[key], dict) and isinstance(value, dict):
                out[key] = merged([out[key], value], path)
            else:
                raise RuntimeError(f"two features map the backend argument {path!r}")
    return out


def backend_mapping(backend: str, cfg, ctx) -> Dict[str, Any]:
    """Merge `<backend>(cfg, ctx)` of every feature module that maps to this backend."""
    return merged(getattr(m, backend)(cfg, ctx) for m in modules() if hasattr(m, backend))


def backend_issues(backend: str, cfg, ctx) -> List[Any]:
    """Every feature's `<backend>_issues(cfg, ctx)`: what this backend, as installed, and this device cannot honour
    (run by the backend's capability_issues, together with the generic rules)."""
    return [i for m in modules() if hasattr(m, f"{backend}_issues") for i in getattr(m, f"{backend}_issues")(cfg, ctx)]


# backend -> (the other backend, how issues name the other backend's library, this backend's library)
BACKEND_NAMES = {"megatron": ("torchtitan", "TorchTitan", "megatron-core 0.16.1"),
                 "torchtitan": ("megatron", "megatron-core", "torchtitan 0.2.2")}


def default_of(section, k: str):
    """A group field's schema default."""
    f = type(section).__dataclass_fields__[k]
    return f.default_factory() if callable(f.default_factory) else f.default


def idle_settings(cfg, ctx=None) -> List[Any]:
    """Every feature's `ACTS_ONLY_WITH` rows, (fields of its group, or "group.field" of another group the module
    owns, what they act under, holds(cfg), the fix[, severity]): the row's fields set away from their schema
    defaults while it does not hold. Nothing would read them, so each is an error, or a WARNING where a row says
    so (a model preset's architecture fields, which a switch such as rope_type=rope leaves behind). Fields that
    only the other backend reads are left to other_backend_issues, which names the backend instead."""
    from primus.config.errors import ConfigIssue

    other = BACKEND_NAMES[cfg.backend.name.value][0]
    out = []
    for feature, keys, need, fix, severity in idle_rows(cfg):
        theirs = set(getattr(feature, f"{other}_only", lambda c: ())(cfg))
        set_ = {}
        for key in keys:
            g, k = key.split(".")
            section = getattr(cfg, g)
            if k not in theirs and getattr(section, k) != default_of(section, k):
                set_[key] = getattr(getattr(section, k), "value", getattr(section, k))
        if set_:
            out.append(ConfigIssue(list(set_), set_[next(iter(set_))] if len(set_) == 1 else set_,
                                   f"acts only with {need}: nothing would read it", fix, severity=severity))
    return out


def idle_rows(cfg):
    """The `ACTS_ONLY_WITH` rows that do not hold for cfg: (feature module, their "group.field" keys, what they act
    under, the fix, the severity). idle_settings judges a run by them; the Primus importer leaves their fields out."""
    from primus.config.errors import ERROR

    for feature in modules():
        group = feature.__name__.rsplit(".", 1)[1]
        for fields, need, holds, fix, *severity in getattr(feature, "ACTS_ONLY_WITH", ()):
            if not holds(cfg):  # a field of the module's group, or "group.field" of another group it owns
                yield (feature, [k if "." in k else f"{group}.{k}" for k in fields], need, fix,
                       severity[0] if severity else ERROR)


rule(idle_settings)


def other_backend_issues(backend: str, cfg) -> List[Any]:
    """Every feature's fields that only the other backend reads (`<other>_only(cfg)`), set away from their defaults
    on this backend: it has no such setting, so the value would have no effect. One rule for both backends."""
    from primus.config.errors import ConfigIssue

    other, other_lib, this_lib = BACKEND_NAMES[backend]
    out = []
    for feature in modules():
        if not hasattr(feature, f"{other}_only"):
            continue
        group = feature.__name__.rsplit(".", 1)[1]
        section = getattr(cfg, group)
        for k in getattr(feature, f"{other}_only")(cfg):
            value, default = getattr(section, k), default_of(section, k)
            if value != default:
                shown = getattr(default, "value", default)
                leave = "unset" if default is None else f"at its default ({shown!r})"
                out.append(ConfigIssue([f"{group}.{k}"], getattr(value, "value", value),
                                       f"{other_lib} only: {this_lib} has no such setting",
                                       f"leave {group}.{k} {leave} or use backend={other}"))
    return out
