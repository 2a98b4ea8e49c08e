"""Config -> the exact megatron-core arguments (JSON-able), and the rules this backend/device adds.

Imports neither megatron nor torch: `dry_run=true` prints `build_args` in well under a second. The trainer turns
the same dict into megatron objects (dtype names -> torch dtypes, activation name -> function), so what a dry run
shows is what megatron gets. Keys inside `transformer_config`, `ddp_config`, `optimizer_config` and `scheduler`
are megatron-core 0.16.1's own keyword names.
"""
from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from importlib import metadata
from typing import Any, Dict, List, Optional

from primus.config.errors import ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.features import backend_issues, backend_mapping, merged
from primus.features.backend import PINNED_MCORE
from primus.features.parallel import num_microbatches
from primus.features.recompute import replays_linears

VOCAB_DIVISOR = 128  # Megatron-LM's make_vocab_size_divisible_by default (times tp)

# fp8/fp4 recipes megatron-core 0.16.1's TransformerConfig accepts (transformer_config.py Literal types)
MCORE_FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
MCORE_FP4_RECIPES = ("nvfp4",)


@lru_cache(maxsize=None)
def mcore_version() -> Optional[str]:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def te_available() -> bool:
    return _importable("transformer_engine")


def portable_fp8_available(recipe: Optional[str] = None, planned: bool = False) -> bool:
    """The project's own fp8 linear (primus/turbo/fp8_linear.py), when it exists and says it can run.
    planned: judged for a GPU this machine does not have (dry run / plan): the recipe alone decides."""
    if not _importable("primus.turbo.fp8_linear"):
        return False
    if planned:
        from primus.turbo.providers import PORTABLE_FP8_RECIPES

        return recipe in PORTABLE_FP8_RECIPES
    import inspect

    from primus.turbo import fp8_linear  # small module, no megatron

    fn = getattr(fp8_linear, "fp8_linear_available", None)
    if fn is None:
        return False
    try:
        takes_recipe = len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        takes_recipe = False
    return bool(fn(recipe) if takes_recipe else fn())


def resolved_layer_spec(cfg: PrimusConfig) -> str:
    want = cfg.backend.layer_spec.value
    if want == "auto":
        return "te" if te_available() else "local"
    return want


def fp8_backend(cfg: PrimusConfig) -> Optional[str]:
    """Who runs the low-precision linears: Transformer Engine, the portable fp8 linear, or nobody (None)."""
    p = cfg.precision
    if p.fp8 is None and p.fp4 is None:
        return None
    if resolved_layer_spec(cfg) == "te":
        return "te"
    return "portable"


def padded_vocab_size(cfg: PrimusConfig) -> int:
    # As Megatron-LM: the embedding is padded so each tp shard is a multiple of 128 rows (GEMM-friendly, and
    # independent of the tokenizer's odd sizes). Extra rows are never targets.
    mult = VOCAB_DIVISOR * cfg.parallel.tensor_model_parallel_size
    v = cfg.model.vocab_size
    return ((v + mult - 1) // mult) * mult


def _dtype(cfg: PrimusConfig) -> str:
    p = cfg.precision
    return "bfloat16" if p.bf16 else ("float16" if p.fp16 else "float32")


def fp8_weight_cache(cfg: PrimusConfig, microbatches: int) -> bool:
    """Whether the portable fp8 linears reuse each weight's fp8 cast within a step (fp8_linear.WEIGHT_CASTS, which
    trainer.py enables and clears around every optimizer step): precision.fp8_weight_cache, or, when null, whenever
    a step runs a linear's forward more than once (several micro batches, or recompute replaying it). The cache
    costs the fp8 weight copies' memory (as TE's does) and saves one weight cast per extra forward."""
    p = cfg.precision
    if p.fp8 is None or fp8_backend(cfg) != "portable":
        return False
    if p.fp8_weight_cache is not None:
        return bool(p.fp8_weight_cache)
    return microbatches > 1 or replays_linears(cfg)


def fused_mlp_blockers(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    """Why the fused fp8 MLP (fp8.py's FusedFP8MLP, precision.fp8_fused_mlp) cannot serve this run's MLPs (empty:
    it can). Needs precision.fp8 on megatron (validate.fp8_fused_mlp says so first)."""
    p, keys = cfg.precision, "precision.fp8_fused_mlp"
    out = []
    if fp8_backend(cfg) != "portable":  # (the other rules are about the portable path)
        return [_issue([keys, "backend.layer_spec"], p.fp8_fused_mlp,
                       "Transformer Engine's linears run fp8 in this run; the fused MLP is the portable fp8 "
                       "linear's", "drop precision.fp8_fused_mlp, or use backend.layer_spec=local")]
    if p.fp8_recipe.value != "tensorwise":
        out.append(_issue([keys, "precision.fp8_recipe"], p.fp8_recipe.value,
                          "the fused MLP hands the SwiGLU outputs' amax to tensorwise casts; this recipe has no "
                          "amax pass to skip (delayed: scales from the history; rowwise / blockwise: per row / "
                          "block inside the cast)", "use precision.fp8_recipe=tensorwise, or drop the key"))
    if cfg.turbo.use_turbo_parallel_linear:
        out.append(_issue([keys, "turbo.use_turbo_parallel_linear"], True,
                          "the turbo parallel linears serve fc1 / fc2 instead", "drop one of the two"))
    act = activation_fusion(cfg, ctx)
    if act != "triton":
        out.append(_issue([keys, "model.bias_activation_fusion"], act,
                          "the fused MLP runs primus' Triton SwiGLU, and the activation here resolves to "
                          f"{act or 'unfused'} (primus' Triton kernel is the choice on a GPU)",
                          "set model.bias_activation_fusion=true on a GPU, or drop precision.fp8_fused_mlp"))
    return out


def fp8_fused_mlp(cfg: PrimusConfig, ctx: RunContext) -> bool:
    """Whether fp8.apply fuses the dense MLPs (precision.fp8_fused_mlp: true = must, checked by capability_issues;
    null = wherever fused_mlp_blockers finds nothing in the way; false = off)."""
    p = cfg.precision
    if p.fp8 is None or p.fp8_fused_mlp is False:
        return False
    return not fused_mlp_blockers(cfg, ctx)


def moe_layer_freq(cfg: PrimusConfig) -> List[int]:
    m = cfg.model
    return [0] * m.moe_first_k_dense + [1] * (m.num_layers - m.moe_first_k_dense)


# turbo.* flags the megatron backend wires (turbo.py); dense / MoE ones apply to the local spec only
TURBO_SPEC_FLAGS = ("use_turbo_attention", "use_turbo_rms_norm", "use_turbo_parallel_linear")
TURBO_MOE_FLAGS = ("use_turbo_grouped_gemm", "moe_use_fused_router_with_aux_score", "use_turbo_fused_act_with_probs",
                   "use_turbo_deepep")


def turbo_permute_fusion(cfg: PrimusConfig) -> bool:
    """moe.moe_permute_fusion without TE: served by primus.turbo.moe_ops.permute / unpermute (turbo.py)."""
    return bool(cfg.moe.moe_permute_fusion and cfg.model.num_experts and resolved_layer_spec(cfg) == "local")


def triton_kernel_blockers(ctx: RunContext) -> List[str]:
    """Why one of primus' Triton kernels cannot run in this run's process ([] = it can)."""
    out = []
    if not _importable("triton"):
        out.append("Triton is not installed (pip install triton on CUDA, pytorch-triton-rocm on ROCm)")
    if ctx.device == "cpu" and not ctx.planned and os.environ.get("TRITON_INTERPRET") != "1":
        out.append("the kernel is a GPU kernel (on CPU only under TRITON_INTERPRET=1, for tests)")
    return out


def rope_fusion_blockers(cfg: PrimusConfig, ctx: RunContext) -> List[str]:
    """Why primus' fused q/k/v split + RoPE (fusions.py) cannot serve this run ([] = it can)."""
    m = cfg.model
    out = []
    if m.multi_latent_attention:
        out.append("multi-latent attention applies RoPE inside its own projections")
    if m.qk_layernorm:
        out.append("q/k layernorm sits between the split and RoPE (megatron fuses only without it)")
    return out + triton_kernel_blockers(ctx)


def turbo_loss(cfg: PrimusConfig) -> bool:
    """model.cross_entropy_loss_fusion=true + model.cross_entropy_fusion_impl=turbo: primus.turbo.cross_entropy (Triton)
    serves each post-process chunk's LM loss (perf.turbo_loss); megatron itself is told cross_entropy_loss_fusion=false
    (it knows native / te only). turbo_loss_issues says where it cannot run."""
    m = cfg.model
    return bool(m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl.value == "turbo")


def turbo_loss_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    """Why primus' Triton cross entropy cannot serve this run ([] = it can, or it is not asked for)."""
    if not turbo_loss(cfg):
        return []
    out = []
    keys = ["model.cross_entropy_fusion_impl"]
    tp = cfg.parallel.tensor_model_parallel_size
    if tp > 1:
        out.append(_issue(keys + ["parallel.tensor_model_parallel_size"], {"impl": "turbo", "tp": tp},
                          f"the Triton cross entropy reads whole vocabulary rows; with tensor_model_parallel_size={tp} "
                          "each rank holds a slice of the vocabulary and the row max / sum-exp / label logit need "
                          "all-reduces over the TP ranks, which the kernel does not do (it runs with tp = 1 only)",
                          "set model.cross_entropy_fusion_impl=native (megatron's fused vocab-parallel cross entropy), "
                          "or parallel.tensor_model_parallel_size=1"))
    why = triton_kernel_blockers(ctx)
    if why:
        out.append(_issue(keys + (["device"] if ctx.device == "cpu" else []), "turbo",
                          "the Triton cross entropy cannot run here: " + "; ".join(why),
                          "set model.cross_entropy_fusion_impl=native, or model.cross_entropy_loss_fusion=false "
                          "on CPU"))
    return out


def compiled_loss(cfg: PrimusConfig) -> bool:
    """perf.compile_loss applies: training.compile, the vocabulary not split over TP ranks, and no fused cross entropy
    asked for (model.cross_entropy_loss_fusion: megatron's native / TE one, or primus' Triton one, turbo_loss)."""
    return bool(cfg.training.compile and cfg.parallel.tensor_model_parallel_size == 1
                and not cfg.model.cross_entropy_loss_fusion and not turbo_loss(cfg))


def activation_fusion(cfg: PrimusConfig, ctx: RunContext) -> Optional[str]:
    """model.bias_activation_fusion -> "triton" (primus.turbo.swiglu through megatron's bias_swiglu_impl, see
    fusions.py), "jit" (megatron's torch.compile'd SwiGLU) or None (eager). Unset = fused on a GPU only (on CPU
    megatron's jit would compile per shape for no gain); true on CPU = megatron's jit, or the Triton kernel
    under TRITON_INTERPRET=1 (kernel tests)."""
    want = cfg.model.bias_activation_fusion
    gpu = ctx.device == "cuda" or ctx.planned
    if want is False or (want is None and not gpu):
        return None
    if resolved_layer_spec(cfg) == "te" or not _importable("triton"):
        return "jit"
    return "triton" if gpu or os.environ.get("TRITON_INTERPRET") == "1" else "jit"


def rope_fusion(cfg: PrimusConfig, ctx: RunContext) -> Optional[str]:
    """model.apply_rope_fusion -> "te" (TE's fused RoPE), "triton" (primus.turbo.rope through megatron's
    fused_single_qkv_rope hook) or None (megatron's unfused RoPE). Unset = the fused one where it applies, and on
    CPU never (Triton's interpreter would be slow); an explicit true that cannot be honoured is a capability issue."""
    want = cfg.model.apply_rope_fusion
    if want is False:
        return None
    if resolved_layer_spec(cfg) == "te":
        return "te"
    if want is None and ctx.device == "cpu" and not ctx.planned:
        return None
    return None if rope_fusion_blockers(cfg, ctx) else "triton"


def turbo_args(cfg: PrimusConfig) -> Dict[str, Any]:
    """args["turbo"]: what primus/backends/megatron/turbo.py swaps in ({} when nothing)."""
    t, moe = cfg.turbo, cfg.moe
    out: Dict[str, Any] = {}
    if t.enable_primus_turbo:
        for f in TURBO_SPEC_FLAGS + TURBO_MOE_FLAGS:
            if getattr(t, f) and (f in TURBO_SPEC_FLAGS or cfg.model.num_experts):
                out[f] = True
        if t.turbo_sync_free_moe_stage and cfg.model.num_experts:
            out["turbo_sync_free_moe_stage"] = int(t.turbo_sync_free_moe_stage)
            out["sync_free"] = True  # permute with num_out_tokens = tokens x topk (dropless): no host sync
        if t.use_turbo_parallel_linear:
            out["chunks"] = 2  # pieces of the overlapped TP collectives
    if out.get("use_turbo_grouped_gemm") and t.grouped_gemm_fp8:  # checked: portable fp8 (capability_issues)
        out["grouped_gemm_fp8"] = cfg.precision.fp8.value  # experts' GEMMs in fp8 too (tensorwise, fp8 format)
    if turbo_permute_fusion(cfg):
        out["moe_permute_fusion"] = True
    if out and cfg.model.num_experts:
        out["topk"] = cfg.model.moe_router_topk
    return out


def transformer_config_kwargs(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    m, p, moe = cfg.model, cfg.precision, cfg.moe
    dtype = _dtype(cfg)
    rope = rope_fusion(cfg, ctx)
    k: Dict[str, Any] = {
        # architecture: Llama-style decoder (pre-norm RMSNorm, SwiGLU, RoPE, no biases, no dropout)
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "kv_channels": m.kv_channels,
        "normalization": "RMSNorm",
        "layernorm_epsilon": m.norm_epsilon,
        "qk_layernorm": m.qk_layernorm,
        "gated_linear_unit": True,
        "activation_func": "silu",
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        # fusions: activation_fusion() / rope_fusion() say whose kernels; the rest need TE/apex extensions
        "bias_activation_fusion": activation_fusion(cfg, ctx) is not None,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        # rope_fusion(): TE's fused RoPE with the TE spec, else megatron's fused_single_qkv_rope hook (fusions.py)
        "apply_rope_fusion": rope == "te",
        "fused_single_qkv_rope": rope == "triton",
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        # precision
        "bf16": p.bf16,
        "fp16": p.fp16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        # impl=turbo: megatron computes the loss unfused and perf.turbo_loss replaces it (args["turbo_loss"])
        "cross_entropy_loss_fusion": m.cross_entropy_loss_fusion and not turbo_loss(cfg),
        "cross_entropy_fusion_impl": "native" if turbo_loss(cfg) else m.cross_entropy_fusion_impl.value,
        "deallocate_pipeline_outputs": True,
        "variable_seq_lengths": False,
    }
    if p.fp8 is not None:
        k.update({
            "fp8": p.fp8.value,
            "fp8_recipe": p.fp8_recipe.value,
            "fp8_margin": p.fp8_margin,
            "fp8_interval": p.fp8_interval,
            "fp8_amax_history_len": p.fp8_amax_history_len,
            "fp8_amax_compute_algo": p.fp8_amax_compute_algo,
        })
    if p.fp4 is not None:
        k.update({"fp4": p.fp4.value, "fp4_recipe": p.fp4_recipe.value})
    if p.fp8 is not None or p.fp4 is not None:
        k.update({
            "first_last_layers_bf16": p.first_last_layers_bf16,
            "num_layers_at_start_in_bf16": p.num_layers_at_start_in_bf16,
            "num_layers_at_end_in_bf16": p.num_layers_at_end_in_bf16,
        })
    if m.num_experts:
        k.update({
            "num_moe_experts": m.num_experts,
            "moe_router_topk": m.moe_router_topk,
            "moe_ffn_hidden_size": m.moe_ffn_hidden_size or m.ffn_hidden_size,
            "moe_shared_expert_intermediate_size": m.moe_shared_expert_intermediate_size,
            "moe_layer_freq": moe_layer_freq(cfg),
            "moe_router_load_balancing_type": moe.moe_router_load_balancing_type.value,
            "moe_aux_loss_coeff": moe.moe_aux_loss_coeff,
            "moe_z_loss_coeff": moe.moe_z_loss_coeff,
            "moe_router_score_function": moe.moe_router_score_function.value,
            "moe_router_pre_softmax": moe.moe_router_pre_softmax,
            # the turbo grouped GEMM / fused act with probs serve megatron's GroupedMLP (turbo.py)
            "moe_grouped_gemm": moe.moe_grouped_gemm or bool(
                cfg.turbo.enable_primus_turbo and (cfg.turbo.use_turbo_grouped_gemm
                                                   or cfg.turbo.use_turbo_fused_act_with_probs)),
            "moe_token_dispatcher_type": moe.moe_token_dispatcher_type.value,
            # without TE megatron's fused permute is missing: turbo.py's Triton permute runs instead (args["turbo"])
            "moe_permute_fusion": moe.moe_permute_fusion and not turbo_permute_fusion(cfg),
            "overlap_moe_expert_parallel_comm": moe.overlap_moe_expert_parallel_comm,
        })
    if m.multi_latent_attention:
        k.update({
            "multi_latent_attention": True,
            "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank,
            "qk_head_dim": m.qk_head_dim,
            "qk_pos_emb_head_dim": m.qk_pos_emb_head_dim,
            "v_head_dim": m.v_head_dim,
            "rope_type": "rope",  # plain RoPE at pretraining lengths (YaRN is a context-extension step)
            "rotary_base": m.rotary_base,
        })
        k.pop("kv_channels")
    if m.mtp_num_layers:
        k["mtp_num_layers"] = m.mtp_num_layers
    return k


def ddp_config_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    return {
        "grad_reduce_in_fp32": True,  # Megatron-LM's default for bf16: fp32 main grads, reduced in fp32
    }


def optimizer_config_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    p = cfg.precision
    k = {
        "bf16": p.bf16,
        "fp16": p.fp16,
        "params_dtype": _dtype(cfg),
    }
    if p.fp16:
        k.update({"loss_scale": p.loss_scale, "initial_loss_scale": p.initial_loss_scale,
                  "min_loss_scale": p.min_loss_scale, "loss_scale_window": p.loss_scale_window,
                  "hysteresis": p.hysteresis})
    if p.fp8 is not None:
        k["fp8_recipe"] = p.fp8_recipe.value  # megatron's optimizer reads it for precision-aware state
    return k


def gpt_model_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    m = cfg.model
    return {
        "vocab_size": padded_vocab_size(cfg),
        "max_sequence_length": cfg.training.seq_length,
        "position_embedding_type": "none" if m.multi_latent_attention else "rope",  # MLA applies RoPE itself
        "rotary_base": int(m.rotary_base),
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": m.tie_word_embeddings,
        "parallel_output": True,
    }


def build_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    """What the trainer hands megatron-core: this module's sections, merged with every feature's `megatron()`."""
    own = {
        "fp8_backend": fp8_backend(cfg),
        "fp8_weight_cache": fp8_weight_cache(cfg, num_microbatches(cfg, ctx)),
        "fp8_fused_mlp": fp8_fused_mlp(cfg, ctx),
        "transformer_config": transformer_config_kwargs(cfg, ctx),
        "gpt_model": gpt_model_kwargs(cfg),
        "ddp_config": ddp_config_kwargs(cfg),
        "optimizer_config": optimizer_config_kwargs(cfg),
        "turbo": turbo_args(cfg),
        "rope_fusion": rope_fusion(cfg, ctx),
        "activation_fusion": activation_fusion(cfg, ctx),
        "compile_loss": compiled_loss(cfg),
        # perf.turbo_loss: the LM loss through primus.turbo.cross_entropy (model.cross_entropy_fusion_impl=turbo)
        "turbo_loss": turbo_loss(cfg),
    }
    return merged([own, backend_mapping("megatron", cfg, ctx)])


# ------------------------------------------------------------------------------------------------ capability rules


def _issue(keys, value, rule, fix) -> ConfigIssue:
    return ConfigIssue(list(keys), value, rule, fix)


def _gpu_has_fp8() -> Optional[bool]:
    try:
        import torch  # already imported by context.resolve on a GPU machine

        if not torch.cuda.is_available():
            return None
        if torch.version.hip is not None:
            return True  # MI300 and later run fp8; older ROCm parts fail inside the kernels with their own error
        return torch.cuda.get_device_capability(0) >= (8, 9)
    except Exception:  # noqa: BLE001 - no answer is "unknown", not an error
        return None


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    out: List[ConfigIssue] = []
    p, par, moe, m = cfg.precision, cfg.parallel, cfg.moe, cfg.model
    ver = mcore_version()
    cpu = ctx.device == "cpu"
    spec = resolved_layer_spec(cfg)

    if ver is None:
        return [_issue(["backend.name"], "megatron", "megatron-core is not installed",
                       f"pip install megatron-core=={PINNED_MCORE}")]
    out += backend_issues("megatron", cfg, ctx)  # each feature's megatron_issues

    if cfg.turbo.grouped_gemm_fp8:
        need = []
        if not (cfg.turbo.enable_primus_turbo and cfg.turbo.use_turbo_grouped_gemm and m.num_experts):
            need.append("turbo.enable_primus_turbo=true and turbo.use_turbo_grouped_gemm=true on an MoE model")
        if p.fp8 is None or fp8_backend(cfg) != "portable":
            need.append("precision=fp8 on the portable fp8 path (no Transformer Engine)")
        if need:
            out.append(_issue(["turbo.grouped_gemm_fp8"], True, "fp8 experts need " + " and ".join(need),
                              "set those, or turbo.grouped_gemm_fp8=false"))
        elif p.fp8_recipe.value != "tensorwise":
            out.append(_issue(["turbo.grouped_gemm_fp8", "precision.fp8_recipe"], p.fp8_recipe.value,
                              "the fp8 grouped GEMM over experts (primus.turbo.grouped_gemm) scales tensorwise",
                              "use precision.fp8_recipe=tensorwise, or turbo.grouped_gemm_fp8=false (experts "
                              "then run a bf16 grouped GEMM)"))
        elif p.first_last_layers_bf16:
            out.append(_issue(["turbo.grouped_gemm_fp8", "precision.first_last_layers_bf16"], True,
                              "the fp8 grouped GEMM applies to every MoE layer's experts; keeping the first/last "
                              "layers in bf16 is not wired for experts yet",
                              "set precision.first_last_layers_bf16=false, or turbo.grouped_gemm_fp8=false"))

    if m.apply_rope_fusion and spec != "te":
        why = rope_fusion_blockers(cfg, ctx)
        if why:
            out.append(_issue(["model.apply_rope_fusion"], True, "the fused q/k/v split + RoPE cannot run here: "
                              + "; ".join(why), "set model.apply_rope_fusion=null (use it where it applies) or false"))

    # ---- CPU: what megatron-core cannot do without CUDA (see cpu_compat.py)
    if cpu:
        if p.fp8 is not None or p.fp4 is not None:
            out.append(_issue(["precision.fp8", "precision.fp4", "device"],
                              (p.fp8 or p.fp4).value, "fp8/fp4 training needs a GPU with fp8 tensor cores",
                              "use precision=bf16 on CPU"))
        if moe.overlap_moe_expert_parallel_comm:
            out.append(_issue(["moe.overlap_moe_expert_parallel_comm", "device"], True,
                              "the expert-parallel overlap schedules work on CUDA streams", "turn it off on CPU"))

    # ---- things the local (non-TE) spec of megatron-core 0.16.1 cannot do, on any device
    if spec == "local":
        if m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl.value == "te":
            out.append(_issue(["model.cross_entropy_fusion_impl"], "te", "the TE fused cross entropy needs TE",
                              "set model.cross_entropy_fusion_impl=native"))
        # moe.moe_permute_fusion without TE: primus.turbo.moe_ops permute/unpermute (turbo_issues checks Triton)
        if moe.moe_grouped_gemm and m.num_experts and not p.bf16:
            # without TE the local spec uses GroupedMLP (grouped_gemm.py supplies its GEMM), which is bf16-only
            out.append(_issue(["moe.moe_grouped_gemm", "precision.bf16"], False,
                              f"megatron-core {ver}'s GroupedMLP (the grouped-GEMM experts without TE) runs bf16 only",
                              "set precision=bf16, or moe.moe_grouped_gemm=false"))
        if p.fp4 is not None:
            out.append(_issue(["precision.fp4"], p.fp4.value, f"megatron-core {ver} runs fp4 through TE only",
                              "install Transformer Engine or drop fp4"))
    if m.cross_entropy_loss_fusion and cpu and not turbo_loss(cfg):  # turbo: turbo_loss_issues (the interpreter)
        out.append(_issue(["model.cross_entropy_loss_fusion", "device"], True,
                          "the fused cross entropy is a GPU kernel (torch.compile'd / TE)",
                          "set model.cross_entropy_loss_fusion=false on CPU"))
    out += turbo_loss_issues(cfg, ctx)
    deepep_flag = cfg.turbo.enable_primus_turbo and cfg.turbo.use_turbo_deepep  # the provider rule names that fix
    if moe.moe_token_dispatcher_type.value == "flex" and m.num_experts and not deepep_flag and not ctx.planned \
            and not _importable("deep_ep"):
        out.append(_issue(["moe.moe_token_dispatcher_type"], "flex",
                          f"megatron-core {ver}'s flex dispatcher needs DeepEP (deep_ep), which does not import",
                          "use moe.moe_token_dispatcher_type=alltoall"))

    # ---- precision recipes
    if p.fp8 is not None:
        r = p.fp8_recipe.value
        if r not in MCORE_FP8_RECIPES:
            out.append(_issue(["precision.fp8_recipe"], r, f"megatron-core {ver} has fp8 recipes {list(MCORE_FP8_RECIPES)}",
                              "pick one of those"))
        elif not cpu and spec == "local" and not portable_fp8_available(r, planned=ctx.planned):
            if _importable("primus.turbo.fp8_linear"):
                rule = f"neither Transformer Engine nor the portable fp8 linear can run recipe {r!r} here"
            else:
                rule = "Transformer Engine is not installed and the portable fp8 linear is not available yet"
            out.append(_issue(["precision.fp8", "precision.fp8_recipe"], {"fp8": p.fp8.value, "recipe": r}, rule,
                              "use precision=bf16, or install Transformer Engine"))
        if p.fp8_weight_cache is False and fp8_backend(cfg) == "te":
            out.append(_issue(["precision.fp8_weight_cache", "backend.layer_spec"], False,
                              "Transformer Engine's linears keep their own fp8 weight cache (megatron refreshes it "
                              "at each step's first micro batch); this switch is the portable fp8 linear's",
                              "drop precision.fp8_weight_cache, or use backend.layer_spec=local"))
        if p.fp8_fused_mlp:
            out += fused_mlp_blockers(cfg, ctx)
        if r == "delayed" and spec == "local":  # the portable DelayedScaling (primus.turbo.fp8_linear)
            from primus.turbo.providers import delayed_recipe_issues

            out += delayed_recipe_issues(p)
        if not cpu and _gpu_has_fp8() is False:
            out.append(_issue(["precision.fp8", "device"], p.fp8.value,
                              f"this GPU ({ctx.gpu_name}) has no fp8 tensor cores (needs compute capability >= 8.9)",
                              "use precision=bf16"))
    if p.fp4 is not None and p.fp4_recipe.value not in MCORE_FP4_RECIPES:
        out.append(_issue(["precision.fp4_recipe"], p.fp4_recipe.value,
                          f"megatron-core {ver} has fp4 recipes {list(MCORE_FP4_RECIPES)}", "use nvfp4"))

    if moe.overlap_moe_expert_parallel_comm and m.num_experts:
        if moe.moe_token_dispatcher_type.value not in ("alltoall", "flex"):
            out.append(_issue(["moe.overlap_moe_expert_parallel_comm", "moe.moe_token_dispatcher_type"],
                              moe.moe_token_dispatcher_type.value, "the EP overlap needs the alltoall or flex dispatcher",
                              "set moe.moe_token_dispatcher_type=alltoall"))
        if cfg.recompute.recompute_granularity is not None and cfg.recompute.recompute_granularity.value == "full":
            out.append(_issue(["moe.overlap_moe_expert_parallel_comm", "recompute.recompute_granularity"], "full",
                              f"megatron-core {ver} refuses full recompute with the EP overlap",
                              "use recompute=selective or none"))
        if not (p.bf16 or p.fp16):
            out.append(_issue(["moe.overlap_moe_expert_parallel_comm", "precision.bf16"], False,
                              "the EP overlap runs bf16/fp16 models only", "set precision.bf16=true"))
    if m.mtp_num_layers and par.pipeline_model_parallel_size > 1:
        out.append(_issue(["model.mtp_num_layers", "parallel.pipeline_model_parallel_size"], m.mtp_num_layers,
                          "multi-token prediction with pipeline parallelism is not wired in this backend",
                          "set pp=1 or model.mtp_num_layers=0"))
    out += turbo_issues(cfg, ctx)
    return out




def turbo_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    """Turbo flags with backend=megatron: what they need, and (unless planned) a provider for each on this device
    (primus.turbo.providers names what to install)."""
    t = cfg.turbo
    out: List[ConfigIssue] = []
    permute = turbo_permute_fusion(cfg)
    if not t.enable_primus_turbo and not permute:
        return out
    spec = resolved_layer_spec(cfg)
    if t.enable_primus_turbo and spec == "te":
        on = [f"turbo.{f}" for f in TURBO_SPEC_FLAGS + ("use_turbo_grouped_gemm", "use_turbo_fused_act_with_probs",
                                                         "moe_use_fused_router_with_aux_score") if getattr(t, f)]
        if on:
            out.append(_issue(on + ["backend.layer_spec"], "te",
                              "the megatron turbo swaps replace modules of the local spec; Transformer Engine's "
                              "layers already fuse these", "set backend.layer_spec=local, or turbo=off"))
    if t.enable_primus_turbo and t.use_turbo_parallel_linear and cfg.precision.fp8 is not None and spec == "local":
        from primus.turbo.providers import PORTABLE_FP8_RECIPES  # the fp8 linear the turbo parallel linear runs

        if cfg.precision.fp8_recipe.value not in PORTABLE_FP8_RECIPES:
            out.append(_issue(["turbo.use_turbo_parallel_linear", "precision.fp8_recipe"],
                              cfg.precision.fp8_recipe.value,
                              f"the turbo parallel linear runs fp8 recipes {list(PORTABLE_FP8_RECIPES)}",
                              "use precision=fp8 (tensorwise) or precision=fp8_delayed"))
    if getattr(ctx, "planned", False):
        return out
    from primus.turbo import providers

    for i in providers.capability_issues(cfg, ctx.device, info=providers.device_info_for(ctx.device)):
        if i.keys and i.keys[0].startswith("precision.fp8"):
            continue  # the precision rules above judge fp8 (TE or the portable linear)
        out.append(i)
    return out
