"""The printed plan: per-GPU memory table, throughput at the assumed MFU, verdict, and the settings that would fit."""
from __future__ import annotations

from typing import List, Optional

from primus.plan.advice import Variant
from primus.plan.gpus import GiB
from primus.plan.memory import Layout, MemoryBreakdown, Throughput


def gib(x: float) -> str:
    return f"{x / GiB:8.2f} GiB"


def _count(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def format_plan(title: str, lay: Layout, bd: MemoryBreakdown, tp: Throughput, variants: List[Variant],
                bigger: Optional[List[str]] = None) -> str:
    L = []
    L.append(f"[primus plan] {title}")
    L.append(f"  layout: world={lay.world} tp={lay.tp} pp={lay.pp} cp={lay.cp} ep={lay.ep} dp={lay.dp}"
             + (f" vp={lay.vp}" if lay.vp > 1 else "") + (f" fsdp_shard={lay.dp_shard}" if bd.backend == "torchtitan" else "")
             + f", {lay.num_microbatches} micro batch(es) per step; busiest rank: pipeline stage {bd.stage}"
             + (f" ({bd.stage_layers} layers)" if lay.pp > 1 else ""))
    L.append(f"  memory per GPU (peak during {bd.peak_phase}), target {bd.gpu}:")
    L.append(f"    parameters         {gib(bd.params)}   ({_count(bd.params_numel)} params on this rank)")
    L.append(f"    gradients          {gib(bd.grads)}")
    cpu = f", {gib(bd.optimizer_cpu).strip()} on CPU" if bd.optimizer_cpu else ""
    L.append(f"    optimizer states   {gib(bd.optimizer)}   ({_count(bd.optimizer_state_numel)} Adam elements"
             f"{', ' + _count(bd.main_params_numel) + ' fp32 main params' if bd.main_params_numel else ''}{cpu})")
    L.append(f"    activations        {gib(bd.activations)}")
    L.append(f"    temporary buffers  {gib(bd.temporary)}   (logits/loss {gib(bd.details.get('logits', 0)).strip()}, "
             f"backward working set, gather/step buffers)")
    L.append(f"    ---------------------------------")
    L.append(f"    peak allocated     {gib(bd.total)}")
    L.append(f"    + reserve          {gib(bd.reserve)}   (CUDA context, NCCL, allocator fragmentation)")
    L.append(f"    = needed           {gib(bd.needed)}   of {gib(bd.capacity).strip()}  "
             f"({100 * bd.needed / bd.capacity:.0f}%)")
    for n in bd.notes:
        L.append(f"    note: {n}")
    L.append("  throughput:")
    L.append(f"    FLOPs per token {tp.flops_per_token:.4g}; per step {tp.flops_per_step:.4g} "
             f"({tp.tokens_per_step} tokens), per GPU {tp.flops_per_gpu_step:.4g}")
    if tp.step_time_s is not None:
        L.append(f"    at {100 * tp.assumed_mfu:.0f}% MFU of {tp.peak_tflops:g} TFLOP/s ({tp.mfu_source}): step "
                 f"{tp.step_time_s:.3f} s, {tp.tokens_per_s:,.0f} tokens/s ({tp.tokens_per_s_per_gpu:,.0f} per GPU)")
    else:
        L.append("    no bf16 peak known for this GPU: step time not estimated")
    if bd.fits:
        L.append(f"  verdict: FITS ({gib(bd.headroom).strip()} headroom)")
    else:
        L.append(f"  verdict: DOES NOT FIT (short by {gib(-bd.headroom).strip()})")
    if variants:
        L.append("  what-if (estimate per GPU, needed vs capacity):")
        for v in sorted(variants, key=lambda v: (not v.fits, v.breakdown.needed)):
            mark = "fits" if v.fits else "no  "
            extra = f"; {v.note}" if v.note else ""
            L.append(f"    [{mark}] {v.label:<55} {gib(v.breakdown.needed)}  ({' '.join(v.overrides)}{extra})")
    if bigger:
        L.append("  fits as is on: " + ", ".join(bigger))
    return "\n".join(L)
