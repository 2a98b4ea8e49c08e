"""The model feature: its config, rules and backend mapping (see primus/features/__init__.py).

In-model application (megatron): the fused SwiGLU and q/k/v split + RoPE kernels (primus.turbo.swiglu / rope) are
hooked into megatron by primus/backends/megatron/fusions.py (activation_fusion / rope_fusion say which); the Triton
cross entropy (cross_entropy_fusion_impl=turbo) by perf.turbo_loss. TorchTitan builds the model from
primus/backends/torchtitan/flavors.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
import importlib.util
import os
from typing import Any, Dict, List, Optional

from primus.config.errors import WARNING, ConfigIssue
from primus.features import rule
from primus.features.moe import ROUTER as MOE_ROUTER, LoadBalancing, ScoreFunction


class RopeType(str, Enum):
    rope = "rope"  # plain RoPE
    yarn = "yarn"  # YaRN-scaled RoPE (DeepSeek-V2/V3 multi-latent attention)


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
    # Llama-3.x RoPE frequency scaling (Megatron-LM's names): low frequencies divided by the factor, over an
    # original context of 8192 (megatron-core's and TorchTitan's fixed low / high frequency factors 1 and 4)
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    norm_epsilon: float = 1e-5  # RMSNorm eps
    tie_word_embeddings: bool = False  # share input embedding and output projection
    qk_layernorm: bool = False  # RMSNorm on q and k per head (Qwen3)
    add_qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2 / Qwen2.5); every other linear has none
    # MoE architecture (num_experts None = dense)
    num_experts: Optional[int] = None  # routed experts per MoE layer
    moe_router_topk: int = 2  # experts per token
    moe_ffn_hidden_size: Optional[int] = None  # expert inner size; None = ffn_hidden_size
    moe_shared_expert_intermediate_size: Optional[int] = None  # total shared-expert inner size; None = no shared experts
    moe_first_k_dense: int = 0  # leading dense layers before MoE layers (DeepSeek first_k_dense_replace)
    # after them, every N-th layer is MoE and the rest dense (Megatron-LM's integer moe_layer_freq; Llama 4
    # Maverick: 2); 1 = every layer
    moe_layer_freq: int = 1
    # the model's router and balancing loss (moe.<same name> overrides them for a run)
    moe_router_score_function: ScoreFunction = ScoreFunction.softmax  # router scores
    moe_router_pre_softmax: bool = False  # softmax over all experts before top-k (else over the chosen k)
    moe_router_load_balancing_type: LoadBalancing = LoadBalancing.aux_loss  # balancing loss
    moe_aux_loss_coeff: float = 0.01  # its weight
    # Multi-latent attention (DeepSeek-V2)
    multi_latent_attention: bool = False  # MLA instead of GQA
    q_lora_rank: Optional[int] = None  # query low-rank; None = full-rank query projection
    kv_lora_rank: int = 512  # compressed KV width
    qk_head_dim: int = 128  # non-rotary q/k head dim
    qk_pos_emb_head_dim: int = 64  # rotary q/k head dim
    v_head_dim: int = 128  # value head dim
    # YaRN RoPE scaling (rope_type=yarn; multi-latent attention): the frequencies of a model pretrained at
    # original_max_position_embeddings, stretched by rotary_scaling_factor; mscale / mscale_all_dim set the
    # attention temperature (DeepSeek's names)
    rope_type: RopeType = RopeType.rope
    rotary_scaling_factor: float = 1.0
    original_max_position_embeddings: Optional[int] = None
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    mtp_num_layers: int = 0  # multi-token-prediction depths (their recompute ids follow the decoder's)
    # Attention sinks (gpt-oss; Primus's names): a learned logit per head joins every softmax row and attends
    # nothing (megatron-core's softmax_type=learnable), optionally with a sliding window on alternate layers
    use_sink_attention: bool = False
    sink_sliding_window: int = 0  # keys before each query a windowed layer sees (gpt-oss: 128); 0 = no window
    sink_window_even_layers_only: bool = True  # the window on layers 0, 2, 4, ... (gpt-oss), full attention between
    # Loss fusion (guide: language_model.yaml)
    cross_entropy_loss_fusion: bool = False  # fused cross entropy
    cross_entropy_fusion_impl: CrossEntropyImpl = CrossEntropyImpl.native  # "te" needs TE; "turbo": Triton, tp=1
    # fused q/k/v split + RoPE: null = where available (TE's, or primus' Triton kernel on a GPU), true = required
    apply_rope_fusion: Optional[bool] = None
    # fused SwiGLU (megatron bias_activation_fusion): null = on a GPU (primus' Triton kernel, else megatron's
    # torch.compile'd one), true = also on CPU, false = eager silu(gate) * up
    bias_activation_fusion: Optional[bool] = None


# ------------------------------------------------------------------------------------------- rules

# Fields that act only under another setting (primus.features.idle_settings). An architecture field a switch leaves
# behind (`model=deepseek_v2_lite model.rope_type=rope` keeps the preset's YaRN factors) is harmless: warned, as
# MoE settings on a dense model are, and listed in result.json's ignored_settings.
ACTS_ONLY_WITH = (
    (("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_first_k_dense",
      "moe_layer_freq")
     + MOE_ROUTER, "experts (model.num_experts)", lambda c: bool(c.model.num_experts),
     "drop them, or choose a MoE model (e.g. model=debug_moe)", WARNING),
    (("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"),
     "multi-latent attention (model.multi_latent_attention=true)", lambda c: c.model.multi_latent_attention,
     "drop them, or use an MLA model (e.g. model=deepseek_v2_lite)", WARNING),
    # an A/B that turns the fusion off on a preset naming its kernel leaves the kernel's name behind
    (("cross_entropy_fusion_impl",), "the fused cross entropy (model.cross_entropy_loss_fusion=true)",
     lambda c: c.model.cross_entropy_loss_fusion, "drop it, or set model.cross_entropy_loss_fusion=true", WARNING),
    (("rotary_scaling_factor", "original_max_position_embeddings", "mscale", "mscale_all_dim"),
     "YaRN RoPE scaling (model.rope_type=yarn)", lambda c: c.model.rope_type == RopeType.yarn,
     "drop them, or set model.rope_type=yarn (multi-latent attention)", WARNING),
    (("rope_scaling_factor",), "Llama-3.x RoPE scaling (model.use_rope_scaling=true)",
     lambda c: c.model.use_rope_scaling, "drop it, or set model.use_rope_scaling=true", WARNING),
    (("use_rope_scaling",), "plain RoPE attention (multi-latent attention applies its own RoPE: rope_type=yarn)",
     lambda c: not c.model.multi_latent_attention, "drop it (MLA's RoPE scaling is model.rope_type=yarn)", WARNING),
    # the window belongs to sink attention, as in Primus (its sink_sliding_window is read by the sink kernel only)
    (("sink_sliding_window", "sink_window_even_layers_only"), "attention sinks (model.use_sink_attention=true)",
     lambda c: c.model.use_sink_attention, "drop them, or set model.use_sink_attention=true", WARNING),
    (("sink_window_even_layers_only",), "a sliding window (model.sink_sliding_window > 0)",
     lambda c: not c.model.use_sink_attention or c.model.sink_sliding_window > 0,
     "drop it, or set model.sink_sliding_window (e.g. 128, gpt-oss)", WARNING),
)


def window_size(m) -> Optional[tuple]:
    """megatron's window_size of the windowed layers: (keys before the query, keys after), or None."""
    return (m.sink_sliding_window, 0) if m.use_sink_attention and m.sink_sliding_window > 0 else None


def windowed_layers(m) -> int:
    """How many of the decoder's layers attend within the window (megatron: window_attn_skip_freq=2 leaves the
    layers numbered 2, 4, ... from 1 at full attention)."""
    if window_size(m) is None:
        return 0
    return (m.num_layers + 1) // 2 if m.sink_window_even_layers_only else m.num_layers


@rule
def model_values(cfg, ctx):
    m, out = cfg.model, []
    if m.rotary_base <= 0:
        out.append(ConfigIssue(["model.rotary_base"], m.rotary_base, "RoPE's theta must be > 0", "e.g. 10000 or 500000"))
    if m.norm_epsilon < 0:
        out.append(ConfigIssue(["model.norm_epsilon"], m.norm_epsilon, "must be >= 0", "e.g. 1e-5"))
    if m.rope_type == RopeType.yarn:
        if not m.multi_latent_attention:
            out.append(ConfigIssue(["model.rope_type", "model.multi_latent_attention"], "yarn",
                                   "YaRN RoPE is wired for multi-latent attention (DeepSeek) models only",
                                   "set model.rope_type=rope"))
        if not m.original_max_position_embeddings or m.rotary_scaling_factor <= 0:
            out.append(ConfigIssue(["model.original_max_position_embeddings", "model.rotary_scaling_factor"],
                                   {"original_max_position_embeddings": m.original_max_position_embeddings,
                                    "rotary_scaling_factor": m.rotary_scaling_factor},
                                   "YaRN needs the original context length and a scaling factor > 0",
                                   "e.g. original_max_position_embeddings=4096 rotary_scaling_factor=40 (DeepSeek-V2)"))
    if m.use_rope_scaling and m.rope_scaling_factor <= 0:
        out.append(ConfigIssue(["model.rope_scaling_factor"], m.rope_scaling_factor, "a scaling factor must be > 0",
                               "e.g. 8 (Llama 3.1) or 16 (Llama 4 Scout)"))
    if m.add_qkv_bias and m.multi_latent_attention:
        out.append(ConfigIssue(["model.add_qkv_bias", "model.multi_latent_attention"], True,
                               "multi-latent attention's low-rank q/kv projections have no biases (megatron-core "
                               "builds them bias-free whatever add_qkv_bias says)",
                               "set model.add_qkv_bias=false for an MLA model"))
    if m.num_experts and m.moe_first_k_dense >= m.num_layers:
        out.append(ConfigIssue(["model.moe_first_k_dense", "model.num_layers"],
                               {"moe_first_k_dense": m.moe_first_k_dense, "num_layers": m.num_layers},
                               "every layer would be dense: a MoE model needs at least one MoE layer",
                               f"set model.moe_first_k_dense below {m.num_layers}, or model.num_experts=null for a "
                               "dense model"))
    return out


@rule
def attention_shape(cfg, ctx):
    m, out = cfg.model, []
    if m.num_attention_heads % m.num_query_groups:
        out.append(ConfigIssue(["model.num_attention_heads", "model.num_query_groups"],
                               {"heads": m.num_attention_heads, "kv_heads": m.num_query_groups},
                               "each key/value head serves a whole group of query heads (GQA): heads must be a "
                               "multiple of num_query_groups",
                               f"choose num_query_groups dividing {m.num_attention_heads} (MHA: equal to it)"))
    if m.kv_channels is None and not m.multi_latent_attention and m.hidden_size % m.num_attention_heads:
        out.append(ConfigIssue(["model.hidden_size", "model.num_attention_heads", "model.kv_channels"],
                               {"hidden_size": m.hidden_size, "heads": m.num_attention_heads},
                               "with kv_channels unset the head dim is hidden_size / heads, which must be whole",
                               "choose heads dividing hidden_size, or set model.kv_channels (the head dim)"))
    return out


# ------------------------------------------------------------------------------------------- megatron

VOCAB_DIVISOR = 128  # Megatron-LM's make_vocab_size_divisible_by default (times tp)


def padded_vocab_size(cfg) -> int:
    # As Megatron-LM: the embedding is padded so each tp shard is a multiple of 128 rows (GEMM-friendly, and
    # independent of the tokenizer's odd sizes). Extra rows are never targets.
    mult = VOCAB_DIVISOR * cfg.parallel.tensor_model_parallel_size
    v = cfg.model.vocab_size
    return ((v + mult - 1) // mult) * mult


def moe_layers(m) -> List[int]:
    """1 for each MoE layer, 0 for each dense one: moe_first_k_dense dense layers, then every moe_layer_freq-th
    layer MoE (from the first after them). All 0 for a dense model."""
    if not m.num_experts:
        return [0] * m.num_layers
    k, n = m.moe_first_k_dense, max(1, m.moe_layer_freq)
    return [int(i >= k and (i - k) % n == 0) for i in range(m.num_layers)]


def moe_layer_freq(cfg) -> List[int]:
    return moe_layers(cfg.model)


def _triton_importable() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def triton_kernel_blockers(ctx) -> List[str]:
    """Why one of primus' Triton kernels cannot run in this run's process ([] = it can)."""
    out = []
    if not _triton_importable():
        out.append("Triton is not installed (pip install triton on CUDA, pytorch-triton-rocm on ROCm)")
    if ctx.device == "cpu" and not ctx.planned and os.environ.get("TRITON_INTERPRET") != "1":
        out.append("the kernel is a GPU kernel (on CPU only under TRITON_INTERPRET=1, for tests)")
    return out


def rope_fusion_blockers(cfg, ctx) -> List[str]:
    """Why primus' fused q/k/v split + RoPE (fusions.py) cannot serve this run ([] = it can)."""
    m = cfg.model
    out = []
    if m.multi_latent_attention:
        out.append("multi-latent attention applies RoPE inside its own projections")
    if m.qk_layernorm:
        out.append("q/k layernorm sits between the split and RoPE (megatron fuses only without it)")
    return out + triton_kernel_blockers(ctx)


def _te_version() -> Optional[str]:
    from importlib import metadata

    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _te_older_than(least: tuple) -> bool:
    v = _te_version()
    if v is None:
        return False  # not installed: the TE spec's own issue says so
    parts = tuple(int(x) for x in v.split("+")[0].split(".")[:2] if x.isdigit())
    return parts < least


def turbo_loss(cfg) -> bool:
    """model.cross_entropy_loss_fusion=true + model.cross_entropy_fusion_impl=turbo: primus.turbo.cross_entropy (Triton)
    serves each post-process chunk's LM loss (perf.turbo_loss); megatron itself is told cross_entropy_loss_fusion=false
    (it knows native / te only). turbo_loss_issues says where it cannot run."""
    m = cfg.model
    return bool(m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl.value == "turbo")


def turbo_loss_issues(cfg, ctx) -> List[ConfigIssue]:
    """Why primus' Triton cross entropy cannot serve this run ([] = it can, or it is not asked for)."""
    if not turbo_loss(cfg):
        return []
    out = []
    keys = ["model.cross_entropy_fusion_impl"]
    tp = cfg.parallel.tensor_model_parallel_size
    if tp > 1:
        out.append(ConfigIssue(keys + ["parallel.tensor_model_parallel_size"], {"impl": "turbo", "tp": tp},
                               f"the Triton cross entropy reads whole vocabulary rows; with tensor_model_parallel_size={tp} "
                               "each rank holds a slice of the vocabulary and the row max / sum-exp / label logit need "
                               "all-reduces over the TP ranks, which the kernel does not do (it runs with tp = 1 only)",
                               "set model.cross_entropy_fusion_impl=native (megatron's fused vocab-parallel cross entropy), "
                               "or parallel.tensor_model_parallel_size=1"))
    why = triton_kernel_blockers(ctx)
    if why:
        out.append(ConfigIssue(keys + (["device"] if ctx.device == "cpu" else []), "turbo",
                               "the Triton cross entropy cannot run here: " + "; ".join(why),
                               "set model.cross_entropy_fusion_impl=native, or model.cross_entropy_loss_fusion=false "
                               "on CPU"))
    return out


def activation_fusion(cfg, ctx) -> Optional[str]:
    """model.bias_activation_fusion -> "triton" (primus.turbo.swiglu through megatron's bias_swiglu_impl, see
    fusions.py), "jit" (megatron's torch.compile'd SwiGLU) or None (eager). Unset = fused on a GPU only (on CPU
    megatron's jit would compile per shape for no gain); true on CPU = megatron's jit, or the Triton kernel
    under TRITON_INTERPRET=1 (kernel tests)."""
    from primus.backends.megatron.args import resolved_layer_spec

    want = cfg.model.bias_activation_fusion
    gpu = ctx.device == "cuda" or ctx.planned
    if want is False or (want is None and not gpu):
        return None
    if resolved_layer_spec(cfg) == "te" or not _triton_importable():
        return "jit"
    return "triton" if gpu or os.environ.get("TRITON_INTERPRET") == "1" else "jit"


def rope_fusion(cfg, ctx) -> Optional[str]:
    """model.apply_rope_fusion -> "te" (TE's fused RoPE), "triton" (primus.turbo.rope through megatron's
    fused_single_qkv_rope hook) or None (megatron's unfused RoPE). Unset = the fused one where it applies, and on
    CPU never (Triton's interpreter would be slow); an explicit true that cannot be honoured is a capability issue."""
    from primus.backends.megatron.args import resolved_layer_spec

    want = cfg.model.apply_rope_fusion
    if want is False:
        return None
    if resolved_layer_spec(cfg) == "te":
        return "te"
    if want is None and ctx.device == "cpu" and not ctx.planned:
        return None
    return None if rope_fusion_blockers(cfg, ctx) else "triton"


def megatron(cfg, ctx) -> Dict[str, Any]:
    m = cfg.model
    rope = rope_fusion(cfg, ctx)
    act = activation_fusion(cfg, ctx)
    tc: Dict[str, Any] = {
        # architecture: Llama-style decoder (pre-norm RMSNorm, SwiGLU, RoPE, no dropout; biases on q/k/v only
        # with add_qkv_bias)
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "normalization": "RMSNorm",
        "layernorm_epsilon": m.norm_epsilon,
        "qk_layernorm": m.qk_layernorm,
        "gated_linear_unit": True,
        "activation_func": "silu",
        "add_bias_linear": False,
        "add_qkv_bias": m.add_qkv_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        # fusions: activation_fusion() / rope_fusion() say whose kernels; the rest need TE/apex extensions
        "bias_activation_fusion": act is not None,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        # rope_fusion(): TE's fused RoPE with the TE spec, else megatron's fused_single_qkv_rope hook (fusions.py)
        "apply_rope_fusion": rope == "te",
        "fused_single_qkv_rope": rope == "triton",
        "persist_layer_norm": False,
        # impl=turbo: megatron computes the loss unfused and perf.turbo_loss replaces it (args["turbo_loss"])
        "cross_entropy_loss_fusion": m.cross_entropy_loss_fusion and not turbo_loss(cfg),
        "cross_entropy_fusion_impl": "native" if turbo_loss(cfg) else m.cross_entropy_fusion_impl.value,
    }
    if m.num_experts:
        tc.update({
            "num_moe_experts": m.num_experts,
            "moe_router_topk": m.moe_router_topk,
            "moe_ffn_hidden_size": m.moe_ffn_hidden_size or m.ffn_hidden_size,
            "moe_shared_expert_intermediate_size": m.moe_shared_expert_intermediate_size,
            "moe_layer_freq": moe_layer_freq(cfg),
        })
    if m.multi_latent_attention:  # (no kv_channels: MLA's head dims are its own)
        tc.update({
            "multi_latent_attention": True,
            "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank,
            "qk_head_dim": m.qk_head_dim,
            "qk_pos_emb_head_dim": m.qk_pos_emb_head_dim,
            "v_head_dim": m.v_head_dim,
            "rope_type": m.rope_type.value,
            "rotary_base": m.rotary_base,
        })
        if m.rope_type == RopeType.yarn:
            tc.update({"rotary_scaling_factor": m.rotary_scaling_factor,
                       "original_max_position_embeddings": m.original_max_position_embeddings,
                       "mscale": m.mscale, "mscale_all_dim": m.mscale_all_dim})
    else:
        tc["kv_channels"] = m.kv_channels
    if m.use_sink_attention:
        tc["softmax_type"] = "learnable"
        if window_size(m):
            tc["window_size"] = list(window_size(m))
            tc["window_attn_skip_freq"] = 2 if m.sink_window_even_layers_only else None
    if m.mtp_num_layers:
        tc["mtp_num_layers"] = m.mtp_num_layers
    gpt_model = {
        "vocab_size": padded_vocab_size(cfg),
        "max_sequence_length": cfg.training.seq_length,
        "position_embedding_type": "none" if m.multi_latent_attention else "rope",  # MLA applies RoPE itself
        # megatron types it int; a fractional theta is passed as it is rather than truncated
        "rotary_base": int(m.rotary_base) if float(m.rotary_base).is_integer() else m.rotary_base,
        "rotary_percent": 1.0,
        **({"rope_scaling": True, "rope_scaling_factor": m.rope_scaling_factor}
           if m.use_rope_scaling and not m.multi_latent_attention else {}),
        "share_embeddings_and_output_weights": m.tie_word_embeddings,
        "parallel_output": True,
    }
    return {
        "transformer_config": tc,
        "gpt_model": gpt_model,
        "rope_fusion": rope,
        "activation_fusion": act,
        # perf.turbo_loss: the LM loss through primus.turbo.cross_entropy (model.cross_entropy_fusion_impl=turbo)
        "turbo_loss": turbo_loss(cfg),
    }


def megatron_issues(cfg, ctx) -> List[ConfigIssue]:
    """What megatron-core 0.16.1 and this machine cannot honour of the model settings."""
    from primus.backends.megatron.args import resolved_layer_spec
    from primus.features.precision import te_needed

    m, out = cfg.model, []
    spec, cpu = resolved_layer_spec(cfg), ctx.device == "cpu"
    if m.apply_rope_fusion and spec != "te":
        why = rope_fusion_blockers(cfg, ctx)
        if why:
            out.append(ConfigIssue(["model.apply_rope_fusion"], True, "the fused q/k/v split + RoPE cannot run here: "
                                   + "; ".join(why), "set model.apply_rope_fusion=null (use it where it applies) or false"))
    if spec == "local" and m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl.value == "te":
        out.append(ConfigIssue(["model.cross_entropy_fusion_impl"], "te", "the TE fused cross entropy needs TE",
                               "set model.cross_entropy_fusion_impl=native", needs=te_needed(cfg)))
    if m.cross_entropy_loss_fusion and cpu and not turbo_loss(cfg):  # turbo: turbo_loss_issues (the interpreter)
        out.append(ConfigIssue(["model.cross_entropy_loss_fusion", "device"], True,
                               "the fused cross entropy is a GPU kernel (torch.compile'd / TE)",
                               "set model.cross_entropy_loss_fusion=false on CPU"))
    out += turbo_loss_issues(cfg, ctx)
    if m.use_sink_attention and spec == "te" and _te_older_than((2, 8)):
        # megatron-core 0.16.1's TEDotProductAttention asserts TE >= 2.8.0 for softmax_type (when it builds the model)
        out.append(ConfigIssue(["model.use_sink_attention", "backend.layer_spec"], True,
                               f"attention sinks in Transformer Engine's attention need TE >= 2.8.0 (here "
                               f"{_te_version()})", "set backend.layer_spec=local (the SDPA sink path), or "
                               "upgrade Transformer Engine"))
    if m.mtp_num_layers and cfg.parallel.pipeline_model_parallel_size > 1:
        out.append(ConfigIssue(["model.mtp_num_layers", "parallel.pipeline_model_parallel_size"], m.mtp_num_layers,
                               "multi-token prediction with pipeline parallelism is not wired in this backend",
                               "set pp=1 or model.mtp_num_layers=0"))
    return out


# ------------------------------------------------------------------------------------------- torchtitan
# The model (and its MoE layers: moe.* routing settings) becomes a TorchTitan flavor (backends/torchtitan/flavors.py).


def torchtitan(cfg, ctx) -> Dict[str, Any]:
    from primus.backends.torchtitan import flavors
    from primus.backends.torchtitan.jobconfig_keys import FLAVOR_KEY

    flavor = flavors.build_flavor(cfg)
    return {"model": {"name": flavor.spec, "flavor": flavor.name}, FLAVOR_KEY: flavor.args}


def megatron_only(cfg) -> tuple:
    # megatron's fused-kernel switches: TorchTitan's models run their own RoPE, SwiGLU and loss (compiled)
    return ("cross_entropy_fusion_impl", "apply_rope_fusion", "bias_activation_fusion")


def torchtitan_issues(cfg, ctx) -> List[ConfigIssue]:
    """The shapes torchtitan 0.2.2 cannot build (flavors.py), and model settings it cannot honour."""
    from primus.backends.torchtitan import flavors

    m, par, issues = cfg.model, cfg.parallel, list(flavors.build_flavor(cfg).issues)
    if m.use_sink_attention:
        split = {k: v for k, v in (("tensor_model_parallel_size", par.tensor_model_parallel_size),
                                   ("context_parallel_size", par.context_parallel_size)) if v > 1}
        if split:  # spec.SinkSDPA holds every head's sink; TorchTitan's tp and cp would split its q/k/v
            issues.append(ConfigIssue(["model.use_sink_attention"] + [f"parallel.{k}" for k in split], split,
                                      "attention sinks on TorchTitan are built for whole heads and sequences: no "
                                      "tensor or context parallelism", "use FSDP / pp there, or backend=megatron"))
    if m.cross_entropy_loss_fusion:
        issues.append(ConfigIssue(["model.cross_entropy_loss_fusion"], True,
                                  "torchtitan 0.2.2 has no fused cross entropy", "set false"))
    if m.add_qkv_bias:
        issues.append(ConfigIssue(["model.add_qkv_bias"], True,
                                  "torchtitan 0.2.2's llama3, qwen3 and deepseek_v3 build their q/k/v projections "
                                  "without biases (nn.Linear(..., bias=False)), so a Qwen2.5-style model cannot be "
                                  "built there", "use backend=megatron, or set model.add_qkv_bias=false (a different "
                                  "model: no q/k/v biases)"))
    if m.tie_word_embeddings and (par.tensor_model_parallel_size > 1 or par.pipeline_model_parallel_size > 1) \
            and not m.num_experts and not m.qk_layernorm:
        issues.append(ConfigIssue(["model.tie_word_embeddings"], True,
                                  "Primus ties llama3 embeddings for FSDP/DDP/single-device only",
                                  "untie, or set tp=1 and pp=1"))
    return issues
