"""Workarounds for megatron-core under torch.compile (training.compile=true; the compiling itself is perf.py's)."""
from __future__ import annotations

import torch

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin


def _quiet_tp_group_lookup(_cond: Conditions = None) -> None:
    """RowParallelLinear passes tp_group=None to its GEMM function, whose `get_tensor_model_parallel_group_if_none`
    then calls warnings.warn (a deprecation notice) on every call, inside megatron's activation-offloading context
    manager: dynamo cannot trace the warning nor resume after a graph break inside that context, so it would skip
    the rest of the layer (measured on CPU: 11 breaks, most of each layer left eager). Same lookup, no warning."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import layers

    orig = layers.get_tensor_model_parallel_group_if_none
    if getattr(orig, "__primus_quiet__", False):
        return

    def get_tensor_model_parallel_group_if_none(tp_group, is_expert=False, check_initialized=True):
        if tp_group is None and torch.distributed.is_initialized() and ps.is_initialized():
            get = ps.get_expert_tensor_parallel_group if is_expert else ps.get_tensor_model_parallel_group
            return get(check_initialized=check_initialized)
        return orig(tp_group, is_expert=is_expert, check_initialized=check_initialized)

    get_tensor_model_parallel_group_if_none.__primus_quiet__ = True
    layers.get_tensor_model_parallel_group_if_none = get_tensor_model_parallel_group_if_none


class _AuxLossScale:
    """MoEAuxLossAutoScaler's backward scale, kept where dynamo can read it (a plain object's attribute)."""

    value = None


def _readable_aux_loss_scale(_cond: Conditions = None) -> None:
    """MoEAuxLossAutoScaler.backward reads its scale from a class attribute of the autograd.Function itself, which
    dynamo (torch 2.11 / 2.13) cannot read while it traces that backward ("GetAttrVariable(AutogradFunctionVariable,
    main_loss_backward_scale) does not implement python_type()"): every MoE layer's compiled graph breaks at its
    load-balancing loss (measured on CPU, debug MoE model, 10 layers: 13 of 30 graph breaks). The same backward,
    reading the scale that megatron's schedule sets (set_loss_scale, once per micro batch) from a plain holder;
    before any set_loss_scale the scale is 1, as megatron's own default."""
    from megatron.core.transformer.moe import moe_utils

    scaler = moe_utils.MoEAuxLossAutoScaler
    if getattr(scaler, "__primus_readable__", False):
        return
    set_orig = scaler.set_loss_scale

    def set_loss_scale(scale: torch.Tensor) -> None:
        set_orig(scale)
        _AuxLossScale.value = scaler.main_loss_backward_scale

    def backward(ctx, grad_output: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        scale = _AuxLossScale.value
        return grad_output, (torch.ones_like(aux_loss) if scale is None else torch.ones_like(aux_loss) * scale)

    _AuxLossScale.value = scaler.main_loss_backward_scale
    scaler.set_loss_scale = staticmethod(set_loss_scale)
    scaler.backward = staticmethod(backward)
    scaler.__primus_readable__ = True


WORKAROUNDS = (
    Workaround(
        "megatron.compile.quiet_tp_group_lookup",
        "megatron.core.tensor_parallel.layers.get_tensor_model_parallel_group_if_none",
        "warns (deprecation) on every call with tp_group=None, inside the activation-offloading context: dynamo "
        "breaks the graph there and leaves the rest of each compiled layer eager",
        (pin("megatron-core", PINNED_MCORE),), "training.compile=true",
        lambda c: bool(c.args.get("compile")), _quiet_tp_group_lookup, every_run=True,
        on_mismatch="skip",
        mismatch_note="it re-implements megatron's TP group lookup, which another version may have changed; without "
                      "it compiled layers only have more graph breaks (slower, same results)"),
    Workaround(
        "megatron.compile.moe_aux_loss_scale",
        "megatron.core.transformer.moe.moe_utils.MoEAuxLossAutoScaler.backward / set_loss_scale",
        "the backward reads its scale from the autograd.Function's class attribute, which dynamo cannot read "
        "while tracing it: every compiled MoE layer's graph breaks at its load-balancing loss",
        (pin("megatron-core", PINNED_MCORE),), "training.compile=true",
        lambda c: bool(c.args.get("compile")), _readable_aux_loss_scale, every_run=True,
        on_mismatch="skip",
        mismatch_note="it re-implements the scaler's backward, which another version may have changed; without it "
                      "compiled MoE layers only have more graph breaks (slower, same results)"),
)
