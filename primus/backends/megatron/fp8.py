"""fp8 without Transformer Engine: megatron-core's local linears run their GEMMs through primus.turbo.fp8_linear.

megatron-core routes `config.fp8` to TE modules only, so on the local spec the fp8 fields are kept away from its
TransformerConfig (trainer.py) and, once the model is built, each Column/RowParallelLinear of the decoder has its
`_forward_impl` (megatron's GEMM + tensor-parallel communication autograd function) replaced by:
- row-parallel: the fp8 GEMM alone (megatron reduces the output outside `_forward_impl`);
- column-parallel: the same input communication megatron would do (all-gather over the sequence under sequence
  parallel, else the identity whose backward all-reduces the input gradient), then the fp8 GEMM.
At tp = 1 the GEMM is primus.turbo.fp8_ops' custom-op pair (delayed: its pair that declares the amax histories
mutated), traced by training.compile (no graph break); tp > 1 runs eagerly (one graph break per linear). Gradients
land in `weight.grad` as with megatron's non-fused path, so DDP's main_grad hooks work unchanged (the async dgrad
all-reduce overlap of the bf16 path is given up); with training.gradient_accumulation_fusion, where
features/training.py's FP8_LINEARS_GRAD_ACCUM_FUSION holds (tensorwise, tp = 1, no overlap_grad_reduce), the pair's
weight-gradient GEMM adds into the fp32 `main_grad` instead (primus.turbo.cublaslt) and no gradient is returned.
Recipe "delayed" (TE's DelayedScaling, the portable version): each converted linear gets its own amax histories
(`mod.primus_fp8_delayed`). Kept in bf16: the output
layer, linears whose dims are not multiples of 16, and, with first_last_layers_bf16, the first/last N decoder layers
(global numbering).

Fused MLP (precision.fp8_fused_mlp, args.fp8_fused_mlp says when): a dense SwiGLU MLP whose fc1 and fc2 were both
converted, under the tensorwise recipe, becomes a `FusedFP8MLP` (its class swapped; same parameters and state):
fc1 -> SwiGLU -> fc2 as primus.turbo.fp8_mlp's op pair, whose SwiGLU kernels hand their outputs' amax to the casts
of fc2's input and of fc1's output gradient (one read of each fewer; the same bits as the unfused path). The
tensor-parallel communication is the two linears' own: fc1's input all-gather (sequence parallel) or the identity
whose backward all-reduces the input gradient, fc2's output reduce-scatter or all-reduce.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Dict, List

log = logging.getLogger("primus.megatron")


def _eager(fn):
    """Under training.compile (perf.py) the fp8 GEMM call stays eager: dynamo must not trace the Triton casts."""
    import torch

    return torch.compiler.disable(fn, recursive=True)


def column_impl(gemm, eager: bool = True):
    """ColumnParallelLinear._forward_impl replacement: megatron's input communication (all-gather over the sequence
    under sequence parallel, else the identity whose backward all-reduces the input gradient), then
    `gemm(input, weight, bias)`. eager: keep dynamo out of the GEMM call (a graph break under training.compile)."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    def forward_impl(input, weight, bias, gradient_accumulation_fusion=False, allreduce_dgrad=False,
                     sequence_parallel=False, tp_group=None, **_unused):
        if sequence_parallel:
            input = gather_from_sequence_parallel_region(input, group=tp_group)
        elif allreduce_dgrad:
            input = copy_to_tensor_model_parallel_region(input, group=tp_group)
        return gemm(input, weight, bias)

    return _eager(forward_impl) if eager else forward_impl


def row_impl(gemm, eager: bool = True):
    """RowParallelLinear._forward_impl replacement: the GEMM alone (megatron reduces the output outside it)."""
    def forward_impl(input, weight, bias, **_unused):
        return gemm(input, weight, bias)

    return _eager(forward_impl) if eager else forward_impl


@functools.lru_cache(maxsize=None)
def _fused_mlp_class():
    """(megatron's MLP, FusedFP8MLP), built once (megatron imported on first use): every model chunk's fused MLPs
    share the one class."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
        reduce_from_tensor_model_parallel_region,
        reduce_scatter_to_sequence_parallel_region,
    )
    from megatron.core.transformer.mlp import MLP

    from primus.turbo.fp8_mlp import fp8_swiglu_mlp

    class FusedFP8MLP(MLP):
        """megatron's MLP with fc1 -> SwiGLU -> fc2 run as one fp8 op (this module's docstring, "Fused MLP").
        primus_fp8_fmt: the fp8 format; primus_fp8_eager: keep dynamo out (tp > 1, as the unfused linears);
        primus_fp8_accum: the weight gradients added into their main_grads (apply's `accum`)."""

        def forward(self, hidden_states, per_token_scale=None, **kwargs):
            if per_token_scale is not None:  # MoE experts' probabilities: never converted (type(mlp) is MLP only)
                raise ValueError("FusedFP8MLP takes no per_token_scale")
            return (_eager(self._fused) if self.primus_fp8_eager else self._fused)(hidden_states), None

        def _fused(self, x):
            fc1, fc2 = self.linear_fc1, self.linear_fc2
            if fc1.sequence_parallel:
                x = gather_from_sequence_parallel_region(x, group=fc1.tp_group)
            else:
                x = copy_to_tensor_model_parallel_region(x, group=fc1.tp_group)
            mg1, mg2 = (main_grad_of(fc1.weight), main_grad_of(fc2.weight)) if self.primus_fp8_accum else (None, None)
            mgs = (mg1, mg2) if mg1 is not None and mg2 is not None else None
            out = fp8_swiglu_mlp(x, fc1.weight, fc2.weight, self.primus_fp8_fmt, main_grads=mgs)
            if fc2.sequence_parallel:
                return reduce_scatter_to_sequence_parallel_region(out, group=fc2.tp_group)
            return reduce_from_tensor_model_parallel_region(out, group=fc2.tp_group)

    return MLP, FusedFP8MLP


def main_grad_of(weight):
    """weight's fp32 gradient accumulator where its gradient can be added into it in the GEMM (fp8_ops.accumulates:
    megatron's DDP gave it one), else None (the weight gets its gradient as usual)."""
    from primus.turbo.fp8_ops import accumulates

    mg = getattr(weight, "main_grad", None)
    return mg if accumulates("tensorwise", weight, mg) else None


def fusable_mlp(mlp, MLP) -> bool:
    """A dense SwiGLU MLP without biases whose two linears run the portable fp8 GEMM, with megatron's plain
    communication (no expert / disabled grad reduce, fc1 not gathering its output, fc2 taking a parallel input)."""
    import torch.nn.functional as F

    if type(mlp) is not MLP:  # MoE layers, shared experts (their own forwards)
        return False
    c, fc1, fc2 = mlp.config, mlp.linear_fc1, mlp.linear_fc2
    return (c.gated_linear_unit and mlp.activation_func is F.silu and not c.use_te_activation_func
            and getattr(c, "glu_linear_offset", 0.0) == 0.0 and getattr(c, "activation_func_clamp_value", None) is None
            and fc1.bias is None and fc2.bias is None
            and getattr(fc1, "primus_gemm", None) == "fp8" and getattr(fc2, "primus_gemm", None) == "fp8"
            and not fc1.explicit_expert_comm and not fc2.explicit_expert_comm
            and not getattr(fc1, "disable_grad_reduce", False) and not fc1.gather_output and fc2.input_is_parallel)


def fused_mlps(model) -> int:
    """How many of model's modules are FusedFP8MLPs (fp8.apply's fused MLPs)."""
    return sum(isinstance(m, _fused_mlp_class()[1]) for m in model.modules())


def delayed_scaling(settings: Dict[str, Any]):
    """precision.fp8_amax_history_len / fp8_margin / fp8_amax_compute_algo as the portable DelayedScaling
    (fp8_interval other than 1 is refused by args.capability_issues: the portable path updates every call)."""
    from primus.turbo.fp8_linear import DelayedScaling

    return DelayedScaling(history_len=settings.get("fp8_amax_history_len", 1024),
                          margin=settings.get("fp8_margin", 0), algo=settings.get("fp8_amax_compute_algo", "max"))


def apply(model, settings: Dict[str, Any], config) -> List[str]:
    """Convert one GPTModel chunk in place; returns the converted module names."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from primus.turbo.fp8_linear import fp8_linear, fp8_shape_ok
    from primus.turbo.fp8_ops import compiles, fp8_linear_traced

    recipe, fmt = settings.get("fp8_recipe", "tensorwise"), settings.get("fp8", "e4m3")
    keep_first = keep_last = 0
    if settings.get("first_last_layers_bf16"):
        keep_first = settings.get("num_layers_at_start_in_bf16", 1)
        keep_last = settings.get("num_layers_at_end_in_bf16", 1)
    bf16_layers = set(range(keep_first)) | set(range(config.num_layers - keep_last, config.num_layers))

    delayed = delayed_scaling(settings) if recipe == "delayed" else None

    # tp = 1: the GEMM is primus.turbo.fp8_ops' custom-op pair, which training.compile keeps inside the compiled
    # layer (no graph break). tp > 1 (megatron's collectives around it): the autograd.Function, run eagerly.
    traced = compiles(recipe, getattr(config, "tensor_model_parallel_size", 1))
    # training.gradient_accumulation_fusion (features/training.py's FP8_LINEARS_GRAD_ACCUM_FUSION): the weight
    # gradient added into main_grad in its GEMM, none returned (megatron's DDP gives the weights main_grad once the
    # model is wrapped, after this conversion: read at each forward; without it, the plain pair)
    accum = bool(settings.get("grad_accum_fusion")) and traced and recipe == "tensorwise"

    def gemm_for(state):
        if traced and accum:
            return lambda input, weight, bias: fp8_linear_traced(input, weight, bias, recipe, fmt, state,
                                                                 main_grad=main_grad_of(weight))
        if traced:
            return lambda input, weight, bias: fp8_linear_traced(input, weight, bias, recipe, fmt, state)

        def gemm(input, weight, bias):
            return fp8_linear(input, weight, bias, recipe, fmt, state)
        return gemm

    converted, kept = [], []
    decoder = getattr(model, "decoder", None)
    if decoder is None:
        return converted
    for layer in decoder.layers:
        in_bf16 = (layer.layer_number - 1) in bf16_layers
        for name, mod in layer.named_modules():
            if not isinstance(mod, (ColumnParallelLinear, RowParallelLinear)):
                continue
            full = f"decoder.layers.{layer.layer_number - 1}.{name}"
            out_f, in_f = mod.weight.shape
            if in_bf16 or not fp8_shape_ok(in_f, out_f):
                kept.append(full)
                continue
            # delayed: each linear keeps its own amax histories (x, weight, dy)
            # (allocated now, on the weight's device: a compiled layer is traced with them in place)
            mod.primus_fp8_delayed = (delayed.linear_state().allocate(mod.weight.device) if delayed is not None
                                      else None)
            impl = column_impl if isinstance(mod, ColumnParallelLinear) else row_impl
            mod._forward_impl = impl(gemm_for(mod.primus_fp8_delayed), eager=not traced)
            mod.primus_gemm = "fp8"
            converted.append(full)
    fused = []
    if settings.get("fused_mlp"):
        if recipe != "tensorwise":  # args.fp8_fused_mlp's rule: only tensorwise has an amax pass to fuse
            raise ValueError(f"the fused fp8 MLP is the tensorwise recipe's, not {recipe!r}")
        MLP, FusedFP8MLP = _fused_mlp_class()
        for layer in decoder.layers:
            mlp = getattr(layer, "mlp", None)
            if mlp is not None and fusable_mlp(mlp, MLP):
                mlp.__class__ = FusedFP8MLP
                mlp.primus_fp8_fmt, mlp.primus_fp8_eager, mlp.primus_fp8_accum = fmt, not traced, accum
                fused.append(f"decoder.layers.{layer.layer_number - 1}.mlp")
    log.info("portable fp8 (%s, %s): %d linears converted, %d kept in bf16%s%s", recipe, fmt, len(converted),
             len(kept), f"; {len(fused)} MLPs fused (fc1 -> SwiGLU -> fc2 in one fp8 op)" if settings.get("fused_mlp")
             else "", "; weight gradients added into main_grad in their GEMMs" if accum else "")
    return converted
