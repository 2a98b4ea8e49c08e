"""The tuning feature: offline hipBLASLt GEMM tuning by stage, the guide's section 1 (see
primus/features/__init__.py). The env a run sets per stage is primus/tuning_env.py; the tuner is tuning/."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from primus.config.errors import WARNING, ConfigIssue
from primus.features import rule


@dataclass
class TuningConfig:
    stage: int = 0  # PRIMUS_HIPBLASLT_TUNING_STAGE: 0 none, 1 dump shapes, 2 tune offline, 3 use results
    enabled: Optional[bool] = None  # PRIMUS_HIPBLASLT_TUNING master switch; null = read the env var
    override_file: Optional[str] = None  # HIPBLASLT_TUNING_OVERRIDE_FILE; null = env, else the stage-2 path
    root: str = "outputs/tune_hipblaslt"  # <root>/<model>/gemm_shape and gemm_tune


def tuning_enabled(cfg) -> bool:
    if cfg.tuning.enabled is not None:
        return cfg.tuning.enabled
    return os.environ.get("PRIMUS_HIPBLASLT_TUNING") == "1"


def tuning_on(cfg) -> bool:
    """Whether the stage is honoured: the master switch on and deterministic mode off (the guide's section 1)."""
    from primus.features.training import deterministic_on

    return tuning_enabled(cfg) and not deterministic_on(cfg)


# Fields that act only under another setting (primus.features.idle_settings): without the master switch the run
# forces stage 0, as Primus's hook skips tuning; warned, since the switch is often an env var set per job
ACTS_ONLY_WITH = (
    (("stage", "override_file", "root"),
     "GEMM tuning on (tuning.enabled=true or PRIMUS_HIPBLASLT_TUNING=1) and deterministic mode off", tuning_on,
     "set tuning.enabled=true (or export PRIMUS_HIPBLASLT_TUNING=1), or drop them", WARNING),
)


@rule
def tuning_stage(cfg, ctx):
    tcfg = cfg.tuning
    if tcfg.stage not in (0, 1, 2, 3):
        return [ConfigIssue(["tuning.stage"], tcfg.stage, "must be 0, 1, 2 or 3", "use tuning_stage=0..3")]
    if tcfg.stage == 3 and tuning_on(cfg):
        from primus.tuning_env import results_file

        path = results_file(cfg)
        if not os.path.isfile(path):
            return [ConfigIssue(["tuning.override_file", "tuning.stage"], path,
                                "stage 3 trains with tuned GEMMs: the results file does not exist",
                                "run stage 1 (tuning_stage=1) and stage 2 (tuning_stage=2) first, or point "
                                "tuning.override_file / HIPBLASLT_TUNING_OVERRIDE_FILE at a results file")]
    return []
