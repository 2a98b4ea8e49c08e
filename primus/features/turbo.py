"""The turbo feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TurboConfig:
    enable_primus_turbo: bool = False  # master switch for every flag below
    provider: str = "auto"  # auto: primus_turbo when it imports, else this project's Triton/torch kernels
    use_turbo_attention: bool = False  # fused attention kernels
    use_turbo_parallel_linear: bool = False  # turbo GEMM in column/row-parallel linears
    use_turbo_grouped_gemm: bool = False  # grouped GEMM over MoE experts
    # ... and under precision.fp8 (portable path) in fp8 too: torch._scaled_grouped_mm (sm90, precision.fp8=e4m3;
    # H200: 1.11x bf16 at Mixtral's experts, 0.53-0.74x at many small ones, docs/benchmarks.md) else
    # primus' Triton fp8 grouped GEMM (primus/turbo/grouped_gemm_fp8.py decides).
    # Off by default: the Triton one measured 0.2x torch's bf16 grouped GEMM on the H200 (docs/benchmarks.md)
    grouped_gemm_fp8: bool = False
    use_turbo_grouped_mlp: Optional[bool] = None  # REMOVED: use use_turbo_grouped_gemm (setting it is an error)
    use_turbo_rms_norm: bool = False  # fused RMSNorm
    moe_use_fused_router_with_aux_score: bool = False  # fused router + aux-loss score
    use_turbo_deepep: bool = False  # DeepEP token dispatcher
    turbo_deepep_num_cu: int = 32  # compute units for DeepEP (64/80 for EP8, 32 for EP16-64)
    turbo_sync_free_moe_stage: int = 0  # 0 off; 1 router+permute fusion; 2 +DeepEP +grouped GEMM; 3 +fused act
    use_turbo_fused_act_with_probs: bool = False  # SwiGLU fused with router probabilities
    # TorchTitan
    use_turbo_async_tp: bool = False  # async TP through turbo kernels
    use_turbo_float8_linear: bool = False  # float8 linear through turbo kernels
