"""A/B (session 17): the rowwise transposed cast's column amax pass, this tree vs an older tree's `fp8_linear.py`.

    python bench/colmax_ab.py --baseline outputs/baseline_s17/fp8_linear.py

Per shape (bf16 x): the column amax pass (`column_amax`, each tree's autotuned pick) and the whole transposed cast
(`cast_rowwise(x, transpose=True, pad=True)`: the pass + the cast pass), GPU time (profiler, L2 flushed before each
call), read old / new / old / new; the outputs must be bit-equal.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import copy_line, kernel_ms, load_module, same_bytes  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--shapes", default="8192x4096,8192x2048,4096x4096,8192x6144,8192x14336,8192x28672")
    a = ap.parse_args()
    old = load_module(a.baseline)
    gate = {m: getattr(mod, "COLMAX_PREFETCH_MIN_ELEMS", None) for m, mod in (("baseline", old), ("this tree", F8))}
    print("the column amax pass's prefetching configs from (elements; None: every size):", gate)
    copy = copy_line()
    e4 = torch.float8_e4m3fn
    print("| x | column amax pass old / new / old / new, ms | new vs old | new pick | transposed cast old / new / "
          "old / new, ms (% copy of the best new) | new vs old | bit-equal |")
    print("|---|---|---:|---|---|---:|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = (torch.randn(R, C, device="cuda") * torch.rand(1, C, device="cuda") * 8).to(torch.bfloat16)
        eq = (torch.equal(old.column_amax(x), F8.column_amax(x))
              and same_bytes(old.cast_rowwise(x, e4, transpose=True, pad=True),
                             F8.cast_rowwise(x, e4, transpose=True, pad=True)))
        cells = []
        for fo, fn in ((lambda: old.column_amax(x), lambda: F8.column_amax(x)),
                       (lambda: old.cast_rowwise(x, e4, transpose=True, pad=True),
                        lambda: F8.cast_rowwise(x, e4, transpose=True, pad=True))):
            ts = [kernel_ms(f) for f in (fo, fn, fo, fn)]
            cells.append((ts, min(ts[0], ts[2]) / min(ts[1], ts[3])))
        pick = [c for k, c in F8._COLMAX.picked.items() if k[0] == (R, C)]
        best = min(cells[1][0][1], cells[1][0][3])
        print(f"| {shape} | {' / '.join(f'{t:.4f}' for t in cells[0][0])} | {cells[0][1]:.3f}x | {pick} | "
              f"{' / '.join(f'{t:.4f}' for t in cells[1][0])} ({R * C * 3 / 1e9 / best / copy * 1e5:.1f}) | "
              f"{cells[1][1]:.3f}x | {eq} |", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
