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

# The features' own groups, composed into PrimusConfig below (and importable from here, as before)
from primus.features.model import CrossEntropyImpl, ModelConfig  # noqa: F401
from primus.features.moe import LoadBalancing, MoEConfig, ScoreFunction, TokenDispatcher  # noqa: F401
from primus.features.precision import Dtype, FP4Format, FP4Recipe, FP8Format, FP8Recipe, PrecisionConfig  # noqa: F401
from primus.features.turbo import TurboConfig  # noqa: F401


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
