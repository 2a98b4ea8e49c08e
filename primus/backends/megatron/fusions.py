"""megatron-core's fusion entry points served by primus' Triton kernels when Transformer Engine is absent.

RoPE (model.apply_rope_fusion -> args "rope_fusion" == "triton")
    megatron-core 0.16.1's SelfAttention hands the unsplit projection [s, b, ng, (r+2)*d] to
    `apply_fused_qkv_rotary_pos_emb(mixed_qkv, q_pos_emb, k_pos_emb, split_arg_list)` when
    `config.fused_single_qkv_rope` is set and its module flag HAVE_FUSED_QKV_ROPE says TE's function imported.
    Without TE both are missing; `configure(rope=True, ...)` puts primus.turbo.rope in their place (module globals,
    looked up at call time). The contract is TE's: q [s, b, np, hn], k / v [s, b, ng, hn] (ours are [b, s, h, d] tensors
    seen through transposes, the layout SDPA's fused kernels read directly). args.py sets the flag only where the
    path applies (RoPE on q/k without q/k norms, rotary over the whole head), so megatron's assertion never sees it
    requested elsewhere.

SwiGLU (model.bias_activation_fusion -> args "activation_fusion" == "triton")
    megatron's MLP calls `bias_swiglu_impl(x, bias, fp8_input_store, cpu_offload)` (megatron/core/transformer/mlp.py
    imports it by name). Without a bias and without the fp8 input store that is exactly primus.turbo.swiglu, a
    torch custom op that compiled layers keep whole; other calls go to megatron's own implementation.
"""
from __future__ import annotations


def fused_qkv_rotary_pos_emb(mixed_qkv, q_pos_emb, k_pos_emb, qkv_split_arg_list):
    from primus.turbo.rope import qkv_rope

    s = mixed_qkv.shape[0]
    d = qkv_split_arg_list[1]
    r = qkv_split_arg_list[0] // d
    q_freqs = q_pos_emb[:s].reshape(s, -1)  # megatron's [s_max, 1, 1, d] fp32 angles
    k_freqs = k_pos_emb[:s].reshape(s, -1)
    q, k, v = qkv_rope(mixed_qkv, q_freqs.float(), k_freqs.float(), r)
    return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)


_ORIGINAL: dict = {}


def _megatron_modules():
    from megatron.core.transformer import attention, mlp

    if not _ORIGINAL:  # the first call sees megatron's own entry points
        _ORIGINAL.update(rope=(attention.HAVE_FUSED_QKV_ROPE, getattr(attention, "apply_fused_qkv_rotary_pos_emb", None)),
                         swiglu=mlp.bias_swiglu_impl)
    return attention, mlp


def _primus_bias_swiglu_impl(x, bias, fp8_input_store=False, cpu_offload_input=False):
    if bias is None and not fp8_input_store and not cpu_offload_input:
        from primus.turbo.swiglu import swiglu

        return swiglu(x)
    return _ORIGINAL["swiglu"](x, bias, fp8_input_store, cpu_offload_input)


def configure(rope: bool, swiglu: bool) -> None:
    """Route megatron's fused RoPE / SwiGLU entry points to primus' kernels, or back to megatron's own (a process
    may build several trainers, e.g. tests)."""
    attention, mlp = _megatron_modules()
    have, fn = (True, fused_qkv_rotary_pos_emb) if rope else _ORIGINAL["rope"]
    attention.HAVE_FUSED_QKV_ROPE = have
    attention.apply_fused_qkv_rotary_pos_emb = fn
    mlp.bias_swiglu_impl = _primus_bias_swiglu_impl if swiglu else _ORIGINAL["swiglu"]


def installed() -> dict:
    from megatron.core.transformer import attention, mlp

    return {"rope": getattr(attention, "apply_fused_qkv_rotary_pos_emb", None) is fused_qkv_rotary_pos_emb,
            "swiglu": mlp.bias_swiglu_impl is _primus_bias_swiglu_impl}
