"""Deterministic mode (the guide's PRIMUS_DETERMINISTIC): bitwise-identical reruns with the same seed.

It implies no torch.compile and no GEMM tuning (validate() refuses both), deterministic kernels in torch, a fixed
cuBLAS workspace, and a fixed NCCL algorithm/protocol so collectives reduce in the same order every run.
"""
from __future__ import annotations

import os
import random
from typing import Dict

from primus.config.schema import PrimusConfig
from primus.features.training import deterministic_on

DETERMINISTIC_ENV = {
    "PRIMUS_DETERMINISTIC": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # cuBLAS picks reproducible reductions only with a fixed workspace
    "NCCL_ALGO": "Ring",  # tree/NVLS algorithms may change the reduction order between runs
    "NCCL_PROTO": "Simple",
    "TORCH_NCCL_ENABLE_TIMING": "0",
}


def apply(cfg: PrimusConfig, rank: int = 0) -> Dict[str, str]:
    """Seed every RNG; in deterministic mode also set the env and torch switches. Returns the env it set."""
    import numpy as np
    import torch

    seed = cfg.training.seed + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(cfg.training.seed)
    if not deterministic_on(cfg):
        return {}
    os.environ.update(DETERMINISTIC_ENV)
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return dict(DETERMINISTIC_ENV)
