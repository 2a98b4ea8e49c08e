"""Attention sinks for both backends' attention cores (model.use_sink_attention, gpt-oss): a learned logit per head
that joins every softmax row and attends nothing, as megatron-core's softmax_type="learnable" computes it, optionally
with megatron's sliding window. torch's SDPA has no sink argument; `sink_attention` gives it the sink as one more key.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def _window_allows(sq: int, sk: int, window: Tuple[int, int], device) -> torch.Tensor:
    """[sq, sk] True where query i may see key j under megatron's sliding window (get_sliding_window_causal_mask):
    i - left <= j - (sk - sq) <= i + right."""
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return (j >= i - window[0]) & (j <= i + window[1])


def _allowed(sq: int, sk: int, causal: bool, window, allowed, device) -> Optional[torch.Tensor]:
    """SDPA's boolean mask (True = attend) for these settings; None where is_causal (or nothing) says it all."""
    if window is None and allowed is None and (not causal or sq == sk):
        return None
    if window is not None:  # megatron's window mask stands in for the causal one (window (w, 0) is causal)
        real = _window_allows(sq, sk, window, device)
    else:
        real = torch.ones(sq, sk, dtype=torch.bool, device=device)
        real = torch.tril(real, diagonal=sk - sq) if causal else real
    return real & allowed if allowed is not None else real


def sink_attention(q, k, v, offset: Optional[torch.Tensor], scale: float, causal: bool,
                   allowed: Optional[torch.Tensor] = None, window: Optional[Tuple[int, int]] = None):
    """softmax([q k^T * scale, offset[h]]) without its last column, times v: each head's learned sink is one more
    logit in every row's softmax and attends nothing (megatron-core's softmax_type="learnable"). q [b, hq, sq, d],
    k [b, hk, sk, d], v [b, hk, sk, dv] (hk dividing hq), offset [hq] or None (no sink: the window alone),
    `allowed` SDPA's boolean mask (True = attend) for a non-causal call, `window` megatron's (left, right).

    The sink becomes key 0 of an SDPA call with two more q/k channels: q carries offset / scale in them (split into
    a high and a low half of its dtype, so a bf16 run keeps about 16 bits of the sink), the sink key carries 1 and
    every real key 0, and the sink's value is 0. A zero query 0 keeps the causal diagonal where it was: query i + 1
    sees the sink and keys 0..i. The head dim is padded to a multiple of 8, which flash and cuDNN need."""
    b, hq, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if offset is None:
        real = _allowed(sq, sk, causal, window, allowed, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=real, is_causal=causal and real is None,
                                              scale=scale, enable_gqa=hk != hq)
    extra = 2 + (-(d + 2)) % 8
    x = offset.to(torch.promote_types(q.dtype, torch.float32)) / scale
    hi = x.to(q.dtype)
    q_sink = torch.cat([hi.unsqueeze(1), (x - hi.to(x.dtype)).to(q.dtype).unsqueeze(1), q.new_zeros(hq, extra - 2)],
                       dim=1)
    q2 = torch.cat([q, q_sink.view(1, hq, 1, extra).expand(b, hq, sq, extra)], dim=-1)
    q2 = torch.cat([q2.new_zeros(b, hq, 1, d + extra), q2], dim=2)
    k_sink = k.new_zeros(d + extra)
    k_sink[d:d + 2] = 1.0
    k2 = torch.cat([k, k.new_zeros(b, hk, sk, extra)], dim=-1)
    k2 = torch.cat([k_sink.view(1, 1, 1, -1).expand(b, hk, 1, d + extra), k2], dim=2)
    # v as wide as q / k where it was (flash needs equal head dims); MLA's narrower v stays narrower
    v2 = torch.cat([v, v.new_zeros(b, hk, sk, extra)], dim=-1) if dv == d else v
    v2 = torch.cat([v2.new_zeros(b, hk, 1, v2.shape[-1]), v2], dim=2)
    mask, real = None, _allowed(sq, sk, causal, window, allowed, q.device)
    if real is not None:
        mask = torch.ones(*real.shape[:-2], sq + 1, sk + 1, dtype=torch.bool, device=q.device)
        mask[..., 0, 1:] = False  # the zero query sees the sink only
        mask[..., 1:, 1:] = real
    out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, is_causal=causal and mask is None,
                                         scale=scale, enable_gqa=hk != hq)
    return out[:, :, 1:, :dv]
