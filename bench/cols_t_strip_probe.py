"""Probe (session 12): the rowwise recipe's transposed cast (x^T / dy^T quantised per column of x, over all its R
rows) with the second read of x served from L2.

    python bench/cols_t_strip_probe.py [--shapes 8192x4096,...]     # GPU: bytes vs production, GPU time
    python bench/cols_t_strip_probe.py --cpu --shapes 300x96,70x50   # CPU (TRITON_INTERPRET=1): bytes only

Production (fp8_linear._cast_along_rows_t) is two kernels: _colmax reads x for every column's amax, then
_cast_cols_t reads x again and stores the transpose. Two DRAM reads + one fp8 write cap it at 60% of copy
bandwidth on the minimum bytes (read once, write once); it runs at 41-55% (H200, session 12 call 1).
Here one persistent kernel walks column strips (BK columns, all R rows): an amax pass down the strip, then the cast
pass back up it, so the rows it reads first in the second pass are the ones the first pass read last. When the
strips in flight (one per program) fit in L2 (H200: 50 MB; 132 SMs x R x BK x 2 bytes: 34 MB for R = 8192,
BK = 16), the second read comes from L2, and DRAM sees one read and one write. Narrow strips read 2*BK bytes per
row; neighbouring programs read neighbouring strips at about the same time. Variants: strip width BK, rows per
step BM, warps, programs per SM, and the second pass down (fwd) instead of back up (the control for the reversed
walk). Same arithmetic as production (exact division, clamp): the bytes must be equal.
Result (session 12 call 4, docs/benchmarks.md): equal bytes, but 0.61-0.97x production (27% of copy bandwidth at
best): too few bytes in flight per SM. Not adopted.
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

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import variants_row  # noqa: E402


@triton.jit
def _cast_cols_t_strips(X, Y, SINV, R, C, YR, YC, stride_xr, FP8_MAX, BM: tl.constexpr, BK: tl.constexpr,
                        REV: tl.constexpr):
    """Y (YR, YC) = X (R, C)^T quantised per column of X, zero pad past C / R; SINV (YR,). Persistent: program p
    takes strips p, p + P, ... of BK columns."""
    nstrips = tl.cdiv(YR, BK)
    nsteps = tl.cdiv(YC, BM)
    for s in range(tl.program_id(0), nstrips, tl.num_programs(0)):
        cols = s * BK + tl.arange(0, BK)
        cmask = cols < C
        acc = tl.zeros((BM, BK), dtype=tl.float32)
        for i in range(0, tl.cdiv(R, BM)):
            rows = i * BM + tl.arange(0, BM)
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                        mask=(rows < R)[:, None] & cmask[None, :], other=0.0)
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
        scale = FP8_MAX / tl.maximum(tl.max(acc, axis=0), 1e-12)
        for j in range(0, nsteps):
            if REV:
                i = nsteps - 1 - j
            else:
                i = j
            rows = i * BM + tl.arange(0, BM)
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                        mask=(rows < R)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            y = tl.clamp(x * scale[None, :], -FP8_MAX, FP8_MAX)
            tl.store(Y + cols[None, :].to(tl.int64) * YC + rows[:, None], y.to(Y.dtype.element_ty),
                     mask=(rows < YC)[:, None] & (cols < YR)[None, :])
        tl.store(SINV + cols, 1.0 / scale, mask=cols < YR)


VARIANTS = [  # (BK, BM, num_warps, programs per SM, REV)
    (16, 512, 8, 1, True), (16, 1024, 8, 1, True), (16, 512, 4, 2, True), (32, 256, 8, 1, True),
    (32, 512, 8, 1, True), (8, 1024, 4, 2, True), (16, 512, 8, 1, False), (64, 128, 8, 1, True),
]


def strips(x, dtype, YR, YC, v):
    BK, BM, warps, per_sm, rev = v
    R, C = x.shape
    y = _common.empty((YR, YC), dtype, x.device)
    sinv = _common.empty((YR, 1), torch.float32, x.device)
    grid = (min(triton.cdiv(YR, BK), per_sm * _common.num_sms(x.device)),)
    _cast_cols_t_strips[grid](x, y, sinv, R, C, YR, YC, x.stride(0), F8._fmax(dtype), BM=BM, BK=BK, REV=rev,
                              num_warps=warps)
    return y, sinv



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--shapes", default="8192x4096,8192x14336,4096x4096,8192x28672,16384x4096,16384x14336")
    a = ap.parse_args()
    dev = "cpu" if CPU else "cuda"
    e4 = torch.float8_e4m3fn
    copy = None
    if not CPU:
        from turbo_kernels import copy_line

        copy = copy_line()
        print("| x | production (colmax + cast), ms (% copy) | best strip variant (BK, BM, warps, per SM, rev) | "
              "ms (% copy) | vs production | all variants' bytes equal | every variant, ms |")
        print("|---|---:|---|---:|---:|---|---|")
    _common.POISON = True
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = (torch.randn(R, C, device=dev) * torch.rand(1, C, device=dev) * 8).to(torch.bfloat16)
        x[:, : min(C, 16)] = 0  # a zero strip: the 1e-12 floor
        YR, YC = F8._pad16(C), F8._pad16(R)
        variants_row(shape, lambda: F8._cast_along_rows_t(x, e4, YR, YC), lambda v: strips(x, e4, YR, YC, v),
                     VARIANTS, R * C * 3 / 1e9, copy)
        del x
        if not CPU:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
