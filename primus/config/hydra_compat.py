"""Workaround for an upstream Hydra gap, kept in one place.

Hydra 1.3 parses the override `tuning_stage=2` as the integer 2 and then refuses it as a config-group choice
("Config group override must be a string or a list. Got int"). The guide's stages are numbers, so we quote a bare
integer choice of a numeric-named group before Hydra sees it (`tuning_stage=2` -> `tuning_stage="2"`), for the
command line (train.py) and for the compose API (tests, tools) alike.
"""
import re
from typing import List

NUMERIC_GROUPS = ("tuning_stage",)
_BARE = re.compile(r"^(\+{0,2})(%s)=(-?\d+(?:,-?\d+)*)$" % "|".join(NUMERIC_GROUPS))


def quote_numeric_group_choices(overrides: List[str]) -> List[str]:
    out = []
    for o in overrides:
        m = _BARE.match(o)
        if m:
            prefix, group, values = m.groups()
            o = "%s%s=%s" % (prefix, group, ",".join('"%s"' % v for v in values.split(",")))
        out.append(o)
    return out


def is_saved_run_dir(argv: List[str]) -> bool:
    """True for `--config-dir <run>/.hydra --config-name config` (an exact rerun of a finished run).

    Hydra puts `--config-dir` after the app's own config dir in the search path, so `--config-name config` would
    find conf/config.yaml instead of the saved one. For a run's `.hydra` dir (it holds hydra.yaml and
    overrides.yaml beside config.yaml) train.py then composes from that dir alone; any other --config-dir (extra
    presets of a user) keeps conf/ first, as Hydra intends.
    """
    import os

    cdir = name = None
    for i, a in enumerate(argv):
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            cdir = argv[i + 1]
        elif a.startswith("--config-dir="):
            cdir = a.split("=", 1)[1]
        elif a in ("--config-name", "-cn") and i + 1 < len(argv):
            name = argv[i + 1]
        elif a.startswith("--config-name="):
            name = a.split("=", 1)[1]
    return bool(cdir and name and all(os.path.isfile(os.path.join(cdir, f"{n}.yaml")) for n in (name, "hydra", "overrides")))
