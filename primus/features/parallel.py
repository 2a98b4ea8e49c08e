"""The parallel feature: tensor, pipeline (and virtual), context, expert and data parallel sizes, sequence
parallel, and TorchTitan's FSDP / HSDP split of dp (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from primus.config.errors import ConfigIssue
from primus.features import rule


@dataclass
class ParallelConfig:
    tensor_model_parallel_size: int = 1  # tp
    pipeline_model_parallel_size: int = 1  # pp
    virtual_pipeline_model_parallel_size: Optional[int] = None  # interleaved stages per pp rank
    context_parallel_size: int = 1  # cp
    expert_model_parallel_size: int = 1  # ep
    data_parallel_size: Optional[int] = None  # dp; null = world / (tp * pp * cp)
    sequence_parallel: bool = False  # shard norms/dropout activations over tp
    # TorchTitan FSDP / HSDP split of dp
    data_parallel_shard_degree: int = -1  # FSDP shard degree; -1 = all of dp
    data_parallel_replicate_degree: int = 1  # HSDP replicas


def _dp(cfg, world: int) -> int:
    from primus.context import data_parallel_size

    return data_parallel_size(cfg, world)


@rule
def parallel_layout(cfg, ctx):
    p, m, t, out = cfg.parallel, cfg.model, cfg.training, []
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    world = ctx.world_size
    dp = _dp(cfg, world)
    if tp * pp * cp * dp != world:
        out.append(ConfigIssue(["parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size",
                                "parallel.context_parallel_size", "parallel.data_parallel_size", "launcher.nproc_per_node"],
                               {"tp": tp, "pp": pp, "cp": cp, "dp": p.data_parallel_size, "world_size": world},
                               "tp x pp x cp x dp must equal the world size",
                               "launch tp*pp*cp*dp ranks (launcher.nproc_per_node x launcher.nnodes), or change the sizes"))
        dp = max(dp, 1)
    vp = p.virtual_pipeline_model_parallel_size
    stages = pp * (vp or 1)
    if vp is not None and (vp < 1 or pp < 2):
        out.append(ConfigIssue(["parallel.virtual_pipeline_model_parallel_size"], vp,
                               "virtual pipeline stages need pipeline_model_parallel_size >= 2 and vp >= 1",
                               "set parallel.pipeline_model_parallel_size >= 2 or vp=null"))
    elif m.num_layers % stages:
        out.append(ConfigIssue(["model.num_layers", "parallel.pipeline_model_parallel_size",
                                "parallel.virtual_pipeline_model_parallel_size"], m.num_layers,
                               f"layers must divide evenly across {stages} pipeline stages (pp={pp}, vp={vp})",
                               "choose pp (x vp) dividing num_layers"))
    if m.num_attention_heads % tp or m.num_query_groups % tp:
        out.append(ConfigIssue(["model.num_attention_heads", "model.num_query_groups", "parallel.tensor_model_parallel_size"],
                               {"heads": m.num_attention_heads, "kv_heads": m.num_query_groups, "tp": tp},
                               "attention and KV heads must be divisible by tp", "choose tp dividing both head counts"))
    ep = p.expert_model_parallel_size
    if ep > 1 and not m.num_experts:
        out.append(ConfigIssue(["parallel.expert_model_parallel_size", "model.num_experts"], ep,
                               "expert parallelism needs a MoE model", "set ep=1 or choose a MoE model"))
    elif m.num_experts and m.num_experts % ep:
        out.append(ConfigIssue(["model.num_experts", "parallel.expert_model_parallel_size"],
                               {"experts": m.num_experts, "ep": ep}, "experts must be divisible by ep", "choose ep dividing num_experts"))
    if t.global_batch_size % (t.micro_batch_size * dp):
        out.append(ConfigIssue(["training.global_batch_size", "training.micro_batch_size", "parallel.data_parallel_size"],
                               {"global": t.global_batch_size, "micro": t.micro_batch_size, "dp": dp},
                               "micro_batch_size x dp must divide global_batch_size (gradient accumulation steps are whole)",
                               f"use a global batch that is a multiple of {t.micro_batch_size * dp}"))
    if p.sequence_parallel and tp == 1:
        out.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], True,
                               "sequence parallel shards over tp ranks: needs tp > 1", "set tp > 1 or sequence_parallel=false"))
    if t.seq_length % cp:
        out.append(ConfigIssue(["training.seq_length", "parallel.context_parallel_size"], t.seq_length,
                               "seq_length must be divisible by cp", "choose cp dividing seq_length"))
    if t.seq_length > m.max_position_embeddings:
        out.append(ConfigIssue(["training.seq_length", "model.max_position_embeddings"], t.seq_length,
                               f"longer than the model's positions ({m.max_position_embeddings})",
                               "lower training.seq_length or raise model.max_position_embeddings"))
    return out


# ------------------------------------------------------------------------------------------- megatron-core


def num_microbatches(cfg, ctx) -> int:
    dp = max(1, _dp(cfg, ctx.world_size))
    t = cfg.training
    return max(1, t.global_batch_size // (t.micro_batch_size * dp))


def forward_backward_schedule(cfg) -> str:
    par = cfg.parallel
    if par.pipeline_model_parallel_size == 1:
        return "no_pipelining"
    return "interleaved_1f1b" if par.virtual_pipeline_model_parallel_size else "1f1b"


def megatron(cfg, ctx) -> dict:
    p = cfg.parallel
    sizes = {
        "tensor_model_parallel_size": p.tensor_model_parallel_size,
        "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_model_parallel_size,
        "context_parallel_size": p.context_parallel_size,
        "expert_model_parallel_size": p.expert_model_parallel_size,
    }
    return {
        "parallel_state": dict(sizes),
        "data_parallel_size": _dp(cfg, ctx.world_size),
        "transformer_config": {**sizes, "sequence_parallel": p.sequence_parallel},
        "schedule": {"forward_backward_func": forward_backward_schedule(cfg),
                     "num_microbatches": num_microbatches(cfg, ctx)},
    }


def megatron_issues(cfg, ctx) -> list:
    from primus.backends.megatron import args as margs

    cp, out = cfg.parallel.context_parallel_size, []
    spec = margs.resolved_layer_spec(cfg)
    # sequence parallel is fine on the local spec: spec.py's RMSNorm replaces the stock torch norm that asserts it off
    if cp > 1 and spec == "local":
        out.append(ConfigIssue(["parallel.context_parallel_size", "backend.layer_spec"], cp,
                               "context parallelism is implemented by TE's attention only", "set cp=1 or install TE"))
    if cp > 1 and spec == "te":
        out.append(ConfigIssue(["parallel.context_parallel_size"], cp,
                               "splitting each sequence over cp ranks (data and loss) is not wired in this backend yet",
                               "set parallel.context_parallel_size=1"))
    return out


# ------------------------------------------------------------------------------------------- TorchTitan


def torchtitan_only(cfg) -> tuple:
    """FSDP2's shard and replicate degrees: megatron's data parallel size is parallel.data_parallel_size."""
    return ("data_parallel_shard_degree", "data_parallel_replicate_degree")


def torchtitan_batches(cfg, ctx) -> Tuple[int, int]:
    """(training.local_batch_size, parallelism.pipeline_parallel_microbatch_size)."""
    t = cfg.training
    if cfg.parallel.pipeline_model_parallel_size > 1:
        # megatron's micro batches all go through the pipeline in one step: TorchTitan's local batch is the whole
        # per-dp-rank batch, split into pipeline microbatches of micro_batch_size
        return max(1, t.global_batch_size // (_dp(cfg, ctx.world_size) or 1)), t.micro_batch_size
    return t.micro_batch_size, 1


def torchtitan(cfg, ctx) -> dict:
    par = cfg.parallel
    pp, vp = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    parallelism = {
        "data_parallel_shard_degree": par.data_parallel_shard_degree,
        "data_parallel_replicate_degree": par.data_parallel_replicate_degree,
        "tensor_parallel_degree": par.tensor_model_parallel_size,
        "pipeline_parallel_degree": pp,
        "pipeline_parallel_microbatch_size": torchtitan_batches(cfg, ctx)[1],
        "pipeline_parallel_schedule": "Interleaved1F1B" if vp else "1F1B",
        "context_parallel_degree": par.context_parallel_size,
        "expert_parallel_degree": par.expert_model_parallel_size,
    }
    if vp:
        parallelism["pipeline_parallel_layers_per_stage"] = cfg.model.num_layers // (pp * vp)
    return {"parallelism": parallelism}


def torchtitan_issues(cfg, ctx) -> list:
    par, m, out = cfg.parallel, cfg.model, []
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    if tp > 1 and not par.sequence_parallel:
        out.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], False,
                               "torchtitan's tensor parallel plan always shards norms over tp (sequence parallel)",
                               "set parallel.sequence_parallel=true"))
    if par.virtual_pipeline_model_parallel_size and m.num_layers % (
            par.pipeline_model_parallel_size * par.virtual_pipeline_model_parallel_size):
        out.append(ConfigIssue(["parallel.virtual_pipeline_model_parallel_size"],
                               par.virtual_pipeline_model_parallel_size,
                               "layers must split evenly over pp x vpp stages", "pick a divisor of num_layers"))
    divisor = tp * (2 * cp if cp > 1 else 1)
    if cfg.training.seq_length % divisor:
        out.append(ConfigIssue(["training.seq_length"], cfg.training.seq_length,
                               f"torchtitan needs seq_len divisible by tp x 2cp = {divisor}",
                               f"use a multiple of {divisor}"))
    if par.expert_model_parallel_size > 1 and not m.num_experts:
        out.append(ConfigIssue(["parallel.expert_model_parallel_size"], par.expert_model_parallel_size,
                               "expert parallelism has no effect on a dense model", "set 1"))
    if cp > 1 and ctx.device == "cpu":
        import torch

        # torch's context_parallel() registers ring attention for the CUDA SDPA kernels (flash, efficient, cuDNN);
        # CPU's flash kernel has no sharding strategy and the first step fails inside DTensor dispatch
        out.append(ConfigIssue(["parallel.context_parallel_size", "device"], cp,
                               f"torch {torch.__version__.split('+')[0]}'s context parallelism shards the CUDA "
                               "attention kernels only (aten._scaled_dot_product_flash_attention_for_cpu has no "
                               "sharding strategy)", "set parallel.context_parallel_size=1 on CPU"))
    return out


# ------------------------------------------------------------------------------------------- checkpoints


def layout_of(cfg, world: int) -> dict:
    """The parallel layout a checkpoint is written at (primus_meta.json) and compared with on resume."""
    p = cfg.parallel
    out = {"world_size": world, "tp": p.tensor_model_parallel_size, "pp": p.pipeline_model_parallel_size,
           "vpp": p.virtual_pipeline_model_parallel_size, "cp": p.context_parallel_size,
           "ep": p.expert_model_parallel_size, "dp": _dp(cfg, world)}
    if cfg.backend.name.value == "torchtitan":
        out["dp_replicate"] = p.data_parallel_replicate_degree
    return out
