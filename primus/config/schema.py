"""The typed schema: one dataclass per Hydra config group, composed into `PrimusConfig`.

Every YAML file under `conf/<group>/` extends its group's dataclass (registered in Hydra's ConfigStore by
`register()`), so an unknown key or a wrong type fails at compose time with Hydra's own message. Choices are Enums
because omegaconf 2.3 has no Literal. Field names are the guide's own (docs/guide.md); TorchTitan keys keep their
last component (`training.mixed_precision_param` -> `precision.mixed_precision_param`).

Each group's dataclass and enums live with its feature's rules and backend mappings (primus/features/<name>.py);
this module only composes them (and keeps them importable from here). Cross-field rules are never here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

# noqa: F401 below: the features' groups and enums, importable from here as before
from primus.features.backend import Backend, BackendConfig, Device, LayerSpec, Mode  # noqa: F401
from primus.features.checkpoint import CheckpointConfig  # noqa: F401
from primus.features.data import DataConfig, DataKind  # noqa: F401
from primus.features.launcher import LauncherConfig  # noqa: F401
from primus.features.logging import LoggingConfig, ProfileConfig  # noqa: F401
from primus.features.memory import MemoryConfig  # noqa: F401
from primus.features.model import CrossEntropyImpl, ModelConfig  # noqa: F401
from primus.features.moe import LoadBalancing, MoEConfig, ScoreFunction, TokenDispatcher  # noqa: F401
from primus.features.overlap import OverlapConfig  # noqa: F401
from primus.features.parallel import ParallelConfig  # noqa: F401
from primus.features.plan import PlanConfig  # noqa: F401
from primus.features.precision import Dtype, FP4Format, FP4Recipe, FP8Format, FP8Recipe, PrecisionConfig  # noqa: F401
from primus.features.recompute import ACMode, RecomputeConfig, RecomputeGranularity, RecomputeMethod  # noqa: F401
from primus.features.sweep import Direction, Objective, SweepConfig  # noqa: F401
from primus.features.training import LRDecay, NonFiniteAction, Optimizer, TrainingConfig  # noqa: F401
from primus.features.tuning import TuningConfig  # noqa: F401
from primus.features.turbo import TurboConfig  # noqa: F401


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
    sweep: SweepConfig = field(default_factory=SweepConfig)
    device: Device = Device.auto
    mode: Mode = Mode.train
    dry_run: bool = False  # validate and print the backend arguments as JSON, then exit
    experiment: Optional[str] = None  # name of the experiment preset, when one was chosen
    # the job's stable identity (primus/features/checkpoint.py: run_dir): a name, or "auto" (the experiment or
    # model plus a hash of the command's overrides); the run dir is then outputs/jobs/<id> for every rerun, so
    # checkpoint.resume=auto continues the job. null = a new outputs/runs/<time> dir per run, unless
    # checkpoint.resume=auto asks to continue (then "auto")
    job_id: Optional[str] = None
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

SCHEMA_GROUP = "schema"  # each group's schema is stored as `schema/<group>` (not an option of the group itself); a group's YAML files extend it with `/schema/<group>@_here_` in their defaults


def register() -> None:
    """Store the top-level schema and one schema per group in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from primus.features.checkpoint import register_resolvers

    register_resolvers()  # conf/config.yaml's hydra.run.dir reads the job identity through it
    from primus.config.help import register_resolver

    register_resolver()  # conf/hydra/help/primus.yaml's generated listings
    cs = ConfigStore.instance()
    cs.store(name="primus_schema", node=PrimusConfig)
    for group, (package, node) in GROUPS.items():
        cs.store(group=SCHEMA_GROUP, name=group, node=node, package=package)
