"""Primus model configs -> this project's model presets.

A Primus model (primus/configs/models/<framework>/<name>.yaml) maps to the preset of the same model here
(`preset_for`), or, for a GPT-style model with no preset, becomes one (`model_fields`: its sizes through the key
table). An architecture this project cannot build is refused, naming what is missing (`architecture_issues`).
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

CONF_MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "conf", "model")

# Primus model names whose preset here has another name (after normalize())
ALIASES = {
    "mixtral_8x7b_v0_1": "mixtral_8x7b",
    "mixtral_8x22b_v0_1": "mixtral_8x22b",
    # TorchTitan's deepseek_v3 flavors are named by size: 16B is DeepSeek-V2-Lite's shape, 236B DeepSeek-V2's
    "deepseek_v3_16b": "deepseek_v2_lite",
    "deepseek_v3_236b": "deepseek_v2",
    "deepseek_v3_671b": "deepseek_v3",
}

# Megatron reads the vocabulary from the tokenizer Primus names; these are the published sizes (HF config.json)
TOKENIZER_VOCAB = {
    "meta-llama/Llama-2-7b-hf": 32000, "meta-llama/Llama-2-13b-hf": 32000, "meta-llama/Llama-2-70b-hf": 32000,
    "meta-llama/Meta-Llama-3-8B": 128256, "meta-llama/Meta-Llama-3-70B": 128256,
    "meta-llama/Llama-3.1-8B": 128256, "meta-llama/Llama-3.1-70B": 128256, "meta-llama/Llama-3.1-405B": 128256,
    "meta-llama/Llama-3.2-1B": 128256, "meta-llama/Llama-3.2-3B": 128256, "meta-llama/Llama-3.3-70B-Instruct": 128256,
    "mistralai/Mixtral-8x7B-v0.1": 32000, "mistralai/Mixtral-8x22B-v0.1": 32768,
    "deepseek-ai/DeepSeek-V2-Lite": 102400, "deepseek-ai/DeepSeek-V2": 102400, "deepseek-ai/DeepSeek-V3": 129280,
    "Qwen/Qwen3-0.6B": 151936, "Qwen/Qwen3-1.7B": 151936, "Qwen/Qwen3-4B": 151936, "Qwen/Qwen3-8B": 151936,
    "Qwen/Qwen3-14B": 151936, "Qwen/Qwen3-32B": 151936, "Qwen/Qwen3-30B-A3B": 151936,
    "Qwen/Qwen3-235B-A22B": 151936,
    "Qwen/Qwen2.5-0.5B": 151936, "Qwen/Qwen2.5-1.5B": 151936, "Qwen/Qwen2.5-3B": 151936, "Qwen/Qwen2.5-7B": 152064,
    "Qwen/Qwen2.5-14B": 152064, "Qwen/Qwen2.5-32B": 152064, "Qwen/Qwen2.5-72B": 152064,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 151936, "moonshotai/Kimi-K2-Instruct": 163840,
    "THUDM/glm-4-9b": 151552, "meta-llama/Llama-4-Scout-17B-16E": 202048, "meta-llama/Llama-4-Maverick-17B-128E": 202048,
}

# Published context lengths (HF config.json max_position_embeddings) of zoo models whose Primus config gives none
# (after normalize())
PUBLISHED_CONTEXT = {
    "kimi_k2": 131072,  # moonshotai/Kimi-K2-Instruct
    "gpt_oss_20b": 131072,  # openai/gpt-oss-20b
    "gpt_oss_120b": 131072,  # openai/gpt-oss-120b
}

# Primus model families this project cannot build, by name prefix (after normalize()), and what is missing
UNSUPPORTED_FAMILIES = {
    "mamba": "Mamba (state-space) layers",
    "zebra_llama": "hybrid Mamba / linear-attention layers",
    "lfm2": "LFM2's short-convolution layers",
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention",
    "kimi_k3": "Kimi's linear (KDA) attention layers",
    "minimax": "MiniMax's lightning (linear) attention",
    "flux": "diffusion (Flux) transformers",
    "wan": "diffusion (Wan) transformers",
}

# Families this project builds from Primus's megatron configs but not from its TorchTitan ones, and why
UNSUPPORTED_ON_TORCHTITAN = {
    # Primus's megatron gpt-oss is a GQA MoE with attention sinks (model.use_sink_attention, megatron only);
    # TorchTitan's gpt_oss model is OpenAI's layout
    "gpt_oss": "TorchTitan's gpt_oss model (biased attention and experts, clamped SwiGLU, attention sinks with "
               "sliding windows); Primus's megatron gpt-oss configs import (backend=megatron)",
    # Primus's megatron Llama 4 is a MoE with Llama-3.x RoPE scaling (and every other layer MoE for Maverick);
    # TorchTitan's llama4 also has chunked attention and no-RoPE layers
    "llama4": "TorchTitan's llama4 model (chunked attention, no-RoPE layers, interleaved dense/MoE layers); Primus's "
              "megatron Llama 4 configs import (backend=megatron)",
}

# Megatron model keys whose value decides the architecture: (acceptable(value, model), what is missing otherwise)
ARCH_KEYS: Dict[str, Tuple[Any, str]] = {
    "model_type": (lambda v, m: v in (None, "gpt"), "a non-GPT model type"),
    "swiglu": (lambda v, m: v is not False, "a non-SwiGLU MLP"),
    "normalization": (lambda v, m: v in (None, "RMSNorm"), "LayerNorm (models here use RMSNorm)"),
    "add_bias_linear": (lambda v, m: not v, "biases in the linear layers"),
    "position_embedding_type": (lambda v, m: v in (None, "rope") or m.get("multi_latent_attention"),
                                "a position embedding other than RoPE"),
    "rotary_percent": (lambda v, m: v in (None, 1.0, 1), "partial rotary embeddings"),
    "rotary_interleaved": (lambda v, m: not v, "interleaved RoPE"),
    "qk_l2_norm": (lambda v, m: not v, "q/k L2 normalisation"),
    "apply_layernorm_1p": (lambda v, m: not v, "zero-centred (1p) norms"),
    "lfm_layer_types": (lambda v, m: not v, "LFM2's short-convolution layers"),
    "hybrid_override_pattern": (lambda v, m: not v, "hybrid Mamba/attention layers"),
    "is_hybrid_model": (lambda v, m: not v, "hybrid Mamba/attention layers"),
    "window_size": (lambda v, m: not v, "sliding-window attention"),
    "final_logit_softcapping": (lambda v, m: v is None, "logit soft-capping"),
    "attn_logit_softcapping": (lambda v, m: v is None, "attention logit soft-capping"),
    "router_logit_softcapping": (lambda v, m: v is None, "router logit soft-capping"),
}


def normalize(name: str) -> str:
    """Primus model file name -> preset name here: llama3.1_8B-fp8.yaml -> llama3_1_8b."""
    base = os.path.basename(str(name))
    base = re.sub(r"\.ya?ml$", "", base)
    base = re.sub(r"-(fp8|mxfp8|fp4)$", "", base, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_")


def preset_path(preset: str, model_dir: str = CONF_MODEL_DIR) -> Optional[str]:
    """The preset's file: in model_dir (where a new preset would be written), else in this project's conf/model."""
    for d in (model_dir, CONF_MODEL_DIR):
        path = os.path.join(d, preset + ".yaml")
        if os.path.isfile(path):
            return path
    return None


def preset_for(name: str, model_dir: str = CONF_MODEL_DIR) -> Optional[str]:
    key = normalize(name)
    key = ALIASES.get(key, key)
    return key if preset_path(key, model_dir) else None


def unsupported_family(name: str, framework: str = "megatron") -> Optional[str]:
    key = normalize(name)
    table = {**UNSUPPORTED_FAMILIES, **(UNSUPPORTED_ON_TORCHTITAN if framework == "torchtitan" else {})}
    return next((why for prefix, why in table.items() if key.startswith(prefix)), None)


def architecture_issues(zoo: Dict[str, Any]) -> List[str]:
    out = []
    for key, (ok, what) in ARCH_KEYS.items():
        if key in zoo and not ok(zoo[key], zoo):
            out.append(f"{what} ({key}: {zoo[key]!r})")
    return out
