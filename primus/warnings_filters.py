"""Upstream warnings that tell a Primus user nothing they can act on, hidden where they are raised.

Each entry names the message it hides, the module that raises it and why it does not concern the user. Anything
not listed here is shown as usual: a warning about the user's own choices (e.g. megatron-core's "sequence
parallelism must be used" with tp and ep) still reaches them.

`install()` runs at the start of every run (primus/run.py) and in every worker process (primus/train_loop.py),
before the backends are imported, since most of these are raised at import time. The test suite hides the same
messages through pyproject's `filterwarnings` (tests/test_warnings_filters.py keeps both lists in step).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Type


@dataclass(frozen=True)
class Hidden:
    category: Type[Warning]
    module: str  # regex on the raising module, as warnings.filterwarnings takes it
    message: str  # regex on the start of the message
    why: str


WARNINGS = (
    Hidden(UserWarning, r"megatron\.core\..*", r"(Transformer Engine and Apex are|Apex is) not installed",
           "megatron-core announces every fallback it takes without Transformer Engine / Apex (a CPU run, or a GPU "
           "image without them); Primus picks the layer spec itself and logs which one it built"),
    Hidden(UserWarning, r"megatron\.core\.transformer\.transformer_config", r"full scope is deprecated",
           "megatron-core 0.16.1's own TransformerConfig default (cuda_graph_scope='full') trips its own "
           "deprecation for every config; Primus sets no CUDA graph scope"),
    Hidden(DeprecationWarning, r"megatron\.core\.inference\.contexts.*",
           r"The following imports from `dynamic_context\.py` will be removed",
           "megatron-core importing its own module at import time"),
    Hidden(DeprecationWarning, r"megatron\.core\..*",
           r"\s*The 'megatron\.core\.transformer\.custom_layers\.transformer_engine'",
           "megatron-core's multi-latent attention imports its own deprecated module"),
    Hidden(DeprecationWarning, r"torch\.jit\._script", r"`torch\.jit\.script_method` is deprecated",
           "raised while upstream libraries (megatron-core's fused kernels) are imported, not by a Primus setting"),
    Hidden(UserWarning, r"torchdata\.stateful_dataloader\..*", r"'set_vital' is deprecated",
           "torchdata's StatefulDataLoader (TorchTitan's dataloader) calls the deprecated torch.set_vital itself"),
    Hidden(UserWarning, r"torchtitan\.distributed\.utils", r"In CPU autocast, but the target dtype is not supported",
           "TorchTitan 0.2.2 autocasts a one-process run to precision.mixed_precision_param; CPU autocast knows only "
           "bf16 / fp16, so with float32 torch turns it off and the run stays float32, as asked"),
)

# (logger, start of the message, why) for upstream log records at WARNING level
LOG_RECORDS = (
    ("megatron.core.datasets.gpt_dataset", "Unable to save MockGPTDataset indexes because path_to_cache is None",
     "synthetic data is rebuilt from its seed in milliseconds on every run; it is never cached on purpose"),
)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


_installed = False


def install() -> None:
    """Hide the listed warnings and log records in this process (idempotent)."""
    global _installed
    if _installed:
        return
    for h in WARNINGS:
        warnings.filterwarnings("ignore", message=h.message, category=h.category, module=h.module)
    by_logger = {}
    for name, prefix, _why in LOG_RECORDS:
        by_logger.setdefault(name, []).append(prefix)
    for name, prefixes in by_logger.items():
        logging.getLogger(name).addFilter(_DropMessages(prefixes))
    _installed = True


def pytest_lines() -> list:
    """The same warnings as pytest `filterwarnings` lines (pyproject.toml holds these)."""
    return [f"ignore:{h.message}:{h.category.__name__}:{h.module}" for h in WARNINGS]

