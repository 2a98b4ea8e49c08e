"""Fused QKV split + rotary embedding (Triton), forward and backward, as one torch op that torch.compile keeps whole.

Megatron's attention produces one fused projection per token, laid out per query group as
[q_1 .. q_r, k, v] heads of `d` channels ([s, b, ng, (r + 2) * d]). Unfused, it is split into views, RoPE is applied
to q and k (`x * cos + rotate_half(x) * sin`, rotate_half(x) = cat(-x2, x1)), and SDPA reads them through
[b, h, s, d] permutes; the backward slices the three gradients back into one tensor. Compiled with inductor that
path took ~20 ms of a 528 ms Llama-3.2-1B step on the H200 (three kernels at ~1/4 of the copy bandwidth).

Here one program per token reads its whole row once and writes q, k (rotated) and v into [b, s, heads, d] tensors
(the layout SDPA's fused kernels read natively as [b, h, s, d] views); the backward reads dq, dk, dv (any strides)
and writes the fused gradient row, applying the transposed rotation. Measured on the H200 (bench/turbo_kernels.py,
Llama-3.2-1B bench shape): fwd+bwd 0.66 ms, 2.45x inductor's compiled reference (a variant taking 4 tokens per
program and loading the rotary halves separately measured 4.7x slower: keep this layout). Bytes: one read and one write of the row each
way, the floor for a layout change. cos/sin are computed from megatron's fp32 `freqs` in fp32 (no bf16 rounding of
cos/sin as eager megatron does).

    qkv_rope(mixed [s, b, ng, (r+2)*d], q_freqs [s, d], k_freqs [s, d], r) -> q [b, s, ng*r, d], k, v [b, s, ng, d]
    qkv_rope_reference(...)                                                  plain PyTorch, same contract
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from primus.turbo import _common


@triton.jit
def _partner(cols, HALF: tl.constexpr):
    # rotate_half pairs channel c with c + d/2 (first half) or c - d/2 (second half)
    return tl.where(cols < HALF, cols + HALF, cols - HALF)


@triton.jit
def _token_tile(B, NG, R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """This program's token (s-major, as the projection's rows are) and its [heads x channels] tile: each row is
    head j of query group g, j < R a query head, j == R the key, j == R + 1 the value."""
    tok = tl.program_id(0)
    rows = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = (rows < NG * (R + 2))[:, None] & cmask[None, :]
    return tok, tok // B, tok % B, rows, cols, cmask, mask, rows // (R + 2), rows % (R + 2), _partner(cols, HALF)


@triton.jit
def _qkv_rope_fwd(MIXED, QF, KF, Q, K, V, S, B, NG, stride_ms, stride_mb, stride_qf, stride_kf,
                  R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    tok, si, bi, rows, cols, cmask, mask, g, j, pc = _token_tile(B, NG, R, D, HALF, BLOCK_H, BLOCK_D)
    is_q = j < R
    is_v = j == R + 1
    base = MIXED + si.to(tl.int64) * stride_ms + bi.to(tl.int64) * stride_mb
    x = tl.load(base + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(base + rows[:, None] * D + pc[None, :], mask=mask, other=0.0).to(tl.float32)
    fq = tl.load(QF + si * stride_qf + cols, mask=cmask, other=0.0)
    fk = tl.load(KF + si * stride_kf + cols, mask=cmask, other=0.0)
    cos = tl.where(is_q[:, None], tl.cos(fq)[None, :], tl.cos(fk)[None, :])
    sin = tl.where(is_q[:, None], tl.sin(fq)[None, :], tl.sin(fk)[None, :])
    sign = tl.where(cols < HALF, -1.0, 1.0)
    y = tl.where(is_v[:, None], x, x * cos + sign[None, :] * xp * sin).to(Q.dtype.element_ty)
    tokq = (bi.to(tl.int64) * S + si) * (NG * R)
    tokkv = (bi.to(tl.int64) * S + si) * NG
    tl.store(Q + (tokq + g * R + j)[:, None] * D + cols[None, :], y, mask=mask & is_q[:, None])
    tl.store(K + (tokkv + g)[:, None] * D + cols[None, :], y, mask=mask & (j == R)[:, None])
    tl.store(V + (tokkv + g)[:, None] * D + cols[None, :], y, mask=mask & is_v[:, None])


@triton.jit
def _qkv_rope_bwd(DQ, DK, DV, QF, KF, DMIXED, B, NG, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                  stride_qf, stride_kf, R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok, si, bi, rows, cols, cmask, mask, g, j, pc = _token_tile(B, NG, R, D, HALF, BLOCK_H, BLOCK_D)
    is_q = j < R
    is_k = j == R
    is_v = j == R + 1
    b64 = bi.to(tl.int64)
    s64 = si.to(tl.int64)
    oq = (b64 * sq_b + s64 * sq_s + (g * R + j) * sq_h)[:, None]
    ok = (b64 * sk_b + s64 * sk_s + g * sk_h)[:, None]
    ov = (b64 * sv_b + s64 * sv_s + g * sv_h)[:, None]
    mq, mk, mv = mask & is_q[:, None], mask & is_k[:, None], mask & is_v[:, None]
    dy = (tl.load(DQ + oq + cols[None, :], mask=mq, other=0.0).to(tl.float32)
          + tl.load(DK + ok + cols[None, :], mask=mk, other=0.0).to(tl.float32)
          + tl.load(DV + ov + cols[None, :], mask=mv, other=0.0).to(tl.float32))
    dyp = (tl.load(DQ + oq + pc[None, :], mask=mq, other=0.0).to(tl.float32)
           + tl.load(DK + ok + pc[None, :], mask=mk, other=0.0).to(tl.float32))
    fq = tl.load(QF + si * stride_qf + cols, mask=cmask, other=0.0)
    fk = tl.load(KF + si * stride_kf + cols, mask=cmask, other=0.0)
    fqp = tl.load(QF + si * stride_qf + pc, mask=cmask, other=0.0)
    fkp = tl.load(KF + si * stride_kf + pc, mask=cmask, other=0.0)
    cos = tl.where(is_q[:, None], tl.cos(fq)[None, :], tl.cos(fk)[None, :])
    sinp = tl.where(is_q[:, None], tl.sin(fqp)[None, :], tl.sin(fkp)[None, :])
    # y = x*cos + sign*x[p]*sin  =>  dx[c] = dy[c]*cos[c] + sign[p(c)]*dy[p(c)]*sin[p(c)], sign[p(c)] = -sign[c]
    sign_p = tl.where(cols < HALF, 1.0, -1.0)
    dx = tl.where(is_v[:, None], dy, dy * cos + sign_p[None, :] * dyp * sinp)
    tl.store(DMIXED + tok.to(tl.int64) * (NG * (R + 2) * D) + rows[:, None] * D + cols[None, :],
             dx.to(DMIXED.dtype.element_ty), mask=mask)


def _blocks(ng: int, r: int, d: int):
    BLOCK_H, BLOCK_D = triton.next_power_of_2(ng * (r + 2)), triton.next_power_of_2(d)
    warps = 4 if BLOCK_H * BLOCK_D <= 4096 else 8
    return BLOCK_H, BLOCK_D, warps


def _check(mixed: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor, r: int) -> Tuple[int, ...]:
    if mixed.dim() != 4:
        raise ValueError(f"qkv_rope: mixed must be [s, b, groups, (r+2)*d], got shape {tuple(mixed.shape)}")
    s, b, ng, w = mixed.shape
    if r < 1 or w % (r + 2):
        raise ValueError(f"qkv_rope: last dim {w} is not (r+2)*d for r={r} query heads per group")
    d = w // (r + 2)
    if d % 2:
        raise ValueError(f"qkv_rope: head dim {d} must be even")
    for name, f in (("q_freqs", q_freqs), ("k_freqs", k_freqs)):
        if tuple(f.shape) != (s, d) or f.dtype != torch.float32:
            raise ValueError(f"qkv_rope: {name} must be float32 [s={s}, d={d}], got {f.dtype} {tuple(f.shape)}")
    return s, b, ng, d


@torch.library.custom_op("primus::qkv_rope", mutates_args=())
def _qkv_rope_op(mixed: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor,
                 r: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, b, ng, d = _check(mixed, q_freqs, k_freqs, r)
    if mixed.stride(3) != 1 or mixed.stride(2) != mixed.shape[3]:
        mixed = mixed.contiguous()
    q = _common.empty((b, s, ng * r, d), mixed.dtype, mixed.device)
    k = _common.empty((b, s, ng, d), mixed.dtype, mixed.device)
    v = _common.empty((b, s, ng, d), mixed.dtype, mixed.device)
    if s * b:
        BLOCK_H, BLOCK_D, warps = _blocks(ng, r, d)
        _qkv_rope_fwd[(s * b,)](mixed, q_freqs, k_freqs, q, k, v, s, b, ng, mixed.stride(0), mixed.stride(1),
                                q_freqs.stride(0), k_freqs.stride(0), R=r, D=d, HALF=d // 2,
                                BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=warps)
    return q, k, v


@_qkv_rope_op.register_fake
def _(mixed, q_freqs, k_freqs, r):
    s, b, ng, w = mixed.shape
    d = w // (r + 2)
    return (mixed.new_empty((b, s, ng * r, d)), mixed.new_empty((b, s, ng, d)), mixed.new_empty((b, s, ng, d)))


@torch.library.custom_op("primus::qkv_rope_bwd", mutates_args=())
def _qkv_rope_bwd_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, q_freqs: torch.Tensor,
                     k_freqs: torch.Tensor, r: int) -> torch.Tensor:
    b, s, ng, d = dk.shape
    dq, dk, dv = (t if t.stride(3) == 1 else t.contiguous() for t in (dq, dk, dv))
    dmixed = _common.empty((s, b, ng, (r + 2) * d), dq.dtype, dq.device)
    if s * b:
        BLOCK_H, BLOCK_D, warps = _blocks(ng, r, d)
        _qkv_rope_bwd[(s * b,)](dq, dk, dv, q_freqs, k_freqs, dmixed, b, ng,
                                dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
                                dv.stride(0), dv.stride(1), dv.stride(2), q_freqs.stride(0), k_freqs.stride(0),
                                R=r, D=d, HALF=d // 2, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=warps)
    return dmixed


@_qkv_rope_bwd_op.register_fake
def _(dq, dk, dv, q_freqs, k_freqs, r):
    b, s, ng, d = dk.shape
    return dq.new_empty((s, b, ng, (r + 2) * d))


def _setup_context(ctx, inputs, output):
    _, q_freqs, k_freqs, r = inputs
    ctx.save_for_backward(q_freqs, k_freqs)
    ctx.r = r


def _backward(ctx, dq, dk, dv):
    q_freqs, k_freqs = ctx.saved_tensors
    return _qkv_rope_bwd_op(dq, dk, dv, q_freqs, k_freqs, ctx.r), None, None, None


_qkv_rope_op.register_autograd(_backward, setup_context=_setup_context)


def qkv_rope(mixed: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor,
             r: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split megatron's fused projection into q, k, v and rotate q and k (see the module doc)."""
    _check(mixed, q_freqs, k_freqs, r)
    return _qkv_rope_op(mixed, q_freqs, k_freqs, r)


def qkv_rope_reference(mixed: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor,
                       r: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, b, ng, d = _check(mixed, q_freqs, k_freqs, r)
    q, k, v = torch.split(mixed, [r * d, d, d], dim=3)
    q = q.reshape(s, b, ng * r, d)

    def rot(x, f):
        f = f.to(x.dtype)[:, None, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return x * torch.cos(f) + torch.cat((-x2, x1), dim=-1) * torch.sin(f)

    return tuple(t.transpose(0, 1) for t in (rot(q, q_freqs), rot(k, k_freqs), v))
