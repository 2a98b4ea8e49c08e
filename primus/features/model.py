"""The model feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional


class CrossEntropyImpl(str, Enum):
    native = "native"  # megatron's fused vocab-parallel cross entropy
    te = "te"  # Transformer Engine's
    turbo = "turbo"  # primus.turbo.cross_entropy (Triton; megatron backend, tp = 1)


@dataclass
class ModelConfig:
    name: str = "debug"  # preset name; used in output paths (tune_hipblaslt/<name>/...)
    num_layers: int = 2  # decoder layers
    hidden_size: int = 64  # model dimension
    ffn_hidden_size: int = 256  # dense MLP inner size (SwiGLU: per branch)
    num_attention_heads: int = 4  # query heads
    num_query_groups: int = 2  # key/value heads (GQA); == heads for MHA
    kv_channels: Optional[int] = None  # head dim; None = hidden_size / heads
    vocab_size: int = 2048  # tokenizer vocabulary
    max_position_embeddings: int = 4096  # RoPE table length
    rotary_base: float = 10000.0  # RoPE theta
    norm_epsilon: float = 1e-5  # RMSNorm eps
    tie_word_embeddings: bool = False  # share input embedding and output projection
    qk_layernorm: bool = False  # RMSNorm on q and k per head (Qwen3)
    # MoE architecture (num_experts None = dense)
    num_experts: Optional[int] = None  # routed experts per MoE layer
    moe_router_topk: int = 2  # experts per token
    moe_ffn_hidden_size: Optional[int] = None  # expert inner size; None = ffn_hidden_size
    moe_shared_expert_intermediate_size: Optional[int] = None  # total shared-expert inner size; None = no shared experts
    moe_first_k_dense: int = 0  # leading dense layers before MoE layers (DeepSeek first_k_dense_replace)
    # Multi-latent attention (DeepSeek-V2)
    multi_latent_attention: bool = False  # MLA instead of GQA
    q_lora_rank: Optional[int] = None  # query low-rank; None = full-rank query projection
    kv_lora_rank: int = 512  # compressed KV width
    qk_head_dim: int = 128  # non-rotary q/k head dim
    qk_pos_emb_head_dim: int = 64  # rotary q/k head dim
    v_head_dim: int = 128  # value head dim
    mtp_num_layers: int = 0  # multi-token-prediction depths (their recompute ids follow the decoder's)
    # Loss fusion (guide: language_model.yaml)
    cross_entropy_loss_fusion: bool = False  # fused cross entropy
    cross_entropy_fusion_impl: CrossEntropyImpl = CrossEntropyImpl.native  # "te" needs TE; "turbo": Triton, tp=1
    # fused q/k/v split + RoPE: null = where available (TE's, or primus' Triton kernel on a GPU), true = required
    apply_rope_fusion: Optional[bool] = None
    # fused SwiGLU (megatron bias_activation_fusion): null = on a GPU (primus' Triton kernel, else megatron's
    # torch.compile'd one), true = also on CPU, false = eager silu(gate) * up
    bias_activation_fusion: Optional[bool] = None
