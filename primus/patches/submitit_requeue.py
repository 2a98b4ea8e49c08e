"""A requeued Slurm job taken as finished: submitit 1.5.4's watcher takes the first final state it reads as the end.

A Slurm job of a sweep (hydra/launcher=slurm) that is preempted requeues itself: primus.preemption hands the
signal to submitit, which runs `scontrol requeue` and exits. slurmctld can then show the ended instance as FAILED
for a moment before the requeue turns the job PENDING again (seen under load in tests/test_preemption_slurm.py, on
the local cluster whose sacct reads scontrol). submitit's `SlurmInfoWatcher.is_done` took that as final, the
sweep's launcher raised UncompletedJobError ("has not produced any output (state: FAILED)") and stopped waiting
for a job that went on to finish. Here a final state counts only once it has held for REQUEUE_GRACE_S, checked
against slurmctld's live one (`scontrol -o show job`) at each call: while slurmctld holds the job in a state it
leaves again (pending, running, requeued, ...), or within the grace, the job is not done. A 15 s grace was once
outlasted on a loaded 2-core machine (the CI's), so it is 60 s; and an scontrol that times out or cannot reach
slurmctld is no answer, not a final state: it leaves the job undecided, for UNKNOWN_LIMIT_S at most (a slurmctld
that stays unreachable then lets sacct's final state stand). A job that ends with a result is unaffected (submitit
sees its result file first); one that fails without one is reported 60 s later.
"""
from __future__ import annotations

import re
import subprocess
import time
from typing import Dict, Optional

# slurmctld's job states that are not an end (squeue(1), "JOB STATE CODES")
LIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                  "RESIZING", "SUSPENDED", "PREEMPTED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT"})
REQUEUE_GRACE_S = 60.0
UNKNOWN_LIMIT_S = 300.0
GONE = "GONE"  # slurmctld answered that it does not know the job (purged after MinJobAge): as final as FAILED
_FINAL_SINCE: Dict[str, float] = {}  # job id -> when a final state was first read for it


def live_state(job_id: str, timeout: float = 20.0) -> Optional[str]:
    """slurmctld's JobState of `job_id` (an array task as "<id>_<index>"), GONE when slurmctld says it has no such
    job, or None when there was no answer (scontrol timed out, could not run or reach slurmctld)."""
    try:
        r = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return GONE if "invalid job id" in (r.stderr + r.stdout).lower() else None
    m = re.search(r"\bJobState=(\S+)", r.stdout)
    return m.group(1) if m else None


def install() -> bool:
    """Wrap submitit's SlurmInfoWatcher.is_done (once per process)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    if getattr(SlurmInfoWatcher.is_done, "primus_waits_out_requeues", False):
        return True
    sacct_is_done = SlurmInfoWatcher.is_done

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        if not sacct_is_done(self, job_id, mode=mode):
            _FINAL_SINCE.pop(job_id, None)
            return False
        state = live_state(job_id)
        if state in LIVE:  # pending, running or requeued again: a final state read before it was passing
            _FINAL_SINCE.pop(job_id, None)
            return False
        held = time.monotonic() - _FINAL_SINCE.setdefault(job_id, time.monotonic())
        return held >= (UNKNOWN_LIMIT_S if state is None else REQUEUE_GRACE_S)

    is_done.primus_waits_out_requeues = True
    SlurmInfoWatcher.is_done = is_done
    return True
