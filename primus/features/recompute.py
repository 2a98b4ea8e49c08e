"""The recompute feature: activation recompute by granularity, method and count (megatron-core), by global layer
id (this project's `recompute_layer_ids`), and TorchTitan's activation checkpointing (see
primus/features/__init__.py).

Where each key is applied: megatron-core's TransformerConfig takes recompute_granularity / _method / _num_layers /
_modules (`megatron()` below); `recompute_layer_ids` is applied in the model by `apply()` below, which the megatron
trainer calls on each model chunk; TorchTitan takes `activation_checkpoint.mode` / `selective_ac_option`.

Global ids: decoder layers 0..L-1, MTP depth d (0-based) is L+d. megatron-core 0.16.1 can only recompute the first
N layers of each stage ('block') or chunks of N ('uniform'); `apply()` replaces each TransformerBlock's
`_checkpointed_forward` (the path megatron takes when recompute_granularity='full') by a loop that checkpoints a
layer iff its global id is listed. A layer's global id is its `layer_number - 1`: megatron numbers layers
globally, stage offset and virtual stage included, so a pipeline stage needs no offset arithmetic of its own. MTP
layers keep megatron's own per-layer checkpointing, skipped for depths not listed. megatron is imported inside the
functions only, so dry runs stay fast.
"""
from __future__ import annotations

import types
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, Iterable, List, Optional

from primus.config.errors import ConfigIssue
from primus.features import rule


class RecomputeGranularity(str, Enum):
    full = "full"  # whole transformer layers
    selective = "selective"  # the modules in recompute_modules only


class RecomputeMethod(str, Enum):  # (full granularity)
    uniform = "uniform"  # every layer, in checkpointed chunks of recompute_num_layers
    block = "block"  # the first recompute_num_layers layers of each pipeline stage


class ACMode(str, Enum):  # TorchTitan activation_checkpoint.mode
    none = "none"
    selective = "selective"
    full = "full"


@dataclass
class RecomputeConfig:
    recompute_granularity: Optional[RecomputeGranularity] = None  # full | selective | null
    recompute_method: Optional[RecomputeMethod] = None  # uniform | block (full granularity)
    recompute_num_layers: Optional[int] = None  # layers (or chunk size) recomputed
    recompute_layer_ids: Optional[List[int]] = None  # global layer ids to recompute (Primus extension)
    recompute_modules: List[str] = field(default_factory=lambda: ["core_attn"])  # selective: modules recomputed
    # TorchTitan: activation_checkpoint.* ; null mode = follow recompute_granularity
    activation_checkpoint_mode: Optional[ACMode] = None  # none | selective | full
    selective_ac_option: str = "op"  # "op" or an integer N (every N-th layer)


@rule
def recompute_layer_ids(cfg, ctx):
    r = cfg.recompute
    ids = r.recompute_layer_ids
    if ids is None:
        return []
    out = []
    if len(ids) == 0:
        return [ConfigIssue(["recompute.recompute_layer_ids"], [], "an empty list recomputes nothing",
                            "list at least one layer id, or set it to null")]
    if r.recompute_granularity is None or r.recompute_granularity.value != "full" or r.recompute_method is not None:
        out.append(ConfigIssue(
            ["recompute.recompute_layer_ids", "recompute.recompute_granularity", "recompute.recompute_method"],
            {"granularity": r.recompute_granularity and r.recompute_granularity.value,
             "method": r.recompute_method and r.recompute_method.value},
            "recompute_layer_ids needs recompute_granularity=full and recompute_method=null",
            "use recompute=layer_ids, or set recompute.recompute_granularity=full recompute.recompute_method=null"))
    top = cfg.model.num_layers + cfg.model.mtp_num_layers
    bad = sorted({i for i in ids if i < 0 or i >= top})
    if bad:
        out.append(ConfigIssue(["recompute.recompute_layer_ids"], bad,
                               f"ids are global: decoder layers 0..{cfg.model.num_layers - 1}"
                               + (f", MTP depth d is {cfg.model.num_layers}+d (up to {top - 1})" if cfg.model.mtp_num_layers else ""),
                               f"use ids in 0..{top - 1}"))
    if not out:
        r.recompute_layer_ids = sorted(set(ids))  # the guide: duplicates removed, sorted
    return out


# megatron-core 0.16.1's selective-recompute modules (TransformerConfig.__post_init__'s allowed set)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


@rule
def recompute_modules_known(cfg, ctx):
    r = cfg.recompute
    if r.recompute_granularity is None or r.recompute_granularity.value != "selective":
        return []
    out = []
    bad = [m for m in r.recompute_modules if m not in RECOMPUTE_MODULES]
    if bad:  # megatron asserts this only once the model is being built, after the heavy imports
        out.append(ConfigIssue(["recompute.recompute_modules"], bad, "not a selective-recompute module",
                               "use some of " + ", ".join(RECOMPUTE_MODULES)))
    if "mla_up_proj" in r.recompute_modules and not cfg.model.multi_latent_attention:
        out.append(ConfigIssue(["recompute.recompute_modules", "model.multi_latent_attention"], "mla_up_proj",
                               "mla_up_proj recomputes multi-latent attention's up projections",
                               "drop mla_up_proj, or use an MLA model (model.multi_latent_attention=true)"))
    return out


# Fields that act only under another setting (primus.features.idle_settings): set while it is off, they are refused.
# Megatron-LM refuses a layer count with selective recompute; with full recompute and no method, the plain
# `recompute=full` here checkpoints every layer on its own, which a count would not change.
ACTS_ONLY_WITH = (
    (("recompute_num_layers",), "a recompute_method (uniform: chunks of N layers; block: the first N layers of each "
     "pipeline stage)", lambda c: c.recompute.recompute_method is not None,
     "set recompute.recompute_method=uniform or block (with recompute_granularity=full), or drop it"),
    (("recompute_modules",), "selective recompute (recompute_granularity=selective)",
     lambda c: c.recompute.recompute_granularity == RecomputeGranularity.selective,
     "use recompute=selective, or drop it"),
)


@rule
def recompute_method_needs_full(cfg, ctx):
    r = cfg.recompute
    out = []
    if r.recompute_method is not None and (r.recompute_granularity is None or r.recompute_granularity.value != "full"):
        out.append(ConfigIssue(["recompute.recompute_method", "recompute.recompute_granularity"],
                               r.recompute_method.value, "recompute_method applies to recompute_granularity=full",
                               "set recompute.recompute_granularity=full or recompute.recompute_method=null"))
    if r.recompute_method is not None and r.recompute_num_layers is None:
        out.append(ConfigIssue(["recompute.recompute_num_layers"], None,
                               f"recompute_method={r.recompute_method.value} needs the number of layers",
                               "set recompute.recompute_num_layers (e.g. 1 for uniform)"))
    if r.recompute_num_layers is not None and r.recompute_num_layers <= 0:
        out.append(ConfigIssue(["recompute.recompute_num_layers"], r.recompute_num_layers, "must be >= 1", "use a positive count"))
    return out


# ------------------------------------------------------------------------------------------- megatron-core

# megatron-core's selective-recompute modules whose replay runs linears
LINEAR_RECOMPUTE_MODULES = {"mlp", "moe", "shared_experts", "mla_up_proj"}


def replays_linears(cfg) -> bool:
    """Whether activation recompute runs linears' forwards again inside the backward."""
    r = cfg.recompute
    if r.recompute_layer_ids or (r.recompute_granularity is not None and r.recompute_granularity.value == "full"):
        return True
    return r.recompute_granularity is not None and bool(set(r.recompute_modules) & LINEAR_RECOMPUTE_MODULES)


def recompute_kwargs(cfg) -> Dict[str, Any]:
    """The TransformerConfig keywords."""
    r = cfg.recompute
    if r.recompute_layer_ids:
        # megatron requires a method with granularity=full; apply() replaces the block's checkpointed forward, so
        # these two values only get the block onto that code path and choose nothing themselves.
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if r.recompute_granularity is None:
        return {"recompute_granularity": None}
    out: Dict[str, Any] = {"recompute_granularity": r.recompute_granularity.value}
    if r.recompute_granularity.value == "full":
        if r.recompute_method is None:  # plain `recompute=full`: every layer, one per checkpointed chunk
            out.update(recompute_method="uniform", recompute_num_layers=1)
        else:
            out["recompute_method"] = r.recompute_method.value
            out["recompute_num_layers"] = r.recompute_num_layers
    else:
        out["recompute_modules"] = list(r.recompute_modules)
    return out


def megatron(cfg, ctx) -> dict:
    return {"transformer_config": recompute_kwargs(cfg),
            "recompute_layer_ids": list(cfg.recompute.recompute_layer_ids or [])}


# ------------------------------------------------------------------------------------------- TorchTitan

# Our fields that only megatron-core reads: under backend=torchtitan a non-default one is an issue
# (backends/torchtitan/args.py checks every feature's megatron_only).
MEGATRON_ONLY = ("recompute_method", "recompute_num_layers", "recompute_layer_ids", "recompute_modules")


def megatron_only(cfg) -> tuple:
    return MEGATRON_ONLY


def torchtitan_only(cfg) -> tuple:
    return ("activation_checkpoint_mode", "selective_ac_option")


def ac_mode(r: RecomputeConfig) -> str:
    """TorchTitan's activation_checkpoint.mode: its own key, else the one recompute_granularity means."""
    if r.activation_checkpoint_mode is not None:
        return r.activation_checkpoint_mode.value
    if r.recompute_granularity == RecomputeGranularity.selective:
        return ACMode.selective.value
    if r.recompute_granularity == RecomputeGranularity.full:
        return ACMode.full.value
    return ACMode.none.value


def torchtitan(cfg, ctx) -> dict:
    return {"activation_checkpoint": {"mode": ac_mode(cfg.recompute),
                                      "selective_ac_option": cfg.recompute.selective_ac_option}}


def torchtitan_issues(cfg, ctx) -> list:
    out = []
    if ac_mode(cfg.recompute) == "selective":
        opt = cfg.recompute.selective_ac_option
        if opt != "op" and not opt.isdigit():
            out.append(ConfigIssue(["recompute.selective_ac_option"], opt, "must be 'op' or an integer",
                                   "use op or e.g. 2"))
    return out


# ------------------------------------------------------------------------------------------- in the model
# recompute_layer_ids, applied to each megatron GPTModel chunk (the megatron trainer calls apply()).


def _quantization_context(config, layer_index: int):
    if config.fp8:
        from megatron.core.fp8_utils import get_fp8_context

        return get_fp8_context(config, layer_index)
    if getattr(config, "fp4", None):
        from megatron.core.fp4_utils import get_fp4_context

        return get_fp4_context(config, layer_index)
    return nullcontext()


def _checkpoint(config, fn, *args):
    from megatron.core import parallel_state, tensor_parallel

    if config.fp8 or getattr(config, "fp4", None):
        from megatron.core.extensions.transformer_engine import te_checkpoint

        return te_checkpoint(fn, config.distribute_saved_activations, tensor_parallel.random.get_cuda_rng_tracker,
                             parallel_state.get_tensor_model_parallel_group(), *args)
    return tensor_parallel.checkpoint(fn, config.distribute_saved_activations, *args)


def _block_forward(ids: frozenset):
    def _checkpointed_forward(self, hidden_states, attention_mask, context, context_mask, rotary_pos_emb,
                              attention_bias, packed_seq_params, use_inner_quantization_context,
                              padding_mask=None):
        for layer in self.layers:
            global_id = layer.layer_number - 1

            def run(h, mask, ctx, ctx_mask, rope, pad, layer=layer, global_id=global_id):
                q = _quantization_context(self.config, global_id) if use_inner_quantization_context else nullcontext()
                with q:
                    return layer(hidden_states=h, attention_mask=mask, context=ctx, context_mask=ctx_mask,
                                 rotary_pos_emb=rope, attention_bias=attention_bias, inference_context=None,
                                 packed_seq_params=packed_seq_params, padding_mask=pad)

            inputs = (hidden_states, attention_mask, context, context_mask, rotary_pos_emb, padding_mask)
            if global_id in ids:
                hidden_states, context = _checkpoint(self.config, run, *inputs)
            else:
                hidden_states, context = run(*inputs)
        return hidden_states

    return _checkpointed_forward


def _mtp_forward(original, listed: bool):
    def _checkpointed_forward(self, forward_func, *args, **kwargs):
        if listed:
            return original(forward_func, *args, **kwargs)
        return forward_func(*args, **kwargs)

    return _checkpointed_forward


def apply(model, layer_ids: Iterable[int]) -> List[int]:
    """Patch one GPTModel chunk; returns the global ids recomputed on this chunk (for tests and the log)."""
    ids = frozenset(int(i) for i in layer_ids)
    config = model.config
    block = getattr(model, "decoder", None)
    here = []
    if block is not None:
        block._checkpointed_forward = types.MethodType(_block_forward(ids), block)
        here += [l.layer_number - 1 for l in block.layers if l.layer_number - 1 in ids]
    mtp = getattr(model, "mtp", None)
    if mtp is not None:
        for layer in mtp.layers:
            global_id = config.num_layers + layer.layer_number - 1
            layer._checkpointed_forward = types.MethodType(
                _mtp_forward(layer._checkpointed_forward, global_id in ids), layer)
            if global_id in ids:
                here.append(global_id)
    model.primus_recomputed_layer_ids = sorted(here)
    return sorted(here)
