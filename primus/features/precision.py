"""The precision feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional


class FP8Format(str, Enum):
    e4m3 = "e4m3"
    hybrid = "hybrid"  # e4m3 forward, e5m2 gradients


class FP8Recipe(str, Enum):
    delayed = "delayed"  # per-tensor, scale from an amax history (TE, or the portable fp8 linear)
    tensorwise = "tensorwise"  # per-tensor, current scaling
    rowwise = "rowwise"  # per-row scales (TorchTitan / torchao)
    blockwise = "blockwise"  # 1x128 / 128x128 blocks (Megatron)
    mxfp8 = "mxfp8"  # microscaling, 32-element blocks with e8m0 scales


class FP4Format(str, Enum):
    e2m1 = "e2m1"


class FP4Recipe(str, Enum):
    nvfp4 = "nvfp4"
    mxfp4 = "mxfp4"


class Dtype(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class PrecisionConfig:
    bf16: bool = True  # BFloat16 training
    fp16: bool = False  # FP16 training (loss scaling)
    # fp16 loss scaling (megatron's names and defaults); with fp16 off these must stay at their defaults
    loss_scale: Optional[float] = None  # static loss scale (a power of 2 helps); null = dynamic
    initial_loss_scale: float = 4294967296.0  # dynamic: the first scale (2^32); halved on overflows
    min_loss_scale: float = 1.0  # dynamic: the scale never goes below this
    loss_scale_window: int = 1000  # dynamic: overflow-free steps before the scale doubles
    hysteresis: int = 2  # dynamic: overflows tolerated before the scale starts halving
    fp8: Optional[FP8Format] = None  # FP8 format; null = off
    fp8_recipe: FP8Recipe = FP8Recipe.tensorwise  # FP8 scaling recipe
    fp8_margin: int = 0  # delayed scaling: scale margin (power of 2)
    fp8_interval: int = 1  # delayed scaling: amax update interval (steps)
    fp8_amax_history_len: int = 1024  # delayed scaling: amax history length
    fp8_amax_compute_algo: str = "max"  # delayed scaling: "max" or "most_recent"
    fp4: Optional[FP4Format] = None  # FP4 format; null = off (experimental)
    fp4_recipe: FP4Recipe = FP4Recipe.nvfp4  # FP4 scaling recipe
    first_last_layers_bf16: bool = False  # keep first/last layers in BF16 under fp8/fp4
    num_layers_at_start_in_bf16: int = 1  # leading layers kept in BF16
    num_layers_at_end_in_bf16: int = 1  # trailing layers kept in BF16
    # megatron, portable fp8 (no TE): reuse each weight's fp8 cast within a step (TE's fp8 weight cache); null =
    # when a step runs a linear's forward more than once (micro batches > 1, recompute replaying linears)
    fp8_weight_cache: Optional[bool] = None
    # megatron, portable fp8, tensorwise: each dense MLP's fc1 -> SwiGLU -> fc2 as one fp8 op whose SwiGLU kernels
    # give the casts of their outputs the amax (one read fewer each, same bits); null = wherever it applies
    fp8_fused_mlp: Optional[bool] = None
    # TorchTitan (training.* and quantize.linear.float8.*)
    mixed_precision_param: Dtype = Dtype.bfloat16  # FSDP parameter dtype
    mixed_precision_reduce: Dtype = Dtype.float32  # FSDP gradient reduce dtype
    float8_enable_fsdp_float8_all_gather: bool = False  # all-gather FSDP weights in float8 (tensorwise only)
    float8_precompute_float8_dynamic_scale_for_fsdp: bool = False  # one amax all-reduce for all weights
    float8_filter_fqns: List[str] = field(default_factory=lambda: ["output"])  # modules kept out of float8
