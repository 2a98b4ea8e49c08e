"""The checkpoint feature: when to save, how many to keep, where from to resume, and the job identity that makes
a rerun continue (see primus/features/__init__.py). Saving and loading are primus/checkpoint.py and each backend's
checkpoint.py.

Job identity (`job_id`, top level): Hydra gives every run a new timestamped dir, so a rerun of the same command
used to start a new job. With `job_id=<name>`, `job_id=auto`, or `checkpoint.resume=auto` (which implies auto),
the run dir is `outputs/jobs/<id>` for every rerun: its checkpoints continue, each attempt's result.json and
.hydra files are kept under attempts/<k>/ (primus/attempts.py), and the dir lock (primus/locks.py) stops two
attempts running at once. The auto id is the experiment (or model) name plus a hash of the command-line
overrides, leaving out those that do not change the job (checkpoint.resume, job_id, training.train_iters,
logging and profiling), so extending a run or switching TensorBoard off continues it.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import List, Optional

from primus.config.errors import ConfigIssue
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
    from primus.checkpoint import read_meta, reshard_problem, resume_error, resume_path_problem

    problem = resume_path_problem(cfg.checkpoint.resume, cfg.backend.name.value)
    if problem is None and cfg.checkpoint.resume not in (None, "", "auto"):
        # written at a layout this backend cannot reshard to this run's: refused before anything is loaded
        problem = reshard_problem(cfg, read_meta(os.path.abspath(cfg.checkpoint.resume)), ctx.world_size)
    return resume_error(os.path.abspath(cfg.checkpoint.resume), problem).issues if problem else []


JOBS_DIR = "outputs/jobs"
RUNS_DIR = "outputs/runs"
# overrides that leave the job what it is: a rerun that only changes these continues it
_NOT_IDENTITY = re.compile(r"^[+~]*(checkpoint\.resume|job_id|training\.train_iters|logging\.|profile\.|hydra\.)")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def job_id_for(job_id: Optional[str], resume: Optional[str], overrides: List[str], name: str) -> Optional[str]:
    """The job's id, or None for a one-off run (a new timestamped dir)."""
    if job_id in (None, "", "null") and resume != "auto":
        return None
    if job_id not in (None, "", "null", "auto"):
        return job_id
    kept = sorted(o for o in overrides if not _NOT_IDENTITY.match(o))
    return f"{name}-{hashlib.sha256(chr(10).join(kept).encode()).hexdigest()[:8]}"


def run_dir(job_id, resume, overrides, experiment, model, stamp) -> str:
    """hydra.run.dir (conf/config.yaml): outputs/jobs/<id> for a job, outputs/runs/<stamp> for a one-off run."""
    jid = job_id_for(None if job_id is None else str(job_id), None if resume is None else str(resume),
                     [str(o) for o in (overrides or [])], str(experiment or model))
    return os.path.join(JOBS_DIR, jid) if jid else os.path.join(RUNS_DIR, str(stamp))


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("primus_run_dir"):
        OmegaConf.register_new_resolver("primus_run_dir", run_dir)


@rule
def job_id_is_a_dir_name(cfg, ctx):
    j = cfg.job_id
    if j in (None, "auto") or _SAFE_ID.match(j):
        return []
    return [ConfigIssue(["job_id"], j, "names the job's dir (outputs/jobs/<job_id>): letters, digits, '.', '_', '-'",
                        "use e.g. job_id=llama3_8b_run1, or job_id=auto")]
