"""The moe feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional


class TokenDispatcher(str, Enum):
    allgather = "allgather"
    alltoall = "alltoall"
    flex = "flex"  # DeepEP-style dispatcher


class LoadBalancing(str, Enum):
    aux_loss = "aux_loss"
    seq_aux_loss = "seq_aux_loss"
    sinkhorn = "sinkhorn"
    none = "none"


class ScoreFunction(str, Enum):
    softmax = "softmax"
    sigmoid = "sigmoid"


@dataclass
class MoEConfig:
    moe_permute_fusion: bool = False  # fused permute / unpermute of tokens
    moe_grouped_gemm: bool = False  # one grouped GEMM over local experts
    moe_token_dispatcher_type: TokenDispatcher = TokenDispatcher.alltoall  # token dispatcher
    moe_router_load_balancing_type: LoadBalancing = LoadBalancing.aux_loss  # balancing loss
    moe_aux_loss_coeff: float = 0.01  # aux loss weight
    moe_router_score_function: ScoreFunction = ScoreFunction.softmax  # router scores
    moe_router_pre_softmax: bool = False  # softmax before top-k
    moe_z_loss_coeff: Optional[float] = None  # router z-loss weight
    overlap_moe_expert_parallel_comm: bool = False  # overlap EP all-to-all with compute
