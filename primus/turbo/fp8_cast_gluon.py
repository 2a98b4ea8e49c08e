"""The blockwise fp8 cast both ways, in Gluon (Triton's explicit-layout dialect), for NVIDIA GPUs: a tensor in
1x128 groups along its columns and its transpose in 1x128 groups along its rows (along the tokens), from one read.
The blockwise linear casts x and x^T so in the forward, dy and dy^T in the backward.

Why a second kernel beside fp8_linear._cast_block (which stays the portable one: ROCm, the interpreter, fp32
input, the other outputs): plain Triton stores dy^T from `tl.trans` of the fp8 tile, and it moves that transpose
through shared memory byte by byte (sm90 SASS, read on the CPU: 64 LDS.U8 and ~48 PRMT per thread, 1,240
instructions per thread in all). Triton has no way to ask for a register layout in which the transpose is free.
Here each thread holds an 8x8 block of the 128x128 tile, so the transpose is a permute of the thread's own
registers, and a register-only reorder on the fp32 values puts each thread's bytes in dy^T's store order before the
conversion: 936 instructions per thread, no shared-memory transpose, no spill. The arithmetic is _cast_block's
CUDA path (SAT: no clamp, scales from rcp.approx), so the bytes and scales are equal to its (checked on the GPU by
tests/test_turbo_fp8.py). H200: 1.08-1.12x _cast_block's tuned pick at 4096x4096 to 8192x28672, and the blockwise
fp8 linear of a Llama-3-8B layer 1.013x (H200, 2026-12-01; docs/turbo.md).
"""
from __future__ import annotations

from typing import Optional

import torch

try:  # Triton >= 3.5 ships Gluon; without it the portable Triton kernel serves every cast
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except Exception:  # pragma: no cover - depends on the installed Triton
    gluon = gl = None

BR = BC = 128  # the tile: 1x128 groups along both dims
NUM_WARPS = 8  # the layouts below are written for 8 warps of 32 lanes
# Where this kernel was measured faster than the Triton kernel's tuned pick (H200, 2026-12-01, GPU time: 1.05-1.44x
# from 16 tiles (256x1024) to 4,096 (16384x4096); 0.73x at 150x260, 6 tiles, rows not 16-element aligned)
MIN_TILES = 16
ALIGN = 16  # elements: the columns and the row stride (fp8 GEMM operands' dims are multiples of 16 anyway)

if gluon is not None:
    # The 128x128 x tile: a thread owns 8 rows x 8 columns (16-byte loads along the columns), 4 x 8 lanes, 4 x 2
    # warps
    TILE = gl.constexpr(gl.BlockedLayout([8, 8], [4, 8], [4, 2], [1, 0]))
    # Its transpose (128 columns x 128 rows) in the same threads (TILE's lane and warp bases, swapped), each
    # thread's registers ordered along the rows first: YT's rows are contiguous along x's rows
    TILE_T = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        lane_bases=[[8, 0], [16, 0], [32, 0], [0, 8], [0, 16]],
        warp_bases=[[64, 0], [0, 32], [0, 64]], block_bases=[], shape=[BC, BR]))

    @gluon.jit
    def _rcp(a):
        return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [a], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def load_tile(X, R, C, stride_xr, r0, c0, BR: gl.constexpr, BC: gl.constexpr):
        """The (BR, BC) tile of X (R, C) (rows contiguous) at (r0, c0), in TILE, fp32, zero past R / C:
        (lr, lc, rows, cols, x), lr / lc its row / column offsets. 64-bit tile base, 32-bit offsets inside the
        tile (as _cast_block)."""
        lr = gl.arange(0, BR, layout=gl.SliceLayout(1, TILE))
        lc = gl.arange(0, BC, layout=gl.SliceLayout(0, TILE))
        rows = r0 + lr
        cols = c0 + lc
        x = gl.load(X + (r0.to(gl.int64) * stride_xr + c0) + (lr[:, None] * stride_xr + lc[None, :]),
                    mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(gl.float32)
        return lr, lc, rows, cols, x

    @gluon.jit
    def _cast_both_1x128(X, Y, YT, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, FP8_MAX,
                         BR: gl.constexpr, BC: gl.constexpr):
        """X (R, C), rows contiguous -> Y (RP, C) with scale_inv S[r, g] at S + r*s_sr + g*s_sc, and YT (C, RP)
        with ST[g, c] at ST + g*s_tr + c*s_tc; rows R..RP-1 (Y) and columns R..RP-1 (YT) are the zero pad."""
        pid_r = gl.program_id(0)
        pid_c = gl.program_id(1)
        r0 = pid_r * BR
        c0 = pid_c * BC
        lr, lc, rows, cols, x = load_tile(X, R, C, stride_xr, r0, c0, BR, BC)
        ax = gl.abs(x)
        ra = gl.maximum(gl.max(ax, axis=1), 1e-12)  # one group per row of the tile
        gl.store(Y + (r0.to(gl.int64) * C + c0) + (lr[:, None] * C + lc[None, :]),
                 (x * (FP8_MAX * _rcp(ra))[:, None]).to(Y.dtype.element_ty),
                 mask=(rows[:, None] < RP) & (cols[None, :] < C))
        gl.store(S + rows * s_sr + pid_c * s_sc, ra * (1.0 / FP8_MAX), mask=rows < RP)
        ca = gl.maximum(gl.max(ax, axis=0), 1e-12)  # one group per column of the tile (a row of YT)
        qt = gl.convert_layout(gl.permute(x * (FP8_MAX * _rcp(ca))[None, :], [1, 0]), TILE_T)
        tc = gl.arange(0, BC, layout=gl.SliceLayout(1, TILE_T))
        tr = gl.arange(0, BR, layout=gl.SliceLayout(0, TILE_T))
        gl.store(YT + (c0.to(gl.int64) * RP + r0) + (tc[:, None] * RP + tr[None, :]), qt.to(YT.dtype.element_ty),
                 mask=((c0 + tc)[:, None] < C) & ((r0 + tr)[None, :] < RP))
        gl.store(ST + pid_r * s_tr + cols * s_tc, ca * (1.0 / FP8_MAX), mask=cols < C)


def unavailable(x2: torch.Tensor, saturates: bool) -> Optional[str]:
    """Why this kernel does not serve a both-ways 1x128 cast of x2 (None: it does). saturates: the device's fp8
    conversion saturates (fp8_linear._conversion_saturates), the arithmetic this kernel shares with _cast_block."""
    if gluon is None:
        return "this Triton has no Gluon"
    if not saturates or x2.device.type != "cuda":
        return "not an NVIDIA GPU (Gluon layouts for 32-lane warps; the conversion must saturate)"
    if x2.dtype not in (torch.bfloat16, torch.float16):
        return f"{x2.dtype} input (fp32 keeps one launch per output: see fp8_linear.cast_tensorwise)"
    R, C = x2.shape
    if x2.stride(1) != 1 or C % ALIGN or x2.stride(0) % ALIGN:
        return f"rows not contiguous and {ALIGN}-element aligned"
    if -(-R // BR) * -(-C // BC) < MIN_TILES:
        return f"fewer than {MIN_TILES} tiles"
    return None


def cast_both_1x128(x2, y, sy, yt, syt, RP: int, fp8_max: float) -> None:
    """Fill y, yt and their scale_inv tensors (fp8_linear.cast_blockwise's, 1x128 groups, already allocated)."""
    R, C = x2.shape
    grid = (-(-RP // BR), -(-C // BC))
    _cast_both_1x128[grid](x2, y, yt, sy, syt, R, C, RP, x2.stride(0), sy.stride(0), sy.stride(1), syt.stride(1),
                           syt.stride(0), fp8_max, BR=BR, BC=BC, num_warps=NUM_WARPS)
