"""Model FLOPs per token and the MFU formula, shared by both backends, the planner and the benchmarks.

MFU = tokens/s x (6 N + 12 L H Dh S) / peak, where N counts the parameters that do matmuls per token (the input
embedding lookup is left out, as TorchTitan does; the output projection is in, tied or not; for MoE only the
routed top-k experts, the shared experts and the router), L layers, H query heads, Dh head dim, S sequence length.
The 12 L H Dh S term is attention's QK^T and AV (forward + backward, no causal discount), as in the reference; a
layer with a sliding window (model.sink_sliding_window) counts the keys its window holds instead of S.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus.config.schema import ModelConfig


def head_dim(m: ModelConfig) -> int:
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def attention_params(m: ModelConfig) -> int:
    h, heads = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = h * heads * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank * heads * qk
        kv_down = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)
        kv_up = m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim)
        out = heads * m.v_head_dim * h
        return q + kv_down + kv_up + out
    dh = head_dim(m)
    return h * heads * dh + 2 * h * m.num_query_groups * dh + heads * dh * h


def qkv_bias_params(m: ModelConfig) -> int:
    """The q/k/v projection biases of one layer (add_qkv_bias; not matmul parameters, so outside N)."""
    if not m.add_qkv_bias or m.multi_latent_attention:
        return 0
    return (m.num_attention_heads + 2 * m.num_query_groups) * head_dim(m)


def sink_params(m: ModelConfig) -> int:
    """One layer's learned attention sinks (model.use_sink_attention): a logit per query head, outside N."""
    return m.num_attention_heads if m.use_sink_attention else 0


def dense_mlp_params(m: ModelConfig) -> int:
    return 3 * m.hidden_size * m.ffn_hidden_size  # SwiGLU: gate, up, down


def expert_params(m: ModelConfig) -> int:
    return 3 * m.hidden_size * (m.moe_ffn_hidden_size or m.ffn_hidden_size)


def shared_expert_params(m: ModelConfig) -> int:
    return 3 * m.hidden_size * (m.moe_shared_expert_intermediate_size or 0)


def num_moe_layers(m: ModelConfig) -> int:
    from primus.features.model import moe_layers

    return sum(moe_layers(m))


@dataclass
class ParamCounts:
    total: int  # every parameter, embeddings and norms included
    matmul_active: int  # N of the MFU formula: matmul parameters a token passes through


def param_counts(m: ModelConfig) -> ParamCounts:
    h = m.hidden_size
    attn = attention_params(m)
    norms_per_layer = 2 * h + qkv_bias_params(m)  # (+ the q/k/v biases: per-layer vectors like the norms)
    norms_per_layer += sink_params(m)
    if m.qk_layernorm:  # GQA: per-head q/k norms; MLA: norms on the compressed latents
        norms_per_layer += (m.kv_lora_rank + (m.q_lora_rank or 0)) if m.multi_latent_attention else 2 * head_dim(m)
    moe_layers = num_moe_layers(m)
    dense_layers = m.num_layers - moe_layers
    router = h * (m.num_experts or 0)
    layer_total = (attn + norms_per_layer) * m.num_layers + dense_layers * dense_mlp_params(m)
    layer_total += moe_layers * ((m.num_experts or 0) * expert_params(m) + shared_expert_params(m) + router)
    layer_active = attn * m.num_layers + dense_layers * dense_mlp_params(m)
    layer_active += moe_layers * (m.moe_router_topk * expert_params(m) + shared_expert_params(m) + router)
    embed = m.vocab_size * h
    output = 0 if m.tie_word_embeddings else m.vocab_size * h
    total = layer_total + embed + output + h  # + final norm
    return ParamCounts(total=total, matmul_active=layer_active + m.vocab_size * h)


def flops_per_token(m: ModelConfig, seq_length: int, causal: bool = False) -> float:
    """Training FLOPs (forward + backward) per token.

    The attention term counts the full S x S score matrix, as Megatron and the README do; `causal=True` halves it
    (only the lower triangle is computed by a causal kernel), the convention of the PaLM paper and of TorchTitan.
    """
    n = param_counts(m).matmul_active
    if m.multi_latent_attention:
        attn_dim = (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2
    else:
        attn_dim = head_dim(m)
    from primus.features.model import window_size, windowed_layers

    def keys(layers: int, span: int) -> float:  # keys per query summed over layers: the span, or half it (causal)
        return layers * (span - span * span / (2.0 * seq_length) if causal else span)

    window = window_size(m)
    span = min(window[0] + 1, seq_length) if window else seq_length
    n_win = windowed_layers(m)
    per_key = 12.0 * m.num_attention_heads * attn_dim
    return 6.0 * n + per_key * (keys(m.num_layers - n_win, seq_length) + keys(n_win, span))
