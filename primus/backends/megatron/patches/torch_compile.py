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
)
