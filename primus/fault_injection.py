"""TEST HOOKS (not for production runs): make failures happen at a chosen step, so the guards can be tested.

    PRIMUS_INJECT_NAN_AT_STEP=N        the trainer's loss of step N is multiplied by NaN (so are its gradients)
    PRIMUS_INJECT_OOM_AT_STEP=N        the loop raises torch.OutOfMemoryError before step N
    PRIMUS_INJECT_PREEMPT_AT_STEP=N    as if SIGTERM arrived during step N (primus/preemption.py)
    PRIMUS_INJECT_SAVE_FAILURE_AT_STEP=N   the checkpoint save of step N dies before it is committed
                                       (primus/checkpoint.py)

Each reads its variable when asked, so a test sets it in the subprocess env only.
"""
from __future__ import annotations

import os


def _at(name: str, step: int) -> bool:
    v = os.environ.get(name)
    return bool(v) and int(v) == step


def nan_at(step: int) -> bool:
    return _at("PRIMUS_INJECT_NAN_AT_STEP", step)


def maybe_oom(step: int) -> None:
    if _at("PRIMUS_INJECT_OOM_AT_STEP", step):
        import torch

        raise torch.OutOfMemoryError(f"out of memory: injected before step {step} (PRIMUS_INJECT_OOM_AT_STEP test "
                                     "hook)")
