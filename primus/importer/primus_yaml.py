"""Primus's YAML semantics, as its loader (primus/core/config/yaml_loader.py) applies them:

- `${VAR}` / `${VAR:default}` in strings come from the environment; a string that was substituted is then read as a
  bool / int / float when it looks like one (an untouched string stays a string);
- `extends:` (a name or a list, relative to the file) deep-merges its files first, later ones winning, and the file's
  own keys last;
- a module's `config` (modules/<framework>/) and `model` (models/<framework>/) are both loaded that way; the model's
  keys join the module's (the module's win), then `overrides` are merged on top.
"""
from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict, List, Optional

import yaml

_ENV = re.compile(r"\${([^:{}]+)(?::([^}]*))?}")
_FLOAT = re.compile(r"^-?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)$")


class PrimusYamlError(ValueError):
    """The file cannot be read the way Primus reads it."""


def _scalar(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    if _FLOAT.fullmatch(v):
        return float(v)
    # Primus leaves "null" a string here; YAML's own null is what a default of `null` means to its users
    return None if v == "null" else v


def resolve_env(obj: Any, env: Dict[str, str], where: str) -> Any:
    if isinstance(obj, dict):
        return {k: resolve_env(v, env, where) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve_env(v, env, where) for v in obj]
    if not isinstance(obj, str):
        return obj

    def sub(m):
        var, default = m.group(1), m.group(2)
        if default is None and var not in env:
            raise PrimusYamlError(f"{where}: environment variable {var} is required (written ${{{var}}} with no "
                                  f"default) but not set. Fix: export {var}=..., or write ${{{var}:default}}")
        return env.get(var, default)

    out = _ENV.sub(sub, obj)
    return _scalar(out) if out != obj else out


def deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def read_yaml(path: str) -> Any:
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise PrimusYamlError(f"cannot read {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise PrimusYamlError(f"{path} is not valid YAML: {e}") from e


def parse(path: str, env: Optional[Dict[str, str]] = None, chain: Optional[List[str]] = None) -> Dict[str, Any]:
    """One Primus YAML file with its env substitution and `extends:` chain. `chain` collects the files read, in
    merge order (bases first)."""
    env = dict(os.environ) if env is None else env
    cfg = read_yaml(path)
    if not isinstance(cfg, dict):
        raise PrimusYamlError(f"{path} is empty or not a mapping")
    cfg = resolve_env(cfg, env, path)
    if "extends" not in cfg:
        if chain is not None:
            chain.append(path)
        return cfg
    ext = cfg["extends"]
    merged: Dict[str, Any] = {}
    for name in [ext] if isinstance(ext, str) else list(ext or []):
        base = os.path.normpath(os.path.join(os.path.dirname(path), name))
        if not os.path.isfile(base):
            raise PrimusYamlError(f"{path}: extends {name!r}, but {base} does not exist")
        merged = deep_merge(merged, parse(base, env, chain))
    if chain is not None:
        chain.append(path)
    return deep_merge(merged, {k: v for k, v in cfg.items() if k != "extends"})
