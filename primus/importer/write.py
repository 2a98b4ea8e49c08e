"""Imported settings -> an experiment preset (and a model preset), or Hydra command-line overrides."""
from __future__ import annotations

import enum
import os
import textwrap
from typing import Any, Dict, List

import yaml

from primus.importer.core import Imported, Listed, missing_in_schema


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def nested(flat: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key in sorted(flat):
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _plain(flat[key])
    return out


def _value(v: Any) -> str:
    return yaml.safe_dump(_plain(v), default_flow_style=True, width=10 ** 6).strip().removesuffix("...").strip()


def listed_lines(listed: List[Listed]) -> List[str]:
    out = []
    for item in listed:
        if item.value is None and "," in item.key:
            out.append(f"{item.key} ({item.source}) -- {item.reason}")
        else:
            out.append(f"{item.key}: {_value(item.value)} ({item.source}) -- {item.reason}")
    return out


def _comment(lines: List[str]) -> List[str]:
    out = []
    for line in lines:
        wrapped = textwrap.wrap(line, width=114, subsequent_indent="    ", break_on_hyphens=False) or [""]
        out += ["#   " + w for w in wrapped]
    return out


def header(imp: Imported, name: str) -> List[str]:
    lines = [f"# Imported from the Primus experiment {os.path.basename(imp.path)} (framework {imp.framework}, "
             f"model {imp.model_name}) by python -m primus.importer.",
             f"# Check it: python train.py experiment={name} dry_run=true"]
    if imp.notes:
        lines += ["# Notes:"] + _comment(imp.notes)
    if imp.listed:
        lines += ["# Primus keys with no setting here (key: value (where) -- reason):"] + _comment(listed_lines(imp.listed))
    return lines


def experiment_yaml(imp: Imported, name: str) -> str:
    body = {"defaults": [{"override /backend": imp.framework}, {"override /model": imp.model_preset}]}
    text = yaml.safe_dump(body, sort_keys=False)
    if imp.sets:
        text += yaml.safe_dump(nested(imp.sets), sort_keys=False, width=120)
    return "\n".join(["# @package _global_"] + header(imp, name)) + "\n" + text


def model_yaml(imp: Imported) -> str:
    fields = dict(imp.new_model or {})
    text = yaml.safe_dump({"defaults": ["/schema/model@_here_", "_self_"], **fields}, sort_keys=False, width=120)
    return (f"# {fields.get('name')}: imported from Primus's model config {imp.model_name} by python -m "
            "primus.importer (its sizes; the vocabulary is the tokenizer's).\n" + text)


def overrides(imp: Imported) -> List[str]:
    out = [f"backend={imp.framework}", f"model={imp.model_preset}"]
    out += [f"{k}={_value(v)}" for k, v in sorted(imp.sets.items())]
    return out


def report(imp: Imported) -> str:
    lines = [f"Primus experiment {imp.path}: framework {imp.framework}, model {imp.model_name} -> "
             f"model={imp.model_preset}{' (new preset)' if imp.new_model else ''}",
             f"  {len(imp.sets)} settings imported"]
    for note in imp.notes:
        lines.append(f"  note: {note}")
    missing = missing_in_schema(imp.sets)
    if missing:
        lines.append("  keys this build's schema does not have (the dry run will name them): " + ", ".join(missing))
    if imp.listed:
        lines.append(f"  {len(imp.listed)} Primus keys with no setting here:")
        lines += [f"    {line}" for line in listed_lines(imp.listed)]
    return "\n".join(lines)
