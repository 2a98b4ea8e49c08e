"""Probe (session 12, written for the next H200 call): the rowwise recipe's backward reads dy three times; can the
rowwise cast of dy hand its column amax to the transposed cast, so that dy is read twice?

    python bench/rowwise_colmax_probe.py [--shapes 8192x4096,8192x6144,8192x14336,4096x4096]   # GPU
    python bench/rowwise_colmax_probe.py --cpu --shapes 300x96,70x50                             # CPU: bytes only

Production, when the backward wants dx and dW (fp8_linear.fp8_backward, recipe rowwise): `cast_rowwise(dy)` (dy
along N, one read), then `cast_rowwise(dy, transpose=True)` = `_colmax` (a read of dy for every column's amax over
the tokens) + `_cast_cols_t` (a read of dy, the transposed store). The column amax pass is the transposed cast's
cost over its 60% ceiling (session 12 call 1: the cast pass alone runs at 73-98% of copy bandwidth, both passes
41-55%).
Here the rowwise cast of dy also keeps, per program of ROWS rows, the running |dy| max of each column in registers
(the row tiles it loads anyway) and writes it once: a (ceil(R / ROWS), C) fp32 partial, ROWS times smaller than
dy. A small kernel reduces the partials to the column amax, and production's `_cast_cols_t` does the rest: three
kernels, two reads of dy, plus the partials (8192 x 4096 with ROWS = 64: 2 MB against dy's 64 MB).
Only where a row fits one tile (C <= 16384: the qkv, o and down linears' dy; gate+up's 28672 would need the
chunked walk, whose per-chunk column maxima do not fit in registers). Variants: rows per tile BR, rows per program
ROWS, warps. Same arithmetic as production: the bytes of dy's fp8, dy^T's fp8 and both scales must be equal.
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
def _cast_rowwise_colmax(X, Y, SINV, PART, R, C, RP, stride_xr, FP8_MAX, BR: tl.constexpr, BC: tl.constexpr,
                         ROWS: tl.constexpr):
    """= fp8_linear._cast_rowwise's one-tile path (Y (RP, C) per row along C, zero pad rows, SINV (RP,)), and
    PART[p, c] = max |X[r, c]| over this program's ROWS rows."""
    pid = tl.program_id(0)
    c1 = tl.arange(0, BC)
    cm = c1 < C
    acc = tl.zeros((BR, BC), dtype=tl.float32)
    for i in range(0, ROWS // BR):
        rows = pid * ROWS + i * BR + tl.arange(0, BR)
        r64 = rows[:, None].to(tl.int64)
        xf = tl.load(X + r64 * stride_xr + c1[None, :], mask=(rows < R)[:, None] & cm[None, :],
                     other=0.0).to(tl.float32)
        ax = tl.abs(xf)
        acc = tl.maximum(acc, ax)
        scale = FP8_MAX / tl.maximum(tl.max(ax, axis=1), 1e-12)
        q = tl.clamp(xf * scale[:, None], -FP8_MAX, FP8_MAX)
        tl.store(Y + r64 * C + c1[None, :], q.to(Y.dtype.element_ty), mask=(rows < RP)[:, None] & cm[None, :])
        tl.store(SINV + rows, 1.0 / scale, mask=rows < RP)
    tl.store(PART + pid * C + c1, tl.max(acc, axis=0), mask=cm)


@triton.jit
def _reduce_parts(PART, AMAX, NP, C, BP: tl.constexpr, BK: tl.constexpr):
    """AMAX[c] = max over the NP partial rows of PART (NP, C)."""
    cols = tl.program_id(0) * BK + tl.arange(0, BK)
    acc = tl.zeros((BP, BK), dtype=tl.float32)
    for p0 in range(0, NP, BP):
        p = p0 + tl.arange(0, BP)
        acc = tl.maximum(acc, tl.load(PART + p[:, None] * C + cols[None, :],
                                      mask=(p < NP)[:, None] & (cols < C)[None, :], other=0.0))
    tl.store(AMAX + cols, tl.max(acc, axis=0), mask=cols < C)


VARIANTS = [  # (BR, ROWS, num_warps)
    (1, 16, 4), (1, 32, 8), (1, 64, 8), (2, 32, 8), (2, 64, 8), (4, 64, 8), (1, 128, 8), (4, 128, 4),
]


def fused(x, dtype, v):
    """(dy fp8 (RP, C), its scale_inv (RP, 1), dy^T fp8 (C, RP), its scale_inv (C, 1)): production's
    cast_rowwise(x, pad_rows=True) and cast_rowwise(x, transpose=True, pad=True), from two reads of x."""
    BR, ROWS, warps = v
    R, C = x.shape
    RP = F8._pad16(R)
    BC = triton.next_power_of_2(C)
    y = _common.empty((RP, C), dtype, x.device)
    sy = _common.empty((RP, 1), torch.float32, x.device)
    NP = triton.cdiv(RP, ROWS)
    part = torch.empty((NP, C), dtype=torch.float32, device=x.device)
    fmax = F8._fmax(dtype)
    _cast_rowwise_colmax[(NP,)](x, y, sy, part, R, C, RP, x.stride(0), fmax, BR=BR, BC=BC, ROWS=ROWS,
                                num_warps=warps)
    amax = torch.empty(C, dtype=torch.float32, device=x.device)
    _reduce_parts[(triton.cdiv(C, 128),)](part, amax, NP, C, BP=32, BK=128, num_warps=4)
    yt = _common.empty((C, RP), dtype, x.device)
    syt = _common.empty((C, 1), torch.float32, x.device)
    F8._COLS_T.launch(lambda m: (triton.cdiv(RP, m["BM"]), triton.cdiv(C, m["BK"])),
                      (x, amax, yt, syt, R, C, C, RP, x.stride(0), fmax), default=F8._COLS_T.configs[0])
    return y, sy, yt, syt


def production(x, dtype):
    return (*F8.cast_rowwise(x, dtype, pad_rows=True), *F8.cast_rowwise(x, dtype, transpose=True, pad=True))



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--shapes", default="8192x4096,8192x6144,8192x14336,4096x4096,16384x4096")
    a = ap.parse_args()
    dev = "cpu" if CPU else "cuda"
    e4 = torch.float8_e4m3fn
    _common.POISON = CPU  # on the CPU both sides' outputs start as NaN, so an element left unwritten shows
    copy = None
    if not CPU:
        from turbo_kernels import copy_line

        copy = copy_line()
        print("| dy | production (rowwise + colmax + cast^T), ms (% copy) | best fused (BR, ROWS, warps) | ms (% copy) "
              "| fused / production speed | bytes equal (every variant) | every variant, ms |")
        print("|---|---:|---|---:|---:|---|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = (torch.randn(R, C, device=dev) * torch.rand(1, C, device=dev) * torch.rand(R, 1, device=dev) * 8).to(
            torch.bfloat16)
        x[:, : min(C, 16)] = 0  # zero columns and a zero row: the 1e-12 floor both ways
        x[R // 2] = 0
        # at most 64 elements of the tile per thread: more spills (sm90, read on the CPU with
        # bench/kernel_resources.py's compile: 104 / 56 bytes of stack at 128 per thread)
        vs = [v for v in VARIANTS if v[0] * triton.next_power_of_2(C) <= 64 * 32 * v[2]]
        # min bytes: read dy once, write dy and dy^T in fp8
        variants_row(shape, lambda: production(x, e4), lambda v: fused(x, e4, v), vs, R * C * 4 / 1e9, copy)
        del x
        if not CPU:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
