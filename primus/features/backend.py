"""The backend feature: which trainer runs the job, on which device, in which mode; the megatron-core version and
layer spec it is written against (see primus/features/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from primus.config.errors import ConfigIssue


class Backend(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"


class LayerSpec(str, Enum):
    auto = "auto"  # Transformer Engine's spec when TE imports, else the local fused spec
    te = "te"  # require Transformer Engine
    local = "local"  # megatron-core local modules with a fused (SDPA) attention core


class Device(str, Enum):
    auto = "auto"  # the GPU when one is present, else CPU
    cpu = "cpu"
    cuda = "cuda"


class Mode(str, Enum):
    train = "train"
    plan = "plan"  # memory / throughput estimate only (no GPU)


@dataclass
class BackendConfig:
    name: Backend = Backend.megatron  # which trainer runs the job
    layer_spec: LayerSpec = LayerSpec.auto  # megatron: TE spec or local fused spec


PINNED_MCORE = "0.16.1"  # the megatron-core release the megatron backend is written against


def megatron(cfg, ctx) -> dict:
    from primus.backends.megatron import args as margs

    return {"megatron_core": {"installed": margs.mcore_version(), "pinned": PINNED_MCORE},
            "layer_spec": margs.resolved_layer_spec(cfg)}


def megatron_issues(cfg, ctx) -> list:
    """What the installed megatron-core and Transformer Engine cannot honour (megatron-core itself is present:
    capability_issues stops before the features when it is not)."""
    from primus.backends.megatron import args as margs

    out = []
    ver, te = margs.mcore_version(), margs.te_available()
    if ver != PINNED_MCORE:
        out.append(ConfigIssue(["backend.name"], ver, f"this backend is written against megatron-core {PINNED_MCORE}",
                               f"pip install megatron-core=={PINNED_MCORE}"))
    if cfg.backend.layer_spec.value == "te" and not te:
        out.append(ConfigIssue(["backend.layer_spec"], "te", "Transformer Engine is not importable here",
                               "use backend.layer_spec=auto (local fused spec) or install Transformer Engine",
                               needs="Transformer Engine"))
    if margs.resolved_layer_spec(cfg) == "te" and ctx.device == "cpu":
        out.append(ConfigIssue(["backend.layer_spec", "device"], "te", "Transformer Engine layers need a GPU",
                               "use backend.layer_spec=local on CPU"))
    return out


def megatron_only(cfg) -> tuple:
    # megatron-core's layer spec (TE or local modules); TorchTitan builds its own model classes
    return ("layer_spec",)
