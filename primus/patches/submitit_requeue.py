"""A requeued Slurm job taken as finished: submitit 1.5.4's watcher reads a job's state from `sacct` alone.

A Slurm job of a sweep (hydra/launcher=slurm) that is preempted requeues itself: primus.preemption hands the
signal to submitit, which runs `scontrol requeue` and exits. For a moment the accounting database can still report
the ended instance as FAILED while slurmctld already holds the job PENDING again (seen under load in
tests/test_preemption_slurm.py). submitit's `SlurmInfoWatcher.is_done` took that as final, the sweep's launcher
raised UncompletedJobError ("has not produced any output (state: FAILED)") and stopped waiting for a job that went
on to finish. Here a final state from sacct is checked against slurmctld's live one (`scontrol -o show job`): while
slurmctld holds the job in a state it leaves again (pending, running, requeued, ...), the job is not done. A job
slurmctld no longer knows (purged after its MinJobAge), or an scontrol that does not answer, keeps sacct's word.
"""
from __future__ import annotations

import re
import subprocess
from typing import Optional

# slurmctld's job states that are not an end (squeue(1), "JOB STATE CODES")
LIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                  "RESIZING", "SUSPENDED", "PREEMPTED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT"})


def live_state(job_id: str, timeout: float = 20.0) -> Optional[str]:
    """slurmctld's JobState of `job_id` (an array task as "<id>_<index>"), or None when it has none to give."""
    try:
        r = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bJobState=(\S+)", r.stdout) if r.returncode == 0 else None
    return m.group(1) if m else None


def install() -> bool:
    """Wrap submitit's SlurmInfoWatcher.is_done (once per process)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    if getattr(SlurmInfoWatcher.is_done, "primus_checks_live_state", False):
        return True
    sacct_is_done = SlurmInfoWatcher.is_done

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        if not sacct_is_done(self, job_id, mode=mode):
            return False
        return live_state(job_id) not in LIVE

    is_done.primus_checks_live_state = True
    SlurmInfoWatcher.is_done = is_done
    return True
