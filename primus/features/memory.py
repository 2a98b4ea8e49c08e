"""The memory feature: distributed / offloaded / precision-aware optimizer state, the allocator's cache and
TorchTitan's FSDP CPU offload (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass

from primus.config.errors import ConfigIssue
from primus.features import rule


@dataclass
class MemoryConfig:
    use_distributed_optimizer: bool = False  # shard optimizer state over dp
    optimizer_cpu_offload: bool = False  # optimizer state and step on CPU
    optimizer_offload_fraction: float = 1.0  # share of optimizer state offloaded
    # megatron's HybridDeviceOptimizer on side streams: each CPU sub-optimizer's grads come down and its params go
    # back up while the others step (the offloaded step's transfers hidden behind its CPU Adam)
    overlap_cpu_optimizer_d2h_h2d: bool = False
    use_precision_aware_optimizer: bool = False  # low-precision optimizer state (distributed optimizer)
    empty_unused_memory_level: int = 0  # 0 never, 1 after each step, 2 also after forward-backward
    enable_cpu_offload: bool = False  # TorchTitan training.enable_cpu_offload (FSDP CPU offload)


# Fields that act only under another setting (primus.features.idle_settings): the offloaded share and the overlap of
# its transfers, without offload, would be dropped: refused
ACTS_ONLY_WITH = (
    (("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"),
     "optimizer offload (memory.optimizer_cpu_offload=true)", lambda c: c.memory.optimizer_cpu_offload,
     "use memory=offload with them (it sets optimizer_cpu_offload=true), or drop them"),
)


@rule
def memory_values(cfg, ctx):
    mem, out = cfg.memory, []
    if not 0.0 <= mem.optimizer_offload_fraction <= 1.0:
        out.append(ConfigIssue(["memory.optimizer_offload_fraction"], mem.optimizer_offload_fraction,
                               "a fraction: must be in [0, 1]", "use e.g. 1.0 (all) or 0.5"))
    if mem.empty_unused_memory_level not in (0, 1, 2):
        out.append(ConfigIssue(["memory.empty_unused_memory_level"], mem.empty_unused_memory_level,
                               "must be 0, 1 or 2", "use 0 (default)"))
    return out


# ------------------------------------------------------------------------------------------- megatron-core


def megatron(cfg, ctx) -> dict:
    mem = cfg.memory
    overlap = {"overlap_cpu_optimizer_d2h_h2d": True} if mem.overlap_cpu_optimizer_d2h_h2d else {}
    return {
        "ddp_config": {"use_distributed_optimizer": mem.use_distributed_optimizer},
        "optimizer_config": {
            "use_distributed_optimizer": mem.use_distributed_optimizer,
            "optimizer_cpu_offload": mem.optimizer_cpu_offload,
            "optimizer_offload_fraction": mem.optimizer_offload_fraction,
            "use_precision_aware_optimizer": mem.use_precision_aware_optimizer,
            **overlap,
        },
        "empty_unused_memory_level": mem.empty_unused_memory_level,
    }


def megatron_issues(cfg, ctx) -> list:
    from primus.backends.megatron import args as margs

    mem, out = cfg.memory, []
    ver = margs.mcore_version()
    # the distributed optimizer runs on CPU too: its CUDA type checks and buffers are redirected by patches/cpu.py
    # (the parity matrix trains it at dp2 bitwise like one process)
    if ctx.device == "cpu":  # what megatron-core cannot do without CUDA
        if mem.optimizer_cpu_offload:
            out.append(ConfigIssue(["memory.optimizer_cpu_offload", "device"], True,
                                   "optimizer offload moves state from the GPU to the CPU: there is no GPU",
                                   "set memory.optimizer_cpu_offload=false on CPU"))
    if mem.optimizer_cpu_offload and not mem.use_distributed_optimizer:  # (megatron offloads SGD too)
        out.append(ConfigIssue(["memory.optimizer_cpu_offload", "memory.use_distributed_optimizer"], True,
                               f"megatron-core {ver} offloads the distributed optimizer's shards only",
                               "use memory=offload (sets use_distributed_optimizer=true)"))
    if mem.use_precision_aware_optimizer:
        if not mem.use_distributed_optimizer:
            out.append(ConfigIssue(["memory.use_precision_aware_optimizer", "memory.use_distributed_optimizer"], True,
                                   f"megatron-core {ver} supports the precision-aware optimizer with the distributed "
                                   "optimizer only", "set memory.use_distributed_optimizer=true"))
        if cfg.training.optimizer.value == "sgd":
            out.append(ConfigIssue(["memory.use_precision_aware_optimizer", "training.optimizer"], "sgd",
                                   "the precision-aware optimizer is Adam only", "use training.optimizer=adamw"))
        if not margs.te_available():
            # OptimizerConfig.__post_init__ checks the TE version before anything else, offload or not
            out.append(ConfigIssue(["memory.use_precision_aware_optimizer"], True,
                                   f"megatron-core {ver} implements it with Transformer Engine (FusedAdam), not installed",
                                   "install Transformer Engine, or set memory.use_precision_aware_optimizer=false",
                                   needs="Transformer Engine"))
    return out


# ------------------------------------------------------------------------------------------- TorchTitan

# Our fields that only megatron-core reads: under backend=torchtitan a non-default one is an issue
# (backends/torchtitan/args.py checks every feature's megatron_only).
MEGATRON_ONLY = ("use_distributed_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
                 "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer", "empty_unused_memory_level")


def megatron_only(cfg) -> tuple:
    return MEGATRON_ONLY


def torchtitan_only(cfg) -> tuple:
    return ("enable_cpu_offload",)  # FSDP2's CPU offload


def torchtitan(cfg, ctx) -> dict:
    return {"training": {"enable_cpu_offload": cfg.memory.enable_cpu_offload}}


def torchtitan_issues(cfg, ctx) -> list:
    out = []
    if cfg.memory.enable_cpu_offload and cfg.device.value == "cpu":
        out.append(ConfigIssue(["memory.enable_cpu_offload", "device"], True, "FSDP CPU offload needs a GPU",
                               "set it false on CPU"))
    return out
