"""Fused RMSNorm (Triton), forward and backward.

    y = x * rsqrt(mean(x^2) + eps) * w        (statistics in fp32, any x / w dtype)

Forward: one pass over x (read x, w; write y and a fp32 rstd per row). Backward: one pass over (x, dy) gives dx
and per-program partial sums of dw (fp32), reduced by one small torch sum. Bytes: fwd 2*M*N*b, bwd 3*M*N*b.

    TurboRMSNorm(hidden, eps)          drop-in nn.Module (weight init ones)
    rms_norm(x, weight, eps)           functional, autograd-aware
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import nn

from primus.turbo import _common


@triton.jit
def _rmsnorm_fwd(X, W, Y, RSTD, M, N, stride_x, stride_y, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) / N
    rstd = 1.0 / tl.sqrt(ms + eps)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None].to(tl.int64) * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _rmsnorm_bwd(DY, X, W, RSTD, DX, DW_PART, M, N, stride_dy, stride_x, stride_dx,
                 ROWS_PER_PROG, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row0 = pid * ROWS_PER_PROG
    for it in range(0, tl.cdiv(ROWS_PER_PROG, BLOCK_M)):
        rows = row0 + it * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = (rows < M) & (rows < row0 + ROWS_PER_PROG)
        mask = rmask[:, None] & cmask[None, :]
        r64 = rows[:, None].to(tl.int64)
        x = tl.load(X + r64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        c = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        tl.store(DX + r64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
    tl.store(DW_PART + pid * N + cols, dw, mask=cmask)


def _blocks(N: int):
    BLOCK_N = triton.next_power_of_2(N)
    BLOCK_M = max(1, min(16, 4096 // BLOCK_N))
    warps = 4 if BLOCK_N * BLOCK_M <= 4096 else 8 if BLOCK_N * BLOCK_M <= 16384 else 16
    return BLOCK_M, BLOCK_N, warps


def _fwd_config_ok(cfg, BLOCK_N=1, **_):
    tile = cfg["BLOCK_M"] * BLOCK_N  # elements per program: at most 16K, at least 2 per thread
    return tile <= 16384 and cfg["num_warps"] * 64 <= tile


# The forward at hidden 4096 ran 0.82x torch.compile with the default below (one row per program, 4 warps: 65% of
# copy bandwidth; docs/benchmarks.md); inductor's reductions at that size use more warps / rows per program.
# Autotuned per hidden size on the GPU (the default first: _blocks' choice for 4096).
_FWD = _common.Tuned(_rmsnorm_fwd, [
    {"BLOCK_M": 1, "num_warps": 4}, {"BLOCK_M": 1, "num_warps": 8}, {"BLOCK_M": 1, "num_warps": 16},
    {"BLOCK_M": 2, "num_warps": 8}, {"BLOCK_M": 4, "num_warps": 8}, {"BLOCK_M": 2, "num_warps": 16},
    {"BLOCK_M": 8, "num_warps": 8}, {"BLOCK_M": 16, "num_warps": 4}, {"BLOCK_M": 4, "num_warps": 4},
], key=["N"], valid=_fwd_config_ok)


def rms_norm_fwd(x2: torch.Tensor, weight: torch.Tensor, eps: float, config=None):
    """config: one entry of _FWD's space (tests); None = the tuned / default choice."""
    M, N = x2.shape
    y = _common.empty_like(x2)
    rstd = _common.empty((M,), torch.float32, x2.device)
    BLOCK_N = triton.next_power_of_2(N)
    if BLOCK_N > 65536:
        raise ValueError(f"rms_norm: hidden size {N} > 65536 is not supported by the fused kernel")
    args = (x2, weight, y, rstd, M, N, x2.stride(0), y.stride(0), eps)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]),)

    BLOCK_M, _, warps = _blocks(N)
    default = {"BLOCK_M": BLOCK_M, "num_warps": warps}
    if config is not None:
        _FWD.run(config, grid, args, BLOCK_N=BLOCK_N)
    elif BLOCK_N > 16384:  # beyond the tuned space
        _FWD.run(default, grid, args, BLOCK_N=BLOCK_N)
    else:
        _FWD.launch(grid, args, default=default, BLOCK_N=BLOCK_N)
    return y, rstd


def rms_norm_bwd(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    M, N = x2.shape
    dx = _common.empty_like(x2)
    BLOCK_M, BLOCK_N, warps = _blocks(N)
    progs = max(1, min(triton.cdiv(M, BLOCK_M), 4 * _common.num_sms(x2.device)))
    rows_per_prog = triton.cdiv(triton.cdiv(M, progs), BLOCK_M) * BLOCK_M
    progs = triton.cdiv(M, rows_per_prog)
    dw_part = _common.empty((progs, N), torch.float32, x2.device)
    _rmsnorm_bwd[(progs,)](dy2, x2, weight, rstd, dx, dw_part, M, N, dy2.stride(0), x2.stride(0), dx.stride(0),
                           rows_per_prog, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=warps)
    return dx, dw_part.sum(0).to(weight.dtype)


# One torch op pair (with fake kernels): torch.compile keeps the fused norm inside a compiled graph as one node
# (no graph break around it, as an autograd.Function calling Triton would need), and eager calls run the same ops.
@torch.library.custom_op("primus::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y, rstd = rms_norm_fwd(x2, weight.contiguous(), eps)
    return y.view(x.shape), rstd


@_rms_norm_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty((x.numel() // x.shape[-1] if x.shape[-1] else 0,), dtype=torch.float32)


@torch.library.custom_op("primus::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     rstd: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    dy2 = dy.reshape(-1, x.shape[-1])
    if dy2.stride(-1) != 1:
        dy2 = dy2.contiguous()
    dx, dw = rms_norm_bwd(dy2, x2, weight.contiguous(), rstd)
    return dx.view(x.shape), dw


@_rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd):
    return x.new_empty(x.shape), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.set_materialize_grads(False)  # no zero "gradient" for rstd (a fill kernel per norm per backward)


def _backward(ctx, dy, _drstd):
    if dy is None:  # nothing downstream used the output
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_norm_bwd_op(dy, x, weight, rstd)
    return dx, dw, None


_rms_norm_op.register_autograd(_backward, setup_context=_setup)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Fused RMSNorm over the last dimension (Triton fwd + bwd; a single node under torch.compile)."""
    return _rms_norm_op(x, weight, float(eps))[0]


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch (the eager / torch.compile baseline and the test reference)."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(y.dtype)).to(x.dtype)


class TurboRMSNorm(nn.Module):
    """Drop-in RMSNorm: `weight` of shape (hidden,), initialised to ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"
