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

from primus.backends.torchtitan.jobconfig_keys import installed_version, static_problems
from primus.config.errors import ConfigIssue
from primus.config.schema import (
    ACMode, DataKind, LRDecay, Optimizer, PrimusConfig, RecomputeGranularity,
    MemoryConfig, OverlapConfig, RecomputeConfig, TrainingConfig,
)
from primus.context import RunContext, data_parallel_size
from primus.features import backend_mapping, merged, modules
from primus.features.turbo import torchtitan_async_tp

SYNTHETIC_DATASET = "primus_synthetic"  # registered by data.py in TorchTitan's dataset table
JSONL_DATASET = "primus_jsonl"
NO_CLIP = 1.0e30  # TorchTitan always clips; max_norm 0 would zero every gradient, so "off" is a huge norm

# Our fields that only megatron-core reads: setting them under backend=torchtitan would have no effect (the
# features' own: their megatron_only(cfg)).
_MEGATRON_ONLY = {
    "recompute": (RecomputeConfig, ["recompute_method", "recompute_num_layers", "recompute_layer_ids",
                                    "recompute_modules"]),
    "overlap": (OverlapConfig, ["overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm",
                                "async_tensor_model_parallel_allreduce", "align_grad_reduce",
                                "align_param_gather", "bucket_size"]),
    "memory": (MemoryConfig, ["use_distributed_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
                              "use_precision_aware_optimizer", "empty_unused_memory_level"]),
}


def _ac_mode(r: RecomputeConfig) -> str:
    if r.activation_checkpoint_mode is not None:
        return r.activation_checkpoint_mode.value
    if r.recompute_granularity == RecomputeGranularity.selective:
        return ACMode.selective.value
    if r.recompute_granularity == RecomputeGranularity.full:
        return ACMode.full.value
    return ACMode.none.value


def _megatron_only(cfg: PrimusConfig):
    """(group, its dataclass, megatron-only fields): this module's, then each feature's megatron_only(cfg)."""
    for group, (cls, keys) in _MEGATRON_ONLY.items():
        yield group, cls, keys
    for feature in modules():
        if hasattr(feature, "megatron_only"):
            group = feature.__name__.rsplit(".", 1)[1]
            yield group, type(getattr(cfg, group)), feature.megatron_only(cfg)


def _unhonoured(cfg: PrimusConfig, issues: List[ConfigIssue]) -> None:
    for group, cls, keys in _megatron_only(cfg):
        section = getattr(cfg, group)
        for k in keys:
            value, default = getattr(section, k), cls.__dataclass_fields__[k]
            default = default.default_factory() if callable(default.default_factory) else default.default
            if value != default:
                issues.append(ConfigIssue([f"{group}.{k}"], getattr(value, "value", value),
                                          "megatron-core only: torchtitan 0.2.2 has no such setting",
                                          f"leave {group}.{k} at its default ({default!r}) or use backend=megatron"))
    t, m = cfg.training, cfg.model
    if t.optimizer == Optimizer.sgd:
        issues.append(ConfigIssue(["training.optimizer"], "sgd", "torchtitan 0.2.2 builds Adam and AdamW only",
                                  "use adamw"))
    if t.init_method_std != TrainingConfig.init_method_std:
        issues.append(ConfigIssue(["training.init_method_std"], t.init_method_std,
                                  "torchtitan's models fix their init (0.02, depth-scaled)", "leave it at 0.02"))
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
    if par.expert_model_parallel_size > 1 and not m.num_experts:
        issues.append(ConfigIssue(["parallel.expert_model_parallel_size"], par.expert_model_parallel_size,
                                  "expert parallelism has no effect on a dense model", "set 1"))
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
    _unhonoured(cfg, issues)
    t, par = cfg.training, cfg.parallel
    dp = data_parallel_size(cfg, ctx.world_size) or 1
    pp = par.pipeline_model_parallel_size
    if pp > 1:
        # megatron's micro batches all go through the pipeline in one step: TorchTitan's local batch is the whole
        # per-dp-rank batch, split into pipeline microbatches of micro_batch_size
        local_batch = max(1, t.global_batch_size // dp)
        pp_micro = t.micro_batch_size
    else:
        local_batch, pp_micro = t.micro_batch_size, 1
    data = cfg.data
    training: Dict[str, Any] = {
        "dataset": SYNTHETIC_DATASET if data.kind == DataKind.synthetic else JSONL_DATASET,
        "local_batch_size": local_batch,
        "global_batch_size": t.global_batch_size,
        "seq_len": t.seq_length,
        "max_norm": t.clip_grad if t.clip_grad > 0 else NO_CLIP,
        "steps": t.train_iters,
        "enable_cpu_offload": cfg.memory.enable_cpu_offload,
        "dataloader": {"num_workers": data.num_workers},
    }
    if data.kind == DataKind.jsonl and data.path:
        training["dataset_path"] = os.path.abspath(data.path)
    model: Dict[str, Any] = {}
    if data.kind == DataKind.jsonl and data.tokenizer:
        model["hf_assets_path"] = os.path.abspath(data.tokenizer)
    lr_min_factor = 1.0 if t.lr_decay_style == LRDecay.constant else (t.min_lr / t.lr if t.lr else 0.0)
    parallelism: Dict[str, Any] = {
        "data_parallel_shard_degree": par.data_parallel_shard_degree,
        "data_parallel_replicate_degree": par.data_parallel_replicate_degree,
        "tensor_parallel_degree": par.tensor_model_parallel_size,
        "enable_async_tensor_parallel": cfg.overlap.enable_async_tensor_parallel or torchtitan_async_tp(cfg),
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
    }
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
    for feature in modules():  # the features' own rules for this backend and device
        if hasattr(feature, "torchtitan_issues"):
            issues += feature.torchtitan_issues(cfg, ctx)
    return issues
