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
all-reduce overlap of the bf16 path is given up). Recipe "delayed" (TE's DelayedScaling, the portable
version): each converted linear gets its own amax histories (`mod.primus_fp8_delayed`). Kept in bf16: the output
layer, linears whose dims are not multiples of 16, and, with first_last_layers_bf16, the first/last N decoder layers
(global numbering).
"""
from __future__ import annotations

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

    def gemm_for(state):
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
    log.info("portable fp8 (%s, %s): %d linears converted, %d kept in bf16", recipe, fmt, len(converted), len(kept))
    return converted
