"""The rowwise recipe's transposed casts without their column amax pass (session 17): production before vs after.

    python bench/rowwise_colmax_probe.py [--shapes 8192x4096,...]     # GPU: one table, old and new in one call
    python bench/rowwise_colmax_probe.py --cpu --shapes 300x96,70x50  # CPU (interpreter): bytes only

The rowwise linear quantises each operand once per GEMM it feeds: x along K (fprop) and along the tokens (wgrad's
x^T), dy along N (dgrad) and along the tokens (wgrad's dy^T), W along K and along N (dgrad's W^T). The casts along
the tokens scale per column of x / dy, so before session 17 they ran a column amax pass (`_colmax`, a whole read)
before the cast pass (`_cast_cols_t`, a read and the transposed fp8 write): two reads and one write, a 60% ceiling
on their minimum bytes (session 12: both passes 41-55% of copy bandwidth, the cast pass alone 73-98%).
Now the cast along K / N (`cast_rowwise(..., col_amax=True)`, `_cast_rowwise_colmax`) keeps every column's max
from the tiles it reads anyway and hands it to the transposed cast (`amax=`): x / dy read twice in all, not three
times. Per shape (bf16 x, e4m3), GPU time (profiler, L2 flushed before each call) and % of copy bandwidth on each
kernel's minimum bytes (a cast: read 2 B + write 1 B per element; both casts of x: read 2 + write 1 + 1):
  before: cast along C | column amax pass | transposed cast   after: cast along C + column amax | transposed cast
The outputs (x along C, its scales, x^T and its scales) must be equal bit for bit.
"""
from __future__ import annotations

import argparse
import os
import sys

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import same_bytes  # noqa: E402


def before(x, dt):
    return (*F8.cast_rowwise(x, dt, pad_rows=True), *F8.cast_rowwise(x, dt, transpose=True, pad=True))


def after(x, dt):
    y, s, amax = F8.cast_rowwise(x, dt, pad_rows=True, col_amax=True)
    return (y, s, *F8.cast_rowwise(x, dt, transpose=True, pad=True, amax=amax))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--shapes", default="8192x4096,8192x6144,8192x14336,4096x4096,16384x4096,8192x2048,"
                                        "8192x8192,8192x16384")
    a = ap.parse_args()
    dev = "cpu" if CPU else "cuda"
    e4 = torch.float8_e4m3fn
    _common.POISON = CPU  # on the CPU every output starts as NaN, so an element left unwritten shows
    copy = None
    if not CPU:
        from turbo_kernels import copy_line, kernel_ms

        copy = copy_line()
        print("| x | before: along C / column amax / transposed, ms (% copy) | after: along C + column amax / "
              "transposed, ms (% copy) | both casts before / after, ms (% copy) | after vs before | bytes equal "
              "| picked (BR, ROWS, warps) |")
        print("|---|---|---|---|---:|---|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = (torch.randn(R, C, device=dev) * torch.rand(1, C, device=dev) * torch.rand(R, 1, device=dev) * 8).to(
            torch.bfloat16)
        x[:, : min(C, 16)] = 0  # zero columns and a zero row: the 1e-12 floor both ways
        x[R // 2] = 0
        eq = same_bytes(before(x, e4), after(x, e4))
        if CPU:
            print(f"{shape}: after's bytes equal before's: {eq}", flush=True)
            continue
        amax = F8.column_amax(x)
        t = {
            "row": kernel_ms(lambda: F8.cast_rowwise(x, e4, pad_rows=True)),
            "colmax": kernel_ms(lambda: F8.column_amax(x)),
            "cols_t": kernel_ms(lambda: F8.cast_rowwise(x, e4, transpose=True, pad=True, amax=amax)),
            "row_colmax": kernel_ms(lambda: F8.cast_rowwise(x, e4, pad_rows=True, col_amax=True)),
            "before": kernel_ms(lambda: before(x, e4)),
            "after": kernel_ms(lambda: after(x, e4)),
        }
        n = R * C

        def pct(ms, bytes_per_elem):
            return f"{ms:.4f} ({n * bytes_per_elem / 1e9 / ms / copy * 1e5:.1f})"

        picked = [(c["BR"], c["ROWS"], c["num_warps"]) for k, c in F8._ROWWISE_COLMAX.picked.items()
                  if k[0] == (R, C)]
        print(f"| {shape} | {pct(t['row'], 3)} / {pct(t['colmax'], 2)} / {pct(t['cols_t'], 3)} | "
              f"{pct(t['row_colmax'], 3)} / {pct(t['cols_t'], 3)} | {pct(t['before'], 4)} / {pct(t['after'], 4)} | "
              f"{t['before'] / t['after']:.3f}x | {eq} | {picked} |", flush=True)
        del x, amax
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
