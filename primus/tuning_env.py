"""Tuning-stage semantics of the guide (section 1): switch, deterministic mode, paths and the env a run sets.

The stage (PRIMUS_HIPBLASLT_TUNING_STAGE, `tuning_stage=N`) is honoured only when tuning is switched on
(PRIMUS_HIPBLASLT_TUNING=1 or tuning.enabled=true) and deterministic mode is off; otherwise the run forces
TE_HIPBLASLT_TUNING_RUN_COUNT=0 and TE_HIPBLASLT_TUNING_ALGO_COUNT=0. The tuner itself lives in `tuning/`.
"""
from __future__ import annotations

import os
from typing import Dict

from primus.config.schema import PrimusConfig
from primus.features.tuning import tuning_on


def model_root(cfg: PrimusConfig) -> str:
    return os.path.join(cfg.tuning.root, cfg.model.name)


def shape_dir(cfg: PrimusConfig) -> str:
    return os.path.join(model_root(cfg), "gemm_shape")


def tune_dir(cfg: PrimusConfig) -> str:
    return os.path.join(model_root(cfg), "gemm_tune")


def results_file(cfg: PrimusConfig) -> str:
    """Stage-3 input: tuning.override_file, else HIPBLASLT_TUNING_OVERRIDE_FILE, else the stage-2 output."""
    return (cfg.tuning.override_file or os.environ.get("HIPBLASLT_TUNING_OVERRIDE_FILE")
            or os.path.join(tune_dir(cfg), "tune_hipblas_gemm_results.txt"))


def effective_stage(cfg: PrimusConfig) -> int:
    return cfg.tuning.stage if tuning_on(cfg) else 0


def tuning_env(cfg: PrimusConfig, rocm: bool, node_rank: int = 0) -> Dict[str, str]:
    """Env vars the run sets for its stage (before any GPU work)."""
    stage = effective_stage(cfg)
    env: Dict[str, str] = {"PRIMUS_HIPBLASLT_TUNING_STAGE": str(stage)}
    if not tuning_on(cfg):
        env.update(TE_HIPBLASLT_TUNING_RUN_COUNT="0", TE_HIPBLASLT_TUNING_ALGO_COUNT="0")
        return env
    env["PRIMUS_HIPBLASLT_TUNING"] = "1"
    if stage == 0:  # Transformer Engine's in-process tuning, as the original does with tuning on at stage 0
        env.update(TE_HIPBLASLT_TUNING_RUN_COUNT="10", TE_HIPBLASLT_TUNING_ALGO_COUNT="50")
        return env
    env.update(TE_HIPBLASLT_TUNING_RUN_COUNT="0", TE_HIPBLASLT_TUNING_ALGO_COUNT="0")
    if stage == 1 and rocm:  # hipBLASLt's own log, one file per node (CUDA records at the torch level instead)
        from tuning.shapes import rocm_dump_env

        env.update(rocm_dump_env(os.path.abspath(model_root(cfg)), node_rank))
    if stage == 3 and rocm:  # CUDA routes tuned GEMMs in-process instead (tuning.apply.install_tuned_linear)
        from tuning.apply import rocm_override_env

        env.update(rocm_override_env(results_file(cfg)))
    return env
