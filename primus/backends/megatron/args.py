"""Config -> the exact megatron-core arguments (JSON-able), and the rules this backend/device adds.

Imports neither megatron nor torch: `dry_run=true` prints `build_args` in well under a second. The trainer turns
the same dict into megatron objects (dtype names -> torch dtypes, activation name -> function), so what a dry run
shows is what megatron gets. Keys inside `transformer_config`, `ddp_config`, `optimizer_config` and `scheduler`
are megatron-core 0.16.1's own keyword names. Each feature maps its own keys (primus/features/<name>.py:
`megatron()`) and says what this backend cannot honour (`megatron_issues()`); this module merges them.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from importlib import metadata
from typing import Any, Dict, List, Optional

from primus.config.errors import ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.features import backend_issues, backend_mapping, merged, other_backend_issues
from primus.features.backend import PINNED_MCORE
from primus.features.model import activation_fusion, rope_fusion, turbo_loss  # noqa: F401 - read by the planner
from primus.features.parallel import num_microbatches  # noqa: F401 - read from here by the trainer and planner
from primus.features.precision import fp8_weight_cache, portable_fp8_available, te_available  # noqa: F401
from primus.features.recompute import replays_linears  # noqa: F401
from primus.features.turbo import turbo_args  # noqa: F401 - read from here by the planner


@lru_cache(maxsize=None)
def mcore_version() -> Optional[str]:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolved_layer_spec(cfg: PrimusConfig) -> str:
    want = cfg.backend.layer_spec.value
    if want == "auto":
        return "te" if te_available() else "local"
    return want


GRAD_REDUCE_IN_FP32 = True  # Megatron-LM's default for bf16: fp32 main grads, reduced in fp32


def compiled_loss(cfg: PrimusConfig) -> bool:
    """perf.compile_loss applies: training.compile, the vocabulary not split over TP ranks, and no fused cross entropy
    asked for (model.cross_entropy_loss_fusion: megatron's native / TE one, or primus' Triton one, turbo_loss)."""
    return bool(cfg.training.compile and cfg.parallel.tensor_model_parallel_size == 1
                and not cfg.model.cross_entropy_loss_fusion and not turbo_loss(cfg))


def build_args(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    """What the trainer hands megatron-core: the few backend-wide settings below, merged with every feature's
    `megatron()`."""
    own = {
        "transformer_config": {"deallocate_pipeline_outputs": True, "variable_seq_lengths": False},
        "ddp_config": {"grad_reduce_in_fp32": GRAD_REDUCE_IN_FP32},
        "compile_loss": compiled_loss(cfg),
    }
    return merged([own, backend_mapping("megatron", cfg, ctx)])


# ------------------------------------------------------------------------------------------------ capability rules


def _issue(keys, value, rule, fix) -> ConfigIssue:
    return ConfigIssue(list(keys), value, rule, fix)


def capability_issues(cfg: PrimusConfig, ctx: RunContext) -> List[ConfigIssue]:
    """What megatron-core as installed, on this device, cannot do: each feature's `megatron_issues`, and the
    TorchTitan-only fields set (each feature's `torchtitan_only`)."""
    if mcore_version() is None:
        return [_issue(["backend.name"], "megatron", "megatron-core is not installed",
                       f"pip install megatron-core=={PINNED_MCORE}")]
    return other_backend_issues("megatron", cfg) + backend_issues("megatron", cfg, ctx)
