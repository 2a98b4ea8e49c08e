"""Every key of the composed config is a schema field, or the run stops.

Hydra refuses an unknown key given plainly (`precison=fp8`), but its own message suggests `+precison=fp8`, and a
`+key` is added to the config however the schema reads. Such a key used to be saved to `.hydra/config.yaml` and
read by nothing, with exit 0. This check walks the composed config against the schema's dataclasses before
anything else and names each unknown key with the closest schema keys.

A switch is true or false: omegaconf turns any non-zero number given to a bool field into true
(`precision.bf16=2`), so the command-line overrides of bool fields are checked for the words themselves.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Dict, List, Optional

from primus.config.errors import ConfigIssue

FREE = object()  # a field whose value is a free-form mapping (launcher.env, extra): any keys


def schema_tree(cls) -> Dict[str, Any]:
    """{field: subtree} for nested dataclasses, FREE for free-form dicts, None for leaves."""
    hints = typing.get_type_hints(cls)
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out[f.name] = schema_tree(t)
        elif typing.get_origin(t) in (dict, Dict) or t in (dict, Dict):
            out[f.name] = FREE
        else:
            out[f.name] = None
    return out


def _dotted(tree: Dict[str, Any], prefix: str = "") -> List[str]:
    out = []
    for k, sub in tree.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(sub, dict):
            out += _dotted(sub, key + ".")
    return out


@functools.lru_cache(maxsize=None)
def schema_leaves(cls=None) -> tuple:
    """Every dotted leaf key of the schema (a free-form mapping counts as a leaf)."""
    if cls is None:
        from primus.config.schema import PrimusConfig

        cls = PrimusConfig
    tree = schema_tree(cls)
    return tuple(k for k in _dotted(tree) if not isinstance(_subtree(tree, k), dict))


def _subtree(tree: Dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def _suggest(key: str, here: List[str], everywhere: List[str]) -> Optional[str]:
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, here, n=1, cutoff=0.75)
    if close:
        return key[: len(key) - len(leaf)] + close[0]
    leaves = {k.rsplit(".", 1)[-1]: k for k in everywhere}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[close[0]] if close else None


def unknown_keys(cfg: Dict[str, Any], cls=None) -> List[ConfigIssue]:
    """One issue per key of `cfg` (a plain container of the composed config) that the schema does not have."""
    if cls is None:
        from primus.config.schema import PrimusConfig as cls
    tree = schema_tree(cls)
    everywhere = _dotted(tree)
    issues: List[ConfigIssue] = []

    def walk(node: Dict[str, Any], sub: Dict[str, Any], prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if k not in sub:
                guess = _suggest(key, list(sub), everywhere)
                fix = f"did you mean {guess}? Set it without '+': {guess}=..." if guess else \
                    "remove it (python train.py --cfg job lists every key)"
                issues.append(ConfigIssue([key], v, "not a key of the config schema, so nothing would read it",
                                          fix))
            elif isinstance(sub[k], dict) and isinstance(v, dict):
                walk(v, sub[k], key + ".")

    walk(cfg, tree, "")
    return issues


BOOL_WORDS = ("true", "false")


def _leaf_type(cls, key: str):
    for part in key.split(".")[:-1]:
        hints = typing.get_type_hints(cls)
        if part not in hints or not dataclasses.is_dataclass(hints[part]):
            return None
        cls = hints[part]
    return typing.get_type_hints(cls).get(key.rsplit(".", 1)[-1])


def non_bool_overrides(overrides: List[str], cls=None) -> List[ConfigIssue]:
    """One issue per command-line override that gives a bool field anything but true or false (null where the
    field is optional)."""
    if cls is None:
        from primus.config.schema import PrimusConfig as cls
    out: List[ConfigIssue] = []
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if not sep:
            continue
        t = _leaf_type(cls, key)
        optional = typing.get_origin(t) is typing.Union and type(None) in typing.get_args(t)
        if optional:
            t = next(a for a in typing.get_args(t) if a is not type(None))
        if t is not bool:
            continue
        v = value.strip().lower()
        if v in BOOL_WORDS or (optional and v == "null"):
            continue
        out.append(ConfigIssue([key], value, "a switch is true or false" + (" (or null)" if optional else ""),
                               f"write {key}=true or {key}=false"))
    return out
