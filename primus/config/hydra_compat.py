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
