"""Every CPU-only redirection the TorchTitan backend needs, in one place (never active on a GPU).

TorchTitan 0.2.2 assumes an accelerator. With torch 2.13 CPU it trains once these upstream behaviours are
worked around (each item is a registered workaround, `WORKAROUNDS`, applied by
`primus.backends.torchtitan.patches.apply`):

1. Device type: `torchtitan.tools.utils` resolves `device_type` / `device_module` at import time and falls back to
   "cuda" / torch.cuda when no accelerator is found; several modules copy both names at import. We point them
   all at "cpu".
2. Memory monitor: its DeviceMemoryMonitor calls get_device_name, get_device_properties().total_memory,
   reset_peak_memory_stats, empty_cache and memory_stats on the device module; `torch.cpu` has none of these.
   A small stand-in module answers them (no peak statistics on CPU) and forwards everything else to torch.cpu.
3. Process-group timeout helper: `torchtitan.distributed.utils.set_pg_timeouts` (called after the first step)
   runs `barrier(device_ids=[current_device()])`; c10d rejects device ids for a CPU/gloo group. Ours barriers
   without them, then sets the same timeouts.
4. FSDP reduce op: TorchTitan disables FSDP's gradient division (factor 1.0), which makes FSDP2 reduce-scatter
   with PREMUL_SUM(1.0); gloo has no PREMUL_SUM. FSDP2's own `set_force_sum_reduction_for_comms` switches to a
   plain SUM (then divides by 1.0, a no-op), applied right after TorchTitan's parallelize function.
5. MoE token counts: TorchTitan's router and token reorderer count tokens per expert with `torch.histc` on the
   int64 expert indices; CPU histc has no integer kernel. Inside `torchtitan.models.moe.moe` only, histc of an
   integer tensor is computed on a float copy and cast back (counts are exact: far below 2**24).
6. Peak FLOPS: `torchtitan.tools.utils.get_peak_flops` (called by the Trainer and its MetricsProcessor) runs
   `lspci` to spot an H100, warns when lspci is missing, then warns "Peak flops undefined for: cpu, fallback to
   A100" and computes MFU against an A100. A CPU has no such peak: ours returns NaN (TorchTitan's MFU is then
   NaN, "unknown", as Primus' own meter reports "MFU n/a") without running lspci.

All are applied on a version mismatch too (with the registry's warning): without them TorchTitan cannot train on
CPU at all, and each one gives a CUDA-only call its CPU meaning.
"""
from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace

import torch

from primus.backends.torchtitan import PINNED_VERSION
from primus.patches.registry import TORCH, Conditions, Workaround, pin

_SUM_REDUCTION = False  # (4) on: after_parallelize switches FSDP units to SUM

# torchtitan modules that bind `device_type` / `device_module` at import time
_DEVICE_MODULES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiling",
)


class _CpuDeviceModule:
    """torch.cpu plus the memory-monitor calls it lacks (2)."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        return SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def memory_stats(device=None) -> dict:
        return {}  # the monitor reads .get(key, -1): "unknown"

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def _set_pg_timeouts(timeout: timedelta, parallel_dims) -> None:
    """(3) TorchTitan's helper without the device ids in its barrier."""
    import warnings

    torch.distributed.barrier()
    groups = [mesh.get_group() for mesh in parallel_dims.get_all_one_dimensional_meshes().values()] + [None]
    with warnings.catch_warnings():
        # c10d warns for groups whose backend it cannot retime; timeouts are best effort on CPU
        warnings.filterwarnings("ignore", message="Set timeout is now only supported")
        for group in groups:
            torch.distributed.distributed_c10d._set_pg_timeout(timeout, group)


class _TorchWithIntegerHistc:
    """The `torch` module as torchtitan's MoE module sees it: histc also takes integer tensors (5)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def histc(input, *args, **kwargs):
        if input.is_floating_point():
            return torch.histc(input, *args, **kwargs)
        return torch.histc(input.float(), *args, **kwargs).to(input.dtype)


def _device_type(_cond: Conditions) -> None:
    """(1)"""
    import importlib

    for name in _DEVICE_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, "device_type"):
            mod.device_type = "cpu"


def _memory_monitor(_cond: Conditions) -> None:
    """(2)"""
    import importlib

    module = _CpuDeviceModule()
    for name in _DEVICE_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, "device_module"):
            mod.device_module = module


def _pg_timeouts(_cond: Conditions) -> None:
    """(3)"""
    import torchtitan.distributed.utils as dist_utils

    dist_utils.set_pg_timeouts = _set_pg_timeouts


def _fsdp_sum_reduction(_cond: Conditions) -> None:
    """(4): switched on here, done per model by `after_parallelize` (the train spec's parallelize function)."""
    global _SUM_REDUCTION
    _SUM_REDUCTION = True


def _integer_histc(_cond: Conditions) -> None:
    """(5)"""
    import torchtitan.models.moe.moe as moe

    moe.torch = _TorchWithIntegerHistc()


def _no_peak_flops(device_name: str) -> float:
    """(6)"""
    return float("nan")


def _peak_flops(_cond: Conditions) -> None:
    """(6)"""
    import torchtitan.tools.utils as tt_utils

    tt_utils.get_peak_flops = _no_peak_flops


def after_parallelize(model: torch.nn.Module) -> torch.nn.Module:
    """(4) SUM instead of PREMUL_SUM for every FSDP unit; a no-op off CPU or without FSDP."""
    if not _SUM_REDUCTION:
        return model
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    return model


def _cpu_run(cond: Conditions) -> bool:
    return cond.device == "cpu"


_TT = pin("torchtitan", PINNED_VERSION)

WORKAROUNDS = (
    Workaround(
        "torchtitan.cpu.device_type",
        "torchtitan.tools.utils.device_type (copied at import by components.metrics, distributed.utils, "
        "distributed.parallel_dims, tools.profiling)",
        "falls back to 'cuda' when no accelerator is found (item 1)",
        (_TT,), "device is CPU", _cpu_run, _device_type),
    Workaround(
        "torchtitan.cpu.memory_monitor",
        "torchtitan.tools.utils.device_module (and its copies) as used by DeviceMemoryMonitor",
        "falls back to torch.cuda; torch.cpu has no get_device_name / get_device_properties / memory_stats / "
        "reset_peak_memory_stats / empty_cache (item 2)",
        (_TT,), "device is CPU", _cpu_run, _memory_monitor),
    Workaround(
        "torchtitan.cpu.pg_timeouts_barrier",
        "torchtitan.distributed.utils.set_pg_timeouts",
        "barrier(device_ids=[current_device()]): c10d rejects device ids for a CPU / gloo group (item 3)",
        (_TT,), "device is CPU", _cpu_run, _pg_timeouts),
    Workaround(
        "torchtitan.cpu.fsdp_sum_reduction",
        "TorchTitan's FSDP2 setup (gradient divide factor 1.0) -> reduce-scatter with PREMUL_SUM",
        "gloo has no PREMUL_SUM (item 4)",
        (_TT, pin("torch", *TORCH)), "device is CPU", _cpu_run, _fsdp_sum_reduction),
    Workaround(
        "torchtitan.cpu.moe_integer_histc",
        "torch.histc on int64 expert indices in torchtitan.models.moe.moe (router, token reorderer)",
        "CPU histc has no integer kernel (item 5)",
        (_TT, pin("torch", *TORCH)), "device is CPU", _cpu_run, _integer_histc),
    Workaround(
        "torchtitan.cpu.peak_flops",
        "torchtitan.tools.utils.get_peak_flops (Trainer.__init__, MetricsProcessor.__init__)",
        "runs lspci, then warns 'Peak flops undefined for: cpu, fallback to A100' and uses an A100's peak for "
        "MFU (item 6)",
        (_TT,), "device is CPU", _cpu_run, _peak_flops),
)
