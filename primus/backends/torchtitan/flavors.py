"""Our ModelConfig -> a TorchTitan model family and the args of a custom flavor (pure Python, no torch).

We never rely on TorchTitan's own flavor names: every preset becomes a flavor built from its exact shape and is
registered into TorchTitan's registry (see `spec.py`) under our own train-spec names:

- dense Llama (no QK-norm, head dim = hidden / heads)  -> `primus_llama3` (TorchTitan's llama3 model; tied
  embeddings through a small subclass in `spec.py`, since llama3 itself never ties)
- QK-norm, an explicit head dim, attention sinks, or MoE without MLA -> `primus_qwen3` (TorchTitan's qwen3, dense
  or MoE; sinks through a small subclass in `spec.py`)
- multi-latent attention (DeepSeek)                     -> `primus_deepseek_v3`

Shapes TorchTitan 0.2.2 cannot build come back as ConfigIssues, never as a silently different model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List

from primus.config.errors import ConfigIssue
from primus.config.schema import LoadBalancing, ModelConfig, PrimusConfig, ScoreFunction

LLAMA3 = "primus_llama3"
QWEN3 = "primus_qwen3"
DEEPSEEK_V3 = "primus_deepseek_v3"
FAMILY_OF_SPEC = {LLAMA3: "llama3", QWEN3: "qwen3", DEEPSEEK_V3: "deepseek_v3"}


@dataclass
class Flavor:
    spec: str  # our train-spec name registered in TorchTitan (model.name)
    name: str  # flavor name (model.flavor), unique per shape
    args: Dict[str, Any]  # keyword arguments of the family's ModelArgs dataclass (nested dicts for sub-dataclasses)
    issues: List[ConfigIssue] = field(default_factory=list)


def llama3_ffn_hidden(dim: int, multiple_of: int, ffn_dim_multiplier) -> int:
    """TorchTitan 0.2.2 llama3 FeedForward: hidden = round_up(mult * int(2 * 4 * dim / 3), multiple_of)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama3_ffn_args(dim: int, ffn: int) -> Dict[str, Any]:
    """multiple_of / ffn_dim_multiplier that make llama3's FFN exactly `ffn` wide.

    llama3 derives the width from dim; with multiple_of = ffn the round-up lands on ffn whenever the derived width
    is in (0, ffn], and a multiplier of ffn / derived brings a larger derived width into that range.
    """
    derived = int(2 * (4 * dim) / 3)
    mult = None if derived <= ffn else ffn / derived
    out = {"multiple_of": ffn, "ffn_dim_multiplier": mult}
    got = llama3_ffn_hidden(dim, ffn, mult)
    assert got == ffn, f"llama3 FFN mapping gives {got}, want {ffn}"
    return out


def _head_dim(m: ModelConfig) -> int:
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def _spec_for(m: ModelConfig) -> str:
    if m.multi_latent_attention:
        return DEEPSEEK_V3
    if m.num_experts or m.qk_layernorm or m.use_sink_attention or _head_dim(m) * m.num_attention_heads != m.hidden_size:
        return QWEN3
    return LLAMA3


def _moe_args(cfg: PrimusConfig, issues: List[ConfigIssue]) -> Dict[str, Any]:
    m, moe = cfg.model, cfg.moe
    expert = m.moe_ffn_hidden_size or m.ffn_hidden_size
    shared = m.moe_shared_expert_intermediate_size or 0
    if shared % expert:
        issues.append(ConfigIssue(
            ["model.moe_shared_expert_intermediate_size", "model.moe_ffn_hidden_size"], {"shared": shared,
                                                                                         "expert": expert},
            "torchtitan 0.2.2 builds shared experts as n copies of the expert width, so the shared size must be a "
            "multiple of the expert size", "use a multiple of moe_ffn_hidden_size or backend=megatron"))
    from primus.features.moe import router

    if m.moe_layer_freq != 1:
        issues.append(ConfigIssue(["model.moe_layer_freq"], m.moe_layer_freq,
                                  "torchtitan 0.2.2's MoE models make every layer MoE (after deepseek_v3's leading "
                                  "dense ones): no dense layers between MoE ones", "use backend=megatron"))
    lb = router(cfg, "moe_router_load_balancing_type")
    lb_key = "moe" if moe.moe_router_load_balancing_type is not None else "model"
    if lb != LoadBalancing.none:
        # TorchTitan 0.2.2 balances experts by an aux-loss-free expert bias (load_balance_coeff); it has no
        # aux / seq-aux / sinkhorn loss. Mapping one of those to the bias would silently change the method.
        issues.append(ConfigIssue(
            [f"{lb_key}.moe_router_load_balancing_type"], lb.value,
            "torchtitan 0.2.2 has no loss-based load balancing (its MoE uses an aux-loss-free bias)",
            "set moe.moe_router_load_balancing_type=none, or use backend=megatron"))
    if moe.moe_z_loss_coeff:
        issues.append(ConfigIssue(["moe.moe_z_loss_coeff"], moe.moe_z_loss_coeff,
                                  "torchtitan 0.2.2 has no router z-loss", "unset it or use backend=megatron"))
    score = router(cfg, "moe_router_score_function")
    softmax = score == ScoreFunction.softmax
    return {
        "num_experts": m.num_experts,
        "num_shared_experts": shared // expert if expert else 0,
        "score_func": score.value,
        # megatron semantics: pre_softmax=False -> softmax over the chosen top-k, i.e. renormalised scores
        "route_norm": (not router(cfg, "moe_router_pre_softmax")) if softmax else True,
        "route_scale": 1.0,
        "score_before_experts": False,
        "top_k": m.moe_router_topk,
        "use_grouped_mm": moe.moe_grouped_gemm,
        "load_balance_coeff": None,
    }


def build_flavor(cfg: PrimusConfig) -> Flavor:
    m = cfg.model
    spec = _spec_for(m)
    issues: List[ConfigIssue] = []
    if m.use_rope_scaling and spec == QWEN3:
        issues.append(ConfigIssue(["model.use_rope_scaling"], True,
                                  "torchtitan 0.2.2 scales RoPE in its llama3 family only; this model (QK-norm, MoE, "
                                  "an explicit head dim or attention sinks) builds as its qwen3",
                                  "use backend=megatron, or model.use_rope_scaling=false"))
    seq = cfg.training.seq_length
    if m.mtp_num_layers:
        issues.append(ConfigIssue(["model.mtp_num_layers"], m.mtp_num_layers,
                                  "torchtitan 0.2.2 has no multi-token prediction", "set 0 or use backend=megatron"))
    if spec == LLAMA3:
        args: Dict[str, Any] = {
            "dim": m.hidden_size,
            "n_layers": m.num_layers,
            "n_heads": m.num_attention_heads,
            "n_kv_heads": m.num_query_groups,
            "vocab_size": m.vocab_size,
            **llama3_ffn_args(m.hidden_size, m.ffn_hidden_size),
            "norm_eps": m.norm_epsilon,
            "rope_theta": m.rotary_base,
            # llama3 always applies Llama-3.1 RoPE scaling: model.use_rope_scaling's factor over 8192 positions (as
            # megatron-core), else factor 1, the identity (plain RoPE)
            "rope_scaling_args": {"scaling_factor": m.rope_scaling_factor, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
            if m.use_rope_scaling else {"scaling_factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": m.max_position_embeddings},
            "max_seq_len": seq,
            "attn_type": "sdpa",
            "attn_mask_type": "causal",
            "tie_word_embeddings": m.tie_word_embeddings,  # field of our subclass (spec.py)
        }
    elif spec == QWEN3:
        args = {
            "dim": m.hidden_size,
            "n_layers": m.num_layers,
            "n_heads": m.num_attention_heads,
            "n_kv_heads": m.num_query_groups,
            "vocab_size": m.vocab_size,
            "head_dim": _head_dim(m),
            "hidden_dim": m.ffn_hidden_size,
            "norm_eps": m.norm_epsilon,
            "rope_theta": m.rotary_base,
            "qk_norm": m.qk_layernorm,
            "max_seq_len": seq,
            "attn_type": "sdpa",
            "attn_mask_type": "causal",
            "enable_weight_tying": m.tie_word_embeddings,
            "moe_enabled": bool(m.num_experts),
        }
        if m.use_sink_attention:  # fields of our subclass (spec.py)
            args.update({"use_sink_attention": True, "sink_sliding_window": m.sink_sliding_window,
                         "sink_window_even_layers_only": m.sink_window_even_layers_only})
        if m.num_experts:
            args["moe_inter_dim"] = m.moe_ffn_hidden_size or m.ffn_hidden_size
            args["moe_args"] = _moe_args(cfg, issues)
            if m.moe_first_k_dense:
                issues.append(ConfigIssue(
                    ["model.moe_first_k_dense"], m.moe_first_k_dense,
                    "torchtitan 0.2.2's qwen3 makes every layer MoE (no leading dense layers without MLA)",
                    "set 0 or use backend=megatron"))
        if m.tie_word_embeddings and cfg.parallel.pipeline_model_parallel_size > 1:
            issues.append(ConfigIssue(["model.tie_word_embeddings", "parallel.pipeline_model_parallel_size"],
                                      True, "tied embeddings across pipeline stages are not supported",
                                      "untie or set pp=1"))
    else:
        if m.use_sink_attention:
            issues.append(ConfigIssue(["model.use_sink_attention", "model.multi_latent_attention"], True,
                                      "attention sinks are built into TorchTitan's qwen3 family here, not its "
                                      "deepseek_v3 (multi-latent attention)",
                                      "use backend=megatron, or model.use_sink_attention=false"))
        if not m.num_experts:
            issues.append(ConfigIssue(["model.multi_latent_attention", "model.num_experts"], None,
                                      "torchtitan 0.2.2 builds MLA only in deepseek_v3, which is MoE",
                                      "set model.num_experts or use backend=megatron"))
        if m.tie_word_embeddings:
            issues.append(ConfigIssue(["model.tie_word_embeddings"], True,
                                      "torchtitan 0.2.2's deepseek_v3 never ties embeddings", "set false"))
        if not m.qk_layernorm:
            # for MLA, qk_layernorm is the RMSNorm on the compressed latents (megatron's meaning), which
            # deepseek_v3 always applies (kv_norm, and q_norm with a q LoRA rank)
            issues.append(ConfigIssue(["model.qk_layernorm", "model.multi_latent_attention"], False,
                                      "torchtitan 0.2.2's deepseek_v3 always normalises the MLA latents",
                                      "set model.qk_layernorm=true (as conf/model/deepseek_v2_lite.yaml does)"))
        args = {
            "max_seq_len": seq,
            "vocab_size": m.vocab_size,
            "dim": m.hidden_size,
            "inter_dim": m.ffn_hidden_size,
            "moe_inter_dim": m.moe_ffn_hidden_size or m.ffn_hidden_size,
            "n_layers": m.num_layers,
            "n_dense_layers": m.moe_first_k_dense,
            "n_heads": m.num_attention_heads,
            "norm_eps": m.norm_epsilon,
            "moe_args": _moe_args(cfg, issues) if m.num_experts else {},
            "q_lora_rank": m.q_lora_rank or 0,
            "kv_lora_rank": m.kv_lora_rank,
            "qk_nope_head_dim": m.qk_head_dim,
            "qk_rope_head_dim": m.qk_pos_emb_head_dim,
            "v_head_dim": m.v_head_dim,
            "attn_type": "sdpa",
            "attn_mask_type": "causal",
            "rope_theta": m.rotary_base,
            # YaRN applies only beyond original_seq_len: rope_type=rope is plain RoPE up to max_position_embeddings
            "original_seq_len": max(m.max_position_embeddings, seq),
        }
        if m.rope_type.value == "yarn":
            # TorchTitan's deepseek_v3 stretches the frequencies only for sequences past original_seq_len (megatron
            # at every length); its one mscale is megatron's mscale_all_dim (the attention temperature)
            args.update({"original_seq_len": m.original_max_position_embeddings, "rope_factor": m.rotary_scaling_factor,
                         "mscale": m.mscale_all_dim})
            if m.mscale != m.mscale_all_dim:
                issues.append(ConfigIssue(["model.mscale", "model.mscale_all_dim"],
                                          {"mscale": m.mscale, "mscale_all_dim": m.mscale_all_dim},
                                          "torchtitan 0.2.2's deepseek_v3 has one YaRN mscale (megatron's "
                                          "mscale_all_dim); a different mscale would be ignored",
                                          "set model.mscale equal to model.mscale_all_dim, or use backend=megatron"))
    digest = hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
    return Flavor(spec=spec, name=f"{m.name}-{digest}", args=args, issues=issues)
