"""Where an offloaded optimizer step goes (memory.optimizer_cpu_offload): the CPU Adam, and the waits on the GPU
for the gradients' device-to-host copies.

megatron-core 0.16.1's HybridDeviceOptimizer.step queues every CPU shard's gradient copies (D2H, behind the GPU
work already queued), steps its GPU share, then for each CPU sub-optimizer waits on that shard's copies and steps
it; each sub-optimizer's post hook queues its parameters' host-to-device copies, which overlap the next shard's
CPU step (memory.overlap_cpu_optimizer_d2h_h2d; without it there is one sub-optimizer, and the copies run on the
current stream). Timed on the host around each CPU sub-optimizer's `step` (instance attributes, as phases.py
wraps the model: the sub-optimizers' own methods, with their hooks, run inside; loading a checkpoint builds new
sub-optimizers, so each step wraps the ones it finds unwrapped):

    cpu_adam_s   the CPU sub-optimizers' steps (Adam over the offloaded share; the H2D copies only queued)
    d2h_wait_s   before each of them, the wait for its gradients to reach the host: the D2H copies and, before
                 the first, the GPU work queued ahead of them (the GPU share's Adam, the gradient norm)
    rest_s       the rest of the trainer's optimizer_s: the GPU share and the wrapper's own work, the last
                 shard's H2D copies, which nothing after them hides, and the trainer's closing sync

The three add up to the step's optimizer_s (result.json's `optimizer_split_s`, medians over the timed steps).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

KEYS = ("cpu_adam_s", "d2h_wait_s")


def hybrid_optimizers(optimizer) -> List:
    """The HybridDeviceOptimizers inside a megatron optimizer (ChainedOptimizer -> MegatronOptimizer -> torch)."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    found, todo, seen = [], [optimizer], set()
    while todo:
        o = todo.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, HybridDeviceOptimizer):
            found.append(o)
            continue
        chained = getattr(o, "chained_optimizers", None)
        if chained is not None:  # ChainedOptimizer: its `optimizer` asserts when it chains more than one
            todo.extend(chained)
        else:
            todo.append(getattr(o, "optimizer", None))
    return found


class OffloadSplit:
    """Wraps the CPU sub-optimizers' `step` of each HybridDeviceOptimizer once; `start()` before the trainer's
    optimizer step, `parts(optimizer_s)` after it."""

    def __init__(self, hybrids: List):
        self.hybrids = hybrids
        self._acc: Dict[str, float] = dict.fromkeys(KEYS, 0.0)
        self._mark = 0.0
        self._wrap()

    def _wrap(self) -> None:
        for h in self.hybrids:
            _wrap_once(h, self._marking)  # the GPU share steps inside: the first CPU wait starts after it
            gpu = getattr(h, "gpu_optimizer", None)
            if gpu is not None:
                _wrap_once(gpu, lambda fn: self._marking(fn, on_exit=True))
            for sub in h.cpu_optimizers:
                _wrap_once(sub, self._timed)

    def _marking(self, fn, on_exit: bool = False):
        def wrapped(*args, **kwargs):
            if not on_exit:
                self._mark = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if on_exit:
                    self._mark = time.perf_counter()

        return wrapped

    def _timed(self, fn):
        def wrapped(*args, **kwargs):
            t = time.perf_counter()
            self._acc["d2h_wait_s"] += t - self._mark
            try:
                return fn(*args, **kwargs)
            finally:
                self._mark = time.perf_counter()
                self._acc["cpu_adam_s"] += self._mark - t

        return wrapped

    def start(self) -> None:
        self._wrap()
        self._acc = dict.fromkeys(KEYS, 0.0)
        self._mark = time.perf_counter()

    def parts(self, optimizer_s: float) -> Dict[str, float]:
        out = dict(self._acc)
        out["rest_s"] = max(0.0, optimizer_s - sum(out.values()))
        return out


def _wrap_once(obj, wrap) -> None:
    if not getattr(obj.step, "_primus_offload_split", False):
        inner = obj.step
        obj.step = wrap(inner)
        obj.step._primus_offload_split, obj.step.__wrapped__ = True, inner


def install(optimizer) -> Optional[OffloadSplit]:
    """An OffloadSplit over the optimizer's HybridDeviceOptimizers; None where nothing is offloaded."""
    hybrids = hybrid_optimizers(optimizer)
    return OffloadSplit(hybrids) if hybrids and any(h.cpu_optimizers for h in hybrids) else None
