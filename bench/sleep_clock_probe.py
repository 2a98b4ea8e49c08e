"""Probe (session 19): does the autotune timer's sleep last as long as it was sized for?

    python bench/sleep_clock_probe.py

`_common.queued_gpu_time` holds the GPU with `torch.cuda._sleep(cycles)` while the host enqueues the timed
launches; the cycle count comes from a calibration (cycles per ms). For each requested length this times the sleep
(events), then enqueues 20 (L2 flush, 4 MB copy) launches behind it, with and without a 0.5 ms host stall per
launch, and prints whether the host outran the sleep and the per-launch time the events then report (a 4 MB copy
takes ~7 us; a stall that is timed adds up to 500 us). Session 19, H200, with the calibration of that day's tree
(one 4M-cycle sleep on an idle GPU): every sleep ran about a fifth of its requested length.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from primus.turbo import _common  # noqa: E402


def main():
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    plain = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None)
    dev = torch.cuda.current_device()
    print(f"copy alone: {plain * 1e3:.1f} us; calibration {_common._SLEEP_CYCLES_PER_MS[dev]:,.0f} cycles/ms")
    t = time.perf_counter()
    for _ in range(20):
        time.sleep(5e-4)
    print(f"20 host sleeps of 0.5 ms: {(time.perf_counter() - t) * 1e3:.2f} ms")
    flush = _common._l2_flush_buffer(dev)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]

    def launches(stall):
        for a, b in ev:
            flush.zero_()
            a.record()
            if stall:
                time.sleep(5e-4)
            y.copy_(x)
            b.record()

    print("| sleep asked, ms | slept, ms | host stall | host enqueue, ms | host outran | us per launch (events) |")
    print("|---:|---:|---|---:|---|---:|")
    for ask in (0.5, 2, 8, 32, 64):
        for stall in (False, True):
            torch.cuda.synchronize()
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record()
            torch.cuda._sleep(int(_common._SLEEP_CYCLES_PER_MS[dev] * ask))
            s1.record()
            t = time.perf_counter()
            launches(stall)
            host = (time.perf_counter() - t) * 1e3
            outran = s1.query()
            torch.cuda.synchronize()
            per = sum(a.elapsed_time(b) for a, b in ev) / len(ev) * 1e3
            print(f"| {ask} | {s0.elapsed_time(s1):.2f} | {stall} | {host:.2f} | {outran} | {per:.1f} |", flush=True)


if __name__ == "__main__":
    main()
