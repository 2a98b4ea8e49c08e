"""Per-step throughput, MFU and memory, with the same names for every backend; step-time statistics for results."""
from __future__ import annotations

import math
import resource
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional

from primus.config.schema import PrimusConfig
from primus.context import RunContext
from primus.metrics.flops import flops_per_token
from primus.metrics.peaks import peak_tflops


def peak_memory_gib(device: str) -> float:
    """Peak device memory allocated by torch on GPU; peak resident set size of this process on CPU."""
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


@dataclass
class StepLine:
    step: int
    loss: float
    grad_norm: Optional[float]
    lr: float
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: Optional[float]
    mem_gib: float
    skipped: bool = False  # the optimizer did not apply this step's update
    loss_scale: Optional[float] = None  # fp16's loss scale after the step
    phases: Optional[Dict[str, float]] = None  # the backend's split of step_time_s (StepResult.phases)
    optimizer_split: Optional[Dict[str, float]] = None  # the parts of phases["optimizer_s"] (StepResult's)

    def format(self, total_steps: int) -> str:
        gn = "n/a" if self.grad_norm is None else f"{self.grad_norm:.3f}"
        mfu = "n/a" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        ls = self.loss_scale
        tail = "" if ls is None else f" | loss scale {ls:.0f}" if ls >= 1 and ls.is_integer() else f" | loss scale {ls:g}"
        if self.skipped:  # megatron's fp16 scaler skips steps whose gradients overflowed while the scale comes down
            tail += " | update skipped"
        return (f"step {self.step:>5}/{total_steps} | loss {self.loss:.4f} | grad_norm {gn} | lr {self.lr:.3e} | "
                f"step_time {self.step_time_s * 1000:.1f} ms | tokens/s {self.tokens_per_s:,.0f} "
                f"({self.tokens_per_s_per_gpu:,.0f}/gpu) | TFLOP/s/gpu {self.tflops_per_gpu:.1f} | MFU {mfu} | "
                f"mem {self.mem_gib:.2f} GiB{tail}")


class Meter:
    def __init__(self, cfg: PrimusConfig, ctx: RunContext):
        self.cfg, self.ctx = cfg, ctx
        t = cfg.training
        from primus.features.training import global_batch

        self.tokens_per_step = global_batch(cfg, ctx.world_size) * t.seq_length
        self.flops_per_token = flops_per_token(cfg.model, t.seq_length)
        self.flops_per_token_causal = flops_per_token(cfg.model, t.seq_length, causal=True)
        peaks = peak_tflops(ctx.gpu_name)
        self.peak_bf16 = peaks[0] if peaks else None
        self.peak_fp8 = peaks[1] if peaks else None
        self.lines: List[StepLine] = []

    def step(self, step: int, loss: float, grad_norm: Optional[float], lr: float, step_time_s: float,
             skipped: bool = False, loss_scale: Optional[float] = None,
             phases: Optional[Dict[str, float]] = None,
             optimizer_split: Optional[Dict[str, float]] = None) -> StepLine:
        tps = self.tokens_per_step / step_time_s
        per_gpu = tps / self.ctx.world_size
        tflops = per_gpu * self.flops_per_token / 1e12
        mfu = tflops / self.peak_bf16 if self.peak_bf16 else None
        line = StepLine(step, loss, grad_norm, lr, step_time_s, tps, per_gpu, tflops, mfu, peak_memory_gib(self.ctx.device),
                        skipped, loss_scale, phases or None, optimizer_split or None)
        self.lines.append(line)
        return line

    def summary(self) -> Dict:
        """Statistics over the steps after timing_warmup_steps (all steps if the run was shorter)."""
        warm = self.cfg.training.timing_warmup_steps
        timed = self.lines[warm:] or self.lines
        if not timed:
            return {}
        times = [l.step_time_s for l in timed]
        med = statistics.median(times)
        tps = self.tokens_per_step / med
        per_gpu = tps / self.ctx.world_size
        tflops = per_gpu * self.flops_per_token / 1e12
        return {
            "timed_steps": len(timed),
            "warmup_steps_excluded": len(self.lines) - len(timed),
            "step_time_s": {"median": med, "mean": statistics.fmean(times), "min": min(times), "max": max(times),
                            "stdev": statistics.pstdev(times)},
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": per_gpu,
            "tflops_per_gpu": tflops,
            "flops_per_token": self.flops_per_token,
            "mfu": tflops / self.peak_bf16 if self.peak_bf16 else None,
            "mfu_formula": "tokens/s/gpu x (6 N + 12 L H Dh S) / bf16 dense peak",
            # the same run under the other conventions people quote: causal-halved attention, and the fp8 peak
            "mfu_causal": per_gpu * self.flops_per_token_causal / 1e12 / self.peak_bf16 if self.peak_bf16 else None,
            "mfu_fp8_peak": tflops / self.peak_fp8 if self.peak_fp8 else None,
            "peak_tflops_bf16": self.peak_bf16,
            "peak_tflops_fp8": self.peak_fp8,
            "peak_memory_gib": max(l.mem_gib for l in self.lines),
            "first_loss": self.lines[0].loss,
            "final_loss": self.lines[-1].loss,
            "losses": [l.loss for l in self.lines],
            "skipped_steps": [l.step for l in self.lines if l.skipped],
            **({"loss_scale": self.lines[-1].loss_scale} if self.lines[-1].loss_scale is not None else {}),
            **self._split(timed),
        }

    @staticmethod
    def _split(timed: List[StepLine]) -> Dict:
        """The median seconds of each part of the timed steps, and what the step spent outside them (the loop, the
        loss reduction), where the backend times its parts."""
        if not all(l.phases for l in timed):
            return {}
        split = {k: statistics.median(l.phases[k] for l in timed) for k in timed[0].phases}
        split["other_s"] = max(0.0, statistics.median(l.step_time_s - sum(l.phases.values()) for l in timed))
        out = {"step_split_s": split}
        if all(l.optimizer_split for l in timed):
            out["optimizer_split_s"] = {k: statistics.median(l.optimizer_split[k] for l in timed)
                                        for k in timed[0].optimizer_split}
        return out


def is_finite(x: Optional[float]) -> bool:
    return x is None or math.isfinite(x)
