"""Preemption: SIGTERM / SIGUSR1 / submitit's signal -> finish the step, checkpoint, exit so the job is requeued.

While the step loop runs, `Preemption` replaces the handlers of SIGTERM, SIGUSR1 and (inside a submitit job) the
signal submitit asks Slurm to send before the time limit (`--signal=USR2@<signal_delay_s>`, env
SUBMITIT_PREEMPT_SIGNAL). A handler only records the signal; the loop asks `requested()` after each step (all ranks
agree through one tiny all-reduce, so they stop after the same step), saves a checkpoint, writes result.json with
status "preempted" and calls `exit_for_requeue()`:

* inside a submitit Slurm job, rank 0 hands over to submitit's own handler for its preemption signal (the one
  submitit installed before the job started: `SignalHandler.checkpoint_and_try_requeue`). That handler calls the
  launcher's `checkpoint()` (hydra-submitit-launcher returns a DelayedSubmission of the same launcher call: same
  overrides, same job num, hence the same Hydra run dir), rewrites the submission pickle, runs
  `scontrol requeue <job id>` and exits. The requeued job runs the same pickled call again: the same run dir, and
  `checkpoint.resume=auto` (set by the Slurm launcher config) finds the checkpoint in `<run_dir>/checkpoints`. No
  checkpoint path is ever baked into the pickle. Other ranks wait for Slurm to stop them (as submitit's own handler
  does on ranks != 0), then return.
* outside submitit (a local run), the loop just returns: result.json says "preempted" and the checkpoint is on disk;
  rerun with `checkpoint.resume=auto` in the same run dir (`hydra.run.dir=<run>`) to go on.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, Optional

# TEST HOOK: PRIMUS_INJECT_PREEMPT_AT_STEP=N behaves as if SIGTERM arrived during step N (used to stop a run at a
# chosen step with the schedule of the full run, and by tests without a signal race).
INJECT_ENV = "PRIMUS_INJECT_PREEMPT_AT_STEP"
OTHER_RANKS_WAIT_S = float(os.environ.get("PRIMUS_PREEMPT_WAIT_S", "120"))


def submitit_signal() -> Optional[int]:
    """The signal submitit's job environment handles as 'preempted / timed out' (default SIGUSR2), in a submitit
    Slurm job; else None."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "SLURM_JOB_ID" not in os.environ:
        return None
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return getattr(signal, name, None)


class Preemption:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self.signum: Optional[int] = None
        self.saved: Dict[int, Any] = {}
        self.sub_sig = submitit_signal()
        inject = os.environ.get(INJECT_ENV)
        self.inject_at = int(inject) if inject else None

    # ------------------------------------------------------------------ handlers
    def install(self) -> "Preemption":
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        sigs = {signal.SIGTERM, signal.SIGUSR1}
        if self.sub_sig is not None:
            sigs.add(self.sub_sig)
        for s in sigs:
            self.saved[s] = signal.getsignal(s)
            signal.signal(s, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.signum is None:
            print(f"[primus] caught {signal.Signals(signum).name}: finishing this step, then checkpoint and exit",
                  file=sys.stderr, flush=True)
        self.signum = signum

    def restore(self) -> None:
        for s, h in self.saved.items():
            try:
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self.saved = {}

    # ------------------------------------------------------------------ the loop's question
    def requested(self, step: int) -> bool:
        """Whether to stop after this step (same answer on every rank)."""
        if self.inject_at is not None and step == self.inject_at and self.signum is None:
            print(f"[primus] {INJECT_ENV}={step}: acting as if SIGTERM arrived", file=sys.stderr, flush=True)
            self.signum = signal.SIGTERM
        flag = 1 if self.signum is not None else 0
        try:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                dev = torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else "cpu"
                t = torch.tensor([flag], dtype=torch.int32, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                flag = int(t.item())
                if flag and self.signum is None:
                    self.signum = signal.SIGTERM  # another rank got it
        except ImportError:
            pass
        return bool(flag)

    @property
    def signal_name(self) -> Optional[str]:
        return signal.Signals(self.signum).name if self.signum is not None else None

    # ------------------------------------------------------------------ after result.json is written
    def exit_for_requeue(self, rank: int) -> None:
        """Inside a Slurm job, after the checkpoint and result.json:

        * SIGTERM: Slurm itself is stopping the job (preemption, `scontrol requeue`, scancel). Whether it runs again
          is Slurm's decision, so the job ends without returning a result (exit 75): a submitit launcher then keeps
          waiting for the requeued job and reports its final state, where a returned "preempted" used to read as
          "job finished" while the requeued job went on with nobody watching.
        * submitit's signal (the time-limit warning) or SIGUSR1 (a requeue asked for by hand) in a submitit job:
          rank 0 hands over to submitit's handler, which requeues the job; other ranks wait to be stopped.

        Elsewhere: return (the caller ends with status 'preempted', exit 75)."""
        self.restore()
        if "SLURM_JOB_ID" not in os.environ:
            return
        if self.signum == signal.SIGTERM:
            print(f"[primus] Slurm is stopping job {os.environ['SLURM_JOB_ID']} (SIGTERM): checkpoint saved; ending "
                  "without a result so that a requeued job is waited for", file=sys.stderr, flush=True)
            from primus import exit_codes

            sys.exit(exit_codes.PREEMPTED)
        sig = self.sub_sig
        if sig is None:
            return
        if rank != 0:
            print(f"[primus] rank {rank}: checkpoint saved; waiting for rank 0's requeue to stop this task",
                  file=sys.stderr, flush=True)
            time.sleep(OTHER_RANKS_WAIT_S)
            return
        handler = signal.getsignal(sig)
        if not callable(handler):
            print(f"[primus] no submitit handler for {signal.Signals(sig).name}: not requeued", file=sys.stderr,
                  flush=True)
            return
        print(f"[primus] requeueing Slurm job {os.environ.get('SLURM_JOB_ID')} through submitit", file=sys.stderr,
              flush=True)
        # submitit 1.5.4's SignalHandler.checkpoint_and_try_requeue decides "timed out" (which uses up
        # max_num_timeout) from the walltime alone: after min(80% of the limit, limit - 10 min), so under a
        # 10-minute limit every requeue counted as a time-out. The signal says which it is: submitit's own is the
        # time-limit warning, SIGUSR1 a requeue asked for.
        owner = getattr(handler, "__self__", None)
        if owner is not None and hasattr(owner, "has_timed_out"):
            timed_out = self.signum == sig
            owner.has_timed_out = lambda: timed_out
        # -> launcher.checkpoint() -> new submission pickle, `scontrol requeue`, sys.exit(-1) (or
        # UncompletedJobError when the job may not be requeued)
        handler(sig, None)
