"""The typed schema: one dataclass per Hydra config group, composed into `PrimusConfig`.

Every YAML file under `conf/<group>/` extends its group's dataclass (registered in Hydra's ConfigStore by
`register()`), so an unknown key or a wrong type fails at compose time with Hydra's own message. Choices are Enums
because omegaconf 2.3 has no Literal. Field names are the guide's own (performance-tuning-guide.txt); TorchTitan
keys keep their last component (`training.mixed_precision_param` -> `precision.mixed_precision_param`).

Cross-field rules live in `primus/config/validate.py`, never here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional


class Backend(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"


class LayerSpec(str, Enum):
    auto = "auto"  # Transformer Engine's spec when TE imports, else the local fused spec
    te = "te"  # require Transformer Engine
    local = "local"  # megatron-core local modules with a fused (SDPA) attention core


class Device(str, Enum):
    auto = "auto"  # the GPU when one is present, else CPU
    cpu = "cpu"
    cuda = "cuda"


class Mode(str, Enum):
    train = "train"
    plan = "plan"  # memory / throughput estimate only (no GPU)


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


class RecomputeGranularity(str, Enum):
    full = "full"
    selective = "selective"


class RecomputeMethod(str, Enum):
    uniform = "uniform"
    block = "block"


class ACMode(str, Enum):  # TorchTitan activation_checkpoint.mode
    none = "none"
    selective = "selective"
    full = "full"


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


class Optimizer(str, Enum):
    adam = "adam"  # decoupled weight decay (AdamW), as megatron-core's "adam"
    adamw = "adamw"
    sgd = "sgd"


class LRDecay(str, Enum):
    constant = "constant"
    linear = "linear"
    cosine = "cosine"


class DataKind(str, Enum):
    synthetic = "synthetic"  # random tokens (megatron: MockGPTDataset; torchtitan: in-memory tokens)
    indexed = "indexed"  # megatron-core .bin/.idx prefix
    jsonl = "jsonl"  # a local folder/file of jsonl with a `text` field, tokenised by a local tokenizer


class NonFiniteAction(str, Enum):
    skip = "skip"  # drop the update, keep training
    stop = "stop"  # end the run with status failed


# ----------------------------------------------------------------------------------------------------------------
# Groups
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class BackendConfig:
    name: Backend = Backend.megatron  # which trainer runs the job
    layer_spec: LayerSpec = LayerSpec.auto  # megatron: TE spec or local fused spec


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


@dataclass
class RecomputeConfig:
    recompute_granularity: Optional[RecomputeGranularity] = None  # full | selective | null
    recompute_method: Optional[RecomputeMethod] = None  # uniform | block (full granularity)
    recompute_num_layers: Optional[int] = None  # layers (or chunk size) recomputed
    recompute_layer_ids: Optional[List[int]] = None  # global layer ids to recompute (Primus extension)
    recompute_modules: List[str] = field(default_factory=lambda: ["core_attn"])  # selective: modules recomputed
    # TorchTitan: activation_checkpoint.* ; null mode = follow recompute_granularity
    activation_checkpoint_mode: Optional[ACMode] = None  # none | selective | full
    selective_ac_option: str = "op"  # "op" or an integer N (every N-th layer)


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


@dataclass
class TuningConfig:
    stage: int = 0  # PRIMUS_HIPBLASLT_TUNING_STAGE: 0 none, 1 dump shapes, 2 tune offline, 3 use results
    enabled: Optional[bool] = None  # PRIMUS_HIPBLASLT_TUNING master switch; null = read the env var
    override_file: Optional[str] = None  # HIPBLASLT_TUNING_OVERRIDE_FILE; null = env, else the stage-2 path
    root: str = "outputs/tune_hipblaslt"  # <root>/<model>/gemm_shape and gemm_tune


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


@dataclass
class MemoryConfig:
    use_distributed_optimizer: bool = False  # shard optimizer state over dp
    optimizer_cpu_offload: bool = False  # optimizer state and step on CPU
    optimizer_offload_fraction: float = 1.0  # share of optimizer state offloaded
    use_precision_aware_optimizer: bool = False  # low-precision optimizer state (distributed optimizer)
    empty_unused_memory_level: int = 0  # 0 never, 1 after each step, 2 also after forward-backward
    enable_cpu_offload: bool = False  # TorchTitan training.enable_cpu_offload (FSDP CPU offload)


@dataclass
class TrainingConfig:
    micro_batch_size: int = 4  # sequences per forward per rank
    global_batch_size: int = 8  # sequences per optimizer step (all dp ranks, all micro batches)
    seq_length: int = 128  # tokens per sequence
    train_iters: int = 30  # optimizer steps
    optimizer: Optimizer = Optimizer.adamw
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # final learning rate of the decay
    lr_warmup_iters: int = 2  # linear warm-up steps (0 or < train_iters)
    lr_decay_style: LRDecay = LRDecay.cosine
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # max global grad norm; 0 = off
    init_method_std: float = 0.02  # weight init std
    seed: int = 1234
    compile: bool = False  # torch.compile (per transformer block)
    deterministic: bool = False  # PRIMUS_DETERMINISTIC: bitwise reruns; no compile, no tuning
    log_interval: int = 1  # steps between log lines
    timing_warmup_steps: int = 3  # steps left out of step-time statistics
    on_nonfinite: NonFiniteAction = NonFiniteAction.stop  # loss or grad norm NaN/inf


@dataclass
class DataConfig:
    kind: DataKind = DataKind.synthetic
    path: Optional[str] = None  # indexed prefix (no .bin/.idx) or jsonl file/folder
    tokenizer: Optional[str] = None  # local tokenizer folder (tokenizer.json) for jsonl data
    num_workers: int = 0  # dataloader workers


@dataclass
class LauncherConfig:
    nproc_per_node: int = 1  # worker processes per node (one per GPU)
    nnodes: int = 1  # nodes
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0 = pick a free port
    env: Dict[str, str] = field(default_factory=dict)  # extra env vars set for every worker


@dataclass
class LoggingConfig:
    tensorboard: bool = True  # event files in <run_dir>/tensorboard (rank 0)
    wandb: bool = False  # Weights & Biases, offline mode (needs the wandb package)
    wandb_project: str = "primus-hydra"


@dataclass
class ProfileConfig:
    enabled: bool = False  # torch.profiler trace for a window of steps
    start_step: int = 3  # first profiled step (1-based); earlier steps warm up
    steps: int = 2  # profiled steps
    ranks: List[int] = field(default_factory=lambda: [0])  # ranks that record
    record_shapes: bool = True  # operator input shapes in the trace
    with_stack: bool = False  # Python stacks (large traces)
    top_kernels: int = 15  # rows of the printed kernel table
    memory_snapshot: bool = False  # CUDA allocator history -> memory_snapshot.pickle (pytorch.org/memory_viz)
    memory_snapshot_steps: int = 2  # steps recorded from start_step


@dataclass
class CheckpointConfig:
    interval: int = 0  # save every N steps; 0 = never during the run
    save_at_end: bool = False  # save after the last step
    keep_last: int = 2  # checkpoints kept (older ones deleted); 0 = keep all
    dir: Optional[str] = None  # null = <run_dir>/checkpoints
    resume: Optional[str] = None  # null = fresh start; "auto" = latest valid in dir; or a checkpoint path


@dataclass
class PlanConfig:
    gpu: str = "auto"  # target GPU for the estimate: auto (this machine's, else H200), H100, H200, MI300X, MI325X, MI355X
    gpu_memory_gb: Optional[float] = None  # override the target's memory (GB)
    assumed_mfu: float = 0.45  # MFU used to turn FLOPs into step time and tokens/s
    enforce: bool = True  # refuse to start a run the estimate says cannot fit


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
