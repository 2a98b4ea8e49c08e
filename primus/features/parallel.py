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


def ranks_fix(cfg, ctx, need: int) -> str:
    """How to launch `need` ranks, in the keys the world came from."""
    lc = cfg.launcher
    if not ctx.world_from or ctx.world_from.startswith(("launcher", "Slurm job")):  # judged before submission too
        if need % lc.nnodes == 0:
            return f"launcher.nproc_per_node={need // lc.nnodes}" + (f" (x launcher.nnodes={lc.nnodes})"
                                                                     if lc.nnodes > 1 else "")
        return f"launcher.nnodes x launcher.nproc_per_node = {need}"
    return f"{need} ranks (the world came from {ctx.world_from or 'the launcher'})"


@rule
def parallel_layout(cfg, ctx):
    p, m, out = cfg.parallel, cfg.model, []
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    world, model_size = ctx.world_size, tp * pp * cp
    dp = _dp(cfg, world)
    if model_size * dp != world:
        # megatron-core's initialize_model_parallel: world % (tp x pp x cp) == 0, dp = world / (tp x pp x cp)
        need = model_size * (p.data_parallel_size or max(1, -(-world // model_size)))
        shown_dp = p.data_parallel_size if p.data_parallel_size is not None else f"{world}/{model_size}: not whole"
        out.append(ConfigIssue(["parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size",
                                "parallel.context_parallel_size", "parallel.data_parallel_size", "launcher.nproc_per_node"],
                               {"tp": tp, "pp": pp, "cp": cp, "dp": shown_dp, "world_size": world,
                                "world_from": ctx.world_from or "launcher"},
                               f"tp x pp x cp x dp must equal the world size ({world})",
                               f"launch {need} ranks: {ranks_fix(cfg, ctx, need)}; or change the sizes so that "
                               f"tp x pp x cp divides {world}"))
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
    if ep > 1 and cfg.backend.name.value == "megatron" and world % (tp * ep * pp):
        # megatron-core's initialize_model_parallel: the expert layout (etp x ep x pp, expert tp = tp here) must
        # tile the world too; expert dp = world / (etp x ep x pp)
        etp_ep_pp = tp * ep * pp
        fit = [e for e in range(1, ep + 1) if world % (tp * e * pp) == 0 and (m.num_experts or 1) % e == 0]
        out.append(ConfigIssue(["parallel.expert_model_parallel_size", "launcher.nproc_per_node"],
                               {"ep": ep, "expert_tp": tp, "pp": pp, "world_size": world,
                                "world_from": ctx.world_from or "launcher"},
                               f"the world must be divisible by expert tp x ep x pp = {tp} x {ep} x {pp} = {etp_ep_pp}",
                               f"launch a multiple of {etp_ep_pp} ranks ({ranks_fix(cfg, ctx, etp_ep_pp * max(1, -(-world // etp_ep_pp)))}), "
                               f"or set parallel.expert_model_parallel_size to one of {fit}"))
    if p.sequence_parallel and tp == 1:
        out.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], True,
                               "sequence parallel shards over tp ranks: needs tp > 1", "set tp > 1 or sequence_parallel=false"))
    t = cfg.training
    if t.seq_length % cp:
        out.append(ConfigIssue(["training.seq_length", "parallel.context_parallel_size"], t.seq_length,
                               "seq_length must be divisible by cp", "choose cp dividing seq_length"))
    if t.seq_length > m.max_position_embeddings:
        out.append(ConfigIssue(["training.seq_length", "model.max_position_embeddings"], t.seq_length,
                               f"longer than the model's positions ({m.max_position_embeddings})",
                               "lower training.seq_length or raise model.max_position_embeddings"))
    return out


@rule
def fsdp_degrees(cfg, ctx):
    """TorchTitan 0.2.2's ParallelDims._validate, before any rank starts: replicate >= 1, shard -1 (the rest of dp)
    or >= 1, replicate x shard = dp; and the MoE mesh's expert fsdp = shard x cp x tp / (etp x ep) is whole."""
    if cfg.backend.name.value != "torchtitan":
        return []
    p, out = cfg.parallel, []
    rep, shard, ep = p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.expert_model_parallel_size
    dp = _dp(cfg, ctx.world_size)
    if rep < 1:
        return [ConfigIssue(["parallel.data_parallel_replicate_degree"], rep,
                            "HSDP's replica count is >= 1 (1 = plain FSDP, no replicas)",
                            "set parallel.data_parallel_replicate_degree=1, or a divisor of dp")]
    if shard == 0 or shard < -1:
        return [ConfigIssue(["parallel.data_parallel_shard_degree"], shard,
                            "the FSDP shard degree is -1 (all of dp left after the replicas) or >= 1",
                            "set parallel.data_parallel_shard_degree=-1")]
    if dp < 1:
        return []  # parallel_layout reports the world
    divisors = [d for d in range(1, dp + 1) if dp % d == 0]
    sizes = {"replicate": rep, "shard": shard, "dp": dp, "world_size": ctx.world_size,
             "world_from": ctx.world_from or "launcher"}
    if shard == -1 and dp % rep:
        out.append(ConfigIssue(["parallel.data_parallel_replicate_degree"], sizes,
                               f"the replicas split dp = world / (tp x pp x cp) = {dp}: replicate must divide it",
                               f"set parallel.data_parallel_replicate_degree to one of {divisors}"))
    elif shard != -1 and rep * shard != dp:
        fit = (f"parallel.data_parallel_shard_degree=-1 (= dp / replicate = {dp // rep} here)" if dp % rep == 0 else
               f"parallel.data_parallel_replicate_degree to one of {divisors} and shard -1")
        out.append(ConfigIssue(["parallel.data_parallel_shard_degree", "parallel.data_parallel_replicate_degree"],
                               sizes, f"replicate x shard must equal dp = world / (tp x pp x cp) = {dp}",
                               f"set {fit}, or launch {ranks_fix(cfg, ctx, rep * shard * (ctx.world_size // dp))}"))
    elif ep > 1:
        fsdp = (shard if shard != -1 else dp // rep) * p.context_parallel_size * p.tensor_model_parallel_size
        if fsdp % ep:  # expert tp is TorchTitan's default 1
            out.append(ConfigIssue(["parallel.expert_model_parallel_size"], {"ep": ep, "shard x cp x tp": fsdp},
                                   "torchtitan takes ep out of the FSDP shard x cp x tp ranks: ep must divide them",
                                   f"set parallel.expert_model_parallel_size to a divisor of {fsdp}, or launch more "
                                   "ranks"))
    return out


# ------------------------------------------------------------------------------------------- megatron-core


def num_microbatches(cfg, ctx) -> int:
    from primus.features.training import global_batch

    dp = max(1, _dp(cfg, ctx.world_size))
    t = cfg.training
    return max(1, global_batch(cfg, ctx.world_size) // (t.micro_batch_size * dp))


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
    from primus.features.training import global_batch

    t = cfg.training
    if cfg.parallel.pipeline_model_parallel_size > 1:
        # megatron's micro batches all go through the pipeline in one step: TorchTitan's local batch is the whole
        # per-dp-rank batch, split into pipeline microbatches of micro_batch_size
        return max(1, global_batch(cfg, ctx.world_size) // (_dp(cfg, ctx.world_size) or 1)), t.micro_batch_size
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
