"""The SwiGLU MLP in fp8 (tensorwise) as one op pair: each SwiGLU kernel also gives the amax the next cast needs.

    out = fp8_swiglu_mlp(x, w1, w2, fmt)     # fc2(swiglu(fc1(x))), w1 (2F, H) = [gate | up], w2 (H, F), no biases

Tensorwise current scaling casts a tensor in two passes: its amax, then the cast (fp8_linear.cast_tensorwise).
Two of the MLP's operands come out of the SwiGLU kernels: fc2's input y = swiglu(h) in the forward and fc1's output
gradient dh = swiglu'(h) * dy in the backward, the largest operands of the layer ([T, F] and [T, 2F]). Here those
kernels keep max |output| as they write it (swiglu.swiglu_fwd_amax / swiglu_bwd_amax), and the casts of y and dh
skip their amax pass: one read of each fewer. Transformer Engine fuses the same way inside its LayerNormMLP; a
separate module boundary (megatron's MLP calls fc1, the activation, fc2) has nowhere to pass the amax, so the three
run in one op whose backward runs the three backwards. The amax is of the rounded values, the ones the cast would
read, so the result is bit-for-bit that of the unfused fp8 linears and SwiGLU.

A torch custom op pair (forward, backward) with fake implementations: eager, or one node of a compiled graph.
Weight casts go through fp8_linear.WEIGHT_CASTS like the unfused linears' (precision.fp8_weight_cache).
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from primus.turbo import fp8_linear as F8
from primus.turbo import swiglu as S


def _states(fmt: str, device, w_dtype, *slots):
    f_dt, g_dt = F8.fp8_formats(device, fmt)
    return tuple(F8.FP8State("tensorwise", f_dt, g_dt, w_dtype, False, list(t)) for t in slots)


@torch.library.custom_op("primus::fp8_swiglu_mlp_fwd", mutates_args=())
def fp8_swiglu_mlp_fwd(x2: Tensor, w1: Tensor, w2: Tensor, fmt: str) -> Tuple[Tensor, Tensor, Tensor, Tensor,
                                                                             Tensor, Tensor, Tensor, Tensor,
                                                                             Tensor, Tensor]:
    """(out, h, fc1's saved fp8 x^T / scale / W1^T / scale, fc2's saved fp8 y^T / scale / W2^T / scale)."""
    h, st1 = F8.fp8_forward(x2, w1, None, "tensorwise", fmt)
    y, y_amax = S.swiglu_fwd_amax(h)
    out, st2 = F8.fp8_forward(y, w2, None, "tensorwise", fmt, x_amax=y_amax)
    return (out.contiguous(), h.contiguous(), *st1.tensors, *st2.tensors)


@fp8_swiglu_mlp_fwd.register_fake
def _(x2, w1, w2, fmt):
    from primus.turbo.fp8_ops import _fwd_fake

    M = x2.shape[0]
    F = w1.shape[0] // 2
    h = x2.new_empty((M, 2 * F), dtype=F8._out_dtype(x2))
    _, *t1 = _fwd_fake(x2, w1, "tensorwise", fmt)
    out, *t2 = _fwd_fake(h.new_empty((M, F)), w2, "tensorwise", fmt)
    return (out, h, *t1, *t2)


@torch.library.custom_op("primus::fp8_swiglu_mlp_bwd", mutates_args=())
def fp8_swiglu_mlp_bwd(dout: Tensor, h: Tensor, a1: Tensor, b1: Tensor, c1: Tensor, d1: Tensor, a2: Tensor,
                       b2: Tensor, c2: Tensor, d2: Tensor, fmt: str,
                       w_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dw1, dw2): fc2's backward, the SwiGLU backward (with dh's amax), fc1's backward (dh cast in one pass)."""
    st1, st2 = _states(fmt, dout.device, w_dtype, (a1, b1, c1, d1), (a2, b2, c2, d2))
    dy, dw2, _ = F8.fp8_backward(st2, dout, need_db=False)
    dh, dh_amax = S.swiglu_bwd_amax(dy, h)
    dx, dw1, _ = F8.fp8_backward(st1, dh, need_db=False, dy_amax=dh_amax)
    return dx.contiguous(), dw1.contiguous(), dw2.contiguous()


@fp8_swiglu_mlp_bwd.register_fake
def _(dout, h, a1, b1, c1, d1, a2, b2, c2, d2, fmt, w_dtype):
    from primus.turbo.fp8_ops import _bwd_fake

    dx, dw1 = _bwd_fake(h, a1, b1, c1, d1, "tensorwise", fmt, w_dtype)  # fc1's dy: dh, shaped as h
    _, dw2 = _bwd_fake(dout, a2, b2, c2, d2, "tensorwise", fmt, w_dtype)
    return dx, dw1, dw2


def _setup(ctx, inputs, output):
    x2, w1, w2, fmt = inputs
    saved = output[1:]
    ctx.save_for_backward(*saved)
    ctx.fmt, ctx.w_dtype = fmt, w1.dtype
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)  # no zero "gradients" of the saved outputs (fp8_ops._fp8_setup says why)


def _backward(ctx, dout, *_):
    dx, dw1, dw2 = fp8_swiglu_mlp_bwd(dout.contiguous(), *ctx.saved_tensors, ctx.fmt, ctx.w_dtype)
    return dx, dw1, dw2, None


fp8_swiglu_mlp_fwd.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("primus::fp8_swiglu_mlp_bwd_accum", mutates_args=("main_grad2",))
def fp8_swiglu_mlp_bwd_accum(dout: Tensor, h: Tensor, a2: Tensor, b2: Tensor, c2: Tensor, d2: Tensor,
                             main_grad2: Tensor, fmt: str, w_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(dh, dh's amax slots): fc2's backward with its weight gradient added into its fp32 main_grad inside the GEMM,
    then the SwiGLU backward. fc1's backward is fp8_ops.fp8_linear_bwd_accum on them (one main_grad per op: that
    module says why)."""
    (st2,) = _states(fmt, dout.device, w_dtype, (a2, b2, c2, d2))
    dy, _, _ = F8.fp8_backward(st2, dout, need_db=False, main_grad=main_grad2)
    dh, dh_amax = S.swiglu_bwd_amax(dy, h)
    return dh, dh_amax


@fp8_swiglu_mlp_bwd_accum.register_fake
def _(dout, h, a2, b2, c2, d2, main_grad2, fmt, w_dtype):
    return torch.empty_like(h), h.new_empty((S.AMAX_SLOTS,), dtype=torch.float32)


class _FusedMLPAccum(torch.autograd.Function):
    """The op pair with both weight gradients added into their main_grads and none returned for the weights
    (fp8_ops._FP8LinearAccum says why)."""

    @staticmethod
    def forward(ctx, x2, w1, w2, main_grad1, main_grad2, fmt):
        out, *saved = fp8_swiglu_mlp_fwd(x2, w1, w2, fmt)
        ctx.save_for_backward(*saved)
        ctx.main_grads = (main_grad1, main_grad2)  # not saved_tensors: changed in place between micro batches
        ctx.fmt, ctx.w_dtype = fmt, w1.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        from primus.turbo.fp8_ops import fp8_linear_bwd_accum

        h, a1, b1, c1, d1, a2, b2, c2, d2 = ctx.saved_tensors
        mg1, mg2 = ctx.main_grads
        dh, dh_amax = fp8_swiglu_mlp_bwd_accum(dout.contiguous(), h, a2, b2, c2, d2, mg2, ctx.fmt, ctx.w_dtype)
        dx = fp8_linear_bwd_accum(dh, a1, b1, c1, d1, mg1, ctx.fmt, ctx.w_dtype, dh_amax)
        return dx, None, None, None, None, None


def fp8_swiglu_mlp(x: Tensor, w1: Tensor, w2: Tensor, fmt: str = "e4m3", main_grads=None) -> Tensor:
    """fc2(silu(gate) * up), [gate | up] = fc1(x): x (..., H) @ w1.T (2F, H) -> (..., 2F); @ w2.T (H, F). fp8
    tensorwise GEMMs (fprop, dgrad, wgrad of both linears), fmt "e4m3" or "hybrid" (e5m2 gradients).
    main_grads: (w1's, w2's) fp32 gradient accumulators: the weight gradients are added into them inside their
    GEMMs and none is returned for the weights (fp8_ops.accumulates says which qualify)."""
    from primus.turbo.fp8_ops import accumulates

    fmt = getattr(fmt, "value", fmt)
    if w1.dim() != 2 or w2.dim() != 2 or w1.shape[0] != 2 * w2.shape[1] or w1.shape[1] != x.shape[-1]:
        raise ValueError(f"fp8_swiglu_mlp: x (..., {x.shape[-1]}), w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}: "
                         "w1 must be (2F, H) and w2 (H', F)")
    shape = x.shape
    if main_grads is not None:
        if not all(accumulates("tensorwise", w, g) for w, g in zip((w1, w2), main_grads)):
            raise ValueError("fp8_swiglu_mlp: main_grads must be w1's and w2's fp32 accumulators, of their shapes")
        out = _FusedMLPAccum.apply(x.reshape(-1, shape[-1]), w1, w2, *main_grads, fmt)
    else:
        out = fp8_swiglu_mlp_fwd(x.reshape(-1, shape[-1]), w1, w2, fmt)[0]
    return out.view(*shape[:-1], out.shape[-1])
