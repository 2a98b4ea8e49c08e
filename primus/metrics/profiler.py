"""torch.profiler trace for a window of steps, a kernel-category breakdown, and CUDA memory snapshots.

The trace is Chrome-trace JSON (opens in Perfetto and TensorBoard's profiler); each profiled step is a
`ProfilerStep#N` range. The printed table splits step time into GEMM / attention / elementwise / communication /
optimizer shares: the breakdown performance work starts from. On the megatron backend a second table splits it by
model phase (router, dispatch/permute, experts, combine/unpermute, shared experts, attention, dense MLP,
gradient accumulation, optimizer, other; see phases.py).
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from primus.config.schema import PrimusConfig
from primus.context import RunContext

CATEGORIES: List[Tuple[str, re.Pattern]] = [
    ("communication", re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all|c10d|gloo|broadcast|send|recv", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*(mha|sdp)|_efficient_attention|softmax", re.I)),
    ("optimizer", re.compile(r"adam|optimizer|multi_tensor|foreach|_fused_sgd|clip_grad|lamb", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|cublas|hipblaslt|nvjet|matmul|\bmm\b|aten::mm|aten::addmm|aten::bmm|"
                        r"aten::linear|_scaled_mm|sm90_|sm80_|wgmma|grouped_mm|Cijk_", re.I)),
]


def categorize(name: str) -> str:
    for cat, pat in CATEGORIES:
        if pat.search(name):
            return cat
    return "elementwise/other"


class StepProfiler:
    def __init__(self, cfg: PrimusConfig, ctx: RunContext):
        p = cfg.profile
        self.cfg, self.ctx = cfg, ctx
        self.active = p.enabled and ctx.rank in p.ranks
        self.snapshot = p.memory_snapshot and ctx.device == "cuda" and ctx.rank in p.ranks
        self.first, self.last = p.start_step, p.start_step + p.steps - 1
        self.snap_last = p.start_step + p.memory_snapshot_steps - 1
        self.out_dir = os.path.join(ctx.run_dir, "profile")
        self.prof = None
        self._range = None
        self.trace_path: Optional[str] = None
        self.snapshot_path: Optional[str] = None
        self.table: Optional[str] = None
        self.phase_table: Optional[str] = None
        self.phases: Optional[dict] = None
        self._trainer = None
        self._wrapped = None

    def attach(self, trainer) -> None:
        """The trainer whose model gets phase ranges inside the window (megatron: its `model` chunks)."""
        self._trainer = trainer

    def _install_phases(self) -> None:
        if self._trainer is None or self.cfg.backend.name.value != "megatron":
            return
        from primus.metrics import phases

        self._wrapped = phases.install(self._trainer.model, getattr(self._trainer, "optimizer", None))

    def _remove_phases(self) -> None:
        if self._wrapped is not None:
            self._wrapped.remove()

    def before_step(self, step: int) -> None:
        import torch

        if self.snapshot and step == self.first:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        if not self.active or not (self.first <= step <= self.last):
            return
        if step == self.first:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.ctx.device == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts, record_shapes=self.cfg.profile.record_shapes,
                                               with_stack=self.cfg.profile.with_stack)
            self.prof.start()
            self._install_phases()
        self._range = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._range.__enter__()

    def after_step(self, step: int) -> None:
        import torch

        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self.snapshot and step == self.snap_last:
            os.makedirs(self.out_dir, exist_ok=True)
            self.snapshot_path = os.path.join(self.out_dir, f"memory_snapshot_rank{self.ctx.rank}.pickle")
            torch.cuda.memory._dump_snapshot(self.snapshot_path)
            torch.cuda.memory._record_memory_history(enabled=None)
            print(f"[primus] memory snapshot: {self.snapshot_path} (open at https://pytorch.org/memory_viz)", flush=True)
        if self.prof is not None and step == self.last:
            self.prof.stop()
            self._remove_phases()
            os.makedirs(self.out_dir, exist_ok=True)
            self.trace_path = os.path.join(self.out_dir, f"trace_rank{self.ctx.rank}.json")
            self.prof.export_chrome_trace(self.trace_path)
            self.table = kernel_table(self.prof, self.ctx.device == "cuda", self.cfg.profile.top_kernels,
                                      self.cfg.profile.steps)
            with open(os.path.join(self.out_dir, f"kernels_rank{self.ctx.rank}.md"), "w") as f:
                f.write(self.table + "\n")
            print(f"[primus] profiler trace: {self.trace_path}\n{self.table}", flush=True)
            if self._wrapped is not None:
                self._write_phases()
            self.prof = None

    def _write_phases(self) -> None:
        from primus.metrics import phases

        on_gpu, steps = self.ctx.device == "cuda", self.cfg.profile.steps
        per, total = phases.phase_breakdown(self.prof.events(), on_gpu)
        self.phase_table = phases.phase_table(per, total, on_gpu, steps, self._wrapped.compiled_layers)
        self.phases = phases.as_json(per, total, steps)
        path = os.path.join(self.out_dir, f"phases_rank{self.ctx.rank}.md")
        with open(path, "w") as f:
            f.write(self.phase_table + "\n")
        print(f"[primus] step by phase ({path}):\n{self.phase_table}", flush=True)

    def close(self) -> None:
        if self.prof is not None:  # the run ended inside the window: keep what was recorded
            self.prof.stop()
            self.prof = None
        self._remove_phases()


def is_annotation(e) -> bool:
    """A record_function range mirrored on the GPU timeline (kineto's gpu_user_annotation: inductor's
    "## Call CompiledFxGraph ... ##", "Optimizer.step#AdamW.step", ...). Its GPU time is the time of the kernels
    it encloses, which are rows of their own: counting it would count them twice (measured on the H200: the
    category table read 50% "elementwise" for compiled models until these were dropped)."""
    if getattr(e, "is_user_annotation", False):
        return True
    return e.key.startswith("## ") and e.key.endswith(" ##")


def kernel_breakdown(events, on_gpu: bool) -> Tuple[Dict[str, float], List[Tuple[str, float, int]]]:
    """(time per category in us, [(kernel, us, calls)]) from profiler key averages (GPU time on a GPU)."""
    per_cat: Dict[str, float] = defaultdict(float)
    rows = []
    for e in events:
        if on_gpu:
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = getattr(e, "self_cuda_time_total", 0.0)
            if not t or e.key.startswith("ProfilerStep") or is_annotation(e):
                continue
            # device-side kernels only: CPU ops carry the GPU time of their children too
            if getattr(e, "device_type", None) is not None and "CUDA" not in str(e.device_type) and "PrivateUse" not in str(e.device_type):
                continue
        else:
            t = e.self_cpu_time_total
            if not t or e.key.startswith("ProfilerStep") or not e.key.startswith("aten::"):
                continue
        per_cat[categorize(e.key)] += t
        rows.append((e.key, t, e.count))
    rows.sort(key=lambda r: -r[1])
    return dict(per_cat), rows


def kernel_table(prof, on_gpu: bool, top: int, steps: int) -> str:
    per_cat, rows = kernel_breakdown(prof.key_averages(), on_gpu)
    total = sum(per_cat.values()) or 1.0
    unit = "GPU kernel" if on_gpu else "CPU (aten ops)"
    lines = [f"| category | time/step (ms) | share of {unit} time |", "|---|---:|---:|"]
    for cat, t in sorted(per_cat.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cat} | {t / 1000 / steps:.2f} | {100 * t / total:.1f}% |")
    lines += ["", f"| top kernels | time/step (ms) | calls/step | share |", "|---|---:|---:|---:|"]
    for name, t, n in rows[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{short}` | {t / 1000 / steps:.3f} | {n / steps:.0f} | {100 * t / total:.1f}% |")
    return "\n".join(lines)


def trace_steps(trace_path: str) -> List[str]:
    """Names of the ProfilerStep ranges in an exported trace (used by tests and tools)."""
    with open(trace_path) as f:
        trace = json.load(f)
    return sorted({ev["name"] for ev in trace.get("traceEvents", []) if str(ev.get("name", "")).startswith("ProfilerStep#")})
