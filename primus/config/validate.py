"""`validate(cfg)`: every cross-field rule of the guide, each in one place, run before anything launches.

Each rule is a small function returning ConfigIssues (key, value, rule, fix), registered with `@rule` in the
module of its feature (primus/features/<name>.py); `validate` checks the counts, runs them all and raises one
ConfigError listing every problem. Rules that depend on the installed backend or the device are the backend's
(`primus/backends/<name>/args.py: capability_issues`, which gathers each feature's `<backend>_issues`) and are run
from here too. Normalisations the guide asks for (recompute_layer_ids deduplicated and sorted) happen in the rules,
in place, so every consumer sees one form.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from primus.config.errors import ConfigError, ConfigIssue
from primus.config.schema import Backend, PrecisionConfig, PrimusConfig
from primus.context import RunContext

from primus.features import RULES, Rule, modules, rule  # noqa: F401 - the registry every feature module's rules join

modules()  # importing each feature module registers its rules


# ---------------------------------------------------------------- counts and the model's shape
# Every other rule divides or compares by these, so `validate` reports these alone when any is off.

# (key, must be >= this); a None value (an optional size left unset) is not judged
POSITIVE = (
    ("model.num_layers", 1), ("model.hidden_size", 1), ("model.ffn_hidden_size", 1),
    ("model.num_attention_heads", 1), ("model.num_query_groups", 1), ("model.kv_channels", 1),
    ("model.vocab_size", 1), ("model.max_position_embeddings", 1), ("model.num_experts", 1),
    ("model.moe_ffn_hidden_size", 1), ("model.moe_shared_expert_intermediate_size", 1),
    ("model.moe_first_k_dense", 0), ("model.mtp_num_layers", 0), ("model.q_lora_rank", 1),
    ("model.kv_lora_rank", 1), ("model.qk_head_dim", 1), ("model.qk_pos_emb_head_dim", 1), ("model.v_head_dim", 1),
    ("training.train_iters", 1), ("training.seq_length", 1), ("training.micro_batch_size", 1),
    ("training.global_batch_size", 1), ("training.lr_warmup_iters", 0), ("training.timing_warmup_steps", 0),
    ("training.log_interval", 1),
    ("parallel.tensor_model_parallel_size", 1), ("parallel.pipeline_model_parallel_size", 1),
    ("parallel.context_parallel_size", 1), ("parallel.expert_model_parallel_size", 1),
    ("launcher.nproc_per_node", 1), ("launcher.nnodes", 1), ("checkpoint.interval", 0), ("checkpoint.keep_last", 0),
    ("data.num_workers", 0), ("precision.loss_scale_window", 1), ("precision.hysteresis", 1),
)


def _get(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def counts_are_positive(cfg, ctx) -> List[ConfigIssue]:
    out = []
    for key, least in POSITIVE:
        v = _get(cfg, key)
        if v is not None and v < least:
            what = "a count" if least == 1 else "a count that may be 0"
            null = f" (or null: {_NULL_MEANS[key]})" if key in _NULL_MEANS else ""
            out.append(ConfigIssue([key], v, f"must be >= {least} ({what})", f"set {key} to {least} or more{null}"))
    return out


_NULL_MEANS = {"model.kv_channels": "hidden_size / heads", "model.num_experts": "a dense model",
               "model.moe_ffn_hidden_size": "ffn_hidden_size", "model.moe_shared_expert_intermediate_size":
               "no shared experts", "model.q_lora_rank": "full-rank queries"}


@rule
def model_values(cfg, ctx):
    m, moe, out = cfg.model, cfg.moe, []
    if m.rotary_base <= 0:
        out.append(ConfigIssue(["model.rotary_base"], m.rotary_base, "RoPE's theta must be > 0", "e.g. 10000 or 500000"))
    if m.norm_epsilon < 0:
        out.append(ConfigIssue(["model.norm_epsilon"], m.norm_epsilon, "must be >= 0", "e.g. 1e-5"))
    for k in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        v = getattr(moe, k)
        if v is not None and v < 0:
            out.append(ConfigIssue([f"moe.{k}"], v, "a loss weight must be >= 0", f"set moe.{k} to 0 (off) or more"))
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


# ---------------------------------------------------------------- turbo


TURBO_FEATURE_FLAGS = (
    "use_turbo_attention", "use_turbo_parallel_linear", "use_turbo_grouped_gemm", "use_turbo_rms_norm",
    "moe_use_fused_router_with_aux_score", "use_turbo_deepep", "use_turbo_fused_act_with_probs",
    "use_turbo_async_tp", "use_turbo_float8_linear",
)


@rule
def turbo_grouped_mlp_removed(cfg, ctx):
    if cfg.turbo.use_turbo_grouped_mlp is not None:
        return [ConfigIssue(["turbo.use_turbo_grouped_mlp"], cfg.turbo.use_turbo_grouped_mlp,
                            "use_turbo_grouped_mlp was removed",
                            "delete it and set turbo.use_turbo_grouped_gemm=true instead")]
    return []


@rule
def turbo_flags_need_master_switch(cfg, ctx):
    t = cfg.turbo
    if t.enable_primus_turbo:
        return []
    on = [f"turbo.{f}" for f in TURBO_FEATURE_FLAGS if getattr(t, f)]
    if t.turbo_sync_free_moe_stage > 0:
        on.append("turbo.turbo_sync_free_moe_stage")
    if not on:
        return []
    return [ConfigIssue(on + ["turbo.enable_primus_turbo"], False,
                        "Turbo feature flags take effect only with the master switch on (they are never ignored)",
                        "set turbo.enable_primus_turbo=true, or turn the listed flags off")]


@rule
def turbo_sync_free_stage(cfg, ctx):
    t, out = cfg.turbo, []
    s = t.turbo_sync_free_moe_stage
    if s not in (0, 1, 2, 3):
        return [ConfigIssue(["turbo.turbo_sync_free_moe_stage"], s, "must be 0, 1, 2 or 3 (0 disables)",
                            "use turbo=sync_free_stage2 (recommended) or set the stage to 0..3")]
    # The stages are cumulative (guide + issue 5): each one needs the flags of the ones below it, set explicitly.
    needs = []
    if s >= 1:
        needs += [("turbo.moe_use_fused_router_with_aux_score", t.moe_use_fused_router_with_aux_score),
                  ("moe.moe_permute_fusion", cfg.moe.moe_permute_fusion)]
    if s >= 2:
        needs += [("turbo.use_turbo_grouped_gemm", t.use_turbo_grouped_gemm), ("turbo.use_turbo_deepep", t.use_turbo_deepep)]
    if s >= 3:
        needs += [("turbo.use_turbo_fused_act_with_probs", t.use_turbo_fused_act_with_probs)]
    missing = [k for k, v in needs if not v]
    if missing:
        out.append(ConfigIssue(["turbo.turbo_sync_free_moe_stage"] + missing, s,
                               f"sync-free MoE stage {s} needs " + ", ".join(missing) + " on",
                               f"use the preset turbo=sync_free_stage{s}, or set those keys to true"))
    if s > 0 and not cfg.model.num_experts:
        out.append(ConfigIssue(["turbo.turbo_sync_free_moe_stage", "model.num_experts"], s,
                               "sync-free MoE stages apply to MoE models only", "choose a MoE model or set the stage to 0"))
    return out


@rule
def turbo_deepep(cfg, ctx):
    t, out = cfg.turbo, []
    if t.use_turbo_deepep:
        if t.turbo_deepep_num_cu <= 0:
            out.append(ConfigIssue(["turbo.turbo_deepep_num_cu"], t.turbo_deepep_num_cu, "must be > 0",
                                   "use 64 or 80 for EP8, 32 for EP16-64"))
        if cfg.moe.moe_token_dispatcher_type.value != "flex":
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "moe.moe_token_dispatcher_type"],
                                   cfg.moe.moe_token_dispatcher_type.value,
                                   "DeepEP is the flex token dispatcher", "set moe.moe_token_dispatcher_type=flex"))
        if not cfg.model.num_experts:
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "model.num_experts"], None,
                                   "DeepEP dispatches MoE tokens: the model has no experts", "turn it off or pick a MoE model"))
    return out


# ---------------------------------------------------------------- precision


@rule
def precision_exclusive(cfg, ctx):
    p, out = cfg.precision, []
    if p.bf16 and p.fp16:
        out.append(ConfigIssue(["precision.bf16", "precision.fp16"], True, "bf16 and fp16 are exclusive",
                               "use precision=bf16 or precision=fp16"))
    if p.fp8 is not None and p.fp4 is not None:
        out.append(ConfigIssue(["precision.fp8", "precision.fp4"], [p.fp8.value, p.fp4.value],
                               "fp8 and fp4 are exclusive", "pick one: precision=fp8 or precision=fp4"))
    if not (p.bf16 or p.fp16) and (p.fp8 is not None or p.fp4 is not None):
        out.append(ConfigIssue(["precision.bf16", "precision.fp16"], False,
                               "fp8/fp4 linears run inside a bf16 or fp16 model", "set precision.bf16=true"))
    return out


LOSS_SCALING = {k: getattr(PrecisionConfig(), k) for k in  # fp16's scaler settings and their schema defaults
                ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")}


@rule
def fp16_loss_scaling(cfg, ctx):
    p, out = cfg.precision, []
    changed = [k for k, d in LOSS_SCALING.items() if getattr(p, k) != d]
    if not p.fp16:
        if changed:
            out.append(ConfigIssue([f"precision.{k}" for k in changed] + ["precision.fp16"],
                                   {k: getattr(p, k) for k in changed},
                                   "loss scaling applies to fp16 training only (bf16 and fp32 need none)",
                                   "use precision=fp16, or drop these settings"))
        return out
    if p.loss_scale is not None and p.loss_scale <= 0:
        out.append(ConfigIssue(["precision.loss_scale"], p.loss_scale, "a static loss scale must be > 0",
                               "use a power of 2 such as 1024, or null for dynamic scaling"))
    if not 0 < p.min_loss_scale <= p.initial_loss_scale:
        out.append(ConfigIssue(["precision.min_loss_scale", "precision.initial_loss_scale"],
                               [p.min_loss_scale, p.initial_loss_scale], "need 0 < min_loss_scale <= initial_loss_scale",
                               "e.g. precision.initial_loss_scale=65536 precision.min_loss_scale=1"))
    return out  # loss_scale_window and hysteresis are counts: POSITIVE


@rule
def first_last_layers_bf16(cfg, ctx):
    p, out = cfg.precision, []
    if not p.first_last_layers_bf16:
        return []
    if p.fp8 is None and p.fp4 is None:
        out.append(ConfigIssue(["precision.first_last_layers_bf16"], True,
                               "keeps layers in BF16 out of fp8/fp4: needs precision.fp8 or precision.fp4",
                               "set precision=fp8 (or fp4), or first_last_layers_bf16=false"))
    n = p.num_layers_at_start_in_bf16 + p.num_layers_at_end_in_bf16
    if p.num_layers_at_start_in_bf16 < 0 or p.num_layers_at_end_in_bf16 < 0 or n > cfg.model.num_layers:
        out.append(ConfigIssue(["precision.num_layers_at_start_in_bf16", "precision.num_layers_at_end_in_bf16"],
                               [p.num_layers_at_start_in_bf16, p.num_layers_at_end_in_bf16],
                               f"start + end must be in 0..num_layers ({cfg.model.num_layers})", "lower the counts"))
    return out


@rule
def fp8_weight_cache(cfg, ctx):
    v = cfg.precision.fp8_weight_cache
    if v is None:
        return []
    if cfg.precision.fp8 is None:
        return [ConfigIssue(["precision.fp8_weight_cache", "precision.fp8"], v,
                            "caches the fp8 casts of weights: needs precision.fp8", "set precision=fp8, or drop it")]
    if v and cfg.backend.name != Backend.megatron:
        # FSDP's unsharded weights reuse buffers, so a cast keyed by storage could serve another layer's weight
        return [ConfigIssue(["precision.fp8_weight_cache", "backend.name"], True,
                            "the fp8 weight cache is the megatron backend's (TorchTitan's FSDP all-gathers weights "
                            "into reused buffers)", "drop precision.fp8_weight_cache, or use backend=megatron")]
    return []


@rule
def fp8_fused_mlp(cfg, ctx):
    v = cfg.precision.fp8_fused_mlp
    if not v:  # null: wherever it applies (megatron's args.fp8_fused_mlp); false: off
        return []
    if cfg.precision.fp8 is None:
        return [ConfigIssue(["precision.fp8_fused_mlp", "precision.fp8"], v,
                            "fuses the fp8 MLP's casts: needs precision.fp8", "set precision=fp8, or drop it")]
    if cfg.backend.name != Backend.megatron:
        return [ConfigIssue(["precision.fp8_fused_mlp", "backend.name"], True,
                            "the fused fp8 MLP replaces megatron's MLP module (TorchTitan's fp8 is torchao's or "
                            "turbo.use_turbo_float8_linear)", "drop precision.fp8_fused_mlp, or use backend=megatron")]
    return []


# Which recipes each backend can run at all (the installed-library checks are the backend's capability_issues).
FP8_RECIPES = {
    Backend.megatron: {"delayed", "tensorwise", "blockwise", "mxfp8"},
    Backend.torchtitan: {"tensorwise", "rowwise"},
}
FP4_BACKENDS = {Backend.megatron}


@rule
def low_precision_recipe_for_backend(cfg, ctx):
    p, out = cfg.precision, []
    b, t = cfg.backend.name, cfg.turbo
    recipes = FP8_RECIPES[b]
    fix = "pick one of those (precision=fp8 is tensorwise, which both backends run)"
    if b == Backend.torchtitan:
        from primus.turbo.providers import PORTABLE_FP8_RECIPES

        if t.enable_primus_turbo and t.use_turbo_float8_linear:  # the turbo fp8 linear instead of torchao's
            recipes = set(PORTABLE_FP8_RECIPES)
        else:
            fix += f"; turbo=torchtitan_fp8 (the turbo fp8 linear) runs {sorted(PORTABLE_FP8_RECIPES)}"
    if p.fp8 is not None and p.fp8_recipe.value not in recipes:
        out.append(ConfigIssue(["precision.fp8_recipe", "backend.name"], p.fp8_recipe.value,
                               f"backend {b.value} runs fp8 recipes {sorted(recipes)}", fix))
    if p.fp4 is not None and b not in FP4_BACKENDS:
        out.append(ConfigIssue(["precision.fp4", "backend.name"], p.fp4.value,
                               f"backend {b.value} has no fp4 training path", "use backend=megatron with Transformer Engine, or drop fp4"))
    return out


# ---------------------------------------------------------------- MoE


MOE_FLAGS = ("moe_permute_fusion", "moe_grouped_gemm", "overlap_moe_expert_parallel_comm")


@rule
def moe_settings_on_dense_model(cfg, ctx):
    if cfg.model.num_experts:
        out = []
        if cfg.moe.overlap_moe_expert_parallel_comm and cfg.parallel.expert_model_parallel_size == 1:
            out.append(ConfigIssue(["moe.overlap_moe_expert_parallel_comm", "parallel.expert_model_parallel_size"], True,
                                   "there is no expert-parallel communication to overlap with ep=1",
                                   "set parallel.expert_model_parallel_size > 1 or use moe=optimized"))
        if cfg.model.moe_router_topk > cfg.model.num_experts or cfg.model.moe_router_topk < 1:
            out.append(ConfigIssue(["model.moe_router_topk"], cfg.model.moe_router_topk,
                                   f"must be in 1..num_experts ({cfg.model.num_experts})", "lower top-k"))
        return out
    on = [f"moe.{f}" for f in MOE_FLAGS if getattr(cfg.moe, f)]
    on += [f"turbo.{f}" for f in ("use_turbo_grouped_gemm", "moe_use_fused_router_with_aux_score",
                                  "use_turbo_fused_act_with_probs") if getattr(cfg.turbo, f)]
    if on:
        return [ConfigIssue(on, True, f"MoE settings on a dense model ({cfg.model.name} has no experts)",
                            "use moe=off and turbo without MoE flags, or choose a MoE model (e.g. model=debug_moe)")]
    return []


def validate(cfg: PrimusConfig, ctx: RunContext, rules: Optional[List[Rule]] = None) -> PrimusConfig:
    """Run every rule (generic, then the backend's capability rules) and raise one ConfigError listing all issues."""
    issues: List[ConfigIssue] = counts_are_positive(cfg, ctx)
    if issues:  # the other rules divide by these counts: their verdicts would be noise
        raise ConfigError(issues)
    for r in rules or RULES:
        issues += r(cfg, ctx)
    if not issues and rules is None:
        from primus.backends import capability_issues

        issues += capability_issues(cfg, ctx)
    if issues:
        raise ConfigError(issues)
    return cfg
