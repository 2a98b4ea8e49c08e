"""Where per-step metrics go besides the log line: TensorBoard event files and, optionally, W&B offline.

Tag names are the same for every backend (`train/loss`, `perf/tokens_per_s_per_gpu`, ...), so runs of both
backends overlay in one TensorBoard.
"""
from __future__ import annotations

import os
from typing import List, Optional

from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.metrics.meter import StepLine

TAGS = {
    "train/loss": "loss",
    "train/grad_norm": "grad_norm",
    "train/lr": "lr",
    "perf/step_time_s": "step_time_s",
    "perf/tokens_per_s": "tokens_per_s",
    "perf/tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
    "perf/tflops_per_gpu": "tflops_per_gpu",
    "perf/mfu": "mfu",
    "memory/peak_gib": "mem_gib",
    "train/loss_scale": "loss_scale",  # fp16 only (None otherwise, not written)
}
VAL_LOSS_TAG = "val/loss"  # after each evaluation (training.eval_interval)


class TensorBoardSink:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def write(self, line: StepLine) -> None:
        for tag, attr in TAGS.items():
            v = getattr(line, attr)
            if v is not None:
                self.writer.add_scalar(tag, v, line.step)

    def scalars(self, values, step: int) -> None:
        """Metrics outside the step line (val/loss after an evaluation)."""
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: PrimusConfig, run_dir: str):
        import wandb  # validate.wandb_installed checked it before the run

        os.environ.setdefault("WANDB_MODE", "offline")
        self.run = wandb.init(project=cfg.logging.wandb_project, dir=run_dir, mode="offline",
                              name=os.path.basename(run_dir))

    def write(self, line: StepLine) -> None:
        self.run.log({tag: getattr(line, a) for tag, a in TAGS.items() if getattr(line, a) is not None}, step=line.step)

    def scalars(self, values, step: int) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


def open_sinks(cfg: PrimusConfig, ctx: RunContext) -> List:
    """Rank 0 only; others log nothing."""
    if not ctx.is_rank0:
        return []
    sinks: List = []
    if cfg.logging.tensorboard:
        sinks.append(TensorBoardSink(os.path.join(ctx.run_dir, "tensorboard")))
    if cfg.logging.wandb:
        sinks.append(WandbSink(cfg, ctx.run_dir))
    return sinks


def close_sinks(sinks: Optional[List]) -> None:
    for s in sinks or []:
        s.close()
