"""Turbo attention: torch SDPA on the fastest backend this device has, GQA without repeating K/V.

    o = turbo_attention(q, k, v, causal=True, layout="bshd")

Layouts: "bshd" (batch, seq, heads, dim; TorchTitan / HF), "sbhd" (Megatron core attention), "bhsd" (SDPA's own).
The output has the input layout. K/V may have fewer heads than Q (GQA / MQA, q_heads % kv_heads == 0): SDPA's
`enable_gqa` reads the shared K/V heads in the kernel, nothing is repeated in memory.

Backend order (first that accepts the inputs wins, `sdpa_kernel(..., set_priority=True)`):
  CUDA: cuDNN, flash, memory-efficient  (H200: cuDNN fwd+bwd causal ~373 TFLOP/s vs flash ~239, platform-facts.md)
  ROCm: flash (AOTriton / CK), memory-efficient
The math backend (which materialises scores and repeats K/V) is never used on a GPU: if no fused backend accepts
the inputs, this raises instead of silently running slowly.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_ORDER = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def backend_order(device: torch.device, backend: str = "auto") -> Sequence[SDPBackend]:
    if backend != "auto":
        return [_ORDER[backend]]
    if device.type != "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]  # CPU: the fused CPU flash kernel, math for odd dtypes
    if torch.version.hip is not None:
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def _to_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "bhsd":
        return t
    if layout == "bshd":
        return t.transpose(1, 2)
    if layout == "sbhd":
        return t.permute(1, 2, 0, 3)
    raise ValueError(f"layout must be bshd, sbhd or bhsd, not {layout!r}")


def _from_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "bhsd":
        return t
    if layout == "bshd":
        return t.transpose(1, 2)
    return t.permute(2, 0, 1, 3)  # sbhd


def turbo_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, layout: str = "bshd",
                    scale: Optional[float] = None, backend: str = "auto", dropout_p: float = 0.0) -> torch.Tensor:
    """Scaled dot-product attention on the fastest fused backend; GQA when k/v have fewer heads than q."""
    qb, kb, vb = (_to_bhsd(t, layout) for t in (q, k, v))
    hq, hk = qb.shape[1], kb.shape[1]
    if hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    gqa = hq != hk
    with sdpa_kernel(list(backend_order(q.device, backend)), set_priority=True):
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale, dropout_p=dropout_p,
                                           enable_gqa=gqa)
    return _from_bhsd(o, layout)


def attention_reference(q, k, v, causal: bool = True, layout: str = "bshd", scale: Optional[float] = None):
    """Plain PyTorch attention (repeats K/V, materialises the scores): the eager baseline and test reference."""
    qb, kb, vb = (_to_bhsd(t, layout) for t in (q, k, v))
    rep = qb.shape[1] // kb.shape[1]
    if rep > 1:
        kb, vb = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
    s = (qb @ kb.transpose(-1, -2)) * (scale if scale is not None else qb.shape[-1] ** -0.5)
    if causal:
        L, S = s.shape[-2], s.shape[-1]
        mask = torch.ones(L, S, dtype=torch.bool, device=s.device).tril(S - L)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(vb.dtype)
    return _from_bhsd(p @ vb, layout)


def active_backend(q, k, v, causal: bool = True, layout: str = "bshd") -> str:
    """Name of the first backend in the preference order that runs these inputs (for start-up logs and the bench)."""
    for b in backend_order(q.device):
        name = [n for n, e in _ORDER.items() if e == b][0]
        try:
            turbo_attention(q, k, v, causal=causal, layout=layout, backend=name)
            return name
        except RuntimeError:
            continue
    return "none"
