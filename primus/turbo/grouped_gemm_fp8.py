"""fp8 grouped GEMM over MoE experts on torch._scaled_grouped_mm (CUTLASS, CUDA sm90), rowwise scales.

    prov, why = fp8_grouped_choice(x, w, fmt, trans_b)     # "torch_scaled" | "triton", and the reason
    y = _ScaledGroupedMM.apply(x, w, ends, trans_b)        # via grouped_gemm.fp8_grouped_gemm(..., provider=...)

The recipe (the way torchao's MoE fp8 training scales, our own kernels): every GEMM operand is quantised to e4m3
with one fp32 scale per row along that GEMM's contraction dim, and the CUTLASS epilogue multiplies the fp32
accumulator by scale_a[row] * scale_b[col]:
  forward  y_g  = x_g @ w[g]        x per token (along K),  w per expert and output column (along K)
  dgrad    dx_g = dy_g @ w[g]^T     dy per token (along N), w per expert and input column (along N)
  wgrad    dw[g] = x_g^T @ dy_g     x and dy per expert and column, along that expert's tokens (per-group scales)
Forward uses fast accumulation (as the portable fp8 linear does), dgrad and wgrad the split accumulator.

Upstream rules (pytorch/pytorch; read at the revisions the code search holds, 2025/26):
  * aten/src/ATen/native/cuda/GroupedBlas.cpp `_scaled_grouped_mm_cuda`: CUDA sm90/sm100 or ROCm MI300+ devices
    (`_scaled_mm_allowed_device`); mat_a must not be transposed (row-major), mat_b must be (column-major, i.e. the
    `.transpose(-2, -1)` of a row-major tensor); 2d or 3d each; mat_a.size(-1) % 16 == 0 and both trailing dims of
    mat_b % 16 == 0; offs required when an operand is 2d, 1d int32 (cumulative ends, no leading 0); no bias, no
    scale_result; out_dtype bf16 only. Rowwise: fp32 scales, `_check_scales_fp8_rowwise`: a 2d operand takes a 1d
    contiguous scale of mat.size(dim) * (2d x 2d: number of groups) elements, a 3d one a (G, size) scale with
    stride(1) == 1 (scale_a along mat_a's rows, scale_b along mat_b's columns).
  * `_f8_f8_bf16_rowwise_grouped_mm_cuda`: both operands float8_e4m3fn (so e5m2 gradients - fmt "hybrid" - cannot
    run there); ROCm goes through FBGEMM/MSLK with e4m3fnuz instead (not wired here).
  * aten/src/ATen/native/cuda/ScaledGroupMM.cu: the CUTLASS kernel is built for ArchTag Sm90 only, and fewer than
    1024 groups; torch/testing/_internal/common_cuda.py PLATFORM_SUPPORTS_FP8_GROUPED_GEMM = SM90 and not SM100
    (sm100 has the mxfp8 grouped GEMM instead), so this path is sm90-only; test/test_scaled_matmul_cuda.py
    test_scaled_grouped_gemm_{2d_2d,2d_3d} exercise the two layouts used here.
  * aten/src/ATen/native/cuda/GroupMMCommon.cuh `prepare_grouped_gemm_data`: group addresses step along the dynamic
    dim. 2d x 3d (offs along M, forward / dgrad): A and the output step by whole rows, nothing to align, any group
    size (0 included). 2d x 2d (offs along K, wgrad): A row-major and B column-major step along their contiguous
    dim, so every group but the last must be a multiple of 16 fp8 elements (TMA: 16-byte addresses), and older
    revisions assert each group > 0 ("CUTLASS cannot handle delta=0"). Megatron's tokens per expert are
    arbitrary, so the wgrad operands are written with each expert's tokens padded to a multiple of 16 (an empty
    expert gets 16) with zero rows, by the per-group cast kernel below, at offsets computed on the device (no
    host sync). Zero rows add nothing: dw[g] is exact in the pad, and 0 for an empty expert.
Everything else (ROCm, sm100, other GPUs, the CPU interpreter, fmt "hybrid", dims not multiples of 16, non-bf16
operands) runs grouped_gemm's Triton fp8 kernels (tensorwise scales); `fp8_grouped_choice` says which and why.
"""
from __future__ import annotations

import logging
from typing import Iterable, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from primus.turbo import _common
from primus.turbo.fp8_linear import WEIGHT_CASTS, _fmax, cast_rowwise

log = logging.getLogger("primus.turbo")

MAX_GROUPS = 1024  # ScaledGroupMM.cu: "Can't process more than 1024 groups" (group_count < 1024)
ALIGN = 16  # fp8 elements per 16 bytes: the dims _scaled_grouped_mm checks and the wgrad group alignment


# ------------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _cast_rows_3d(X, Y, S, R, C, s_xb, s_xr, s_xc, FP8_MAX, BR: tl.constexpr, BC: tl.constexpr):
    """Batch b = program_id(1): each row of X[b] (R, C), any strides, quantised along C into Y[b] (R, C) contiguous,
    S[b, r] = its scale_inv. Used for the weights read through a transposed view (s_xr == 1): tiles are loaded
    coalesced along R and stored coalesced along C."""
    b = tl.program_id(1)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = rows < R
    r64 = rows[:, None].to(tl.int64)
    xb = X + b.to(tl.int64) * s_xb
    amax = tl.zeros((BR,), dtype=tl.float32)
    for i in range(0, tl.cdiv(C, BC)):
        cols = i * BC + tl.arange(0, BC)
        x = tl.load(xb + r64 * s_xr + cols[None, :].to(tl.int64) * s_xc,
                    mask=rmask[:, None] & (cols[None, :] < C), other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    scale = FP8_MAX / tl.maximum(amax, 1e-12)
    yb = Y + b.to(tl.int64) * R * C
    for i in range(0, tl.cdiv(C, BC)):
        cols = i * BC + tl.arange(0, BC)
        m = rmask[:, None] & (cols[None, :] < C)
        x = tl.load(xb + r64 * s_xr + cols[None, :].to(tl.int64) * s_xc, mask=m, other=0.0)
        q = tl.clamp(x.to(tl.float32) * scale[:, None], -FP8_MAX, FP8_MAX)
        tl.store(yb + r64 * C + cols[None, :], q.to(Y.dtype.element_ty), mask=m)
    tl.store(S + b.to(tl.int64) * R + rows, 1.0 / scale, mask=rmask)


@triton.jit
def _cast_groups_t(X, YT, S, ENDS, PENDS, C, s_xm, s_xc, s_ym, FP8_MAX, BM: tl.constexpr, BC: tl.constexpr):
    """Group g = program_id(1), columns of block program_id(0): the rows [start, end) of X (M, C) (expert g's tokens)
    quantised per column along those tokens, written transposed: YT[c, pstart + j] for j < PENDS[g] - pstart (the
    padded group), zero where j >= end - start. S[g, c] = the column's scale_inv. One amax pass, one cast pass."""
    g = tl.program_id(1)
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    cmask = cols < C
    c64 = cols[None, :].to(tl.int64)
    end = tl.load(ENDS + g)
    start = tl.load(ENDS + g - 1, mask=g > 0, other=0)
    pend = tl.load(PENDS + g)
    pstart = tl.load(PENDS + g - 1, mask=g > 0, other=0)
    m = end - start
    amax = tl.zeros((BC,), dtype=tl.float32)
    for j0 in range(0, m, BM):
        j = j0 + tl.arange(0, BM)
        x = tl.load(X + (start + j)[:, None].to(tl.int64) * s_xm + c64 * s_xc,
                    mask=(j < m)[:, None] & cmask[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=0))
    scale = FP8_MAX / tl.maximum(amax, 1e-12)
    for j0 in range(0, pend - pstart, BM):
        j = j0 + tl.arange(0, BM)
        x = tl.load(X + (start + j)[:, None].to(tl.int64) * s_xm + c64 * s_xc,
                    mask=(j < m)[:, None] & cmask[None, :], other=0.0)
        q = tl.clamp(x.to(tl.float32) * scale[None, :], -FP8_MAX, FP8_MAX)
        tl.store(YT + c64 * s_ym + (pstart + j)[:, None], q.to(YT.dtype.element_ty),
                 mask=(j < pend - pstart)[:, None] & cmask[None, :])
    tl.store(S + g.to(tl.int64) * C + cols, 1.0 / scale, mask=cmask)


# ------------------------------------------------------------------------------------------------ cast wrappers


def _rows_config(C: int) -> dict:
    """A fixed config of fp8_linear.cast_rowwise's contiguous-rows space (its own default): the token count changes
    from call to call (routing, expert parallelism), and a tuned launch would autotune once per new count."""
    bc = min(1024, triton.next_power_of_2(C))
    return {"BR": max(1, 2048 // bc), "BC": bc, "num_warps": 4}


def cast_tokens(x2: torch.Tensor, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(M, C) -> fp8 (M, C) with one scale per row along C, scale_inv (M,) (fp8_linear.cast_rowwise)."""
    y, s = cast_rowwise(x2, dtype, config=_rows_config(x2.shape[1]))
    return y, s.view(-1)


def cast_experts(w_rc: torch.Tensor, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row of each expert of a (G, R, C) view quantised along C -> fp8 (G, R, C) contiguous, scale_inv (G, R).
    Contiguous rows go through fp8_linear.cast_rowwise (tuned per weight shape: fixed over a run), a transposed
    view through `_cast_rows_3d`."""
    G, R, C = w_rc.shape
    if w_rc.stride(2) == 1 and w_rc.stride(0) == R * w_rc.stride(1) and w_rc.stride(1) >= C:
        flat = w_rc.as_strided((G * R, C), (w_rc.stride(1), 1))
        y, s = cast_rowwise(flat, dtype)
        return y.view(G, R, C), s.view(G, R)
    y = _common.empty((G, R, C), dtype, w_rc.device)
    s = _common.empty((G, R), torch.float32, w_rc.device)
    BR, BC = (16, 32) if _common.interpreting() else (64, 64)
    _cast_rows_3d[(triton.cdiv(R, BR), G)](w_rc, y, s, R, C, w_rc.stride(0), w_rc.stride(1), w_rc.stride(2),
                                           _fmax(dtype), BR=BR, BC=BC, num_warps=4)
    return y, s


def padded_ends(ends: torch.Tensor) -> torch.Tensor:
    """Cumulative ends of the groups padded to multiples of ALIGN (an empty group to ALIGN), int32, on the device:
    the wgrad offsets along the token dim (every group a positive multiple of 16)."""
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    p = ((sizes + (ALIGN - 1)) // ALIGN * ALIGN).clamp_min(ALIGN)
    return torch.cumsum(p, 0).to(torch.int32)


def padded_len(M: int, G: int) -> int:
    """A host-side bound on the padded token count (each group gains < 16, an empty one 16): no device sync."""
    return (M + ALIGN - 1) // ALIGN * ALIGN + ALIGN * G


def cast_groups_t(x2: torch.Tensor, ends: torch.Tensor, pends: torch.Tensor, MP: int,
                  dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(M, C) rows grouped by `ends` -> the transpose (C, MP) fp8, group g in columns [pends[g-1], pends[g]) with one
    scale per (group, column) along the group's tokens, zero in its pad; scale_inv (G, C). Columns past pends[-1]
    are not written (the GEMM does not read them)."""
    M, C = x2.shape
    G = ends.shape[0]
    yt = _common.empty((C, MP), dtype, x2.device)
    s = _common.empty((G, C), torch.float32, x2.device)
    BM, BC = (16, 32) if _common.interpreting() else (64, 64)
    _cast_groups_t[(triton.cdiv(C, BC), G)](x2, yt, s, ends, pends, C, x2.stride(0), x2.stride(1), yt.stride(0),
                                            _fmax(dtype), BM=BM, BC=BC, num_warps=4)
    return yt, s


# ------------------------------------------------------------------------------------------------------ the GEMM


def _sgmm(a, b, sa, sb, offs, fast: bool) -> torch.Tensor:
    return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=fast)


class _ScaledGroupedMM(torch.autograd.Function):
    """x (M, K) bf16 rows grouped by `ends` (int32 cumulative, on the device), w (G, K, N) or, trans_b, (G, N, K)
    bf16. Forward, dgrad and wgrad on torch._scaled_grouped_mm, e4m3 operands, rowwise / per-group scales."""

    @staticmethod
    def forward(ctx, x, w, ends, trans_b):
        f_dt = torch.float8_e4m3fn
        M, G = x.shape[0], w.shape[0]
        w_kn = w.transpose(1, 2) if trans_b else w  # (G, K, N) view
        K, N = w_kn.shape[1], w_kn.shape[2]
        ctx.trans_b, ctx.shape = trans_b, (M, K, N, G)
        need_dw = ctx.needs_input_grad[1]
        if M == 0:
            ctx.save_for_backward(w, ends)
            return x.new_zeros((0, N))
        xq, sx = cast_tokens(x, f_dt)
        # (G, N, K) along K, scales (G, N); kept through a step when the trainer keeps weight casts (WEIGHT_CASTS)
        wq, sw = WEIGHT_CASTS.get(w, ("experts_k", f_dt, trans_b), lambda: cast_experts(w_kn.transpose(1, 2), f_dt))
        y = _sgmm(xq, wq.transpose(1, 2), sx, sw, ends, fast=True)  # (M, K) @ (G, K, N) column-major
        if need_dw:  # the wgrad operand now (fp8 saved instead of x): x^T (K, MP), per (expert, column) scales
            pends = padded_ends(ends)
            xt, sxt = cast_groups_t(x, ends, pends, padded_len(M, G), f_dt)
            ctx.save_for_backward(w, ends, pends, xt, sxt)
        else:
            ctx.save_for_backward(w, ends)
        return y

    @staticmethod
    def backward(ctx, dy):
        f_dt = torch.float8_e4m3fn
        M, K, N, G = ctx.shape
        w, ends = ctx.saved_tensors[:2]
        dx = dw = None
        if M == 0:
            if ctx.needs_input_grad[0]:
                dx = dy.new_zeros((0, K))
            if ctx.needs_input_grad[1]:
                dw = torch.zeros_like(w)
            return dx, dw, None, None
        dy = dy.contiguous()
        if ctx.needs_input_grad[0]:
            w_kn = w.transpose(1, 2) if ctx.trans_b else w
            dyq, sdy = cast_tokens(dy, f_dt)
            wq, sw = WEIGHT_CASTS.get(w, ("experts_n", f_dt, ctx.trans_b),
                                      lambda: cast_experts(w_kn, f_dt))  # (G, K, N) along N, scales (G, K)
            dx = _sgmm(dyq, wq.transpose(1, 2), sdy, sw, ends, fast=False)  # (M, N) @ (G, N, K) column-major
        if ctx.needs_input_grad[1]:
            pends, xt, sxt = ctx.saved_tensors[2:]
            dyt, sdyt = cast_groups_t(dy, ends, pends, xt.shape[1], f_dt)  # dy^T (N, MP), scales (G, N)
            if ctx.trans_b:  # dw[g] (N, K) = dy_g^T @ x_g
                dw = _sgmm(dyt, xt.t(), sdyt.view(-1), sxt.view(-1), pends, fast=False)
            else:  # dw[g] (K, N) = x_g^T @ dy_g
                dw = _sgmm(xt, dyt.t(), sxt.view(-1), sdyt.view(-1), pends, fast=False)
            dw = dw.to(w.dtype)
        return dx, dw, None, None


# ------------------------------------------------------------------------------------------------ which provider


def plan(fmt: str, *, has_op: bool, device_type: str, hip: bool, capability: Optional[Tuple[int, int]],
         x_dtype, w_dtype, dims: Iterable[int], groups: int) -> Tuple[str, str]:
    """("torch_scaled" | "triton", why): the rules above, on facts only (pure; tests call it directly)."""
    if fmt != "e4m3":
        return "triton", (f"fp8 format {fmt}: e5m2 gradients, and torch._scaled_grouped_mm takes e4m3 operands only "
                          "(precision.fp8=e4m3 would run it)")
    if not has_op:
        return "triton", "this torch has no torch._scaled_grouped_mm"
    if device_type != "cuda":
        return "triton", f"{device_type} device (torch._scaled_grouped_mm is CUDA/ROCm only)"
    if hip:
        return "triton", "ROCm: torch's rowwise fp8 grouped GEMM there needs an FBGEMM/MSLK build (not wired)"
    if capability is None or capability[0] != 9:
        cap = "sm%d%d" % tuple(capability) if capability else "unknown GPU"
        return "triton", f"{cap}: torch's rowwise fp8 grouped GEMM is a CUTLASS sm90 kernel"
    if x_dtype != torch.bfloat16 or w_dtype != torch.bfloat16:
        return "triton", f"operands {x_dtype} x {w_dtype}: the CUTLASS path here takes bf16 (it writes bf16)"
    bad = sorted({d for d in dims if d % ALIGN})
    if bad:
        return "triton", f"dims {bad} not multiples of {ALIGN} (torch._scaled_grouped_mm's rule)"
    if groups >= MAX_GROUPS:
        return "triton", f"{groups} groups: the CUTLASS kernel takes fewer than {MAX_GROUPS}"
    return "torch_scaled", "torch._scaled_grouped_mm (CUTLASS sm90), e4m3, rowwise scales"


def plan_for(device, fmt: str, dims: Iterable[int], groups: int, dtype=torch.bfloat16,
             w_dtype=torch.bfloat16) -> Tuple[str, str]:
    """`plan` with the facts of `device` (a setup-time answer: the megatron trainer records it)."""
    dev = torch.device(device)
    cap = None
    if dev.type == "cuda" and torch.version.hip is None and torch.cuda.is_available():
        cap = tuple(torch.cuda.get_device_capability(dev))  # (cached by torch: device properties)
    return plan(fmt, has_op=hasattr(torch, "_scaled_grouped_mm"), device_type=dev.type,
                hip=torch.version.hip is not None, capability=cap, x_dtype=dtype, w_dtype=w_dtype, dims=dims,
                groups=groups)


_CHOICES: dict = {}


def fp8_grouped_choice(x: torch.Tensor, w: torch.Tensor, fmt: str, trans_b: bool = False) -> Tuple[str, str]:
    """The provider for this call and why: decided (and logged) once per device, format, dtypes and shapes - the
    experts' GEMMs ask in every forward and backward."""
    key = (str(x.device), fmt, x.dtype, w.dtype, x.shape[1], tuple(w.shape), trans_b)
    out = _CHOICES.get(key)
    if out is None:
        out = _CHOICES[key] = plan_for(x.device, fmt, (x.shape[1], w.shape[1], w.shape[2]), w.shape[0], x.dtype,
                                       w.dtype)
        log.info("fp8 grouped GEMM K=%d w=%s trans_b=%s: %s (%s)", x.shape[1], tuple(w.shape), trans_b, *out)
    return out


def fp8_grouped_provider(x: torch.Tensor, w: torch.Tensor, fmt: str = "e4m3", trans_b: bool = False) -> str:
    """"torch_scaled" (torch._scaled_grouped_mm) or "triton" (grouped_gemm's fp8 kernels) for this call."""
    return fp8_grouped_choice(x, w, fmt, trans_b)[0]


def experts_summary(device, fmt: str, shapes: Sequence[Tuple[int, int]], groups: int) -> str:
    """One line for backend_info.fp8_experts: which fp8 grouped GEMM the experts' (K, N) GEMMs run, and why."""
    prov, why = plan_for(device, fmt, [d for s in shapes for d in s], groups)
    if prov == "torch_scaled":
        # the H200 figures of docs/benchmarks.md, 2026-12-02 (fwd+bwd, 4 micro batches, the fp8 weight cache on)
        return (f"fp8 {fmt} rowwise: {why} (primus.turbo.grouped_gemm_fp8; on the H200 1.11x the bf16 grouped GEMM "
                "at Mixtral-8x7B's 8 experts, 0.53-0.74x at 64-128 experts of ffn 768-1408)")
    return (f"fp8 {fmt} tensorwise: primus' Triton grouped GEMM (slower than the bf16 one on the H200), because "
            f"{why}")
