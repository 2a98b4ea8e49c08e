"""Check every key we hand to TorchTitan against the installed TorchTitan's JobConfig.

TorchTitan's config loader accepts what its dataclasses declare; a key they do not declare (a rename between
releases) must never be dropped quietly: a renamed key once silently disabled MoE load balancing for every
DeepSeek config. Two checks share one walk:

- `static_problems` reads `torchtitan/config/job_config.py` as text (ast, no import: dry runs must stay fast and
  must not import torch) and checks keys and `Literal[...]` choices;
- `runtime_problems` checks the same dict against the imported dataclasses (what will actually run).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import typing
from typing import Any, Dict, List, Optional, Tuple

FLAVOR_KEY = "flavor_args"  # top-level keys of ours that are not JobConfig sections (see args.py)
TURBO_KEY = "primus_turbo"  # settings of our turbo model converters (turbo.py)
EXTRA_KEYS = (FLAVOR_KEY, TURBO_KEY)


def installed_version() -> Optional[str]:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


def _job_config_path() -> Optional[str]:
    spec = importlib.util.find_spec("torchtitan")  # top-level: locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "config", "job_config.py")
    return path if os.path.exists(path) else None


# A field's shape: ("section", class name) | ("literal", choices) | ("value", None)
Shape = Tuple[str, Any]


@functools.lru_cache(maxsize=None)
def _static_classes() -> Dict[str, Dict[str, Shape]]:
    path = _job_config_path()
    if path is None:
        return {}
    tree = ast.parse(open(path).read())
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    classes: Dict[str, Dict[str, Shape]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: Dict[str, Shape] = {}
        for st in node.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            ann = st.annotation
            if isinstance(ann, ast.Name) and ann.id in names:
                fields[st.target.id] = ("section", ann.id)
            else:
                fields[st.target.id] = ("literal", _literal_choices(ann)) if _literal_choices(ann) else ("value", None)
        classes[node.name] = fields
    return classes


def _literal_choices(ann: ast.AST) -> Optional[tuple]:
    """Literal["a", "b"] (optionally `| None`) -> ("a", "b"[, None])."""
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        left, right = _literal_choices(ann.left), _literal_choices(ann.right)
        if left is not None and isinstance(ann.right, ast.Constant) and ann.right.value is None:
            return left + (None,)
        return left or right
    if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "Literal":
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        return tuple(e.value for e in elts if isinstance(e, ast.Constant))
    return None


def _walk(args: Dict[str, Any], lookup, root) -> List[str]:
    """Problems as 'dotted.key: reason'. lookup(cls, name) -> Shape or None."""
    problems: List[str] = []

    def visit(cls, data: Dict[str, Any], prefix: str) -> None:
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            shape = lookup(cls, key)
            if shape is None:
                problems.append(f"{dotted}: not a field of the installed torchtitan's JobConfig")
            elif shape[0] == "section":
                if isinstance(value, dict):
                    visit(shape[1], value, dotted + ".")
                else:
                    problems.append(f"{dotted}: is a section, got {value!r}")
            elif shape[0] == "literal" and value not in shape[1]:
                problems.append(f"{dotted}: {value!r} is not one of {list(shape[1])}")

    visit(root, {k: v for k, v in args.items() if k not in EXTRA_KEYS}, "")
    return problems


def static_problems(args: Dict[str, Any]) -> List[str]:
    classes = _static_classes()
    if "JobConfig" not in classes:
        return ["torchtitan: not installed (pip install torchtitan==0.2.2)"]
    return _walk(args, lambda cls, name: classes.get(cls, {}).get(name), "JobConfig")


def runtime_problems(args: Dict[str, Any]) -> List[str]:
    from torchtitan.config.job_config import JobConfig

    def lookup(cls, name):
        hints = typing.get_type_hints(cls)
        if name not in {f.name for f in dataclasses.fields(cls)}:
            return None
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            return ("section", tp)
        choices = _runtime_literal(tp)
        return ("literal", choices) if choices else ("value", None)

    return _walk(args, lookup, JobConfig)


def _runtime_literal(tp) -> Optional[tuple]:
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out: tuple = ()
        for a in typing.get_args(tp):
            if a is type(None):
                out += (None,)
            elif typing.get_origin(a) is typing.Literal:
                out += typing.get_args(a)
            else:
                return None
        return out or None
    return None


class UnknownTorchTitanKey(ValueError):
    """A key we set is not honoured by the installed TorchTitan."""

    def __init__(self, problems: List[str]):
        self.problems = problems
        super().__init__(
            f"torchtitan {installed_version()} does not accept %d key(s) Primus set (pinned: 0.2.2):\n  - %s"
            % (len(problems), "\n  - ".join(problems)))
