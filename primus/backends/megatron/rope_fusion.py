"""model.apply_rope_fusion without Transformer Engine: megatron-core's own `fused_single_qkv_rope` path, served by
primus.turbo.rope (Triton) instead of TE.

megatron-core 0.16.1's SelfAttention hands the unsplit projection [s, b, ng, (r+2)*d] to
`apply_fused_qkv_rotary_pos_emb(mixed_qkv, q_pos_emb, k_pos_emb, split_arg_list)` when
`config.fused_single_qkv_rope` is set and its module flag HAVE_FUSED_QKV_ROPE says TE's function imported. Without
TE both are missing; `install()` puts ours in their place (module globals, looked up at call time). The contract is
TE's: q [s, b, np, hn], k / v [s, b, ng, hn] (ours are [b, s, h, d] tensors seen through transposes, the layout
SDPA's fused kernels read directly). args.py turns the flag on only where this path applies (RoPE on q/k without
q/k norms, rotary over the whole head, no interleaving), so megatron's assertion never sees it requested elsewhere.
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


def install() -> None:
    from megatron.core.transformer import attention

    attention.HAVE_FUSED_QKV_ROPE = True
    attention.apply_fused_qkv_rotary_pos_emb = fused_qkv_rotary_pos_emb


def installed() -> bool:
    from megatron.core.transformer import attention

    return getattr(attention, "apply_fused_qkv_rotary_pos_emb", None) is fused_qkv_rotary_pos_emb


