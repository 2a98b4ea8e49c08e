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
    # what a checkpoint holds (Megatron-LM's switches): the weights always; the optimizer and LR scheduler state
    # unless no_save_optim; every rank's RNG states unless no_save_rng. On resume, no_load_optim starts a fresh
    # optimizer and schedule from the loaded weights, no_load_rng keeps this run's seeded RNGs
    no_save_optim: bool = False
    no_load_optim: bool = False
    no_save_rng: bool = False
    no_load_rng: bool = False
    # megatron's checkpoint format: torch_dist (megatron.core.dist_checkpointing) is what is written; null = it
    ckpt_format: Optional[str] = None


CKPT_FORMATS = ("torch_dist",)  # megatron-core's formats this project writes and reads


def contents(cfg) -> dict:
    """What a checkpoint of this run holds besides the weights (primus_meta.json's `contents`)."""
    return {"optimizer": not cfg.checkpoint.no_save_optim, "rng": not cfg.checkpoint.no_save_rng}


@rule
def checkpoint_format(cfg, ctx):
    f = cfg.checkpoint.ckpt_format
    if f is None or f in CKPT_FORMATS:
        return []
    return [ConfigIssue(["checkpoint.ckpt_format"], f,
                        f"megatron checkpoints are written as {list(CKPT_FORMATS)} (megatron.core.dist_checkpointing, "
                        "resharding across tp/pp/dp); megatron's legacy per-rank torch.save and zarr formats are not",
                        "set checkpoint.ckpt_format=torch_dist, or drop it")]


def megatron_only(cfg) -> tuple:
    # TorchTitan's checkpoints are torch.distributed.checkpoint (DCP) folders: no format to choose
    return ("ckpt_format",)


def megatron(cfg, ctx) -> dict:
    c = cfg.checkpoint
    # read by primus/backends/megatron/checkpoint.py (Megatron-LM's argument names)
    return {"checkpoint": {"no_save_optim": c.no_save_optim, "no_load_optim": c.no_load_optim,
                           "ckpt_format": c.ckpt_format or CKPT_FORMATS[0]}}


def torchtitan(cfg, ctx) -> dict:
    # the shared loop saves and resumes through primus/backends/torchtitan/checkpoint.py, not TorchTitan's manager
    return {"checkpoint": {"enable": False}}


@rule
def resume_path(cfg, ctx):
    """An explicit resume path is checked before anything starts, dry runs included (it used to be checked only
    once the trainer was being built)."""
    from primus.checkpoint import read_meta, reshard_problem, resume_error, resume_path_problem

    c = cfg.checkpoint
    problem = resume_path_problem(c.resume, cfg.backend.name.value)
    if problem is None and c.resume not in (None, "", "auto"):
        # written at a layout this backend cannot reshard to this run's: refused before anything is loaded
        problem = reshard_problem(cfg, read_meta(os.path.abspath(c.resume)), ctx.world_size)
    if problem:
        return resume_error(os.path.abspath(c.resume), problem).issues
    if c.resume not in (None, "", "auto") and not c.no_load_optim:
        from primus.checkpoint import weights_only_error

        if not (read_meta(os.path.abspath(c.resume)).get("contents") or {}).get("optimizer", True):
            return weights_only_error(os.path.abspath(c.resume)).issues
    return []


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
