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
from primus.config.schema import Dtype, FP8Format, FP8Recipe, PrimusConfig, PrecisionConfig, TurboConfig
from primus.context import RunContext
from primus.features import backend_issues, backend_mapping, merged

# The delayed recipe's settings: megatron's, and the turbo fp8 linear's under turbo.use_turbo_float8_linear.
DELAYED_KEYS = ("fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo")
# Our fields that only megatron-core reads: setting them under backend=torchtitan would have no effect (the
# features' own lists are their MEGATRON_ONLY, checked by their torchtitan_issues).
_MEGATRON_ONLY = {
    "precision": (PrecisionConfig, [*DELAYED_KEYS, "fp4", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                                    "num_layers_at_end_in_bf16"]),
    "turbo": (TurboConfig, ["grouped_gemm_fp8"]),  # TorchTitan's MoE experts have no fp8 grouped GEMM here
}


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


def megatron_only_issues(cfg: PrimusConfig, group: str, cls, keys) -> List[ConfigIssue]:
    """Settings of `group` that only megatron-core reads, set away from their defaults under backend=torchtitan."""
    out, section = [], getattr(cfg, group)
    for k in keys:
        value, default = getattr(section, k), cls.__dataclass_fields__[k]
        default = default.default_factory() if callable(default.default_factory) else default.default
        if value != default:
            out.append(ConfigIssue([f"{group}.{k}"], getattr(value, "value", value),
                                   "megatron-core only: torchtitan 0.2.2 has no such setting",
                                   f"leave {group}.{k} at its default ({default!r}) or use backend=megatron"))
    return out


def _unhonoured(cfg: PrimusConfig, issues: List[ConfigIssue]) -> None:
    turbo_delayed = _turbo_fp8(cfg) and cfg.precision.fp8_recipe == FP8Recipe.delayed  # _turbo_float8 reads them
    for group, (cls, keys) in _MEGATRON_ONLY.items():
        if turbo_delayed and group == "precision":
            keys = [k for k in keys if k not in DELAYED_KEYS]
        issues.extend(megatron_only_issues(cfg, group, cls, keys))
    p, m = cfg.precision, cfg.model
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
    if m.cross_entropy_loss_fusion:
        issues.append(ConfigIssue(["model.cross_entropy_loss_fusion"], True,
                                  "torchtitan 0.2.2 has no fused cross entropy", "set false"))
    par = cfg.parallel
    tp = par.tensor_model_parallel_size
    if p.fp8 is not None and tp > 1 and not _turbo_fp8(cfg):
        # 0.2.2's llama3 parallelize looks for a converter named "float8", but the converter is registered as
        # "quantize.linear.float8": its float8 TP plan would never be applied to the float8 linears
        issues.append(ConfigIssue(["precision.fp8", "parallel.tensor_model_parallel_size"], tp,
                                  "torchtitan 0.2.2 does not apply its float8 tensor-parallel plan",
                                  "use float8 with FSDP only (tp=1), turbo=torchtitan_fp8 (the turbo fp8 linear "
                                  "runs under TP), or drop fp8"))
    if m.tie_word_embeddings and (par.tensor_model_parallel_size > 1 or par.pipeline_model_parallel_size > 1) \
            and not m.num_experts and not m.qk_layernorm:
        issues.append(ConfigIssue(["model.tie_word_embeddings"], True,
                                  "Primus ties llama3 embeddings for FSDP/DDP/single-device only",
                                  "untie, or set tp=1 and pp=1"))


def _map(cfg: PrimusConfig, ctx: RunContext):
    """(the job config, the issues found building it): this module's sections merged with every feature's
    `torchtitan()`, and this module's issues with every feature's `torchtitan_issues()`."""
    issues: List[ConfigIssue] = []
    flavor = flavors.build_flavor(cfg)
    issues += flavor.issues
    _unhonoured(cfg, issues)
    _mixed_precision_dropped(cfg, ctx, issues)
    issues += backend_issues("torchtitan", cfg, ctx)
    p = cfg.precision
    f8 = _float8(cfg, issues)
    turbo_converters, turbo_settings, _ = _turbo(cfg, issues)  # (async TP: the overlap feature's key)
    run_dir = os.path.abspath(ctx.run_dir)
    args: Dict[str, Any] = {
        "job": {"dump_folder": os.path.join(run_dir, "torchtitan"), "description": f"primus {cfg.model.name}"},
        "model": {"name": flavor.spec, "flavor": flavor.name, "converters": turbo_converters + f8["converters"]},
        "training": {"mixed_precision_param": p.mixed_precision_param.value,
                     "mixed_precision_reduce": p.mixed_precision_reduce.value},
        FLAVOR_KEY: flavor.args,
    }
    if f8["quantize"]:
        args["quantize"] = f8["quantize"]
    if turbo_settings is not None:
        args[TURBO_KEY] = turbo_settings
    return merged([args, backend_mapping("torchtitan", cfg, ctx)]), issues


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
