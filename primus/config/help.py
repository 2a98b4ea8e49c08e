"""`python train.py --help`: the app's own help, through Hydra's help template (conf/hydra/help/primus.yaml).

The template's generated parts come from `${primus_help:groups}` and `${primus_help:presets}`: every option of
every group with the first comment line of its YAML file (the description is written once, in the file itself),
and every experiment preset with its first comment line. Reading the files is enough: nothing is composed and no
feature module is imported, so the help stays quick.
"""
from __future__ import annotations

import os
from typing import List, Optional

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")
# groups chosen with `group=option`; `cluster` is added with `+cluster=NAME` and belongs to hydra/launcher=slurm
SKIP = ("hydra", "experiment")


def describe(path: str) -> str:
    """The first comment line of a YAML file that is not a `# @package` header ('' if none)."""
    try:
        with open(path) as f:
            for line in f:
                s = line.strip()
                if not s.startswith("#"):
                    if s:
                        break
                    continue
                s = s.lstrip("#").strip()
                if s and not s.startswith("@package"):
                    return s
    except OSError:
        pass
    return ""


def options(group: str, conf_dir: str = CONF_DIR) -> List[str]:
    d = os.path.join(conf_dir, group)
    return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml") and not f.startswith("_"))


def _defaults(conf_dir: str) -> dict:
    """Default option of each group, read from config.yaml's defaults list (`- group: option` lines)."""
    out = {}
    try:
        with open(os.path.join(conf_dir, "config.yaml")) as f:
            for line in f:
                s = line.strip()
                if s.startswith("- ") and ":" in s and not s.startswith("- override"):
                    k, _, v = s[2:].partition(":")
                    out[k.replace("optional ", "").strip()] = v.strip().strip("'\"")
    except OSError:
        pass
    return out


def groups_text(conf_dir: str = CONF_DIR) -> str:
    defaults = _defaults(conf_dir)
    lines: List[str] = []
    for group in sorted(os.listdir(conf_dir)):
        if group in SKIP or not os.path.isdir(os.path.join(conf_dir, group)):
            continue
        opts = options(group, conf_dir)
        if not opts:
            continue
        how = f"+{group}=NAME" if group not in defaults else f"{group}=NAME"
        lines.append(f"{group}  ({how}" + (f", default {defaults[group]})" if group in defaults else ")"))
        width = max(len(o) for o in opts)
        for o in opts:
            lines.append(f"  {o.ljust(width)}  {describe(os.path.join(conf_dir, group, o + '.yaml'))}".rstrip())
    return "\n".join(lines)


def presets_text(conf_dir: str = CONF_DIR) -> str:
    opts = options("experiment", conf_dir)
    width = max(len(o) for o in opts) if opts else 0
    return "\n".join(f"  {o.ljust(width)}  {describe(os.path.join(conf_dir, 'experiment', o + '.yaml'))}".rstrip()
                     for o in opts)


def primus_help(what: str, conf_dir: Optional[str] = None) -> str:
    conf_dir = conf_dir or CONF_DIR
    text = {"groups": groups_text, "presets": presets_text}[what](conf_dir)
    return text.replace("$", "$$")  # Hydra fills the template with string.Template: a bare $ is a placeholder


def register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("primus_help"):
        OmegaConf.register_new_resolver("primus_help", primus_help)
