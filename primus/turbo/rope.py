"""Fused QKV split + rotary embedding (Triton), forward and backward, as one torch op that torch.compile keeps whole.

Megatron's attention produces one fused projection per token, laid out per query group as
[q_1 .. q_r, k, v] heads of `d` channels ([s, b, ng, (r + 2) * d]). Unfused, it is split into views, RoPE is applied
to q and k (`x * cos + rotate_half(x) * sin`, rotate_half(x) = cat(-x2, x1)), and SDPA reads them through
[b, h, s, d] permutes; the backward slices the three gradients back into one tensor. Compiled with inductor that
path took ~20 ms of a 528 ms Llama-3.2-1B step on the H200 (three kernels at ~1/4 of the copy bandwidth).

Here each program takes ROWS consecutive head-rows of the projection (a head-row = one head's d channels of one
token; rows are flattened s-major as the projection stores them) and loads each row as its two rotary halves, so
every load and store is a contiguous, vectorised run; q, k (rotated) and v go to [b, s, heads, d] tensors (the
layout SDPA's fused kernels read natively as [b, h, s, d] views). The backward reads dq, dk, dv (any strides) and
writes the fused gradient row with the transposed rotation. cos/sin come from megatron's fp32 `freqs` through a
small per-call table ([s, 4, d] fp32, L2-resident; no bf16 rounding of cos/sin as eager megatron does): per
element, libdevice's sin/cos would cost more than the memory traffic. Bytes: one read and one write of the row each
way, the floor for a layout change.

History (bench/turbo_kernels.py, H200, Llama-3.2-1B bench shape): one program per token over a [heads x d] tile
with the rotary partner gathered by a permuted load: fwd+bwd 0.66 ms (2.45x inductor, but 29% of copy bandwidth);
a 4-tokens-per-program variant of it 3.09 ms.

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
def _cos_sin_table(QF, KF, CS, stride_qf, stride_kf, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """CS[s] = [cos(q_freqs[s]), sin(q_freqs[s]), cos(k_freqs[s]), sin(k_freqs[s])] (fp32, 4 x D per position).
    Computed once per call: libdevice sin/cos per element of the big kernels would cost more than their memory
    traffic (~30 instructions each)."""
    si = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    m = cols < D
    fq = tl.load(QF + si * stride_qf + cols, mask=m, other=0.0)
    fk = tl.load(KF + si * stride_kf + cols, mask=m, other=0.0)
    base = CS + si.to(tl.int64) * (4 * D) + cols
    tl.store(base, tl.cos(fq), mask=m)
    tl.store(base + D, tl.sin(fq), mask=m)
    tl.store(base + 2 * D, tl.cos(fk), mask=m)
    tl.store(base + 3 * D, tl.sin(fk), mask=m)


@triton.jit
def _row_tile(NROWS, B, H6, R: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """This program's ROWS head-rows of the fused projection, flattened s-major ([s, b, ng, r+2] order, the
    projection's own): token position (s, b) as int64, query group g and slot j (j < R query head, j == R key,
    j == R + 1 value) with the three slot masks as [ROWS, 1] columns, plus the half-row columns and the mask."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # int32: rows < NROWS < 2^31
    c = tl.arange(0, BLOCK_HALF)
    m = (rows < NROWS)[:, None] & (c < HALF)[None, :]
    tok = rows // H6
    w = rows % H6
    j = w % (R + 2)
    return (rows, c, m, (tok // B).to(tl.int64), (tok % B).to(tl.int64), w, w // (R + 2), j,
            (j < R)[:, None], (j == R)[:, None], (j == R + 1)[:, None])


@triton.jit
def _rotation(CS, s64, j, c, mr, R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr):
    """cos / sin of both rotary halves for each row (the q or the k angles of its position), from the table;
    masked-off rows (v, padding) read cos 1, sin 0."""
    t = (s64 * (4 * D) + tl.where(j < R, 0, 2 * D))[:, None] + c[None, :]
    return (tl.load(CS + t, mask=mr, other=1.0), tl.load(CS + t + HALF, mask=mr, other=1.0),
            tl.load(CS + t + D, mask=mr, other=0.0), tl.load(CS + t + D + HALF, mask=mr, other=0.0))


@triton.jit
def _qkv_rope_fwd(MIXED, CS, Q, K, V, NROWS, S, B, NG, H6, stride_ms, stride_mb,
                  R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    rows, c, m, s64, b64, w, g, j, is_q, is_k, is_v = _row_tile(NROWS, B, H6, R, HALF, ROWS, BLOCK_HALF)
    src = (s64 * stride_ms + b64 * stride_mb + w * D)[:, None] + c[None, :]
    x1 = tl.load(MIXED + src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(MIXED + src + HALF, mask=m, other=0.0).to(tl.float32)
    # rotary halves: y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2 (rotate_half(x) = cat(-x2, x1))
    cos1, cos2, sin1, sin2 = _rotation(CS, s64, j, c, m & ~is_v, R, D, HALF)
    y1 = tl.where(is_v, x1, x1 * cos1 - x2 * sin1).to(Q.dtype.element_ty)
    y2 = tl.where(is_v, x2, x2 * cos2 + x1 * sin2).to(Q.dtype.element_ty)
    pos = b64 * S + s64
    dq = ((pos * NG + g) * R + j)[:, None] * D + c[None, :]
    dkv = (pos * NG + g)[:, None] * D + c[None, :]
    tl.store(Q + dq, y1, mask=m & is_q)
    tl.store(Q + dq + HALF, y2, mask=m & is_q)
    tl.store(K + dkv, y1, mask=m & is_k)
    tl.store(K + dkv + HALF, y2, mask=m & is_k)
    tl.store(V + dkv, y1, mask=m & is_v)
    tl.store(V + dkv + HALF, y2, mask=m & is_v)


@triton.jit
def _qkv_rope_bwd(DQ, DK, DV, CS, DMIXED, NROWS, B, H6, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                  R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    rows, c, m, s64, b64, w, g, j, is_q, is_k, is_v = _row_tile(NROWS, B, H6, R, HALF, ROWS, BLOCK_HALF)
    oq = (b64 * sq_b + s64 * sq_s + (g * R + j) * sq_h)[:, None] + c[None, :]
    ok = (b64 * sk_b + s64 * sk_s + g * sk_h)[:, None] + c[None, :]
    ov = (b64 * sv_b + s64 * sv_s + g * sv_h)[:, None] + c[None, :]
    mq, mk, mv = m & is_q, m & is_k, m & is_v
    dy1 = (tl.load(DQ + oq, mask=mq, other=0.0).to(tl.float32) + tl.load(DK + ok, mask=mk, other=0.0).to(tl.float32)
           + tl.load(DV + ov, mask=mv, other=0.0).to(tl.float32))
    dy2 = (tl.load(DQ + oq + HALF, mask=mq, other=0.0).to(tl.float32)
           + tl.load(DK + ok + HALF, mask=mk, other=0.0).to(tl.float32)
           + tl.load(DV + ov + HALF, mask=mv, other=0.0).to(tl.float32))
    cos1, cos2, sin1, sin2 = _rotation(CS, s64, j, c, m & ~is_v, R, D, HALF)
    # the transposed rotation: dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1
    dst = DMIXED + rows.to(tl.int64)[:, None] * D + c[None, :]
    tl.store(dst, tl.where(is_v, dy1, dy1 * cos1 + dy2 * sin2).to(DMIXED.dtype.element_ty), mask=m)
    tl.store(dst + HALF, tl.where(is_v, dy2, dy2 * cos2 - dy1 * sin1).to(DMIXED.dtype.element_ty), mask=m)


ROWS = 64  # head-rows per program (bench/turbo_kernels.py measures the alternatives)


def _table(q_freqs: torch.Tensor, k_freqs: torch.Tensor) -> torch.Tensor:
    s, d = q_freqs.shape
    q_freqs, k_freqs = (f if f.stride(1) == 1 else f.contiguous() for f in (q_freqs, k_freqs))
    cs = _common.empty((s, 4, d), torch.float32, q_freqs.device)
    if s:
        _cos_sin_table[(s,)](q_freqs, k_freqs, cs, q_freqs.stride(0), k_freqs.stride(0), D=d,
                             BLOCK_D=triton.next_power_of_2(d), num_warps=1)
    return cs


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
    n = s * b * ng * (r + 2)
    if n:
        _qkv_rope_fwd[(triton.cdiv(n, ROWS),)](
            mixed, _table(q_freqs, k_freqs), q, k, v, n, s, b, ng, ng * (r + 2), mixed.stride(0), mixed.stride(1),
            R=r, D=d, HALF=d // 2, ROWS=ROWS, BLOCK_HALF=triton.next_power_of_2(d // 2), num_warps=4)
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
    n = s * b * ng * (r + 2)
    if n:
        _qkv_rope_bwd[(triton.cdiv(n, ROWS),)](
            dq, dk, dv, _table(q_freqs, k_freqs), dmixed, n, b, ng * (r + 2),
            dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2),
            R=r, D=d, HALF=d // 2, ROWS=ROWS, BLOCK_HALF=triton.next_power_of_2(d // 2), num_warps=4)
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
