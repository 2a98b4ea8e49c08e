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
    loss_scale: Optional[float] = None  # fp16: the dynamic loss scale after this step (None: no scaling)
    extra: Dict[str, float] = field(default_factory=dict)  # e.g. MoE aux loss
    # seconds of the step's parts where the backend can tell them apart (forward_backward_s, optimizer_s): with an
    # offloaded optimizer the second is the CPU step plus its transfers, the figure that global batch amortises
    phases: Dict[str, float] = field(default_factory=dict)
    # with an offloaded optimizer (megatron): optimizer_s's parts, cpu_adam_s / d2h_wait_s / rest_s
    # (primus/backends/megatron/offload_split.py); not added to the step's sum
    optimizer_split: Dict[str, float] = field(default_factory=dict)


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

    def evaluate(self, step: int) -> Optional[float]:
        """The mean loss over training.eval_iters global batches of held-out data, forward only, the same value on
        every rank; None when the run does not evaluate (training.eval_interval=0)."""
        return None

    # ------------------------------------------------------------------ checkpoints (primus/checkpoint.py)
    def save_checkpoint(self, path: str, step: int) -> Dict[str, Any]:
        """Write model, optimizer, LR scheduler and data position after `step` into the (temporary) directory
        `path`, collectively on every rank. Returns small JSON-able facts for primus_meta.json (e.g. the data
        position). The caller adds the RNG states, the meta file with sizes/crc32 and the atomic rename."""
        raise NotImplementedError(f"backend {self.name}: checkpoints are not implemented")

    def load_checkpoint(self, path: str, meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Restore what save_checkpoint wrote (called after setup, on every rank); `meta` is primus_meta.json.
        The next train_step must then be step meta["step"] + 1."""
        raise NotImplementedError(f"backend {self.name}: checkpoints are not implemented")

    def close(self) -> None:
        """Release process groups and caches."""
