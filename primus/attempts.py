"""Nothing overwrites an earlier attempt of a run.

A run dir can be run again: `checkpoint.resume=auto hydra.run.dir=<run>` after a crash, or a Slurm job requeued
after preemption. Hydra rewrites `<run>/.hydra/` and the new attempt writes its own result.json, so the first
attempt's overrides and result used to be lost. Before a new attempt starts, the previous one's result.json and
`.hydra/` files move to `<run>/attempts/<k>/` (k = 1, 2, ...), and the new result.json lists them.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, List, Optional

from hydra.experimental.callback import Callback

ATTEMPTS_DIR = "attempts"
RESULT_FILE = "result.json"


def previous_attempts(run_dir: str) -> List[str]:
    d = os.path.join(run_dir, ATTEMPTS_DIR)
    if not os.path.isdir(d):
        return []
    return [os.path.join(d, n) for n in sorted(os.listdir(d), key=lambda n: (len(n), n)) if n.isdigit()]


def archive(run_dir: str, hydra_files: bool = True) -> Optional[str]:
    """Move the previous attempt's result.json (and copy its .hydra/*.yaml) into attempts/<k>/; returns that dir,
    or None when the run dir holds no earlier attempt."""
    result = os.path.join(run_dir, RESULT_FILE)
    hydra_dir = os.path.join(run_dir, ".hydra")
    hydra_yaml = [n for n in os.listdir(hydra_dir) if n.endswith(".yaml")] if hydra_files and os.path.isdir(
        hydra_dir) else []
    if not os.path.isfile(result) and not hydra_yaml:
        return None
    dest = os.path.join(run_dir, ATTEMPTS_DIR, str(len(previous_attempts(run_dir)) + 1))
    os.makedirs(dest)
    if hydra_yaml:
        os.makedirs(os.path.join(dest, ".hydra"))
        for n in hydra_yaml:
            shutil.copy2(os.path.join(hydra_dir, n), os.path.join(dest, ".hydra", n))
    if os.path.isfile(result):
        os.replace(result, os.path.join(dest, RESULT_FILE))
    return dest


class KeepAttempts(Callback):
    """Hydra calls on_run_start before it writes the run's .hydra/ files: the earlier attempt's are saved first."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        from hydra.conf import HydraConf
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        # Hydra 1.3 sets HydraConfig only in run_job, after this callback; the run dir's interpolation reads it
        # (${hydra:overrides.task}), so without this a job's rerun lost its earlier .hydra/ files (a warning, not an
        # error). run_job sets the same config again.
        if issubclass(OmegaConf.get_type(config, "hydra") or object, HydraConf):
            HydraConfig.instance().set_config(config)
        run_dir = str(config.hydra.run.dir)
        if os.path.isdir(run_dir):
            archive(run_dir)
