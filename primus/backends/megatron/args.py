"""Config -> the exact megatron-core arguments (JSON-able), and the rules this backend/device adds.

Imports neither megatron nor torch: `dry_run=true` prints `build_args` in well under a second. The trainer turns
the same dict into megatron objects (dtype names -> torch dtypes, activation name -> function), so what a dry run
shows is what megatron gets. Keys inside `transformer_config`, `ddp_config`, `optimizer_config` and `scheduler`
are megatron-core 0.16.1's own keyword names.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from importlib import metadata
from typing import Any, Dict, List, Optional

from primus.config.errors import ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext, data_parallel_size
from primus.features import backend_mapping, merged, modules
from primus.features.model import activation_fusion, turbo_loss  # noqa: F401 - read from here by the planner
from primus.features.precision import fp8_weight_cache, portable_fp8_available, te_available  # noqa: F401
from primus.features.turbo import turbo_args  # noqa: F401 - read from here by the planner

PINNED_MCORE = "0.16.1"


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


def resolved_layer_spec(cfg: PrimusConfig) -> str:
    want = cfg.backend.layer_spec.value
    if want == "auto":
        return "te" if te_available() else "local"
    return want


def num_microbatches(cfg: PrimusConfig, ctx: RunContext) -> int:
    dp = max(1, data_parallel_size(cfg, ctx.world_size))
    t = cfg.training
    return max(1, t.global_batch_size // (t.micro_batch_size * dp))


# megatron-core's selective-recompute modules whose replay runs linears
LINEAR_RECOMPUTE_MODULES = {"mlp", "moe", "shared_experts", "mla_up_proj"}


def replays_linears(cfg: PrimusConfig) -> bool:
    """Whether activation recompute runs linears' forwards again inside the backward."""
    r = cfg.recompute
    if r.recompute_layer_ids or (r.recompute_granularity is not None and r.recompute_granularity.value == "full"):
        return True
    return r.recompute_granularity is not None and bool(set(r.recompute_modules) & LINEAR_RECOMPUTE_MODULES)


def recompute_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    r = cfg.recompute
    if r.recompute_layer_ids:
        # megatron requires a method with granularity=full; recompute_ids.py replaces the block's checkpointed
        # forward, so these two values only get the block onto that code path and choose nothing themselves.
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if r.recompute_granularity is None:
        return {"recompute_granularity": None}
    out: Dict[str, Any] = {"recompute_granularity": r.recompute_granularity.value}
    if r.recompute_granularity.value == "full":
        if r.recompute_method is None:  # plain `recompute=full`: every layer, one per checkpointed chunk
            out.update(recompute_method="uniform", recompute_num_layers=1)
        else:
            out["recompute_method"] = r.recompute_method.value
            out["recompute_num_layers"] = r.recompute_num_layers
    else:
        out["recompute_modules"] = list(r.recompute_modules)
    return out


def compiled_loss(cfg: PrimusConfig) -> bool:
    """perf.compile_loss applies: training.compile, the vocabulary not split over TP ranks, and no fused cross entropy
    asked for (model.cross_entropy_loss_fusion: megatron's native / TE one, or primus' Triton one, turbo_loss)."""
    return bool(cfg.training.compile and cfg.parallel.tensor_model_parallel_size == 1
                and not cfg.model.cross_entropy_loss_fusion and not turbo_loss(cfg))


def transformer_config_kwargs(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    par, ov = cfg.parallel, cfg.overlap
    k: Dict[str, Any] = {  # (the features' keys: primus/features/*.py megatron())
        "init_method_std": cfg.training.init_method_std,
        # parallel layout
        "tensor_model_parallel_size": par.tensor_model_parallel_size,
        "pipeline_model_parallel_size": par.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": par.virtual_pipeline_model_parallel_size,
        "context_parallel_size": par.context_parallel_size,
        "expert_model_parallel_size": par.expert_model_parallel_size,
        "sequence_parallel": par.sequence_parallel,
        # pipeline communication: megatron refuses batched p2p together with the overlapped one
        "overlap_p2p_comm": ov.overlap_p2p_comm,
        "batch_p2p_comm": not ov.overlap_p2p_comm,
        "deallocate_pipeline_outputs": True,
        "variable_seq_lengths": False,
        "deterministic_mode": cfg.training.deterministic,
    }
    k.update(recompute_kwargs(cfg))
    return k


def ddp_config_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    ov, mem = cfg.overlap, cfg.memory
    return {
        "grad_reduce_in_fp32": True,  # Megatron-LM's default for bf16: fp32 main grads, reduced in fp32
        "overlap_grad_reduce": ov.overlap_grad_reduce,
        "overlap_param_gather": ov.overlap_param_gather,
        "align_param_gather": ov.align_param_gather,
        "use_distributed_optimizer": mem.use_distributed_optimizer,
        "bucket_size": ov.bucket_size,
        "check_for_nan_in_grad": False,  # the shared loop checks loss and grad norm itself
    }


def optimizer_config_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    t, mem, ov = cfg.training, cfg.memory, cfg.overlap
    # megatron-core's "adam" is AdamW (decoupled weight decay) unless told otherwise: both our names map to it.
    name = "sgd" if t.optimizer.value == "sgd" else "adam"
    k = {
        "optimizer": name,
        "lr": t.lr,
        "min_lr": t.min_lr,
        "weight_decay": t.weight_decay,
        "clip_grad": t.clip_grad,
        "use_distributed_optimizer": mem.use_distributed_optimizer,
        "overlap_param_gather": ov.overlap_param_gather,
        "optimizer_cpu_offload": mem.optimizer_cpu_offload,
        "optimizer_offload_fraction": mem.optimizer_offload_fraction,
        "use_precision_aware_optimizer": mem.use_precision_aware_optimizer,
    }
    if name == "adam":
        k.update({"adam_beta1": t.adam_beta1, "adam_beta2": t.adam_beta2, "adam_eps": t.adam_eps,
                  "decoupled_weight_decay": True})
    return k


def scheduler_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    """megatron.core.optimizer_param_scheduler.OptimizerParamScheduler, counted in optimizer steps."""
    t = cfg.training
    return {
        "init_lr": 0.0,
        "max_lr": t.lr,
        "min_lr": t.min_lr,
        "lr_warmup_steps": t.lr_warmup_iters,
        "lr_decay_steps": t.train_iters,
        "lr_decay_style": t.lr_decay_style.value,
        "start_wd": t.weight_decay,
        "end_wd": t.weight_decay,
        "wd_incr_steps": t.train_iters,
        "wd_incr_style": "constant",
    }


def parallel_state_kwargs(cfg: PrimusConfig) -> Dict[str, Any]:
    p = cfg.parallel
    return {
        "tensor_model_parallel_size": p.tensor_model_parallel_size,
        "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_model_parallel_size,
        "context_parallel_size": p.context_parallel_size,
        "expert_model_parallel_size": p.expert_model_parallel_size,
    }


def needs_single_connection(cfg: PrimusConfig) -> bool:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 makes communication kernels launch in issue order, which megatron's
    overlaps rely on (TP all-reduce / sequence-parallel all-gather ahead of the GEMM that hides it)."""
    ov, par = cfg.overlap, cfg.parallel
    tp = par.tensor_model_parallel_size > 1
    return bool(
        (tp and (ov.async_tensor_model_parallel_allreduce or par.sequence_parallel))
        or ov.overlap_grad_reduce
        or ov.overlap_param_gather
        or (ov.overlap_p2p_comm and par.pipeline_model_parallel_size > 1)
        or cfg.moe.overlap_moe_expert_parallel_comm
    )


def env_vars(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, str]:
    if ctx.device == "cuda" and needs_single_connection(cfg):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def forward_backward_schedule(cfg: PrimusConfig) -> str:
    par = cfg.parallel
    if par.pipeline_model_parallel_size == 1:
        return "no_pipelining"
    return "interleaved_1f1b" if par.virtual_pipeline_model_parallel_size else "1f1b"


def build_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    t, mem = cfg.training, cfg.memory
    own = {
        "megatron_core": {"installed": mcore_version(), "pinned": PINNED_MCORE},
        "layer_spec": resolved_layer_spec(cfg),
        "parallel_state": parallel_state_kwargs(cfg),
        "data_parallel_size": data_parallel_size(cfg, ctx.world_size),
        "transformer_config": transformer_config_kwargs(cfg, ctx),
        "ddp_config": ddp_config_kwargs(cfg),
        "optimizer_config": optimizer_config_kwargs(cfg),
        "scheduler": scheduler_kwargs(cfg),
        "schedule": {
            "forward_backward_func": forward_backward_schedule(cfg),
            "num_microbatches": num_microbatches(cfg, ctx),
            "micro_batch_size": t.micro_batch_size,
            "global_batch_size": t.global_batch_size,
            "seq_length": t.seq_length,
            # Megatron-LM wires these as config.grad_sync_func / param_sync_func only when aligned
            "align_grad_reduce": cfg.overlap.align_grad_reduce,
            "align_param_gather": cfg.overlap.align_param_gather,
        },
        "recompute_layer_ids": list(cfg.recompute.recompute_layer_ids or []),
        # perf.py: torch.compile per TransformerLayer; torch AdamW switched to its fused kernel (no TE/apex)
        "compile": bool(t.compile),
        "compile_loss": compiled_loss(cfg),
        "fused_adamw": t.optimizer.value != "sgd" and not mem.use_precision_aware_optimizer,
        "empty_unused_memory_level": cfg.memory.empty_unused_memory_level,
        "env": env_vars(cfg, ctx),
        "data": {
            "kind": cfg.data.kind.value,
            "path": cfg.data.path,
            "tokenizer": cfg.data.tokenizer,
            "seed": t.seed,
            "num_samples": t.train_iters * t.global_batch_size,
        },
        "seed": t.seed,
    }
    return merged([own, backend_mapping("megatron", cfg, ctx)])


# ------------------------------------------------------------------------------------------------ capability rules


def _issue(keys, value, rule, fix) -> ConfigIssue:
    return ConfigIssue(list(keys), value, rule, fix)


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    out: List[ConfigIssue] = []
    par, mem, ov = cfg.parallel, cfg.memory, cfg.overlap
    ver = mcore_version()
    cpu = ctx.device == "cpu"
    te = te_available()
    spec = resolved_layer_spec(cfg)

    if ver is None:
        return [_issue(["backend.name"], "megatron", "megatron-core is not installed",
                       f"pip install megatron-core=={PINNED_MCORE}")]
    if ver != PINNED_MCORE:
        out.append(_issue(["backend.name"], ver, f"this backend is written against megatron-core {PINNED_MCORE}",
                          f"pip install megatron-core=={PINNED_MCORE}"))
    if cfg.backend.layer_spec.value == "te" and not te:
        out.append(_issue(["backend.layer_spec"], "te", "Transformer Engine is not importable here",
                          "use backend.layer_spec=auto (local fused spec) or install Transformer Engine"))
    if spec == "te" and cpu:
        out.append(_issue(["backend.layer_spec", "device"], "te", "Transformer Engine layers need a GPU",
                          "use backend.layer_spec=local on CPU"))

    # ---- CPU: what megatron-core cannot do without CUDA (see cpu_compat.py)
    if cpu:
        if mem.use_distributed_optimizer:
            out.append(_issue(["memory.use_distributed_optimizer", "device"], True,
                              f"megatron-core {ver}'s distributed optimizer only accepts CUDA tensors",
                              "use memory=default on CPU"))
        if mem.optimizer_cpu_offload:
            out.append(_issue(["memory.optimizer_cpu_offload", "device"], True,
                              "optimizer offload moves state from the GPU to the CPU: there is no GPU",
                              "set memory.optimizer_cpu_offload=false on CPU"))

    # ---- things the local (non-TE) spec of megatron-core 0.16.1 cannot do, on any device
    if spec == "local":
        # sequence parallel is fine here: spec.py's RMSNorm replaces the stock torch norm that asserts it off
        if par.context_parallel_size > 1:
            out.append(_issue(["parallel.context_parallel_size", "backend.layer_spec"], par.context_parallel_size,
                              "context parallelism is implemented by TE's attention only", "set cp=1 or install TE"))

    # ---- optimizer / memory
    if mem.optimizer_cpu_offload and not mem.use_distributed_optimizer:
        out.append(_issue(["memory.optimizer_cpu_offload", "memory.use_distributed_optimizer"], True,
                          f"megatron-core {ver} offloads the distributed optimizer's shards only",
                          "use memory=offload (sets use_distributed_optimizer=true)"))
    if mem.use_precision_aware_optimizer:
        if not mem.use_distributed_optimizer:
            out.append(_issue(["memory.use_precision_aware_optimizer", "memory.use_distributed_optimizer"], True,
                              f"megatron-core {ver} supports the precision-aware optimizer with the distributed optimizer only",
                              "set memory.use_distributed_optimizer=true"))
        if cfg.training.optimizer.value == "sgd":
            out.append(_issue(["memory.use_precision_aware_optimizer", "training.optimizer"], "sgd",
                              "the precision-aware optimizer is Adam only", "use training.optimizer=adamw"))
        if not te:
            # OptimizerConfig.__post_init__ checks the TE version before anything else, offload or not
            out.append(_issue(["memory.use_precision_aware_optimizer"], True,
                              f"megatron-core {ver} implements it with Transformer Engine (FusedAdam), not installed",
                              "install Transformer Engine, or set memory.use_precision_aware_optimizer=false"))
    if ov.overlap_param_gather and not mem.use_distributed_optimizer:
        out.append(_issue(["overlap.overlap_param_gather", "memory.use_distributed_optimizer"], True,
                          "parameters are all-gathered only when the optimizer is distributed",
                          "set memory.use_distributed_optimizer=true or overlap.overlap_param_gather=false"))
    if ov.align_param_gather and not ov.overlap_param_gather:
        out.append(_issue(["overlap.align_param_gather", "overlap.overlap_param_gather"], True,
                          "aligning param all-gathers applies to overlapped gathers", "set overlap.overlap_param_gather=true"))
    if ov.overlap_p2p_comm and par.pipeline_model_parallel_size > 1 and not par.virtual_pipeline_model_parallel_size:
        out.append(_issue(["overlap.overlap_p2p_comm", "parallel.virtual_pipeline_model_parallel_size"], True,
                          f"megatron-core {ver} overlaps pipeline send/recv in the interleaved schedule only",
                          "set parallel.virtual_pipeline_model_parallel_size, or overlap.overlap_p2p_comm=false"))
    if par.context_parallel_size > 1 and spec == "te":
        out.append(_issue(["parallel.context_parallel_size"], par.context_parallel_size,
                          "splitting each sequence over cp ranks (data and loss) is not wired in this backend yet",
                          "set parallel.context_parallel_size=1"))
    for feature in modules():  # the features' own rules for this backend and device
        if hasattr(feature, "megatron_issues"):
            out += feature.megatron_issues(cfg, ctx)
    return out

