"""One module per feature of the performance tuning guide.

Each module (`precision`, `recompute`, `turbo`, `moe`, `parallel`, `overlap`, `memory`, `training`, `data`,
`tuning`, `launcher`, ...) holds, for its feature:

- its config dataclass and enums (the Hydra group's schema; field names are the guide's);
- its rules, registered with `@rule` below and run by `primus.config.validate.validate`;
- its mapping to each backend: `megatron(cfg, ctx)` (megatron-core arguments, by section) and
  `torchtitan(cfg, ctx)` (TorchTitan JobConfig keys), read by `primus/backends/<name>/args.py`;
- its in-model application where one exists.

Facts that several rules or mappings need (which fp8 recipe runs on which backend and device, which Turbo flag
serves which backend) are data in the one feature module that owns them; everything else reads them from there.
So `git grep <flag>` finds where a flag is defined, checked and applied.
"""
from __future__ import annotations

from typing import Callable, List

Rule = Callable[..., list]  # (cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]
RULES: List[Rule] = []  # every feature's rules, in import order; validate() runs them all


def rule(fn: Rule) -> Rule:
    """Register a cross-field rule. It returns ConfigIssues (keys, value, what is allowed, the fix), never raises."""
    RULES.append(fn)
    return fn
