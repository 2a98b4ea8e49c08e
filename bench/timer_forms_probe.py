"""Probe (session 19): why do the autotune timer and the profiler disagree on the RMSNorm forward's configs?

    python bench/timer_forms_probe.py [--only rmsnorm]

Session 18 (docs/benchmarks.md, call 5) found `_common.queued_gpu_time` rating one RMSNorm config 11-24% faster than
another that the profiler (`turbo_kernels.kernel_ms`) put within 2-4% of it; on the casts the two agree within 1%.
The two differ in four ways, and each column below changes one of them, every config of each space timed by each:

  profiler        kernel_ms: launched from the host one by one (the GPU may idle between), kernel durations summed,
                  flush = an int8 add_ over 256 MB (reads and writes)
  profiler q      the same kernels' durations, but launched queued behind a sleeping kernel (no idle gaps)
  events          production's timer: queued, events around each launch, flush = zero_ of twice the L2 (writes only)
  events add      the same with kernel_ms's add_ flush
  events gap      production's, with a 20 us sleep between the flush and the launch
  graph           a CUDA graph of 20 (zero_ flush, launch) pairs, minus one of 20 flushes, per launch

Each cell is us per call, and its ratio to the fastest config of that column. If one column alone reorders the
configs, the difference it changes is the cause.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from primus.turbo import rmsnorm as RN  # noqa: E402
from turbo_kernels import copy_line, kernel_ms  # noqa: E402

N = 20
_ADD = {}


def add_flush():
    if "buf" not in _ADD:
        _ADD["buf"] = torch.zeros(256 << 20, dtype=torch.int8, device="cuda")
    _ADD["buf"].add_(1)


def zero_flush():
    _common._l2_flush_buffer(torch.cuda.current_device()).zero_()


def sleep_cycles(ms: float) -> int:
    return int(_common._SLEEP_CYCLES_PER_MS[torch.cuda.current_device()] * ms)


def queued_events(fn, flush, gap_us: float = 0.0, reps: int = 7) -> float:
    """Production's form (`queued_gpu_time`) with the flush and an optional idle gap as parameters; median us."""
    import time

    _common.queued_gpu_time(fn, quantiles=None, n=2, reps=1)  # calibrates the sleep
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(N)]

    def launches():
        for a, b in events:
            flush()
            if gap_us:
                torch.cuda._sleep(sleep_cycles(gap_us / 1e3))
            a.record()
            fn()
            b.record()

    t = time.perf_counter()
    launches()
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(reps):
        torch.cuda._sleep(sleep_cycles(2 * host_ms + 0.2))
        launches()
        torch.cuda.synchronize()
        times.append(sum(a.elapsed_time(b) for a, b in events) / N)
    return sorted(times)[len(times) // 2] * 1e3


def _cuda_names(body) -> set:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        body()
        torch.cuda.synchronize()
    return {e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def profiler_queued(fn) -> float:
    """Kernel durations (profiler) of N calls, each after an add_ flush, all queued behind a sleep; us per call."""
    from torch.profiler import ProfilerActivity, profile

    skip = _cuda_names(add_flush) | _cuda_names(lambda: torch.cuda._sleep(1000))
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        torch.cuda._sleep(sleep_cycles(20.0))
        for _ in range(N):
            add_flush()
            fn()
        torch.cuda.synchronize()
    us = sum(e.time_range.elapsed_us() for e in p.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in skip)
    return us / N


def graph_us(fn, reps: int = 5) -> float:
    """(CUDA graph of N (zero_ flush, fn) pairs) - (graph of N flushes), per launch; median us."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    graphs = []
    for body in (lambda: [(zero_flush(), fn()) for _ in range(N)], lambda: [zero_flush() for _ in range(N)]):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                body()
        torch.cuda.synchronize()
        graphs.append(g)
    out = []
    for g in graphs:
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        out.append(sorted(ts)[len(ts) // 2] * 1e3)
    return (out[0] - out[1]) / N


FORMS = {
    "profiler": lambda fn: kernel_ms(fn) * 1e3,
    "profiler q": profiler_queued,
    "events": lambda fn: queued_events(fn, zero_flush),
    "events add": lambda fn: queued_events(fn, add_flush),
    "events gap": lambda fn: queued_events(fn, zero_flush, gap_us=20.0),
    "graph": graph_us,
}


def cases(e4):
    out = []
    for s in ((16384, 2048), (8192, 4096)):
        x = torch.randn(*s, device="cuda").to(torch.bfloat16)
        w = torch.rand(s[1], device="cuda").to(torch.bfloat16)
        consts = {"BLOCK_N": s[1]}
        out.append((f"rmsnorm fwd {s[0]}x{s[1]}", [c for c in RN._FWD.configs if RN._fwd_config_ok(c, **consts)],
                    functools.partial(lambda x, w, cfg: RN.rms_norm_fwd(x, w, 1e-5, config=cfg), x, w)))
    x = torch.randn(8192, 4096, device="cuda").to(torch.bfloat16)  # a control: the timers agreed on the casts
    rw = functools.partial(lambda x, cfg: F8.cast_rowwise(x, e4, config=cfg), x)
    seen = []
    orig = F8._ROWWISE_ROWS.space

    def record(args=(), **consts):
        seen.append(orig(args, **consts))
        return seen[-1]

    F8._ROWWISE_ROWS.space = record
    try:
        F8.cast_rowwise(x, e4)
        torch.cuda.synchronize()
    finally:
        del F8._ROWWISE_ROWS.space
    out.append(("rowwise cast 8192x4096 (control)", seen[-1], rw))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="a substring of the case labels to run")
    a = ap.parse_args()
    print(copy_line(), flush=True)
    e4 = F8.fp8_dtypes("cuda")[0]
    torch.manual_seed(0)
    todo = [c for c in cases(e4) if a.only in c[0]]
    if not todo:
        raise SystemExit(f"--only {a.only!r} matches no case; the cases are: " + "; ".join(c[0] for c in cases(e4)))
    for label, cfgs, run_cfg in todo:
        rows = []
        for cfg in cfgs:
            fn = functools.partial(run_cfg, cfg)
            rows.append((cfg, {f: FORMS[f](fn) for f in FORMS}))
        best = {f: min(r[f] for _, r in rows) for f in FORMS}
        print(f"\n{label}\n| config | " + " | ".join(FORMS) + " |")
        print("|---|" + "---:|" * len(FORMS))
        for cfg, r in rows:
            cells = [f"{r[f]:.1f} ({r[f] / best[f]:.3f})" for f in FORMS]
            print(f"| {cfg} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
