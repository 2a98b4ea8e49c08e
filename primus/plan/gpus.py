"""GPU memory capacity by name: the planner's targets (H100 80 GB, H200 141 GB, MI300X 192 GB, MI325X 256 GB,
MI355X 288 GB), detected from torch when a GPU is present, else taken from `plan.gpu` / `plan.gpu_memory_gb`.

Capacities are what the framework can allocate (torch's `total_memory`), not the marketing number: an H200 "141 GB"
card reports about 139.8 GiB to torch, an H100 "80 GB" about 79.2 GiB. GiB throughout (2**30 bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

GiB = float(1 << 30)

# name fragment -> (nominal label, usable GiB as torch reports total_memory, HBM bandwidth in TB/s: the vendors'
# figure, with which the pick's step-time model prices memory-bound work). More specific first.
GPUS = [
    ("H100 PCIe", ("H100 PCIe 80 GB", 79.2, 2.0)),
    ("H100", ("H100 80 GB", 79.2, 3.35)),
    ("H200", ("H200 141 GB", 139.8, 4.8)),
    ("MI300X", ("MI300X 192 GB", 191.98, 5.3)),
    ("MI325X", ("MI325X 256 GB", 255.98, 6.0)),
    ("MI355X", ("MI355X 288 GB", 287.98, 8.0)),
]
KNOWN = [frag for frag, _ in GPUS if frag != "H100 PCIe"]  # the names `plan.gpu` accepts (and the advice's "bigger GPU")


@dataclass
class Gpu:
    name: str  # short name (H200) or the device name torch reported
    label: str  # what the report prints: "H200 141 GB"
    capacity_bytes: float  # bytes the framework can allocate
    source: str  # "detected" | "plan.gpu" | "plan.gpu_memory_gb"
    hbm_tbps: Optional[float] = None  # HBM bandwidth (GPUS), None for a GPU the table does not know


def lookup(name: str) -> Optional[Gpu]:
    for frag, (label, gib, tbps) in GPUS:
        if frag.lower() in name.lower():
            return Gpu(name=frag, label=label, capacity_bytes=gib * GiB, source="plan.gpu", hbm_tbps=tbps)
    return None


def detect() -> Optional[Gpu]:
    """The local GPU from torch, or None without importing torch when there is clearly no GPU."""
    from primus.context import gpu_present

    if not gpu_present():
        return None
    import torch

    name = torch.cuda.get_device_name(0)
    total = float(torch.cuda.get_device_properties(0).total_memory)
    known = lookup(name)
    return Gpu(name=known.name if known else name, label=f"{name} ({total / GiB:.1f} GiB)", capacity_bytes=total,
               source="detected", hbm_tbps=known.hbm_tbps if known else None)


def resolve_gpu(gpu: Optional[str], gpu_memory_gb: Optional[float], allow_detect: bool = True) -> Gpu:
    """Precedence: an explicit `plan.gpu_memory_gb`, then an explicit `plan.gpu` name, then the local GPU, then H200."""
    if gpu_memory_gb:
        label = f"{gpu or 'GPU'} {gpu_memory_gb:g} GiB"
        named = lookup(gpu) if gpu else None
        return Gpu(name=gpu or "custom", label=label, capacity_bytes=float(gpu_memory_gb) * GiB,
                   source="plan.gpu_memory_gb", hbm_tbps=named.hbm_tbps if named else None)
    if gpu:
        found = lookup(gpu)
        if found is None:
            raise ValueError(f"unknown GPU {gpu!r}: use one of {KNOWN} or set plan.gpu_memory_gb")
        return found
    if allow_detect:
        found = detect()
        if found is not None:
            return found
    return lookup("H200")
