"""The overlap feature: communication hidden behind compute (gradient reduce, parameter gather, pipeline p2p, TP
collectives), see primus/features/__init__.py.

Applied by megatron-core itself from the arguments `megatron()` maps (DDP, optimizer and pipeline schedule), with
the schedules' grad / param sync hooks wired by the megatron trainer (trainer.py: _wire_sync_hooks) as Megatron-LM's
training loop wires them; by TorchTitan from `parallelism.enable_async_tensor_parallel`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from primus.config.errors import ConfigIssue, warning


@dataclass
class OverlapConfig:
    overlap_grad_reduce: bool = False  # overlap gradient reduce-scatter/all-reduce with backward
    overlap_param_gather: bool = False  # overlap parameter all-gather with forward (distributed optimizer)
    overlap_p2p_comm: bool = False  # overlap pipeline send/recv (interleaved schedule)
    async_tensor_model_parallel_allreduce: bool = False  # async TP all-reduce
    align_grad_reduce: bool = True  # launch grad reduces of all pp stages together
    align_param_gather: bool = False  # launch param gathers of all vp chunks together
    bucket_size: Optional[int] = None  # DDP bucket size in elements; null = megatron's default
    enable_async_tensor_parallel: bool = False  # TorchTitan parallelism.enable_async_tensor_parallel


# ------------------------------------------------------------------------------------------- megatron-core


def needs_single_connection(cfg) -> bool:
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


def megatron(cfg, ctx) -> dict:
    ov = cfg.overlap
    return {
        # pipeline communication: megatron refuses batched p2p together with the overlapped one
        "transformer_config": {"overlap_p2p_comm": ov.overlap_p2p_comm, "batch_p2p_comm": not ov.overlap_p2p_comm,
                               # megatron-core's own field (its TP all-reduce overlaps without it: see the warning)
                               "async_tensor_model_parallel_allreduce": ov.async_tensor_model_parallel_allreduce},
        "ddp_config": {"overlap_grad_reduce": ov.overlap_grad_reduce, "overlap_param_gather": ov.overlap_param_gather,
                       "align_param_gather": ov.align_param_gather, "bucket_size": ov.bucket_size},
        "optimizer_config": {"overlap_param_gather": ov.overlap_param_gather},
        # Megatron-LM wires these as config.grad_sync_func / param_sync_func only when aligned
        "schedule": {"align_grad_reduce": ov.align_grad_reduce, "align_param_gather": ov.align_param_gather},
        "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if ctx.device == "cuda" and needs_single_connection(cfg) else {},
    }


def megatron_issues(cfg, ctx) -> list:
    from primus.backends.megatron import args as margs

    ov, par, out = cfg.overlap, cfg.parallel, []
    ver = margs.mcore_version()
    if ov.overlap_param_gather and not cfg.memory.use_distributed_optimizer:
        out.append(ConfigIssue(["overlap.overlap_param_gather", "memory.use_distributed_optimizer"], True,
                               "parameters are all-gathered only when the optimizer is distributed",
                               "set memory.use_distributed_optimizer=true or overlap.overlap_param_gather=false"))
    if ov.align_param_gather and not ov.overlap_param_gather:
        out.append(ConfigIssue(["overlap.align_param_gather", "overlap.overlap_param_gather"], True,
                               "aligning param all-gathers applies to overlapped gathers",
                               "set overlap.overlap_param_gather=true"))
    if ov.async_tensor_model_parallel_allreduce:
        what = ("here it sets CUDA_DEVICE_MAX_CONNECTIONS=1 on the GPU, which the overlap needs"
                if par.tensor_model_parallel_size > 1 else "with tp=1 there is no TP all-reduce")
        out.append(warning(["overlap.async_tensor_model_parallel_allreduce"], True,
                           f"megatron-core {ver} takes it but marks it deprecated and ignores it (the TP all-reduce "
                           f"of its linears is asynchronous already); {what}",
                           "drop it"))
    if ov.overlap_p2p_comm and par.pipeline_model_parallel_size > 1 and not par.virtual_pipeline_model_parallel_size:
        out.append(ConfigIssue(["overlap.overlap_p2p_comm", "parallel.virtual_pipeline_model_parallel_size"], True,
                               f"megatron-core {ver} overlaps pipeline send/recv in the interleaved schedule only",
                               "set parallel.virtual_pipeline_model_parallel_size, or overlap.overlap_p2p_comm=false"))
    return out


# ------------------------------------------------------------------------------------------- TorchTitan

# Our fields that only megatron-core reads: under backend=torchtitan a non-default one is an issue
# (backends/torchtitan/args.py checks every feature's megatron_only).
MEGATRON_ONLY = ("overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm",
                 "async_tensor_model_parallel_allreduce", "align_grad_reduce", "align_param_gather", "bucket_size")


def megatron_only(cfg) -> tuple:
    return MEGATRON_ONLY


def torchtitan_only(cfg) -> tuple:
    return ("enable_async_tensor_parallel",)


def torchtitan(cfg, ctx) -> dict:
    # TorchTitan's async TP: torch symmetric-memory fused all-gather/reduce-scatter matmuls, which compile inserts
    # into the TP regions; turbo.use_turbo_async_tp asks for the same
    from primus.features.turbo import torchtitan_async_tp

    return {"parallelism": {"enable_async_tensor_parallel": cfg.overlap.enable_async_tensor_parallel
                            or torchtitan_async_tp(cfg)}}


def torchtitan_issues(cfg, ctx) -> list:
    out = []
    tp, compiled = cfg.parallel.tensor_model_parallel_size, cfg.training.compile
    if cfg.overlap.enable_async_tensor_parallel and (tp == 1 or not compiled):
        out.append(ConfigIssue(["overlap.enable_async_tensor_parallel", "parallel.tensor_model_parallel_size",
                                "training.compile"], {"tp": tp, "compile": compiled},
                               "torchtitan's async TP needs tp > 1 and torch.compile of the model",
                               "set tp > 1 and training.compile=true, or turn async TP off"))
    return out
