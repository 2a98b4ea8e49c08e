"""Probe (session 17): launch forms of the rowwise transposed cast's column amax pass (`fp8_linear._colmax`).

    python bench/colmax_pass_probe.py                      # GPU: one table per shape
    python bench/colmax_pass_probe.py --cpu --shapes 70x50 # CPU (interpreter): exactness only

The transposed rowwise cast (x^T, dy^T, W^T) is a column amax pass and a cast pass. The pass is a pure read of x,
yet it ran at 57-79% of copy bandwidth in session 17 (the tensorwise amax pass, also a pure read, at 87-89%), and
keeping the column amax in the cast along the rows instead did not pay (bench/rowwise_colmax_variants.py). Here:
production (its autotuned pick, `column_amax`) against variants of the same kernel:
  PREFETCH  the next BM x BK tile loaded before the current one is folded in (two tiles in flight per program)
  RELAXED   the per-column atomic max with sem="relaxed" (Triton's default is acq_rel)
  ACC16     the running max kept in x's dtype (exact: a max of x's values is one of them; half the registers)
  STAGES    the row loop as tl.range(..., num_stages=STAGES) (Triton's software pipelining; 1: none)
with BM rows x BK columns per tile, ROWS rows per program, warps. Every variant's amax must equal production's.
% copy: the bytes read (2 per element) over the copy bandwidth's bytes moved.
Since this probe ran (call 4), production's `_colmax` is this kernel with RELAXED = 1 and no STAGES (df58850), so
its "production" column now reads that newer space (bench/colmax_ab.py times it against e5c07be's).
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
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402


@triton.jit
def _colmax_v(X, AMAX, R, C, stride_xr, BM: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr,
              PREFETCH: tl.constexpr, RELAXED: tl.constexpr, ACC16: tl.constexpr, STAGES: tl.constexpr):
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    cmask = cols < C
    r0 = tl.program_id(0) * ROWS
    if ACC16:
        acc = tl.zeros((BM, BK), dtype=X.dtype.element_ty)
    else:
        acc = tl.zeros((BM, BK), dtype=tl.float32)
    if PREFETCH:
        rn = r0 + tl.arange(0, BM)
        xn = tl.load(X + rn[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=(rn < R)[:, None] & cmask[None, :],
                     other=0.0)
    for i in tl.range(0, ROWS // BM, num_stages=STAGES):
        rows = r0 + i * BM + tl.arange(0, BM)
        if PREFETCH:
            x = xn
            rn = rows + BM
            xn = tl.load(X + rn[:, None].to(tl.int64) * stride_xr + cols[None, :],
                         mask=((rn < R) & (rn < r0 + ROWS))[:, None] & cmask[None, :], other=0.0)
        else:
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                        mask=(rows < R)[:, None] & cmask[None, :], other=0.0)
        if ACC16:
            acc = tl.maximum(acc, tl.abs(x)).to(X.dtype.element_ty)
        else:
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    cmax = tl.max(acc, axis=0).to(tl.float32)
    if RELAXED:
        tl.atomic_max(AMAX + cols, cmax, mask=cmask, sem="relaxed")
    else:
        tl.atomic_max(AMAX + cols, cmax, mask=cmask)


VARIANTS = [  # (BM, BK, ROWS, warps, PREFETCH, RELAXED, ACC16, STAGES)
    (32, 128, 256, 4, 0, 0, 0, 1), (32, 256, 256, 4, 0, 0, 0, 1), (64, 128, 512, 4, 0, 0, 0, 1),
    (32, 256, 256, 4, 0, 1, 0, 1), (32, 256, 256, 4, 1, 1, 0, 1), (32, 256, 256, 4, 1, 1, 1, 1),
    (32, 256, 256, 4, 0, 1, 1, 1), (32, 256, 256, 4, 0, 1, 0, 3), (32, 256, 256, 4, 0, 1, 1, 3),
    (32, 256, 256, 4, 0, 1, 1, 4), (32, 256, 128, 4, 1, 1, 1, 1), (32, 256, 64, 4, 1, 1, 1, 1),
    (16, 512, 128, 4, 1, 1, 1, 1), (16, 512, 256, 4, 1, 1, 1, 1), (64, 256, 256, 8, 1, 1, 1, 1),
    (32, 512, 256, 8, 1, 1, 1, 1), (64, 128, 256, 4, 1, 1, 1, 1), (32, 128, 128, 4, 1, 1, 1, 1),
    (16, 256, 128, 4, 1, 1, 1, 1), (32, 256, 512, 4, 1, 1, 1, 1), (64, 256, 512, 8, 0, 1, 1, 3),
    (16, 1024, 128, 8, 1, 1, 1, 1),
]


def variant(x, v):
    BM, BK, ROWS, warps, pre, relaxed, acc16, stages = v
    R, C = x.shape
    amax = torch.zeros(C, dtype=torch.float32, device=x.device)
    _colmax_v[(triton.cdiv(R, ROWS), triton.cdiv(C, BK))](x, amax, R, C, x.stride(0), BM=BM, BK=BK, ROWS=ROWS,
                                                          PREFETCH=pre, RELAXED=relaxed, ACC16=acc16, STAGES=stages,
                                                          num_warps=warps)
    return amax


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--shapes", default="8192x4096,8192x2048,4096x4096,8192x6144,8192x14336,8192x28672")
    a = ap.parse_args()
    dev = "cpu" if CPU else "cuda"
    copy = None
    if not CPU:
        from turbo_kernels import copy_line, kernel_ms

        copy = copy_line()
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = (torch.randn(R, C, device=dev) * torch.rand(1, C, device=dev) * 8).to(torch.bfloat16)
        x[0, 0], x[R - 1, C - 1] = -1e3, 2e3
        ref = F8.column_amax(x)
        vs = [v for v in VARIANTS if v[2] <= max(v[0], triton.next_power_of_2(R))]
        eqs = {v: torch.equal(variant(x, v), ref) for v in vs}
        if CPU:
            print(f"{shape}: every variant's amax equals production's: {all(eqs.values())}", flush=True)
            continue
        n = R * C
        pc = lambda ms: n * 2 / 1e9 / ms / copy * 1e5  # noqa: E731
        t0 = kernel_ms(lambda: F8.column_amax(x))
        picked = [c for k, c in F8._COLMAX.picked.items() if k[0] == (R, C)]
        print(f"\n{shape}: production column_amax {t0:.4f} ms ({pc(t0):.1f}% copy), picked {picked}")
        print("| variant (BM, BK, ROWS, warps, PREFETCH, RELAXED, ACC16, STAGES) | ms | % copy | vs production | exact |")
        print("|---|---:|---:|---:|---|")
        rows = []
        for v in vs:
            try:
                rows.append((kernel_ms(lambda v=v: variant(x, v)), v))
            except Exception as e:  # a variant that does not compile here is a row, not the end of the probe
                print(f"| {v} | failed: {type(e).__name__}: {str(e)[:80]} | | | |")
        for t, v in sorted(rows):
            print(f"| {v} | {t:.4f} | {pc(t):.1f} | {t0 / t:.3f}x | {eqs[v]} |", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
