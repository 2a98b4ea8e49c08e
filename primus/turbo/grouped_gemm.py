"""Grouped GEMM over MoE experts: y[rows of group g] = x[rows of group g] @ w[g], forward and backward.

    y = grouped_gemm(x, w, group_sizes)          # x (M, K) rows sorted by expert, w (G, K, N), sizes (G,) ints
    y = grouped_gemm(x, w, group_sizes, trans_b=True)   # w (G, N, K)
    y = fp8_grouped_gemm(x, w, group_sizes, trans_b, fmt="hybrid")   # fp8 operands (provider below)

`group_sizes` may be a device tensor: nothing here reads it on the host (sync-free; the Triton kernels walk the
groups on the device). Providers, first that serves the device/dtype:
  "torch"   torch._grouped_mm (CUTLASS; CUDA sm90/sm100, bf16), autograd built in
  "triton"  this file's persistent Triton grouped GEMM (any GPU Triton runs on, ROCm included; the interpreter)
  "loop"    a per-expert torch.mm loop (reference / tests only; syncs on group sizes)
fp8 (forward, dgrad and wgrad in fp8), providers chosen by grouped_gemm_fp8.fp8_grouped_provider (logged):
  "torch_scaled"  torch._scaled_grouped_mm (CUTLASS, CUDA sm90 only), e4m3, rowwise scales (grouped_gemm_fp8.py)
  "triton"        the Triton kernels here with fp8 operands (e4m3; e5m2 gradients under "hybrid"), one scale for
                  the tokens, one per expert weight and one for the output gradient, applied to the fp32
                  accumulator: ROCm, sm100, other GPUs, the interpreter, fmt "hybrid", dims not multiples of 16.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import triton
import triton.language as tl

from primus.turbo import _common


@triton.jit
def _gg_fwd(X, W, Y, ENDS, G, N, K, s_xm, s_xk, s_wg, s_wk, s_wn, s_ym, s_yn, NUM_PROGS, SX, SW,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCALED: tl.constexpr = False):
    """Persistent: program p takes tiles p, p+P, ... of the concatenated (group, m-tile, n-tile) space.
    SCALED (fp8 operands): the fp32 accumulator is multiplied by SX[0] (X's scale_inv) * SW[g] (group g's)."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BN)
    base = 0
    start = 0
    for g in range(0, G):
        end = tl.load(ENDS + g)
        m = end - start
        tiles = tl.cdiv(m, BM) * tiles_n
        first = base + (pid - base % NUM_PROGS + NUM_PROGS) % NUM_PROGS
        for t in range(first, base + tiles, NUM_PROGS):
            local = t - base
            tm = local // tiles_n
            tn = local % tiles_n
            rm = start + tm * BM + tl.arange(0, BM)
            rn = tn * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            mmask = rm < end
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            wg = W + g * s_wg.to(tl.int64)
            for kk in range(0, tl.cdiv(K, BK)):
                k = kk * BK + rk
                a = tl.load(X + rm[:, None].to(tl.int64) * s_xm + k[None, :] * s_xk,
                            mask=mmask[:, None] & (k[None, :] < K), other=0.0)
                b = tl.load(wg + k[:, None].to(tl.int64) * s_wk + rn[None, :] * s_wn,
                            mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
            if SCALED:
                acc = acc * (tl.load(SX) * tl.load(SW + g))
            tl.store(Y + rm[:, None].to(tl.int64) * s_ym + rn[None, :] * s_yn, acc.to(Y.dtype.element_ty),
                     mask=mmask[:, None] & (rn[None, :] < N))
        base += tiles
        start = end


@triton.jit
def _gg_wgrad(X, DY, DW, ENDS, K, N, s_xm, s_xk, s_dm, s_dn, s_wg, s_wk, s_wn, SX, SD,
              BK: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, SCALED: tl.constexpr = False,
              ACC: tl.constexpr = False):
    """DW[g] (K, N) = X[g rows]^T @ DY[g rows]; grid (G * K tiles * N tiles,). Empty groups write zeros.
    SCALED (fp8 operands): times SX[0] * SD[0] (the two operands' scale_inv).
    ACC: DW[g] += instead (DW is the fp32 / bf16 main_grad; the sum in fp32, rounded once to DW's dtype).
    The group is the slowest index of the program id, so the programs running at once share one group's rows of X
    and DY (a few MB) in L2: with the group fastest, as a (G, K tiles, N tiles) grid runs, each tile read its rows
    from HBM (at 64 experts of 2048 x 2816, 8.9 GB a call instead of 0.5 GB)."""
    tiles_n = tl.cdiv(N, BN)
    per_group = tl.cdiv(K, BK) * tiles_n
    pid = tl.program_id(0)
    g = pid // per_group
    local = pid % per_group
    rk = (local // tiles_n) * BK + tl.arange(0, BK)
    rn = (local % tiles_n) * BN + tl.arange(0, BN)
    end = tl.load(ENDS + g)
    start = tl.load(ENDS + g - 1, mask=g > 0, other=0)
    dw = DW + g.to(tl.int64) * s_wg + rk[:, None] * s_wk + rn[None, :] * s_wn
    m = (rk[:, None] < K) & (rn[None, :] < N)
    acc = tl.zeros((BK, BN), dtype=tl.float32)
    for mm in range(0, tl.cdiv(end - start, BM)):
        rm = start + mm * BM + tl.arange(0, BM)
        mmask = rm < end
        xt = tl.load(X + rm[None, :].to(tl.int64) * s_xm + rk[:, None] * s_xk,
                     mask=mmask[None, :] & (rk[:, None] < K), other=0.0)
        d = tl.load(DY + rm[:, None].to(tl.int64) * s_dm + rn[None, :] * s_dn,
                    mask=mmask[:, None] & (rn[None, :] < N), other=0.0)
        acc += tl.dot(xt, d)
    if SCALED:
        acc = acc * (tl.load(SX) * tl.load(SD))
    if ACC:
        acc += tl.load(dw, mask=m, other=0.0).to(tl.float32)
    tl.store(dw, acc.to(DW.dtype.element_ty), mask=m)


def _cfg():
    if _common.interpreting():
        return 16, 32, 32, 2
    return 128, 128, 64, 8


def _triton_fwd(x, w_kn, ends, N, K, out_dtype=None, sx=None, sw=None):
    """w_kn: a (G, K, N) view (any strides). sx / sw: fp8 operands' scale_inv (scalar / per group)."""
    M = x.shape[0]
    y = _common.empty((M, N), out_dtype or x.dtype, x.device)
    BM, BN, BK, warps = _cfg()
    progs = _common.num_sms(x.device) * (1 if _common.interpreting() else 2)
    G = w_kn.shape[0]
    scaled = sx is not None
    _gg_fwd[(progs,)](x, w_kn, y, ends, G, N, K, x.stride(0), x.stride(1), w_kn.stride(0), w_kn.stride(1),
                      w_kn.stride(2), y.stride(0), y.stride(1), progs, sx if scaled else y, sw if scaled else y,
                      BM=BM, BN=BN, BK=BK, SCALED=scaled, num_warps=warps, num_stages=3)
    return y


def _triton_wgrad(x, dy, ends, G, out_dtype, trans_b: bool, sx=None, sd=None):
    K, N = x.shape[1], dy.shape[1]
    dw = _common.empty((G, N, K) if trans_b else (G, K, N), out_dtype, x.device)
    v = dw.transpose(1, 2) if trans_b else dw  # write through a (G, K, N) view
    BMr, BNr, BKr, warps = _cfg()
    BKw, BNw, BMw = (32, 32, 16) if _common.interpreting() else (128, 128, 64)
    scaled = sx is not None
    _gg_wgrad[(G * triton.cdiv(K, BKw) * triton.cdiv(N, BNw),)](
        x, dy, v, ends, K, N, x.stride(0), x.stride(1), dy.stride(0), dy.stride(1), v.stride(0), v.stride(1),
        v.stride(2), sx if scaled else dw, sd if scaled else dw, BK=BKw, BN=BNw, BM=BMw, SCALED=scaled,
        num_warps=warps, num_stages=3)
    return dw


class _TritonGroupedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, ends, trans_b):
        w_kn = w.transpose(1, 2) if trans_b else w
        K, N = w_kn.shape[1], w_kn.shape[2]
        ctx.save_for_backward(x, w, ends)
        ctx.trans_b = trans_b
        return _triton_fwd(x, w_kn, ends, N, K)

    @staticmethod
    def backward(ctx, dy):
        x, w, ends = ctx.saved_tensors
        dy = dy.contiguous()
        w_kn = w.transpose(1, 2) if ctx.trans_b else w
        dx = dw = None
        if ctx.needs_input_grad[0]:
            w_nk = w_kn.transpose(1, 2)  # (G, N, K)
            dx = _triton_fwd(dy, w_nk, ends, w_nk.shape[2], w_nk.shape[1])
        if ctx.needs_input_grad[1]:
            dw = _triton_wgrad(x, dy, ends, w.shape[0], w.dtype, ctx.trans_b)
        return dx, dw, None, None


# ------------------------------------------------------------------ weight gradients accumulated into main_grad
# training.gradient_accumulation_fusion for the experts: megatron-core's GroupedMLP has no fused path (its flag reaches
# the linears only), so each micro batch wrote the experts' bf16 weight gradients and megatron's DDP hook then added
# them into the fp32 main_grad, 10 bytes a parameter in torch's unvectorised mixed-dtype add: with 64 experts that
# was 15% of a compiled DeepSeek-V2-Lite step on an H100 (docs/benchmarks.md). Here the weight-gradient GEMM adds its
# fp32 tile into main_grad itself (a read and a write of main_grad, no bf16 gradient, no second kernel).


# The accumulating weight-gradient GEMM's launch configs, autotuned on the GPU per (K, N) (_common.Tuned; the
# hand-picked one first). Each output tile is a tile of main_grad read and written once (8 bytes an element) beside a
# short reduction over one expert's rows (768 at DeepSeek-V2-Lite's 8192 tokens top-6 over 64 experts), so the
# kernel is as much main_grad traffic as GEMM. At 4 warps two programs share an SM, one's main_grad traffic beside
# the other's GEMM: on an H100 at the four expert shapes of DeepSeek-V2-Lite and Qwen3-30B-A3B these two ran
# 1.37-1.49x CUTLASS's weight gradient plus the add, where 128 x 128 at 8 warps (one program an SM) ran 0.99-1.16x,
# reading main_grad's tile before the reduction instead of after it 5-12% slower, and BK 64 or BN 256
# 1.15-1.29x (docs/turbo.md). Autotuning runs each config on a copy of main_grad (stateful), once per shape: at
# DeepSeek-V2-Lite's gate/up experts 1.5 GB for a moment.
_WGRAD_ACC = _common.Tuned(_gg_wgrad, [
    {"BK": 128, "BN": 128, "BM": 64, "num_warps": 4, "num_stages": 3},
    {"BK": 128, "BN": 128, "BM": 32, "num_warps": 4, "num_stages": 4},
], key=["K", "N"])
_WGRAD_ACC_INTERPRETED = {"BK": 32, "BN": 32, "BM": 16, "num_warps": 4}


def wgrad_accumulate_launch(x: torch.Tensor, dy: torch.Tensor, ends: torch.Tensor, mg: torch.Tensor,
                            config: Optional[dict] = None) -> None:
    """mg (G, K, N) += the grouped x^T @ dy in the Triton kernel: `config` one of _WGRAD_ACC's (the bench times each),
    else the tuned pick."""
    G, K, N = mg.shape
    args = (x, dy, mg, ends, K, N, x.stride(0), x.stride(1), dy.stride(0), dy.stride(1), mg.stride(0), mg.stride(1),
            mg.stride(2), mg, mg)
    grid = lambda meta: (G * triton.cdiv(K, meta["BK"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
    if config is not None:
        _WGRAD_ACC.run(config, grid, args, SCALED=False, ACC=True)
    else:
        _WGRAD_ACC.launch(grid, args, default=_WGRAD_ACC_INTERPRETED, stateful=(2,), SCALED=False, ACC=True)


@torch.library.custom_op("primus::grouped_wgrad_accumulate", mutates_args=("main_grad",))
def grouped_wgrad_accumulate(x: torch.Tensor, dy: torch.Tensor, ends: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad viewed (G, K, N): main_grad[g] += x[rows of g]^T @ dy[rows of g], summed in fp32. `ends` (G,) the
    groups' cumulative row ends on the device (nothing read on the host on a GPU)."""
    G, K, N = ends.shape[0], x.shape[1], dy.shape[1]
    mg = main_grad.view(G, K, N)
    if x.is_cuda or _common.interpreting():
        wgrad_accumulate_launch(x, dy, ends, mg)
        return
    start = 0
    for g, end in enumerate(ends.tolist()):  # a CPU tensor: no device to sync with
        if end > start:
            mg[g].addmm_(x[start:end].t().to(mg.dtype), dy[start:end].to(mg.dtype))
        start = end


@grouped_wgrad_accumulate.register_fake
def _(x, dy, ends, main_grad) -> None:
    return None


class _GroupedGemmAccum(torch.autograd.Function):
    """y = grouped_gemm(x, w); backward: dx as grouped_gemm's, the weight gradient added into `main_grad` by
    `grouped_wgrad_accumulate` and none returned for w (megatron's DDP hook, which would add it, does not run)."""

    @staticmethod
    def forward(ctx, x, w, ends, main_grad, provider):
        ctx.save_for_backward(x, w, ends)
        ctx.main_grad = main_grad  # not saved_tensors: it changes in place between micro batches, by design
        ctx.provider = provider
        return _mm(x, w, ends, provider)

    @staticmethod
    def backward(ctx, dy):
        x, w, ends = ctx.saved_tensors
        dy = dy.contiguous()
        dx = _mm(dy, w.transpose(1, 2), ends, ctx.provider) if ctx.needs_input_grad[0] else None
        torch.ops.primus.grouped_wgrad_accumulate(x, dy, ends, ctx.main_grad)
        return dx, None, None, None, None


def _mm(x, w_kn, ends, provider):
    """(M, N) = grouped x @ w_kn (G, K, N) without autograd: torch._grouped_mm, or the Triton kernel."""
    if provider == "torch":
        return torch._grouped_mm(x, w_kn, offs=ends)
    return _triton_fwd(x, w_kn, ends, w_kn.shape[2], w_kn.shape[1])


def grouped_gemm_accumulate(x: torch.Tensor, w: torch.Tensor, group_sizes: Union[torch.Tensor, Sequence[int]],
                            main_grad: torch.Tensor, provider: Optional[str] = None) -> torch.Tensor:
    """`grouped_gemm(x, w, group_sizes)` (w (G, K, N)) whose weight gradient is added into `main_grad` (w's shape or
    its parameter's, viewed (G, K, N); fp32 or the weight's dtype) instead of returned. provider: "torch" or
    "triton" for the two GEMMs (None: grouped_gemm's pick)."""
    provider = provider or pick_provider(x, w)
    if provider not in ("torch", "triton"):
        raise ValueError(f"grouped_gemm_accumulate provider must be torch or triton, not {provider!r}")
    if main_grad.numel() != w.numel() or not main_grad.is_contiguous():
        raise ValueError(f"grouped_gemm_accumulate: main_grad {tuple(main_grad.shape)} must be contiguous with the "
                         f"{w.numel()} elements of w {tuple(w.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    return _GroupedGemmAccum.apply(x, w, _ends(group_sizes, x.device), main_grad, provider)


def _quantize_experts(w: torch.Tensor, dtype):
    """Per-expert tensorwise fp8: (w_fp8 same shape, scale_inv (G,) fp32)."""
    from primus.turbo.fp8_linear import _fmax

    fmax = _fmax(dtype)
    scale = fmax / w.detach().abs().amax(dim=(1, 2)).float().clamp_min(1e-12)
    wq = (w.detach().float() * scale[:, None, None]).clamp(-fmax, fmax).to(dtype)
    return wq, (1.0 / scale).contiguous()


class _Fp8GroupedGemm(torch.autograd.Function):
    """Tensorwise fp8 (one scale for the tokens, one per expert weight, one for the output gradient); fp32
    accumulation, bf16 outputs, weight gradient in the weight's dtype. fmt "hybrid": e5m2 gradients."""

    @staticmethod
    def forward(ctx, x, w, ends, trans_b, fmt):
        from primus.turbo.fp8_linear import WEIGHT_CASTS, cast_tensorwise, fp8_formats

        f_dt, g_dt = fp8_formats(x.device, fmt)
        xq, _, sx = cast_tensorwise(x, f_dt, want_y=True, want_t=False, pad_t=False)
        # kept through a step when the trainer keeps weight casts (fp8_linear.WEIGHT_CASTS); the backward reuses it
        wq, sw = WEIGHT_CASTS.get(w, ("experts_tensorwise", f_dt), lambda: _quantize_experts(w, f_dt))
        w_kn = wq.transpose(1, 2) if trans_b else wq
        K, N = w_kn.shape[1], w_kn.shape[2]
        ctx.save_for_backward(xq, sx, wq, sw, ends)
        ctx.trans_b, ctx.g_dt, ctx.x_dtype, ctx.w_dtype = trans_b, g_dt, x.dtype, w.dtype
        return _triton_fwd(xq, w_kn, ends, N, K, out_dtype=x.dtype, sx=sx, sw=sw)

    @staticmethod
    def backward(ctx, dy):
        from primus.turbo.fp8_linear import cast_tensorwise

        xq, sx, wq, sw, ends = ctx.saved_tensors
        dyq, _, sdy = cast_tensorwise(dy.contiguous(), ctx.g_dt, want_y=True, want_t=False, pad_t=False)
        w_kn = wq.transpose(1, 2) if ctx.trans_b else wq
        dx = dw = None
        if ctx.needs_input_grad[0]:
            w_nk = w_kn.transpose(1, 2)  # (G, N, K)
            dx = _triton_fwd(dyq, w_nk, ends, w_nk.shape[2], w_nk.shape[1], out_dtype=ctx.x_dtype, sx=sdy, sw=sw)
        if ctx.needs_input_grad[1]:
            dw = _triton_wgrad(xq, dyq, ends, wq.shape[0], ctx.w_dtype, ctx.trans_b, sx=sx, sd=sdy)
        return dx, dw, None, None, None


def fp8_grouped_gemm(x: torch.Tensor, w: torch.Tensor, group_sizes: Union[torch.Tensor, Sequence[int]],
                     trans_b: bool = False, fmt: str = "hybrid", provider: Optional[str] = None) -> torch.Tensor:
    """`grouped_gemm` with fp8 operands: forward, dgrad and wgrad in fp8, scales computed on the device (sync-free).
    provider (None = grouped_gemm_fp8.fp8_grouped_provider, logged once per shape):
      "torch_scaled"  torch._scaled_grouped_mm (CUTLASS, CUDA sm90), e4m3 only, rowwise scales (grouped_gemm_fp8.py)
      "triton"        this file's Triton kernels, tensorwise scales (one for the tokens, one per expert, one for the
                      gradient); e4m3 or "hybrid" (e5m2 gradients); any GPU Triton runs on, and the interpreter"""
    if fmt not in ("e4m3", "hybrid"):
        raise ValueError(f"fp8_grouped_gemm: fmt must be e4m3 or hybrid, not {fmt!r}")
    if provider is None:
        from primus.turbo.grouped_gemm_fp8 import fp8_grouped_provider

        provider = fp8_grouped_provider(x, w, fmt, trans_b)
    if x.stride(1) != 1:
        x = x.contiguous()
    ends = _ends(group_sizes, x.device)
    if provider == "torch_scaled":
        if fmt != "e4m3":
            raise ValueError(f"fp8_grouped_gemm: torch._scaled_grouped_mm takes e4m3 operands only, not fmt {fmt!r}")
        from primus.turbo.grouped_gemm_fp8 import _ScaledGroupedMM

        return _ScaledGroupedMM.apply(x, w, ends, trans_b)
    if provider == "triton":
        return _Fp8GroupedGemm.apply(x, w, ends, trans_b, fmt)
    raise ValueError(f"fp8_grouped_gemm provider must be torch_scaled or triton, not {provider!r}")


def _ends(group_sizes, device) -> torch.Tensor:
    if not torch.is_tensor(group_sizes):
        group_sizes = torch.tensor(list(group_sizes), device=device)
    return torch.cumsum(group_sizes.to(device), 0).to(torch.int32)


def grouped_mm_gpu(device) -> bool:
    """torch._grouped_mm's CUDA kernel runs on `device`: CUDA sm90 / sm100, not ROCm."""
    return (device.type == "cuda" and torch.version.hip is None and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(device)[0] in (9, 10))


def grouped_mm_aligned(x: torch.Tensor, w: torch.Tensor) -> bool:
    """bf16 operands whose K and N are 16-byte aligned, as torch._grouped_mm's CUDA kernel needs (shapes only:
    dynamo evaluates it while tracing)."""
    return (x.dtype == w.dtype == torch.bfloat16 and x.shape[1] % 8 == 0 and w.shape[-1] % 8 == 0
            and w.shape[-2] % 8 == 0)


def torch_grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """torch._grouped_mm serves this device/dtype (CUDA sm90/sm100 bf16; K and N 16-byte aligned)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        return False
    if x.device.type == "cuda":
        return grouped_mm_gpu(x.device) and grouped_mm_aligned(x, w)
    return x.device.type == "cpu"


def pick_provider(x: torch.Tensor, w: torch.Tensor) -> str:
    if torch_grouped_mm_ok(x, w) and not (x.device.type == "cpu" and _common.interpreting()):
        return "torch"
    if x.device.type == "cuda" or _common.interpreting():
        return "triton"
    return "torch" if hasattr(torch, "_grouped_mm") and x.dtype == torch.bfloat16 else "loop"


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, group_sizes: Union[torch.Tensor, Sequence[int]],
                 trans_b: bool = False, provider: Optional[str] = None) -> torch.Tensor:
    """Rows of x are grouped consecutively by expert, `group_sizes` (G,) summing to x.shape[0] (empty groups are
    fine). Returns (M, N). Differentiable in x and w."""
    provider = provider or pick_provider(x, w)
    ends = _ends(group_sizes, x.device)
    if provider == "torch":
        wb = w.transpose(1, 2) if trans_b else w
        return torch._grouped_mm(x, wb, offs=ends)
    if provider == "triton":
        if x.stride(1) != 1:
            x = x.contiguous()
        return _TritonGroupedGemm.apply(x, w, ends, trans_b)
    if provider == "loop":
        return grouped_gemm_reference(x, w, group_sizes, trans_b)
    raise ValueError(f"grouped_gemm provider must be torch, triton or loop, not {provider!r}")


def grouped_gemm_reference(x, w, group_sizes, trans_b: bool = False) -> torch.Tensor:
    """Per-expert loop (syncs on the sizes): the eager baseline and test reference."""
    sizes = group_sizes.tolist() if torch.is_tensor(group_sizes) else list(group_sizes)
    outs, s = [], 0
    for g, m in enumerate(sizes):
        wg = w[g].t() if trans_b else w[g]
        outs.append(x[s:s + m] @ wg)
        s += m
    return torch.cat(outs, 0)
