"""Probe (session 11): do the fp8 casts spend their time issuing instructions rather than moving bytes?

    python bench/cast_sat_probe.py [--shapes 8192x4096,8192x14336] [--baseline OLD/fp8_linear.py]

Every cast kernel clamps x * scale to +-FP8_MAX before converting to fp8 (two instructions per element per
output). On sm89+ Triton converts fp32 -> e4m3 / e5m2 with `cvt.rn.satfinite` (checked below in the PTX), which
clamps to the largest finite value itself, so the clamp is redundant there. The both-ways blockwise cast
(dy 1x128 along N and dy^T 1x128 along M from one read) runs at ~57-61% of copy bandwidth although it moves its
bytes once; a replay of the delayed cast (x and x^T, one scale) runs at ~88-91%. If the blockwise cast is
issue-bound, dropping its two clamps per element should show.

Variant: this tree's fp8_linear.py with every `tl.clamp(E, -FP8_MAX, FP8_MAX)` replaced by `E` (written to a temp
file and imported). Same inputs (x scaled so some values saturate only in the delayed cast, whose scale comes from
an older, smaller amax), outputs must be bit-equal. GPU time (`turbo_kernels.kernel_ms`, L2 flushed), % of copy
bandwidth on min bytes. With --baseline: that older tree's casts (column "A") vs this tree's ("B") instead, the
delayed cast also recorded (state moving on, bytes compared call by call).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import copy_line, kernel_ms, load_module, same_bytes  # noqa: E402

CLAMP = re.compile(r"tl\.clamp\((.+?), -FP8_MAX, FP8_MAX\)")


def variant_module():
    src = open(F8.__file__).read()
    new, n = CLAMP.subn(r"(\1)", src)
    path = os.path.join(tempfile.mkdtemp(), "fp8_linear_sat.py")
    with open(path, "w") as f:
        f.write(new)
    return load_module(path, "fp8_linear_sat"), n



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096,8192x14336,4096x4096")
    ap.add_argument("--baseline", default="")
    a = ap.parse_args()
    if a.baseline:
        V, n, B = F8, 0, load_module(a.baseline)
    else:
        V, n = variant_module()
        B = F8
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    copy = copy_line(f"A = {a.baseline}, B = this tree" if a.baseline else f"A = this tree, B = {n} clamps removed")
    print("| x | cast | A, ms (% copy) | B, ms (% copy) | B / A speed | same bytes |")
    print("|---|---|---:|---:|---:|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        x_hot = x * 4  # larger than the history: the delayed cast saturates
        n_el = R * C
        hist = {}
        for tag, mod in (("now", B), ("sat", V)):
            h = hist[tag] = mod.DelayedScaling(16, 0, "max").history()
            for _ in range(2):
                mod.cast_tensorwise(x, e4, want_y=True, want_t=True, history=h)
        cases = [
            ("tensorwise x, x^T", 4, lambda m: m.cast_tensorwise(x, e4, want_y=True, want_t=True)),
            ("delayed x, x^T (saturating)", 4,
             lambda m: m.cast_tensorwise(x_hot, e4, want_y=True, want_t=True,
                                         history=hist["now" if m is B else "sat"], record=False)),
            ("delayed x, x^T (recorded)", 4,
             lambda m: m.cast_tensorwise(x, e4, want_y=True, want_t=True, history=hist["now" if m is B else "sat"])),
            ("rowwise x", 3, lambda m: m.cast_rowwise(x, e4, pad_rows=True)),
            ("rowwise x^T (col amax + cast)", 3, lambda m: m.cast_rowwise(x, e5, transpose=True, pad=True)),
            ("blockwise x 1x128, x^T 1x128", 4, lambda m: m.cast_blockwise(x, e4, want_t=True, pad_rows=True)),
            ("blockwise x^T alone", 3, lambda m: m.cast_blockwise(x, e4, want_y=False, want_t=True, pad_rows=True)),
            ("blockwise W, W^T 128x128", 4, lambda m: m.cast_blockwise(x, e4, tile=True, want_t=True)),
        ]
        for name, bpe, fn in cases:
            ok = same_bytes(fn(B), fn(V))
            t0 = kernel_ms(lambda: fn(B))
            t1 = kernel_ms(lambda: fn(V))
            gb = n_el * bpe / 1e9
            print(f"| {shape} | {name} | {t0:.4f} ({gb / t0 / copy * 1e5:.1f}) | {t1:.4f} "
                  f"({gb / t1 / copy * 1e5:.1f}) | {t0 / t1:.3f}x | {ok} |", flush=True)
        del x, x_hot
        torch.cuda.empty_cache()
    # what the conversion compiles to (the claim the variant rests on)
    for name in ("_cast_block", "_cast_tensorwise"):
        kern = getattr(V, name)
        for dev_cache in kern.device_caches.values():
            for ck in list(dev_cache[0].values())[:1]:
                cvts = sorted(set(re.findall(r"cvt\.[a-z0-9.]*e[45]m[23]x2[a-z0-9.]*", ck.asm["ptx"])))
                print(f"{name} PTX fp8 conversions: {cvts}")


if __name__ == "__main__":
    main()
