"""Layer specs: Transformer Engine's when TE imports, else megatron-core's local spec with fused modules swapped in.

The stock local spec's DotProductAttention materialises the [b, heads, s, s] score tensor (measured on the H200,
Llama-3.2-1B at seq 4096: 8.7% MFU, out of memory at micro batch 8). `SDPAttention` hands the same inputs to
torch's scaled_dot_product_attention (cuDNN / flash on the GPU, GQA without repeating K/V): 45% MFU there.
Norms become `RMSNorm` (torch.nn.functional.rms_norm, one fused kernel on the GPU) whose weights carry megatron's
`sequence_parallel` mark, so their gradients are summed over tp ranks when sequence parallel is on.

Attention sinks (model.use_sink_attention: megatron's softmax_type="learnable", a learned logit per head that joins
every row's softmax and attends nothing) and their sliding window (megatron's window_size / window_attn_skip_freq)
run through the same SDPA call: `primus.backends.attention_sinks.sink_attention` adds the sink as one more key, so
that torch's SDPA (which has no sink argument) may still pick its fused kernels.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig


class SDPAttention(MegatronModule):
    """Core attention for megatron's SelfAttention / MLASelfAttention: [s, b, h, d] in, [s, b, h * dv] out."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None, pg_collection=None,
                 k_channels: Optional[int] = None, v_channels: Optional[int] = None):
        # MLA passes k/v head dims (192 / 128 for DeepSeek-V2); SDPA reads them off the tensors
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention has no context parallelism (capability_issues should have said so)")
        tp = pg_collection.tp.size() if pg_collection is not None else \
            parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.attn_mask_type = attn_mask_type
        # MLA passes its own scale (q/k head dim 192, v 128); otherwise 1/sqrt(kv_channels) as megatron does
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        from megatron.core.transformer.utils import is_layer_window_attention

        # (left, right) as flash attention counts it: query i sees keys i - left .. i + right
        self.window = config.window_size if is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number) else None
        self.tp_group = pg_collection.tp if pg_collection is not None else \
            parallel_state.get_tensor_model_parallel_group()
        if config.softmax_type not in ("vanilla", "learnable"):
            raise ValueError(f"SDPAttention: softmax_type {config.softmax_type!r} (model rules allow learnable only)")
        self.softmax_offset = None
        if config.softmax_type == "learnable":
            # megatron-core's name, shape (this rank's heads), dtype and init, so checkpoints carry over to its
            # DotProductAttention and TE's
            self.softmax_offset = torch.nn.Parameter(torch.empty(self.heads, dtype=config.params_dtype))
            if config.perform_initialization:
                config.init_method(self.softmax_offset)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_unused):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention: packed sequences / attention bias need TE's attention")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # [s, b, h, d] -> [b, h, s, d]: strided views, no copies
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask = None
        causal = mask_type == AttnMaskType.causal
        if attention_mask is not None and not causal:
            mask = ~attention_mask  # megatron: True = masked out; SDPA: True = attend
        dropout = self.dropout_p if self.training else 0.0
        if self.softmax_offset is not None or self.window is not None:
            if dropout > 0.0:
                raise NotImplementedError("SDPAttention: attention sinks / a sliding window with attention dropout")
            from primus.backends.attention_sinks import sink_attention

            out = sink_attention(q, k, v, self.softmax_offset, self.scale, causal, mask, self.window)
            b, h, s, dv = out.shape
            return out.permute(2, 0, 1, 3).reshape(s, b, h * dv)
        kwargs = dict(attn_mask=mask, dropout_p=dropout, is_causal=causal and mask is None, scale=self.scale,
                      enable_gqa=k.size(1) != q.size(1))
        if dropout > 0.0:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        b, h, s, dv = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * dv)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """The learned sinks, split over tp ranks by head (as megatron-core's DotProductAttention saves them)."""
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state = self.state_dict(prefix="", keep_vars=True) if self.softmax_offset is not None else {}
        return make_sharded_tensors_for_checkpoint(state, prefix, {"softmax_offset": 0}, sharded_offsets,
                                                   tp_group=self.tp_group,
                                                   dp_cp_group=(metadata or {}).get("dp_cp_group"))


class RMSNorm(torch.nn.Module):
    """RMSNorm through torch.nn.functional.rms_norm, usable under sequence parallel."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        # megatron's finalize_model_grads sums grads of params marked so over the tp group
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _swap_local_modules(layer_spec: ModuleSpec) -> None:
    sub = layer_spec.submodules
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(sub, name, None) is not None and _is_norm(getattr(sub, name)):
            setattr(sub, name, RMSNorm)
    attn = sub.self_attention.submodules
    attn.core_attention = SDPAttention
    for name in ("q_layernorm", "k_layernorm", "kv_layernorm"):
        if hasattr(attn, name) and _is_norm(getattr(attn, name)):
            setattr(attn, name, RMSNorm)
    # MLP / MoE / shared experts are linears + SwiGLU (the jit-fused bias_swiglu on the GPU): nothing to swap


def _is_norm(cls) -> bool:
    from megatron.core.transformer.identity_op import IdentityOp

    return cls is not IdentityOp and "Norm" in getattr(cls, "__name__", "")


def decoder_block_spec(config: TransformerConfig, use_te: bool, vp_stage: Optional[int] = None,
                       pp_rank: Optional[int] = None, turbo: Optional[dict] = None):
    """The decoder block spec for this pipeline stage (and virtual stage). `turbo`: args["turbo"] (turbo.py swaps
    the attention core / norms it asks for)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization="RMSNorm",
                                      vp_stage=vp_stage, pp_rank=pp_rank)
    if not use_te:
        for layer_spec in spec.layer_specs:
            _swap_local_modules(layer_spec)
        spec.layer_norm = RMSNorm
        if turbo:
            from primus.backends.megatron import turbo as mturbo

            for layer_spec in spec.layer_specs:
                mturbo.swap_spec(layer_spec, turbo)
            if turbo.get("use_turbo_rms_norm"):
                spec.layer_norm = mturbo.TurboRMSNorm
    return spec


def mtp_block_spec(config: TransformerConfig, block_spec, use_te: bool, vp_stage: Optional[int] = None):
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    mtp = get_gpt_mtp_block_spec(config, block_spec, use_transformer_engine=use_te, vp_stage=vp_stage)
    if mtp is not None and not use_te:
        for layer in mtp.layer_specs:
            for name in ("enorm", "hnorm", "layer_norm"):
                if hasattr(layer.submodules, name) and _is_norm(getattr(layer.submodules, name)):
                    setattr(layer.submodules, name, RMSNorm)
    return mtp


def describe(use_te: bool) -> str:
    if use_te:
        return "Transformer Engine spec"
    return "local spec + torch SDPA core attention + F.rms_norm RMSNorm (Transformer Engine not importable)"


def sdpa_backends() -> Tuple[str, ...]:
    """Which SDPA kernels torch may pick here (for the log)."""
    if not torch.cuda.is_available():
        return ("math/cpu",)
    b = torch.backends.cuda
    names = [("cudnn", b.cudnn_sdp_enabled()), ("flash", b.flash_sdp_enabled()),
             ("mem_efficient", b.mem_efficient_sdp_enabled())]
    return tuple(n for n, on in names if on)
