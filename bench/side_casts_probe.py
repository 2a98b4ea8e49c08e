"""The fp8 linear's wgrad casts on a side stream vs in line, same process, GPU time (H200).

    python bench/side_casts_probe.py [--recipes blockwise,rowwise] [--tokens 8192]

For each Llama-3-8B linear (qkv, o, gate+up, down) and recipe: fwd+bwd with fp8_linear.SIDE_CASTS off (every cast
in line; blockwise casts x / x^T and dy / dy^T from one read) and on (the wgrad's operands cast on a side stream
during the GEMM before), with the side stream at priority 0 and -1 (highest); the bf16 linear of the same call as
the baseline. Timing: the fwd+bwd captured in a CUDA graph and replayed (the GPU's wall time, overlap included, no
host: a profiler sum of kernel times would count overlapped kernels twice). Also printed: `_common.queued_gpu_time`
(20 launches queued behind a sleeping kernel; host-bound when the launch queue fills) and the host ms per call. Outputs (y, dx, dw) must be bit-equal between off and on: the same kernels write the same bytes.
"""
from __future__ import annotations

import argparse
import time
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402

SHAPES = [(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")]


def step(fn, x, w, dy):
    def run():
        x.grad = None
        w.grad = None
        fn(x, w).backward(dy)
    return run


def graph_time(run, reps: int = 20) -> float:
    """ms per call of `run` replayed from a CUDA graph (no host in the timing at all: one launch per replay; the
    side stream's fork / join is captured like any other event wait)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    del g
    return sorted(times)[2]


def host_ms(run, n: int = 10) -> float:
    run()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        run()
    host = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return host


def outputs(fn, x, w, dy):
    x.grad = w.grad = None
    y = fn(x, w)
    y.backward(dy)
    torch.cuda.synchronize()
    return y.detach().clone(), x.grad.clone(), w.grad.clone()


def set_side(on: bool, priority: int = 0):
    F8.SIDE_CASTS = on
    if F8._SIDE_PRIORITY != priority:
        F8._SIDE_PRIORITY = priority
        F8._SIDE_STREAMS.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="blockwise,rowwise")
    ap.add_argument("--tokens", type=int, default=8192)
    a = ap.parse_args()
    M = a.tokens
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, M={M}", flush=True)
    variants = [("in line", False, 0), ("side p0", True, 0), ("side p-1", True, -1), ("in line again", False, 0),
                ("side p0 again", True, 0)]
    tot = {}
    rows = []
    for K, N, name in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        t_bf = graph_time(step(lambda a_, b_: torch.nn.functional.linear(a_, b_), x, w, dy))
        tot["bf16"] = tot.get("bf16", 0) + t_bf
        rows.append(f"| {name} | bf16 | - | {t_bf:.3f} | 1.000x | |")
        for recipe in a.recipes.split(","):
            fn = lambda a_, b_, r=recipe: F8.fp8_linear(a_, b_, None, r)
            ref = None
            for label, on, prio in variants:
                set_side(on, prio)
                got = outputs(fn, x, w, dy)
                if ref is None:
                    ref, same = got, "ref"
                else:
                    same = "bit-equal" if all(torch.equal(p, q) for p, q in zip(ref, got)) else "DIFFERENT"
                tq = _common.queued_gpu_time(step(fn, x, w, dy), quantiles=None)
                th = host_ms(step(fn, x, w, dy))
                t = graph_time(step(fn, x, w, dy))
                key = (recipe, label)
                tot[key] = tot.get(key, 0) + t
                rows.append(f"| {name} | {recipe} | {label} | {t:.3f} | {t_bf / t:.3f}x | {same} | {tq:.3f} | {th:.3f} |")
                print(rows[-1], flush=True)
        del x, w, dy
        torch.cuda.empty_cache()
    set_side(True, 0)
    print("\n| linear | recipe | casts | ms fwd+bwd (CUDA graph) | vs bf16 | outputs vs in line | queued ms | host ms |"
          "\n|---|---|---|---:|---:|---|---:|---:|")
    print("\n".join(rows))
    print(f"| all four | bf16 | - | {tot['bf16']:.3f} | 1.000x | |")
    for k, v in tot.items():
        if k != "bf16":
            base = tot[(k[0], "in line")]
            print(f"| all four | {k[0]} | {k[1]} | {v:.3f} | {tot['bf16'] / v:.3f}x | {base / v:.3f}x in line |")


if __name__ == "__main__":
    main()
