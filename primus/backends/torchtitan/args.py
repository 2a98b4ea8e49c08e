"""Primus config -> the exact TorchTitan job config (nested dict of JobConfig sections), plus what it cannot honour.

No torch / torchtitan import here: dry runs print `build_args` in well under a second.

Pinned to torchtitan 0.2.2: 0.3.0 does not import on torch 2.11 (the GPU machine) and needs patches on torch 2.13;
0.2.2 trains stock on torch 2.11 (see docs/torchtitan.md). It imports triton without declaring it.

The returned dict holds JobConfig sections (`job`, `model`, `training`, `parallelism`, ...) and one more
top-level key, `flavor_args` (jobconfig_keys.FLAVOR_KEY): the model args of the custom flavor that `spec.py`
registers under `model.name` / `model.flavor`. It is not a JobConfig section and is never handed to JobConfig.

Each feature maps its own keys (primus/features/<name>.py: `torchtitan()`), says what TorchTitan cannot honour
(`torchtitan_issues()`) and lists its fields that only megatron-core reads (`megatron_only()`: a non-default one
is an issue here, primus.features.other_backend_issues). Every TorchTitan key we set is checked against the installed TorchTitan (jobconfig_keys).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from primus.backends.torchtitan.jobconfig_keys import installed_version, static_problems
from primus.config.errors import ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.features import backend_issues, backend_mapping, merged, other_backend_issues


def _map(cfg: PrimusConfig, ctx: RunContext):
    """(the job config, the issues found building it): every feature's `torchtitan()` merged, and every feature's
    `torchtitan_issues()` and megatron-only fields."""
    issues = other_backend_issues("torchtitan", cfg) + backend_issues("torchtitan", cfg, ctx)
    run_dir = os.path.abspath(ctx.run_dir)
    args: Dict[str, Any] = {
        "job": {"dump_folder": os.path.join(run_dir, "torchtitan"), "description": f"primus {cfg.model.name}"},
    }
    return merged([args, backend_mapping("torchtitan", cfg, ctx)]), issues


def build_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    return _map(cfg, ctx)[0]


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    args, issues = _map(cfg, ctx)
    version = installed_version()
    if version is not None and version != "0.2.2":
        issues.append(ConfigIssue(["backend.name"], f"torchtitan {version}",
                                  "Primus maps to torchtitan 0.2.2 (0.3.0 does not import on torch 2.11)",
                                  "pip install torchtitan==0.2.2"))
    for problem in static_problems(args):
        key, _, why = problem.partition(": ")
        issues.append(ConfigIssue([f"torchtitan:{key}"], version, why,
                                  "fix primus/backends/torchtitan/args.py for this torchtitan version"))
    return issues
