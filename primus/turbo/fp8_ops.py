"""The fp8 linear (primus.turbo.fp8_linear) as a pair of torch custom ops, so torch.compile keeps it in the graph.

    y = fp8_linear_traced(x, weight, bias, recipe, fmt)     # recipe: tensorwise | rowwise | blockwise

dynamo sees one opaque node for the forward and one for the backward (the Triton casts and the fp8 GEMMs run
inside; shapes come from the fake kernels), where the autograd.Function of fp8_linear.py is a graph break. Used by
TorchTitan's TurboFP8Linear (fullgraph per-block compile) and by megatron's portable fp8 linears at tp = 1 under
training.compile.

The delayed recipe updates its amax histories in place, so it has its own pair, which declares those state tensors
mutated (x's and the weight's in the forward, dy's in the backward): `fp8_linear_traced(..., "delayed", fmt,
delayed=DelayedLinearState)`. torch refuses an autograd formula on a mutating op, so the pair is joined by a small
autograd.Function that dynamo traces (it holds the dy state on ctx, not in save_for_backward: a backward that ran
in between, e.g. of another micro batch under pipelining, has bumped its version).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from primus.turbo import fp8_linear as F8

RECIPES = ("tensorwise", "rowwise", "blockwise", "delayed")


def compiles(recipe: str, tp_size: int = 1) -> bool:
    """Whether an fp8 linear of `recipe` goes through these ops, inside a compiled graph: tp = 1 (no collective
    around the GEMM). The one rule megatron's portable fp8 and turbo linears follow."""
    return tp_size == 1 and recipe in RECIPES


_fp8_dtypes, _out_dtype, _pad16 = F8.fp8_formats, F8._out_dtype, F8._pad16

# Outputs are fixed 5-/2-tuples; the unused slots of a recipe are empty tensors.


@torch.library.custom_op("primus::fp8_linear_fwd", mutates_args=())
def fp8_linear_fwd(x2: Tensor, weight: Tensor, recipe: str, fmt: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    y, st = F8.fp8_forward(x2, weight, None, recipe, fmt, need_wgrad=True)
    empty = x2.new_empty(0)
    if recipe in ("tensorwise", "blockwise"):  # fp8 x^T and W^T / W with their scales (fp8_linear.fp8_forward)
        a, b, c, d = st.tensors
        return y.contiguous(), a, b, c, d
    return y.contiguous(), empty, empty.clone(), empty.clone(), empty.clone()  # rowwise saves the inputs


@fp8_linear_fwd.register_fake
def _fwd_fake(x2, weight, recipe, fmt):
    M, K = x2.shape
    N = weight.shape[0]
    f_dt, _ = _fp8_dtypes(x2.device, fmt)
    y = x2.new_empty((M, N), dtype=_out_dtype(x2))
    e = lambda: x2.new_empty(0)  # noqa: E731
    if recipe == "tensorwise":
        return (y, x2.new_empty((K, _pad16(M)), dtype=f_dt), x2.new_empty((), dtype=torch.float32),
                x2.new_empty((K, N), dtype=f_dt), x2.new_empty((), dtype=torch.float32))
    if recipe == "blockwise":
        # x^T (K, MP) and its scales (MP/128, K), row-major; W (N, K) as the column-major view of the cast's W^T,
        # and its tile scales (N/128, K/128) as a view of their padded (L4, K/128) layout: strides as fp8_forward
        # returns them (inductor asserts every custom-op output's strides against these)
        mp = (M + 127) // 128 * 128
        n128, k128 = (N + 127) // 128, (K + 127) // 128
        _, sw_strides = F8.blockwise_scale_layout(K, N, tile=True)
        return (y, x2.new_empty((K, mp), dtype=f_dt), x2.new_empty((mp // 128, K), dtype=torch.float32),
                x2.new_empty_strided((N, K), (1, N), dtype=f_dt),
                x2.new_empty_strided((n128, k128), sw_strides, dtype=torch.float32))
    return y, e(), e(), e(), e()


@torch.library.custom_op("primus::fp8_linear_bwd", mutates_args=())
def fp8_linear_bwd(dy2: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, recipe: str, fmt: str,
                   w_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    f_dt, g_dt = _fp8_dtypes(dy2.device, fmt)
    saved = {"tensorwise": [a, b, c, d], "rowwise": [a, b], "blockwise": [a, b, c, d]}[recipe]
    st = F8.FP8State(recipe, f_dt, g_dt, w_dtype, False, saved)
    dx, dw, _ = F8.fp8_backward(st, dy2, need_dx=True, need_dw=True, need_db=False)
    return dx.contiguous(), dw.contiguous()


@fp8_linear_bwd.register_fake
def _bwd_fake(dy2, a, b, c, d, recipe, fmt, w_dtype):
    M = dy2.shape[0]
    if recipe == "tensorwise":
        K, N = c.shape  # W^T in fp8
    elif recipe == "blockwise":
        N, K = c.shape  # W in fp8
    else:
        N, K = b.shape  # the weight
    w_dt = w_dtype if w_dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    return dy2.new_empty((M, K), dtype=_out_dtype(dy2)), dy2.new_empty((N, K), dtype=w_dt)


def _fp8_setup(ctx, inputs, output):
    x2, weight, recipe, fmt = inputs
    _, a, b, c, d = output
    saved = (x2, weight, a, b) if recipe == "rowwise" else (a, b, c, d)
    ctx.save_for_backward(*saved)
    ctx.recipe, ctx.fmt, ctx.w_dtype = recipe, fmt, weight.dtype
    ctx.mark_non_differentiable(a, b, c, d)
    # torch would otherwise fill a zero "gradient" for each saved output before calling the backward, which ignores
    # them: a write of x^T and W^T per linear (eager; measured as the fused MLP's 1% loss on the H200)
    ctx.set_materialize_grads(False)


def _fp8_backward(ctx, dy, *_):
    a, b, c, d = ctx.saved_tensors
    dx, dw = fp8_linear_bwd(dy.contiguous(), a, b, c, d, ctx.recipe, ctx.fmt, ctx.w_dtype)
    return dx, dw, None, None


fp8_linear_fwd.register_autograd(_fp8_backward, setup_context=_fp8_setup)


# -------------------------------------------------------- the weight gradient added into main_grad (tensorwise)


# One main_grad per op: megatron's main_grads are views of one grad buffer, and a custom op's mutable arguments
# must not alias each other, so an op mutating two of them is one Inductor cannot run in place (it clones one
# through as_strided and copies it back; with such an op a 16-layer Llama-2-7B failed on an H100 with an illegal
# memory access right after a layer's last accumulate, docs/turbo.md). The fused MLP's backward is two ops.
@torch.library.custom_op("primus::fp8_linear_bwd_accum", mutates_args=("main_grad",))
def fp8_linear_bwd_accum(dy2: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, main_grad: Tensor, fmt: str,
                         w_dtype: torch.dtype, dy_amax: Optional[Tensor] = None) -> Tensor:
    """dx; the weight gradient added into main_grad (fp32, the weight's shape) inside its GEMM. dy_amax: dy2's
    amax as partial maxima from its producer (fp8_linear.fp8_backward's)."""
    f_dt, g_dt = _fp8_dtypes(dy2.device, fmt)
    st = F8.FP8State("tensorwise", f_dt, g_dt, w_dtype, False, [a, b, c, d])
    dx, _, _ = F8.fp8_backward(st, dy2, need_db=False, dy_amax=dy_amax, main_grad=main_grad)
    return dx.contiguous()


@fp8_linear_bwd_accum.register_fake
def _(dy2, a, b, c, d, main_grad, fmt, w_dtype, dy_amax=None):
    return _bwd_fake(dy2, a, b, c, d, "tensorwise", fmt, w_dtype)[0]


class _FP8LinearAccum(torch.autograd.Function):
    """The tensorwise pair with the weight gradient added into `main_grad` and none returned for the weight
    (training.gradient_accumulation_fusion: megatron's DDP hook, which would add it, does not run). dynamo traces
    this Function: its body is the two custom ops."""

    @staticmethod
    def forward(ctx, x2, weight, main_grad, fmt):
        y, a, b, c, d = fp8_linear_fwd(x2, weight, "tensorwise", fmt)
        ctx.save_for_backward(a, b, c, d)
        ctx.main_grad = main_grad  # not saved_tensors: it changes in place between micro batches, by design
        ctx.fmt, ctx.w_dtype = fmt, weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b, c, d = ctx.saved_tensors
        dx = fp8_linear_bwd_accum(dy.contiguous(), a, b, c, d, ctx.main_grad, ctx.fmt, ctx.w_dtype)
        return dx, None, None, None


def accumulates(recipe: str, weight: Tensor, main_grad: Optional[Tensor]) -> bool:
    """Whether a traced fp8 linear of `recipe` can add its weight gradient into `main_grad`: tensorwise, and
    main_grad the weight's fp32 accumulator (megatron's DDP gives each parameter one)."""
    return (recipe == "tensorwise" and main_grad is not None and main_grad.dtype == torch.float32
            and main_grad.shape == weight.shape and main_grad.is_contiguous())


# ---------------------------------------------------------------------------------------------- delayed scaling


@torch.library.custom_op("primus::fp8_linear_delayed_fwd", mutates_args=("x_buf", "x_meta", "w_buf", "w_meta"))
def fp8_linear_delayed_fwd(x2: Tensor, weight: Tensor, x_buf: Tensor, x_meta: Tensor, w_buf: Tensor,
                           w_meta: Tensor, fmt: str, history_len: int, margin: int,
                           algo: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    settings = F8.DelayedScaling(history_len, margin, algo)
    state = F8.DelayedLinearState(settings)  # views of the state tensors this op was given (dy's unused here)
    state.x, state.w = F8.AmaxHistory(settings, x_buf, x_meta), F8.AmaxHistory(settings, w_buf, w_meta)
    y, st = F8.fp8_forward(x2, weight, None, "delayed", fmt, need_wgrad=True, delayed=state)
    a, b, c, d = st.tensors  # fp8 x^T, its scale_inv, fp8 W^T, its scale_inv (new tensors, not the state's)
    return y.contiguous(), a, b, c, d


@fp8_linear_delayed_fwd.register_fake
def _(x2, weight, x_buf, x_meta, w_buf, w_meta, fmt, history_len, margin, algo):
    return _fwd_fake(x2, weight, "tensorwise", fmt)  # the tensorwise layouts


@torch.library.custom_op("primus::fp8_linear_delayed_bwd", mutates_args=("dy_buf", "dy_meta"))
def fp8_linear_delayed_bwd(dy2: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, dy_buf: Tensor,
                           dy_meta: Tensor, fmt: str, w_dtype: torch.dtype, history_len: int, margin: int,
                           algo: str) -> Tuple[Tensor, Tensor]:
    f_dt, g_dt = _fp8_dtypes(dy2.device, fmt)
    settings = F8.DelayedScaling(history_len, margin, algo)
    state = F8.DelayedLinearState(settings)
    state.dy = F8.AmaxHistory(settings, dy_buf, dy_meta)
    st = F8.FP8State("delayed", f_dt, g_dt, w_dtype, False, [a, b, c, d], state)
    dx, dw, _ = F8.fp8_backward(st, dy2, need_dx=True, need_dw=True, need_db=False)
    return dx.contiguous(), dw.contiguous()


@fp8_linear_delayed_bwd.register_fake
def _(dy2, a, b, c, d, dy_buf, dy_meta, fmt, w_dtype, history_len, margin, algo):
    return _bwd_fake(dy2, a, b, c, d, "tensorwise", fmt, w_dtype)


class _DelayedFP8Linear(torch.autograd.Function):
    """The delayed pair's autograd (dynamo traces this Function: its body is the two custom ops)."""

    @staticmethod
    def forward(ctx, x2, weight, x_buf, x_meta, w_buf, w_meta, dy_buf, dy_meta, fmt, history_len, margin, algo):
        y, a, b, c, d = fp8_linear_delayed_fwd(x2, weight, x_buf, x_meta, w_buf, w_meta, fmt, history_len, margin,
                                               algo)
        ctx.save_for_backward(a, b, c, d)
        ctx.dy_buf, ctx.dy_meta = dy_buf, dy_meta
        ctx.fmt, ctx.w_dtype, ctx.settings = fmt, weight.dtype, (history_len, margin, algo)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b, c, d = ctx.saved_tensors
        dx, dw = fp8_linear_delayed_bwd(dy.contiguous(), a, b, c, d, ctx.dy_buf, ctx.dy_meta, ctx.fmt, ctx.w_dtype,
                                        *ctx.settings)
        return (dx, dw) + (None,) * 10


def _delayed(x2: Tensor, weight: Tensor, state, fmt: str) -> Tensor:
    if not isinstance(state, F8.DelayedLinearState):
        raise ValueError("fp8_linear_traced: the delayed recipe needs this linear's DelayedLinearState "
                         "(fp8_linear.DelayedScaling(...).linear_state())")
    if state.x.buf is None or state.x.buf.device != weight.device:  # compiled linears: allocated when built
        state.allocate(weight.device)
    st = state.settings
    return _DelayedFP8Linear.apply(x2, weight, state.x.buf, state.x.meta, state.w.buf, state.w.meta, state.dy.buf,
                                   state.dy.meta, fmt, st.history_len, st.margin, st.algo)


def fp8_linear_traced(x: Tensor, weight: Tensor, bias: Optional[Tensor], recipe: str, fmt: str,
                      delayed=None, main_grad: Optional[Tensor] = None) -> Tensor:
    """y = x @ weight.T (+ bias) through the custom ops: x (..., K), weight (N, K). The bias is added outside the
    op (autograd gives its gradient). delayed: the linear's DelayedLinearState (recipe "delayed" only).
    main_grad: the weight's fp32 gradient accumulator (tensorwise only, `accumulates`): the weight gradient is
    added into it and none is returned for the weight."""
    if recipe not in RECIPES:
        raise ValueError(f"fp8_linear_traced: recipe must be one of {RECIPES}, not {recipe!r}")
    if (recipe == "delayed") != (delayed is not None):
        raise ValueError("fp8_linear_traced: the delayed recipe needs this linear's DelayedLinearState (and other "
                         "recipes take none)")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if main_grad is not None and not accumulates(recipe, weight, main_grad):
        raise ValueError(f"fp8_linear_traced: main_grad {main_grad.dtype} {tuple(main_grad.shape)} must be the fp32 "
                         f"accumulator of weight {tuple(weight.shape)}, under the tensorwise recipe (not {recipe!r})")
    if recipe == "delayed":
        y = _delayed(x2, weight, delayed, fmt)
    elif main_grad is not None:
        y = _FP8LinearAccum.apply(x2, weight, main_grad, fmt)
    else:
        y = fp8_linear_fwd(x2, weight, recipe, fmt)[0]
    y = y.view(*shape[:-1], y.shape[-1])
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y
