"""The contract every backend trainer meets; the shared loop (primus/train_loop.py) drives it step by step."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from primus.config.schema import PrimusConfig
from primus.context import RunContext


@dataclass
class StepResult:
    loss: float  # mean LM loss of the global batch (same value on every rank)
    grad_norm: Optional[float]  # global grad norm before clipping (None when the backend cannot tell)
    lr: float  # learning rate used by this step
    skipped: bool = False  # the optimizer skipped the update (fp16 overflow, non-finite guard)
    extra: Dict[str, float] = field(default_factory=dict)  # e.g. MoE aux loss


class Trainer(abc.ABC):
    """One backend's trainer. Built on every rank after torch.distributed is initialised (world >= 1)."""

    name: str = "?"

    def __init__(self, cfg: PrimusConfig, ctx: RunContext):
        self.cfg = cfg
        self.ctx = ctx

    @abc.abstractmethod
    def setup(self) -> Dict[str, Any]:
        """Build model, optimizer, scheduler and data. Returns facts for the log and result.json, at least
        {"params": total parameter count of the whole model (all ranks together)}."""

    @abc.abstractmethod
    def train_step(self, step: int) -> StepResult:
        """Run one optimizer step (all micro batches) and return its metrics, synchronised with the device."""

    def state_dict_for_checkpoint(self) -> Dict[str, Any]:  # issue 9
        raise NotImplementedError(f"{self.name}: checkpointing")

    def close(self) -> None:
        """Release process groups and caches."""
