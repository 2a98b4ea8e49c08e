"""Primus config -> the exact TorchTitan job config (nested dict of JobConfig sections), plus what it cannot honour.

No torch / torchtitan import here: dry runs print `build_args` in well under a second.

Pinned to torchtitan 0.2.2: 0.3.0 does not import on torch 2.11 (the GPU machine) and needs patches on torch 2.13;
0.2.2 trains stock on torch 2.11 (see docs/torchtitan.md). It imports triton without declaring it.

The returned dict holds JobConfig sections (`job`, `model`, `training`, `parallelism`, ...) and one more
top-level key, `flavor_args` (jobconfig_keys.FLAVOR_KEY): the model args of the custom flavor that `spec.py`
registers under `model.name` / `model.flavor`. It is not a JobConfig section and is never handed to JobConfig.

Fields of ours that TorchTitan cannot honour (megatron-only knobs, recipes it lacks) are ConfigIssues when set to
a non-default value; every TorchTitan key we set is checked against the installed TorchTitan (jobconfig_keys).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from primus.backends.torchtitan import flavors
from primus.backends.torchtitan.jobconfig_keys import FLAVOR_KEY, TURBO_KEY, installed_version, static_problems
from primus.config.errors import ConfigIssue
from primus.config.schema import (
    ACMode, DataKind, Dtype, FP8Format, FP8Recipe, LRDecay, Optimizer, PrimusConfig, RecomputeGranularity,
    MemoryConfig, OverlapConfig, PrecisionConfig, RecomputeConfig, TrainingConfig, TurboConfig,
)
from primus.context import RunContext, data_parallel_size

SYNTHETIC_DATASET = "primus_synthetic"  # registered by data.py in TorchTitan's dataset table
JSONL_DATASET = "primus_jsonl"
NO_CLIP = 1.0e30  # TorchTitan always clips; max_norm 0 would zero every gradient, so "off" is a huge norm

# The delayed recipe's settings: megatron's, and the turbo fp8 linear's under turbo.use_turbo_float8_linear.
DELAYED_KEYS = ("fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo")
# Our fields that only megatron-core reads: setting them under backend=torchtitan would have no effect.
_MEGATRON_ONLY = {
    "recompute": (RecomputeConfig, ["recompute_method", "recompute_num_layers", "recompute_layer_ids",
                                    "recompute_modules"]),
    "overlap": (OverlapConfig, ["overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm",
                                "async_tensor_model_parallel_allreduce", "align_grad_reduce",
                                "align_param_gather", "bucket_size"]),
    "memory": (MemoryConfig, ["use_distributed_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
                              "use_precision_aware_optimizer", "empty_unused_memory_level"]),
    "precision": (PrecisionConfig, [*DELAYED_KEYS, "fp4", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                                    "num_layers_at_end_in_bf16"]),
    "turbo": (TurboConfig, ["grouped_gemm_fp8"]),  # TorchTitan's MoE experts have no fp8 grouped GEMM here
}


def _ac_mode(r: RecomputeConfig) -> str:
    if r.activation_checkpoint_mode is not None:
        return r.activation_checkpoint_mode.value
    if r.recompute_granularity == RecomputeGranularity.selective:
        return ACMode.selective.value
    if r.recompute_granularity == RecomputeGranularity.full:
        return ACMode.full.value
    return ACMode.none.value


def _float8(cfg: PrimusConfig, issues: List[ConfigIssue]) -> Dict[str, Any]:
    """model.converters and quantize.linear.* for the fp8 settings."""
    p = cfg.precision
    if p.fp8 is None:
        moved = {k: getattr(p, k) for k in ("float8_enable_fsdp_float8_all_gather",
                                            "float8_precompute_float8_dynamic_scale_for_fsdp")
                 if getattr(p, k) != getattr(PrecisionConfig, k)}
        if moved:
            issues.append(ConfigIssue([f"precision.{k}" for k in moved], moved,
                                      "float8 options have no effect without precision.fp8",
                                      "set precision.fp8 (e.g. precision=fp8_tensorwise) or drop them"))
        return {"converters": [], "quantize": {}}
    recipe = p.fp8_recipe
    if _turbo_fp8(cfg):
        return _turbo_float8(cfg, issues)
    if recipe == FP8Recipe.mxfp8:
        return {"converters": ["quantize.linear.mx"],
                "quantize": {"linear": {"mx": {"recipe_name": "mxfp8_cublas",
                                               "filter_fqns": list(p.float8_filter_fqns)}}}}
    if recipe not in (FP8Recipe.tensorwise, FP8Recipe.rowwise):
        issues.append(ConfigIssue(["precision.fp8_recipe"], recipe.value,
                                  "torchtitan 0.2.2 (torchao float8) has tensorwise, rowwise and mxfp8 recipes only",
                                  "use precision=fp8_tensorwise or fp8_rowwise; or turbo=torchtitan_fp8 (the turbo "
                                  "fp8 linear runs blockwise and delayed too); or backend=megatron"))
    # torchao's formats are fixed per recipe: tensorwise casts grads to e5m2 (hybrid), rowwise/mxfp8 use e4m3
    want = FP8Format.hybrid if recipe == FP8Recipe.tensorwise else FP8Format.e4m3
    if recipe in (FP8Recipe.tensorwise, FP8Recipe.rowwise) and p.fp8 != want:
        issues.append(ConfigIssue(["precision.fp8", "precision.fp8_recipe"], {"fp8": p.fp8.value,
                                                                                "recipe": recipe.value},
                                  f"torchao's {recipe.value} recipe runs fp8 format {want.value}",
                                  f"set precision.fp8={want.value}"))
    f8: Dict[str, Any] = {"filter_fqns": list(p.float8_filter_fqns)}
    if recipe == FP8Recipe.rowwise:
        # torchtitan asserts the float8 all-gather options are off with a named recipe
        for k in ("float8_enable_fsdp_float8_all_gather", "float8_precompute_float8_dynamic_scale_for_fsdp"):
            if getattr(p, k):
                issues.append(ConfigIssue([f"precision.{k}", "precision.fp8_recipe"], True,
                                          "float8 all-gather works with the tensorwise recipe only",
                                          "set it false or use precision=fp8_tensorwise"))
        f8["recipe_name"] = "rowwise"
    else:
        # tensorwise is torchao's default config (recipe_name unset), the only path with float8 all-gather
        f8["enable_fsdp_float8_all_gather"] = p.float8_enable_fsdp_float8_all_gather
        f8["precompute_float8_dynamic_scale_for_fsdp"] = p.float8_precompute_float8_dynamic_scale_for_fsdp
        if p.float8_precompute_float8_dynamic_scale_for_fsdp and not p.float8_enable_fsdp_float8_all_gather:
            issues.append(ConfigIssue(["precision.float8_precompute_float8_dynamic_scale_for_fsdp"], True,
                                      "it only acts together with float8_enable_fsdp_float8_all_gather",
                                      "enable precision.float8_enable_fsdp_float8_all_gather too"))
    return {"converters": ["quantize.linear.float8"], "quantize": {"linear": {"float8": f8}}}


# ---------------------------------------------------------------------------------------------------- turbo
# turbo.* flags -> our TorchTitan model converters (turbo.py), settings in args[TURBO_KEY]. Pure Python here.

TURBO_ATTENTION = "primus_turbo.attention"  # names registered by turbo.py (kept in sync by a test)
TURBO_FLOAT8 = "primus_turbo.float8_linear"
TURBO_GROUPED_GEMM = "primus_turbo.grouped_gemm"


def _turbo_on(cfg: PrimusConfig, flag: str) -> bool:
    return bool(cfg.turbo.enable_primus_turbo and getattr(cfg.turbo, flag))


def _turbo_fp8(cfg: PrimusConfig) -> bool:
    return _turbo_on(cfg, "use_turbo_float8_linear") and cfg.precision.fp8 is not None


def _turbo_float8(cfg: PrimusConfig, issues: List[ConfigIssue]) -> Dict[str, Any]:
    """precision.fp8 served by primus.turbo.fp8_linear instead of torchao's quantize.linear.float8 converter."""
    from primus.turbo.providers import PORTABLE_FP8_RECIPES, delayed_recipe_issues

    p = cfg.precision
    if p.fp8_recipe.value not in PORTABLE_FP8_RECIPES:
        issues.append(ConfigIssue(["turbo.use_turbo_float8_linear", "precision.fp8_recipe"], p.fp8_recipe.value,
                                  f"the turbo fp8 linear runs recipes {list(PORTABLE_FP8_RECIPES)}",
                                  "pick one of those (precision=fp8_tensorwise, fp8_delayed, fp8_rowwise, "
                                  "fp8_blockwise), or turbo.use_turbo_float8_linear=false"))
    if p.fp8_recipe == FP8Recipe.delayed:
        issues.extend(delayed_recipe_issues(p))
    for k in ("float8_enable_fsdp_float8_all_gather", "float8_precompute_float8_dynamic_scale_for_fsdp"):
        if getattr(p, k):
            issues.append(ConfigIssue([f"precision.{k}", "turbo.use_turbo_float8_linear"], True,
                                      "the turbo fp8 linear casts after the FSDP all-gather (bf16 all-gather); "
                                      "float8 all-gather is torchao's",
                                      f"set precision.{k}=false, or turbo.use_turbo_float8_linear=false"))
    return {"converters": [TURBO_FLOAT8], "quantize": {}}


def _turbo_float8_tp_issues(cfg: PrimusConfig) -> List[ConfigIssue]:
    """The turbo fp8 linear under TorchTitan's TP plan runs on each rank's shards (turbo._tp_forward): their dims
    must still be fp8 GEMM operands (multiples of 16), and TorchTitan's async TP cannot fuse its collectives into
    the fp8 GEMMs (custom ops, not aten matmuls: the fusion would silently skip them)."""
    from primus.metrics.flops import head_dim as head_dim_of

    m, par, out = cfg.model, cfg.parallel, []
    tp = par.tensor_model_parallel_size
    head_dim = head_dim_of(m)
    local = {"q (heads x head dim)": m.num_attention_heads * head_dim, "k / v (kv heads x head dim)":
             m.num_query_groups * head_dim, "ffn_hidden_size": m.ffn_hidden_size}
    bad = {k: v for k, v in local.items() if v % tp or (v // tp) % 16}
    if bad:
        out.append(ConfigIssue(["turbo.use_turbo_float8_linear", "parallel.tensor_model_parallel_size"],
                               {"tp": tp, **bad}, "each rank's shard of these linear dims must be a multiple of 16 "
                               "(an fp8 GEMM operand)", "pick a tensor_model_parallel_size that keeps them so"))
    if cfg.turbo.use_turbo_async_tp or cfg.overlap.enable_async_tensor_parallel:
        out.append(ConfigIssue(["turbo.use_turbo_float8_linear", "turbo.use_turbo_async_tp",
                                "overlap.enable_async_tensor_parallel"], True,
                               "TorchTitan's async TP fuses the TP collectives into aten matmuls; the turbo fp8 "
                               "linear's GEMMs are custom ops it cannot fuse",
                               "turn async TP off, or turbo.use_turbo_float8_linear=false"))
    return out


def _turbo(cfg: PrimusConfig, issues: List[ConfigIssue]):
    """(converters to add before the float8 one, settings for turbo.py or None, async TP on)."""
    t, p, par = cfg.turbo, cfg.precision, cfg.parallel
    if not t.enable_primus_turbo:
        return [], None, False
    converters: List[str] = []
    settings: Dict[str, Any] = {"compile": cfg.training.compile}
    if t.use_turbo_attention:
        converters.append(TURBO_ATTENTION)
        settings["attention"] = True
    if t.use_turbo_grouped_gemm and cfg.model.num_experts:  # dense models: validate.py's MoE-on-dense rule
        converters.append(TURBO_GROUPED_GEMM)
        settings["grouped_gemm"] = True
    if t.use_turbo_float8_linear:
        if p.fp8 is None:
            issues.append(ConfigIssue(["turbo.use_turbo_float8_linear", "precision.fp8"], None,
                                      "the turbo float8 linear serves precision.fp8; with fp8 off there is nothing "
                                      "to serve",
                                      "set precision=fp8 (tensorwise), or turbo.use_turbo_float8_linear=false"))
        else:
            settings["float8_linear"] = {"recipe": p.fp8_recipe.value, "fmt": p.fp8.value,
                                         "filter_fqns": list(p.float8_filter_fqns)}
            if p.fp8_recipe == FP8Recipe.delayed:  # fp8_linear.DelayedScaling's settings
                settings["float8_linear"]["delayed"] = {"history_len": p.fp8_amax_history_len,
                                                        "margin": p.fp8_margin, "algo": p.fp8_amax_compute_algo}
            if par.tensor_model_parallel_size > 1:
                issues.extend(_turbo_float8_tp_issues(cfg))
    async_tp = False
    if t.use_turbo_async_tp:
        # TorchTitan's async TP: torch symmetric-memory fused all-gather/reduce-scatter matmuls, which compile
        # inserts into the TP regions. primus.turbo.parallel_linear is not wired into TorchTitan's DTensor plan.
        tp = par.tensor_model_parallel_size
        if tp == 1 or not cfg.training.compile:
            issues.append(ConfigIssue(["turbo.use_turbo_async_tp", "parallel.tensor_model_parallel_size",
                                       "training.compile"], {"tp": tp, "compile": cfg.training.compile},
                                      "async TP overlaps the TP collectives with the GEMMs: it needs tp > 1 and "
                                      "torch.compile (TorchTitan's micro-pipelined TP)",
                                      "set tp > 1 and training.compile=true, or turbo.use_turbo_async_tp=false"))
        async_tp = True
        settings["async_tp"] = True
    return converters, settings, async_tp




def turbo_provider_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    """A turbo flag whose provider is missing on this device (names what to install). A planned run (dry run on a
    machine without the target GPU) skips the hardware probe."""
    if not cfg.turbo.enable_primus_turbo or getattr(ctx, "planned", False):
        return []
    from primus.turbo import providers

    return providers.capability_issues(cfg, ctx.device, info=providers.device_info_for(ctx.device))


def _mixed_precision_dropped(cfg: PrimusConfig, ctx: RunContext, issues: List[ConfigIssue]) -> None:
    """TorchTitan applies bf16 through fully_shard (FSDP/HSDP/CP) or autocast (DDP / one device); with TP or PP
    and no FSDP it logs a warning and trains in fp32, so a bf16 setting would silently have no effect."""
    par, p = cfg.parallel, cfg.precision
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size
    shard = par.data_parallel_shard_degree
    if shard == -1:
        shard = max(1, ctx.world_size // max(1, par.data_parallel_replicate_degree * cp * tp * pp))
    if (tp > 1 or pp > 1) and shard == 1 and cp == 1 and p.mixed_precision_param == Dtype.bfloat16:
        issues.append(ConfigIssue(["precision.mixed_precision_param", "parallel.data_parallel_shard_degree"],
                                  "bfloat16", "torchtitan 0.2.2 drops mixed precision under TP/PP without FSDP "
                                  "(it would train in fp32)",
                                  "shard over dp too (data_parallel_shard_degree > 1), or set "
                                  "precision.bf16=false precision.mixed_precision_param=float32"))


def _unhonoured(cfg: PrimusConfig, issues: List[ConfigIssue]) -> None:
    turbo_delayed = _turbo_fp8(cfg) and cfg.precision.fp8_recipe == FP8Recipe.delayed  # _turbo_float8 reads them
    for group, (cls, keys) in _MEGATRON_ONLY.items():
        section = getattr(cfg, group)
        for k in keys:
            if turbo_delayed and group == "precision" and k in DELAYED_KEYS:
                continue
            value, default = getattr(section, k), cls.__dataclass_fields__[k]
            default = default.default_factory() if callable(default.default_factory) else default.default
            if value != default:
                issues.append(ConfigIssue([f"{group}.{k}"], getattr(value, "value", value),
                                          "megatron-core only: torchtitan 0.2.2 has no such setting",
                                          f"leave {group}.{k} at its default ({default!r}) or use backend=megatron"))
    p, t, m = cfg.precision, cfg.training, cfg.model
    if p.fp16:
        issues.append(ConfigIssue(["precision.fp16"], True, "torchtitan 0.2.2 has no fp16 (loss-scaled) training",
                                  "use precision=bf16"))
    if not p.bf16 and p.mixed_precision_param == Dtype.bfloat16:
        issues.append(ConfigIssue(["precision.bf16", "precision.mixed_precision_param"], "bfloat16",
                                  "bf16=false asks for fp32 training but torchtitan would still compute in bf16",
                                  "also set precision.mixed_precision_param=float32"))
    if p.mixed_precision_param not in (Dtype.bfloat16, Dtype.float32):
        issues.append(ConfigIssue(["precision.mixed_precision_param"], p.mixed_precision_param.value,
                                  "torchtitan 0.2.2 accepts bfloat16 or float32", "use one of those"))
    if p.mixed_precision_reduce != Dtype.float32:
        issues.append(ConfigIssue(["precision.mixed_precision_reduce"], p.mixed_precision_reduce.value,
                                  "torchtitan 0.2.2 reduces gradients in float32 only", "use float32"))
    if t.optimizer == Optimizer.sgd:
        issues.append(ConfigIssue(["training.optimizer"], "sgd", "torchtitan 0.2.2 builds Adam and AdamW only",
                                  "use adamw"))
    if t.init_method_std != TrainingConfig.init_method_std:
        issues.append(ConfigIssue(["training.init_method_std"], t.init_method_std,
                                  "torchtitan's models fix their init (0.02, depth-scaled)", "leave it at 0.02"))
    if m.cross_entropy_loss_fusion:
        issues.append(ConfigIssue(["model.cross_entropy_loss_fusion"], True,
                                  "torchtitan 0.2.2 has no fused cross entropy", "set false"))
    if cfg.data.kind == DataKind.indexed:
        issues.append(ConfigIssue(["data.kind"], "indexed",
                                  "torchtitan reads text datasets, not megatron .bin/.idx", "use data=jsonl or synthetic"))
    par = cfg.parallel
    if par.tensor_model_parallel_size > 1 and not par.sequence_parallel:
        issues.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], False,
                                  "torchtitan's tensor parallel plan always shards norms over tp (sequence parallel)",
                                  "set parallel.sequence_parallel=true"))
    if par.virtual_pipeline_model_parallel_size and m.num_layers % (
            par.pipeline_model_parallel_size * par.virtual_pipeline_model_parallel_size):
        issues.append(ConfigIssue(["parallel.virtual_pipeline_model_parallel_size"],
                                  par.virtual_pipeline_model_parallel_size,
                                  "layers must split evenly over pp x vpp stages", "pick a divisor of num_layers"))
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    if cfg.overlap.enable_async_tensor_parallel and (tp == 1 or not t.compile):
        issues.append(ConfigIssue(["overlap.enable_async_tensor_parallel", "parallel.tensor_model_parallel_size",
                                  "training.compile"], {"tp": tp, "compile": t.compile},
                                  "torchtitan's async TP needs tp > 1 and torch.compile of the model",
                                  "set tp > 1 and training.compile=true, or turn async TP off"))
    divisor = tp * (2 * cp if cp > 1 else 1)
    if cfg.training.seq_length % divisor:
        issues.append(ConfigIssue(["training.seq_length"], cfg.training.seq_length,
                                  f"torchtitan needs seq_len divisible by tp x 2cp = {divisor}",
                                  f"use a multiple of {divisor}"))
    if p.fp8 is not None and tp > 1 and not _turbo_fp8(cfg):
        # 0.2.2's llama3 parallelize looks for a converter named "float8", but the converter is registered as
        # "quantize.linear.float8": its float8 TP plan would never be applied to the float8 linears
        issues.append(ConfigIssue(["precision.fp8", "parallel.tensor_model_parallel_size"], tp,
                                  "torchtitan 0.2.2 does not apply its float8 tensor-parallel plan",
                                  "use float8 with FSDP only (tp=1), turbo=torchtitan_fp8 (the turbo fp8 linear "
                                  "runs under TP), or drop fp8"))
    if par.expert_model_parallel_size > 1 and not m.num_experts:
        issues.append(ConfigIssue(["parallel.expert_model_parallel_size"], par.expert_model_parallel_size,
                                  "expert parallelism has no effect on a dense model", "set 1"))
    if m.tie_word_embeddings and (par.tensor_model_parallel_size > 1 or par.pipeline_model_parallel_size > 1) \
            and not m.num_experts and not m.qk_layernorm:
        issues.append(ConfigIssue(["model.tie_word_embeddings"], True,
                                  "Primus ties llama3 embeddings for FSDP/DDP/single-device only",
                                  "untie, or set tp=1 and pp=1"))
    if cfg.memory.enable_cpu_offload and cfg.device.value == "cpu":
        issues.append(ConfigIssue(["memory.enable_cpu_offload", "device"], True,
                                  "FSDP CPU offload needs a GPU", "set it false on CPU"))
    if _ac_mode(cfg.recompute) == "selective":
        opt = cfg.recompute.selective_ac_option
        if opt != "op" and not opt.isdigit():
            issues.append(ConfigIssue(["recompute.selective_ac_option"], opt, "must be 'op' or an integer",
                                      "use op or e.g. 2"))


def _map(cfg: PrimusConfig, ctx: RunContext):
    issues: List[ConfigIssue] = []
    flavor = flavors.build_flavor(cfg)
    issues += flavor.issues
    _unhonoured(cfg, issues)
    _mixed_precision_dropped(cfg, ctx, issues)
    t, par, p = cfg.training, cfg.parallel, cfg.precision
    dp = data_parallel_size(cfg, ctx.world_size) or 1
    pp = par.pipeline_model_parallel_size
    if pp > 1:
        # megatron's micro batches all go through the pipeline in one step: TorchTitan's local batch is the whole
        # per-dp-rank batch, split into pipeline microbatches of micro_batch_size
        local_batch = max(1, t.global_batch_size // dp)
        pp_micro = t.micro_batch_size
    else:
        local_batch, pp_micro = t.micro_batch_size, 1
    f8 = _float8(cfg, issues)
    turbo_converters, turbo_settings, turbo_async_tp = _turbo(cfg, issues)
    data = cfg.data
    training: Dict[str, Any] = {
        "dataset": SYNTHETIC_DATASET if data.kind == DataKind.synthetic else JSONL_DATASET,
        "local_batch_size": local_batch,
        "global_batch_size": t.global_batch_size,
        "seq_len": t.seq_length,
        "max_norm": t.clip_grad if t.clip_grad > 0 else NO_CLIP,
        "steps": t.train_iters,
        "enable_cpu_offload": cfg.memory.enable_cpu_offload,
        "mixed_precision_param": p.mixed_precision_param.value,
        "mixed_precision_reduce": p.mixed_precision_reduce.value,
        "dataloader": {"num_workers": data.num_workers},
    }
    if data.kind == DataKind.jsonl and data.path:
        training["dataset_path"] = os.path.abspath(data.path)
    model: Dict[str, Any] = {"name": flavor.spec, "flavor": flavor.name,
                             "converters": turbo_converters + f8["converters"]}
    if data.kind == DataKind.jsonl and data.tokenizer:
        model["hf_assets_path"] = os.path.abspath(data.tokenizer)
    lr_min_factor = 1.0 if t.lr_decay_style == LRDecay.constant else (t.min_lr / t.lr if t.lr else 0.0)
    parallelism: Dict[str, Any] = {
        "data_parallel_shard_degree": par.data_parallel_shard_degree,
        "data_parallel_replicate_degree": par.data_parallel_replicate_degree,
        "tensor_parallel_degree": par.tensor_model_parallel_size,
        "enable_async_tensor_parallel": cfg.overlap.enable_async_tensor_parallel or turbo_async_tp,
        "pipeline_parallel_degree": pp,
        "pipeline_parallel_microbatch_size": pp_micro,
        "pipeline_parallel_schedule": "Interleaved1F1B" if par.virtual_pipeline_model_parallel_size else "1F1B",
        "context_parallel_degree": par.context_parallel_size,
        "expert_parallel_degree": par.expert_model_parallel_size,
    }
    if par.virtual_pipeline_model_parallel_size:
        parallelism["pipeline_parallel_layers_per_stage"] = cfg.model.num_layers // (
            pp * par.virtual_pipeline_model_parallel_size)
    run_dir = os.path.abspath(ctx.run_dir)
    args: Dict[str, Any] = {
        "job": {"dump_folder": os.path.join(run_dir, "torchtitan"), "description": f"primus {cfg.model.name}"},
        "metrics": {
            # TorchTitan computes the global loss only on logging steps; the shared loop needs it every step
            # (our MetricsProcessor subclass in spec.py records instead of printing)
            "log_freq": 1, "enable_tensorboard": False, "enable_wandb": False, "disable_color_printing": True,
        },
        "model": model,
        "optimizer": {
            "name": "AdamW",  # ours: adam = decoupled weight decay, as megatron-core's "adam"
            "lr": t.lr, "beta1": t.adam_beta1, "beta2": t.adam_beta2, "eps": t.adam_eps,
            "weight_decay": t.weight_decay,
            # fused AdamW runs on CPU tensors too in torch >= 2.4; foreach on CPU is the safer common path
            "implementation": "fused" if ctx.device == "cuda" else "foreach",
        },
        "lr_scheduler": {
            "warmup_steps": t.lr_warmup_iters,
            "decay_type": "cosine" if t.lr_decay_style == LRDecay.cosine else "linear",
            "min_lr_factor": lr_min_factor,
        },
        "training": training,
        "parallelism": parallelism,
        "checkpoint": {"enable": False},  # checkpointing arrives with issue 9
        "activation_checkpoint": {"mode": _ac_mode(cfg.recompute),
                                  "selective_ac_option": cfg.recompute.selective_ac_option},
        "compile": {"enable": t.compile, "components": ["model", "loss"]},
        "comm": {"trace_buf_size": 0},  # no flight-recorder files in the run dir
        "debug": {"seed": t.seed, "deterministic": t.deterministic},
        FLAVOR_KEY: flavor.args,
    }
    if f8["quantize"]:
        args["quantize"] = f8["quantize"]
    if turbo_settings is not None:
        args[TURBO_KEY] = turbo_settings
    return args, issues


def build_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    return _map(cfg, ctx)[0]


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    args, issues = _map(cfg, ctx)
    version = installed_version()
    if version is not None and version != "0.2.2":
        issues.append(ConfigIssue(["backend.name"], f"torchtitan {version}",
                                  "Primus maps to torchtitan 0.2.2 (0.3.0 does not import on torch 2.11)",
                                  "pip install torchtitan==0.2.2"))
    for problem in static_problems(args):
        key, _, why = problem.partition(": ")
        issues.append(ConfigIssue([f"torchtitan:{key}"], version, why,
                                  "fix primus/backends/torchtitan/args.py for this torchtitan version"))
    issues += turbo_provider_issues(cfg, ctx)
    if ctx.device == "cpu" and cfg.precision.fp8 is not None and not _turbo_fp8(cfg):
        issues.append(ConfigIssue(["precision.fp8", "device"], cfg.precision.fp8.value,
                                  "torchao float8 needs a GPU with SM89+ (TorchTitan refuses CPU)",
                                  "drop precision.fp8 on CPU"))
    return issues
