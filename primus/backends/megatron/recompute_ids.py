"""`recompute.recompute_layer_ids`: full recompute of exactly the listed layers, by global id.

Global ids: decoder layers 0..L-1, MTP depth d (0-based) is L+d. megatron-core 0.16.1 can only recompute the first
N layers of each stage ('block') or chunks of N ('uniform'); here each TransformerBlock's `_checkpointed_forward`
(the path megatron takes when recompute_granularity='full') is replaced by a loop that checkpoints a layer iff
its global id is listed. A layer's global id is its `layer_number - 1`: megatron numbers layers globally, stage
offset and virtual stage included, so a pipeline stage needs no offset arithmetic of its own. MTP layers keep
megatron's own per-layer checkpointing, skipped for depths not listed.
"""
from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Iterable, List


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
