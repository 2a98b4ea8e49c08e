"""The parallel feature: tensor, pipeline (and virtual), context, expert and data parallel sizes, sequence
parallel, and TorchTitan's FSDP / HSDP split of dp (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from primus.config.errors import ConfigIssue
from primus.features import rule


@dataclass
class ParallelConfig:
    tensor_model_parallel_size: int = 1  # tp
    pipeline_model_parallel_size: int = 1  # pp
    virtual_pipeline_model_parallel_size: Optional[int] = None  # interleaved stages per pp rank
    # uneven pipeline split (Megatron-LM's names): layers on the first / last pp rank; the rest split evenly over
    # the middle ranks. Primus' large models give the embedding / output stages fewer layers.
    decoder_first_pipeline_num_layers: Optional[int] = None
    decoder_last_pipeline_num_layers: Optional[int] = None
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
        ways = []
        if need % lc.nnodes == 0:
            ways.append(f"launcher.nproc_per_node={need // lc.nnodes}" + (f" (x launcher.nnodes={lc.nnodes})"
                                                                          if lc.nnodes > 1 else ""))
        if lc.nproc_per_node > 1 and need % lc.nproc_per_node == 0 and need // lc.nproc_per_node != lc.nnodes:
            # more nodes of the same size: a node already given 8 ranks (one per GPU) has no more GPUs to give
            more = f"launcher.nnodes={need // lc.nproc_per_node} (x launcher.nproc_per_node={lc.nproc_per_node})"
            ways.insert(0 if lc.nproc_per_node >= 8 else len(ways), more)
        return ", or ".join(ways) or f"launcher.nnodes x launcher.nproc_per_node = {need}"
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
    elif uneven(cfg):
        out += _uneven_issues(cfg)
    elif m.num_layers % stages:
        first = lighter_first_stage(m.num_layers, pp, vp)
        out.append(ConfigIssue(["model.num_layers", "parallel.pipeline_model_parallel_size",
                                "parallel.virtual_pipeline_model_parallel_size"], m.num_layers,
                               f"layers must divide evenly across {stages} pipeline stages (pp={pp}, vp={vp})",
                               "choose pp (x vp) dividing num_layers"
                               + (f", or split unevenly: {FIRST}={first} (the other ranks share the rest)"
                                  if first else "")))
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


FIRST, LAST = "parallel.decoder_first_pipeline_num_layers", "parallel.decoder_last_pipeline_num_layers"


def uneven(cfg) -> bool:
    p = cfg.parallel
    return p.decoder_first_pipeline_num_layers is not None or p.decoder_last_pipeline_num_layers is not None


def split_of(num_layers: int, pp: int, vp: Optional[int], first: Optional[int], last: Optional[int]):
    """Layers on each pp rank as megatron-core 0.16.1 builds them (transformer_block.get_num_layers_to_build), or
    a reason they cannot be built. The middle ranks share what first / last leave; with vp each rank's layers
    split into vp equal chunks, so every rank's count is a multiple of vp."""
    if first is None and last is None:
        if num_layers % (pp * (vp or 1)):
            return None, f"{num_layers} layers do not split evenly over pp x vp = {pp * (vp or 1)} stages"
        return [num_layers // pp] * pp, ""
    if pp < 2:
        return None, "an uneven split needs pipeline_model_parallel_size >= 2"
    for name, n in (("first", first), ("last", last)):
        if n is not None and not 1 <= n < num_layers:
            return None, f"the {name} stage's layers must be between 1 and num_layers - 1 = {num_layers - 1}"
    middle_stages = pp - (first is not None) - (last is not None)
    middle = num_layers - (first or 0) - (last or 0)
    if middle_stages == 0 and middle != 0:
        return None, (f"with pp={pp} and both ends set, first + last must equal num_layers={num_layers} "
                      f"({first} + {last} = {first + last})")
    if middle_stages > 0 and (middle <= 0 or middle % middle_stages):
        return None, (f"the {middle} layers left after the first / last stages must split evenly (and at least one "
                      f"each) over the {middle_stages} other pipeline stage(s)")
    per_middle = middle // middle_stages if middle_stages else 0
    counts = [per_middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    if vp and any(c % vp for c in counts):
        return None, (f"with virtual_pipeline_model_parallel_size={vp} every pp rank's layers split into {vp} equal "
                      f"chunks: the per-rank counts {counts} must all be multiples of {vp}")
    return counts, ""


def lighter_first_stage(num_layers: int, pp: int, vp: Optional[int]) -> Optional[int]:
    """The largest first-stage layer count at or below the others' that makes the split valid (the first stage also
    holds the embedding), or None."""
    if pp < 2:
        return None
    for first in range(num_layers // pp, 0, -1):
        if split_of(num_layers, pp, vp, first, None)[0] is not None:
            return first
    return None


def stage_layer_counts(cfg, pp: Optional[int] = None) -> Optional[List[int]]:
    """Layers held by each pp rank (None where the split is invalid; the rules report it)."""
    p = cfg.parallel
    pp = pp or p.pipeline_model_parallel_size
    return split_of(cfg.model.num_layers, pp, p.virtual_pipeline_model_parallel_size,
                    p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers)[0]


def stage_layer_ids(cfg, pp: int, vp: int, rank: int) -> List[int]:
    """Global (0-based) ids of the layers pp rank `rank` holds: megatron-core's get_transformer_layer_offset,
    where virtual stage v of rank r starts at v x (layers per virtual round) + the chunks of ranks before r."""
    counts = stage_layer_counts(cfg, pp) or [cfg.model.num_layers // pp] * pp
    vp = vp or 1
    chunks = [c // vp for c in counts]
    ids = []
    for v in range(vp):
        start = v * sum(chunks) + sum(chunks[:rank])
        ids += range(start, start + chunks[rank])
    return ids


def _uneven_issues(cfg) -> list:
    p, m = cfg.parallel, cfg.model
    pp, vp = p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    counts, why = split_of(m.num_layers, pp, vp, first, last)
    if counts is not None:
        return []
    keys = [k for k, v in ((FIRST, first), (LAST, last)) if v is not None]
    value = {"num_layers": m.num_layers, "pp": pp, "vp": vp, "first": first, "last": last}
    if pp < 2:
        return [ConfigIssue(keys + ["parallel.pipeline_model_parallel_size"], value, why,
                            "set parallel.pipeline_model_parallel_size >= 2, or leave "
                            + " and ".join(f"{k}=null" for k in keys))]
    # the values of one key that would work with the other kept: the key out of range if one is, else the last
    vary_first = last is None or (first is not None and not 1 <= first < m.num_layers)
    key = FIRST if vary_first else LAST
    fit = [n for n in range(1, m.num_layers)
           if split_of(m.num_layers, pp, vp, *((n, last) if vary_first else (first, n)))[0] is not None]
    fix = (f"set {key} to one of {fit[:8]}" if fit else
           "choose first / last layer counts so that the rest split evenly over the middle stages")
    return [ConfigIssue(keys + ["model.num_layers", "parallel.pipeline_model_parallel_size"]
                        + (["parallel.virtual_pipeline_model_parallel_size"] if vp else []), value,
                        f"uneven pipeline split: {why}",
                        fix + " (or null both where num_layers divides evenly over the stages)")]


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
    # megatron-core's TransformerConfig names; its layer offsets (get_transformer_layer_offset) follow them, so
    # every layer keeps its global layer_number (init, recompute_layer_ids and fp8's bf16 ends index by it)
    uneven_split = {k: v for k, v in (("num_layers_in_first_pipeline_stage", p.decoder_first_pipeline_num_layers),
                                      ("num_layers_in_last_pipeline_stage", p.decoder_last_pipeline_num_layers))
                    if v is not None}
    return {
        "parallel_state": dict(sizes),
        "data_parallel_size": _dp(cfg, ctx.world_size),
        "transformer_config": {**sizes, "sequence_parallel": p.sequence_parallel, **uneven_split},
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
    if uneven(cfg) and not vp:
        parallelism["module_fqns_per_model_part"] = model_parts(cfg)
    elif vp:
        parallelism["pipeline_parallel_layers_per_stage"] = cfg.model.num_layers // (pp * vp)
    return {"parallelism": parallelism}


def model_parts(cfg) -> List[List[str]]:
    """TorchTitan's explicit split (parallelism.module_fqns_per_model_part): one list of module names per pp rank,
    the embedding on the first, the final norm and output on the last, the layers as megatron-core places them."""
    pp = cfg.parallel.pipeline_model_parallel_size
    parts = []
    for rank in range(pp):
        names = [f"layers.{i}" for i in stage_layer_ids(cfg, pp, 1, rank)]
        parts.append((["tok_embeddings"] if rank == 0 else []) + names + (["norm", "output"] if rank == pp - 1 else []))
    return parts


def torchtitan_issues(cfg, ctx) -> list:
    par, m, out = cfg.parallel, cfg.model, []
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    if tp > 1 and not par.sequence_parallel:
        out.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], False,
                               "torchtitan's tensor parallel plan always shards norms over tp (sequence parallel)",
                               "set parallel.sequence_parallel=true"))
    if par.virtual_pipeline_model_parallel_size and uneven(cfg):
        out.append(ConfigIssue([k for k in (FIRST, LAST) if getattr(par, k.split(".")[1]) is not None]
                               + ["parallel.virtual_pipeline_model_parallel_size"],
                               {"first": par.decoder_first_pipeline_num_layers,
                                "last": par.decoder_last_pipeline_num_layers,
                                "vp": par.virtual_pipeline_model_parallel_size},
                               "torchtitan's interleaved schedule splits layers evenly "
                               "(pipeline_parallel_layers_per_stage); its explicit per-stage split is wired for one "
                               "stage per pp rank here",
                               "set parallel.virtual_pipeline_model_parallel_size=null, or null both "
                               "decoder_*_pipeline_num_layers for an even interleaved split"))
    elif par.virtual_pipeline_model_parallel_size and m.num_layers % (
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
    if uneven(cfg):  # recorded only when set: checkpoints of even splits keep their layout record
        out["pp_layers"] = stage_layer_counts(cfg)
    return out
