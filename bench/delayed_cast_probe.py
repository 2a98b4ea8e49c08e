"""Probe (session 10): the delayed-scaling cast (scale from the amax history, x and x^T in one pass) vs an older
tree's, same call, same inputs, GPU time.

    python bench/delayed_cast_probe.py --baseline OLD/fp8_linear.py [--shapes 8192x4096,4096x4096]

Per shape: 3 warm-up calls on fresh histories (call 0 reads x for its own amax; later calls take the history's),
then the steady state timed two ways: the sum of the kernels' own durations (`turbo_kernels.kernel_ms`, L2
flushed before each call) and the wall time of 20 calls queued behind a sleeping kernel (`_common.queued_gpu_time`,
launch gaps between the dependent kernels included). % of the copy bandwidth on min bytes (read x, write x and x^T
in fp8). Outputs (x and x^T in fp8, scale_inv) must be bit-equal to the baseline's at every call.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import copy_line, kernel_breakdown, kernel_ms, load_module  # noqa: E402



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--shapes", default="8192x4096,4096x4096,8192x14336,8192x28672")
    ap.add_argument("--parts", default="", help="then: this tree with fp8_linear._PARTS (the amax pass's most "
                    "programs) at each of these values, e.g. 1024,512,256,132, and the kernels of each cast")
    a = ap.parse_args()
    base = load_module(a.baseline)
    e4 = torch.float8_e4m3fn
    copy = copy_line()
    print("| x | tree | kernels' time, ms (% copy) | queued wall, ms (% copy) | new / old (kernels, wall) | same bytes |")
    print("|---|---|---:|---:|---:|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        gb = R * C * 4 / 1e9  # bf16 in, fp8 x and x^T out
        torch.manual_seed(0)
        xs = [torch.randn(R, C, device="cuda", dtype=torch.bfloat16) * (1 + i) for i in range(3)]
        res = {}
        same = True
        hists = {}
        for tag, mod in (("old", base), ("new", F8)):
            h = hists[tag] = mod.DelayedScaling(16, 0, "max").history()
            res[tag] = [mod.cast_tensorwise(x, e4, want_y=True, want_t=True, history=h) for x in xs]
        for (y0, t0, s0), (y1, t1, s1) in zip(res["old"], res["new"]):
            same &= torch.equal(y0.view(torch.uint8), y1.view(torch.uint8)) and torch.equal(
                t0.view(torch.uint8), t1.view(torch.uint8)) and torch.equal(s0, s1)
        # (the state layouts differ between trees; the scales each call used are compared through scale_inv)
        same &= int(hists["new"].meta[1]) == 0 and hists["new"].calls == hists["old"].calls == 3
        for recipe in ("delayed", "tensorwise (control: unchanged kernels)"):
            t = {}
            for tag, mod in (("old", base), ("new", F8)):
                h = hists[tag] if recipe == "delayed" else None
                fn = lambda mod=mod, h=h: mod.cast_tensorwise(xs[0], e4, want_y=True, want_t=True, history=h)
                t[tag] = (kernel_ms(fn), _common.queued_gpu_time(fn, quantiles=None))
                k, w = t[tag]
                print(f"| {shape} {recipe} | {tag} | {k:.4f} ({gb / k / copy * 1e5:.1f}) | {w:.4f} "
                      f"({gb / w / copy * 1e5:.1f}) | "
                      + (f"{t['old'][0] / k:.3f}x, {t['old'][1] / w:.3f}x | {same} |" if tag == "new" else "| |"),
                      flush=True)
        for parts in [int(v) for v in a.parts.split(",") if v]:
            F8._PARTS = parts
            h = F8.DelayedScaling(16, 0, "max").history()
            for x in xs:
                F8.cast_tensorwise(x, e4, want_y=True, want_t=True, history=h)
            cases = {"delayed": lambda: F8.cast_tensorwise(xs[0], e4, want_y=True, want_t=True, history=h),
                     "delayed replay (record=False)":
                         lambda: F8.cast_tensorwise(xs[0], e4, want_y=True, want_t=True, history=h, record=False),
                     "tensorwise": lambda: F8.cast_tensorwise(xs[0], e4, want_y=True, want_t=True)}
            for name, fn in cases.items():
                k = kernel_ms(fn)
                parts_us = ", ".join(f"{nm.split('_', 1)[-1][:24]} {us:.1f}" for nm, us in kernel_breakdown(fn))
                print(f"| {shape} {name} | _PARTS={parts} | {k:.4f} ({gb / k / copy * 1e5:.1f}) | {parts_us} | | |",
                      flush=True)
        F8._PARTS = 1024
        del xs, res
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
