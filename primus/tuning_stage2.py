"""Stage 2 of the guide's GEMM tuning inside `train.py`: tune the dumped shapes offline; no training."""
from __future__ import annotations

import os
from typing import Any, Dict

from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.results import RESULT_FILE, write_json_atomic
from primus.tuning_env import results_file, shape_dir


def run_stage2(cfg: PrimusConfig, ctx: RunContext, meta: Dict[str, Any]) -> str:
    from tuning.tune import tune

    src, dst = shape_dir(cfg), results_file(cfg)
    if not os.path.isdir(src) or not os.listdir(src):
        raise FileNotFoundError(f"tuning stage 2: no dumped shapes in {src}; run tuning_stage=1 first "
                                f"(with tuning.enabled=true or PRIMUS_HIPBLASLT_TUNING=1)")
    print(f"[primus] tuning stage 2: {src} -> {dst} (no training in this stage)", flush=True)
    report = tune(src, dst)
    write_json_atomic(os.path.join(ctx.run_dir, RESULT_FILE),
                      {**meta, "status": "ok", "stage": 2, "results_file": os.path.abspath(dst), "report": report})
    return "ok"
