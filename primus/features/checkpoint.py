"""The checkpoint feature: when to save, how many to keep, where from to resume (see primus/features/__init__.py).
Saving and loading are primus/checkpoint.py and each backend's checkpoint.py."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from primus.features import rule


@dataclass
class CheckpointConfig:
    interval: int = 0  # save every N steps; 0 = never during the run
    save_at_end: bool = False  # save after the last step
    keep_last: int = 2  # checkpoints kept (older ones deleted); 0 = keep all
    dir: Optional[str] = None  # null = <run_dir>/checkpoints
    resume: Optional[str] = None  # null = fresh start; "auto" = latest valid in dir; or a checkpoint path


def torchtitan(cfg, ctx) -> dict:
    # the shared loop saves and resumes through primus/backends/torchtitan/checkpoint.py, not TorchTitan's manager
    return {"checkpoint": {"enable": False}}


@rule
def resume_path(cfg, ctx):
    """An explicit resume path is checked before anything starts, dry runs included (it used to be checked only
    once the trainer was being built)."""
    from primus.checkpoint import _config_error, resume_path_problem

    problem = resume_path_problem(cfg.checkpoint.resume, cfg.backend.name.value)
    return _config_error(os.path.abspath(cfg.checkpoint.resume), problem).issues if problem else []
