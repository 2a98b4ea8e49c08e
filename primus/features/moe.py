"""The moe feature: its config, rules and backend mapping (see primus/features/__init__.py).

The MoE architecture (model.num_experts, moe_router_topk, expert sizes) is the model feature's; the turbo MoE
kernels (turbo.use_turbo_grouped_gemm, ...) are the turbo feature's. TorchTitan reads the routing settings through
the model's flavor (primus/backends/torchtitan/flavors.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
import importlib.util
from typing import Any, Dict, List, Optional

from primus.config.errors import ConfigIssue, warning
from primus.features import default_of, rule


class TokenDispatcher(str, Enum):
    allgather = "allgather"
    alltoall = "alltoall"
    flex = "flex"  # DeepEP-style dispatcher


class LoadBalancing(str, Enum):
    aux_loss = "aux_loss"
    seq_aux_loss = "seq_aux_loss"
    sinkhorn = "sinkhorn"
    none = "none"


class RouterDtype(str, Enum):  # megatron-core's moe_router_dtype
    fp32 = "fp32"
    fp64 = "fp64"


class ScoreFunction(str, Enum):
    softmax = "softmax"
    sigmoid = "sigmoid"


@dataclass
class MoEConfig:
    # fused permute / unpermute of tokens; null = off unless a sync-free stage turns it on (turbo feature)
    moe_permute_fusion: Optional[bool] = None
    moe_grouped_gemm: bool = False  # one grouped GEMM over local experts
    moe_token_dispatcher_type: TokenDispatcher = TokenDispatcher.alltoall  # token dispatcher
    # the router and its balancing loss are the model's (model.<same name>, set by its preset); these override them
    moe_router_load_balancing_type: Optional[LoadBalancing] = None  # balancing loss; null = the model's
    moe_aux_loss_coeff: Optional[float] = None  # aux loss weight; null = the model's
    moe_router_score_function: Optional[ScoreFunction] = None  # router scores; null = the model's
    moe_router_pre_softmax: Optional[bool] = None  # softmax before top-k; null = the model's
    moe_z_loss_coeff: Optional[float] = None  # router z-loss weight
    overlap_moe_expert_parallel_comm: bool = False  # overlap EP all-to-all with compute
    moe_router_dtype: Optional[RouterDtype] = None  # router math in fp32/fp64; null = the model's dtype
    # route tokens uniformly at random (benchmarks: throughput without a trained router's imbalance)
    moe_router_force_load_balancing: bool = False
    moe_shared_expert_overlap: bool = False  # overlap the shared experts with the alltoall dispatch


ROUTER = ("moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_score_function", "moe_router_pre_softmax")


def router(cfg, name: str):
    """A router setting as the run uses it: moe.<name> when set, else the model's (model.<name>)."""
    v = getattr(cfg.moe, name)
    return getattr(cfg.model, name) if v is None else v


# ------------------------------------------------------------------------------------------- rules


@rule
def moe_values(cfg, ctx):
    moe, out = cfg.moe, []
    for k, v in (("moe.moe_aux_loss_coeff", moe.moe_aux_loss_coeff), ("model.moe_aux_loss_coeff",
                                                                       cfg.model.moe_aux_loss_coeff),
                 ("moe.moe_z_loss_coeff", moe.moe_z_loss_coeff)):
        if v is not None and v < 0:
            out.append(ConfigIssue([k], v, "a loss weight must be >= 0", f"set {k} to 0 (off) or more"))
    return out


@rule
def moe_settings_on_dense_model(cfg, ctx):
    from primus.features.turbo import flags

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
    on = [f"moe.{f.name}" for f in dataclasses.fields(MoEConfig)
          if getattr(cfg.moe, f.name) != default_of(cfg.moe, f.name)]
    # the MoE-only turbo flags; DeepEP's own rule (turbo.turbo_deepep) names it together with its dispatcher
    on += [f"turbo.{f}" for f in flags(moe_only=True) if f != "use_turbo_deepep" and getattr(cfg.turbo, f)]
    if on:
        # harmless, as in Primus: nothing maps them on a dense model; the run says so rather than failing
        values = {}
        for k in on:
            group, name = k.split(".")
            v = getattr(getattr(cfg, group), name)
            values[k] = getattr(v, "value", v)
        return [warning(on, values[on[0]] if len(on) == 1 else values,
                        f"MoE settings on a dense model ({cfg.model.name} has no experts): ignored",
                        "use moe=off and turbo without MoE flags, or choose a MoE model (e.g. model=debug_moe)")]
    return []


@rule
def moe_shared_expert_overlap_needs(cfg, ctx):
    moe, out = cfg.moe, []
    if not (moe.moe_shared_expert_overlap and cfg.model.num_experts):
        return []
    if not cfg.model.moe_shared_expert_intermediate_size:
        out.append(ConfigIssue(["moe.moe_shared_expert_overlap", "model.moe_shared_expert_intermediate_size"], True,
                               f"{cfg.model.name} has no shared experts to overlap",
                               "set moe.moe_shared_expert_overlap=false"))
    if moe.moe_token_dispatcher_type.value != "alltoall":
        out.append(ConfigIssue(["moe.moe_shared_expert_overlap", "moe.moe_token_dispatcher_type"],
                               moe.moe_token_dispatcher_type.value,
                               "megatron-core overlaps the shared experts with the alltoall dispatcher only",
                               "set moe.moe_token_dispatcher_type=alltoall, or moe.moe_shared_expert_overlap=false"))
    if moe.overlap_moe_expert_parallel_comm:
        out.append(ConfigIssue(["moe.moe_shared_expert_overlap", "moe.overlap_moe_expert_parallel_comm"], True,
                               "megatron-core refuses the shared-expert overlap with the EP overlap",
                               "turn one of them off"))
    return out


# ------------------------------------------------------------------------------------------- megatron


def megatron(cfg, ctx) -> Dict[str, Any]:
    from primus.features.turbo import turbo_permute_fusion

    moe, t = cfg.moe, cfg.turbo
    if not cfg.model.num_experts:
        return {}
    return {"transformer_config": {
        "moe_router_load_balancing_type": router(cfg, "moe_router_load_balancing_type").value,
        "moe_aux_loss_coeff": router(cfg, "moe_aux_loss_coeff"),
        "moe_z_loss_coeff": moe.moe_z_loss_coeff,
        "moe_router_score_function": router(cfg, "moe_router_score_function").value,
        "moe_router_pre_softmax": router(cfg, "moe_router_pre_softmax"),
        # the turbo grouped GEMM / fused act with probs serve megatron's GroupedMLP (megatron/turbo.py)
        "moe_grouped_gemm": moe.moe_grouped_gemm or bool(
            t.enable_primus_turbo and (t.use_turbo_grouped_gemm or t.use_turbo_fused_act_with_probs)),
        "moe_token_dispatcher_type": moe.moe_token_dispatcher_type.value,
        # without TE megatron's fused permute is missing: megatron/turbo.py's Triton permute runs instead
        "moe_permute_fusion": bool(moe.moe_permute_fusion) and not turbo_permute_fusion(cfg),
        "overlap_moe_expert_parallel_comm": moe.overlap_moe_expert_parallel_comm,
        "moe_router_dtype": None if moe.moe_router_dtype is None else moe.moe_router_dtype.value,
        "moe_router_force_load_balancing": moe.moe_router_force_load_balancing,
        "moe_shared_expert_overlap": moe.moe_shared_expert_overlap,
    }}


def megatron_only(cfg) -> tuple:
    """moe.* fields only megatron reads: TorchTitan 0.2.2's MoE routes in the model's dtype, has no shared-expert
    overlap, and dispatches tokens its own way (its expert-parallel all-to-all)."""
    return ("moe_router_dtype", "moe_shared_expert_overlap", "moe_token_dispatcher_type")


def torchtitan_issues(cfg, ctx) -> List[ConfigIssue]:
    if cfg.moe.moe_permute_fusion and cfg.model.num_experts:
        # what the flag asks for is how TorchTitan works anyway (moe=optimized's grouped GEMM does map there)
        return [warning(["moe.moe_permute_fusion"], True, "torchtitan 0.2.2's MoE always reorders tokens by expert "
                        "its own way (a sort and gather, no fused-permute switch): nothing to turn on",
                        "drop it, or use backend=megatron")]
    return []


def torchtitan(cfg, ctx) -> dict:
    # TorchTitan 0.2.2's debug.moe_force_load_balance spreads tokens evenly over the experts, as megatron's forced
    # balancing does (Primus's MoE throughput runs set it); its MoE models read it from the job config
    if not cfg.moe.moe_router_force_load_balancing:
        return {}
    return {"debug": {"moe_force_load_balance": True}}


def megatron_issues(cfg, ctx) -> List[ConfigIssue]:
    """What megatron-core 0.16.1 and this machine cannot honour of the MoE settings."""
    from primus.backends.megatron.args import mcore_version, resolved_layer_spec

    moe, m, p, out = cfg.moe, cfg.model, cfg.precision, []
    ver, spec = mcore_version(), resolved_layer_spec(cfg)
    if ctx.device == "cpu" and moe.overlap_moe_expert_parallel_comm:
        out.append(ConfigIssue(["moe.overlap_moe_expert_parallel_comm", "device"], True,
                               "the expert-parallel overlap schedules work on CUDA streams", "turn it off on CPU"))
    # moe.moe_permute_fusion without TE: primus.turbo.moe_ops permute/unpermute (the turbo feature checks Triton)
    if spec == "local" and moe.moe_grouped_gemm and m.num_experts and not p.bf16:
        # without TE the local spec uses GroupedMLP (grouped_gemm.py supplies its GEMM), which is bf16-only
        out.append(ConfigIssue(["moe.moe_grouped_gemm", "precision.bf16"], False,
                               f"megatron-core {ver}'s GroupedMLP (the grouped-GEMM experts without TE) runs bf16 only",
                               "set precision=bf16, or moe.moe_grouped_gemm=false"))
    deepep_flag = cfg.turbo.enable_primus_turbo and cfg.turbo.use_turbo_deepep  # the provider rule names that fix
    if moe.moe_token_dispatcher_type.value == "flex" and m.num_experts and not deepep_flag \
            and importlib.util.find_spec("deep_ep") is None:
        out.append(ConfigIssue(["moe.moe_token_dispatcher_type"], "flex",
                               f"megatron-core {ver}'s flex dispatcher needs DeepEP (deep_ep), which does not import",
                               "install DeepEP, or use moe.moe_token_dispatcher_type=alltoall", needs="DeepEP"))
    if moe.overlap_moe_expert_parallel_comm and m.num_experts:
        if moe.moe_token_dispatcher_type.value not in ("alltoall", "flex"):
            out.append(ConfigIssue(["moe.overlap_moe_expert_parallel_comm", "moe.moe_token_dispatcher_type"],
                                   moe.moe_token_dispatcher_type.value,
                                   "the EP overlap needs the alltoall or flex dispatcher",
                                   "set moe.moe_token_dispatcher_type=alltoall"))
        if cfg.recompute.recompute_granularity is not None and cfg.recompute.recompute_granularity.value == "full":
            out.append(ConfigIssue(["moe.overlap_moe_expert_parallel_comm", "recompute.recompute_granularity"], "full",
                                   f"megatron-core {ver} refuses full recompute with the EP overlap",
                                   "use recompute=selective or none"))
        if not (p.bf16 or p.fp16):
            out.append(ConfigIssue(["moe.overlap_moe_expert_parallel_comm", "precision.bf16"], False,
                                   "the EP overlap runs bf16/fp16 models only", "set precision.bf16=true"))
    return out
