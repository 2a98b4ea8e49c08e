"""The typed schema: one dataclass per Hydra config group, composed into `PrimusConfig`.

Every YAML file under `conf/<group>/` extends its group's dataclass (registered in Hydra's ConfigStore by
`register()`), so an unknown key or a wrong type fails at compose time with Hydra's own message. Choices are Enums
because omegaconf 2.3 has no Literal. Field names are the guide's own (performance-tuning-guide.txt); TorchTitan
keys keep their last component (`training.mixed_precision_param` -> `precision.mixed_precision_param`).

Each group's dataclass lives with its feature's rules and backend mappings (primus/features/<name>.py); this
module composes them. Cross-field rules are never here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from primus.features.backend import Backend, Device, LayerSpec, Mode


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


from primus.features.recompute import ACMode, RecomputeGranularity, RecomputeMethod  # noqa: E402


class CrossEntropyImpl(str, Enum):
    native = "native"  # megatron's fused vocab-parallel cross entropy
    te = "te"  # Transformer Engine's
    turbo = "turbo"  # primus.turbo.cross_entropy (Triton; megatron backend, tp = 1)


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


from primus.features.data import DataKind  # noqa: E402
from primus.features.training import LRDecay, NonFiniteAction, Optimizer  # noqa: E402


# ----------------------------------------------------------------------------------------------------------------
# Groups
# ----------------------------------------------------------------------------------------------------------------


from primus.features.backend import BackendConfig  # noqa: E402


@dataclass
class ModelConfig:
    name: str = "debug"  # preset name; used in output paths (tune_hipblaslt/<name>/...)
    num_layers: int = 2  # decoder layers
    hidden_size: int = 64  # model dimension
    ffn_hidden_size: int = 256  # dense MLP inner size (SwiGLU: per branch)
    num_attention_heads: int = 4  # query heads
    num_query_groups: int = 2  # key/value heads (GQA); == heads for MHA
    kv_channels: Optional[int] = None  # head dim; None = hidden_size / heads
    vocab_size: int = 2048  # tokenizer vocabulary
    max_position_embeddings: int = 4096  # RoPE table length
    rotary_base: float = 10000.0  # RoPE theta
    norm_epsilon: float = 1e-5  # RMSNorm eps
    tie_word_embeddings: bool = False  # share input embedding and output projection
    qk_layernorm: bool = False  # RMSNorm on q and k per head (Qwen3)
    # MoE architecture (num_experts None = dense)
    num_experts: Optional[int] = None  # routed experts per MoE layer
    moe_router_topk: int = 2  # experts per token
    moe_ffn_hidden_size: Optional[int] = None  # expert inner size; None = ffn_hidden_size
    moe_shared_expert_intermediate_size: Optional[int] = None  # total shared-expert inner size; None = no shared experts
    moe_first_k_dense: int = 0  # leading dense layers before MoE layers (DeepSeek first_k_dense_replace)
    # Multi-latent attention (DeepSeek-V2)
    multi_latent_attention: bool = False  # MLA instead of GQA
    q_lora_rank: Optional[int] = None  # query low-rank; None = full-rank query projection
    kv_lora_rank: int = 512  # compressed KV width
    qk_head_dim: int = 128  # non-rotary q/k head dim
    qk_pos_emb_head_dim: int = 64  # rotary q/k head dim
    v_head_dim: int = 128  # value head dim
    mtp_num_layers: int = 0  # multi-token-prediction depths (their recompute ids follow the decoder's)
    # Loss fusion (guide: language_model.yaml)
    cross_entropy_loss_fusion: bool = False  # fused cross entropy
    cross_entropy_fusion_impl: CrossEntropyImpl = CrossEntropyImpl.native  # "te" needs TE; "turbo": Triton, tp=1
    # fused q/k/v split + RoPE: null = where available (TE's, or primus' Triton kernel on a GPU), true = required
    apply_rope_fusion: Optional[bool] = None
    # fused SwiGLU (megatron bias_activation_fusion): null = on a GPU (primus' Triton kernel, else megatron's
    # torch.compile'd one), true = also on CPU, false = eager silu(gate) * up
    bias_activation_fusion: Optional[bool] = None


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


from primus.features.recompute import RecomputeConfig  # noqa: E402


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


@dataclass
class TurboConfig:
    enable_primus_turbo: bool = False  # master switch for every flag below
    provider: str = "auto"  # auto: primus_turbo when it imports, else this project's Triton/torch kernels
    use_turbo_attention: bool = False  # fused attention kernels
    use_turbo_parallel_linear: bool = False  # turbo GEMM in column/row-parallel linears
    use_turbo_grouped_gemm: bool = False  # grouped GEMM over MoE experts
    # ... and under precision.fp8 (portable path) in fp8 too: torch._scaled_grouped_mm (sm90, precision.fp8=e4m3;
    # H200: 1.11x bf16 at Mixtral's experts, 0.53-0.74x at many small ones, docs/benchmarks.md 2026-12-02) else
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


from primus.features.checkpoint import CheckpointConfig  # noqa: E402
from primus.features.data import DataConfig  # noqa: E402
from primus.features.launcher import LauncherConfig  # noqa: E402
from primus.features.logging import LoggingConfig, ProfileConfig  # noqa: E402
from primus.features.memory import MemoryConfig  # noqa: E402
from primus.features.overlap import OverlapConfig  # noqa: E402
from primus.features.parallel import ParallelConfig  # noqa: E402
from primus.features.plan import PlanConfig  # noqa: E402
from primus.features.training import TrainingConfig  # noqa: E402
from primus.features.tuning import TuningConfig  # noqa: E402


@dataclass
class PrimusConfig:
    backend: BackendConfig = field(default_factory=BackendConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    turbo: TurboConfig = field(default_factory=TurboConfig)
    tuning: TuningConfig = field(default_factory=TuningConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    device: Device = Device.auto
    mode: Mode = Mode.train
    dry_run: bool = False  # validate and print the backend arguments as JSON, then exit
    experiment: Optional[str] = None  # name of the experiment preset, when one was chosen
    extra: Dict[str, Any] = field(default_factory=dict)  # free-form notes carried into result.json


# group name -> (package key in PrimusConfig, dataclass)
GROUPS: Dict[str, tuple] = {
    "backend": ("backend", BackendConfig),
    "model": ("model", ModelConfig),
    "precision": ("precision", PrecisionConfig),
    "recompute": ("recompute", RecomputeConfig),
    "moe": ("moe", MoEConfig),
    "turbo": ("turbo", TurboConfig),
    "tuning_stage": ("tuning", TuningConfig),
    "parallel": ("parallel", ParallelConfig),
    "overlap": ("overlap", OverlapConfig),
    "memory": ("memory", MemoryConfig),
    "training": ("training", TrainingConfig),
    "data": ("data", DataConfig),
    "launcher": ("launcher", LauncherConfig),
}

SCHEMA_NAME = "_schema"  # each group's schema is stored as `<group>/_schema`; YAML files list it in defaults


def register() -> None:
    """Store the top-level schema and one schema per group in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="primus_schema", node=PrimusConfig)
    for group, (package, node) in GROUPS.items():
        cs.store(group=group, name=SCHEMA_NAME, node=node, package=package)
