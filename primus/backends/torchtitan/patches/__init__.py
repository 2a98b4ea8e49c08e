"""Every TorchTitan workaround of this backend, registered as data and applied by one `apply()`.

Each entry (a `primus.patches.registry.Workaround`) names the upstream behaviour it works around, the versions it
was written against (torchtitan 0.2.2; torch where the behaviour is torch's) and when it applies; `apply()` checks
the installed versions and says so in the log when they differ.

  deferred_datasets.py  every device, first: TorchTitan's text datasets imported with their Hugging Face
          `datasets` names bound to stand-ins that import it at first use (about 0.9 s a process)
  deferred_compile.py  every device, next: torchtitan.train imported with its import-time torch.compile calls
          deferred to first call (they import the compiler stack: about 1 s a process)
  cpu.py  CPU only: device type, memory monitor, process-group timeouts, FSDP's reduce op on gloo, integer histc

Not here, because they are features (primus' kernels or behaviour put into TorchTitan on a user's request):
turbo.py (model converters swapping in turbo modules), spec.py (our train specs and flavors in TorchTitan's
registry), checkpoint.py (non-finite guard, NaN test hook).
"""
from __future__ import annotations

from typing import Any, Dict

from primus.patches.registry import Conditions, apply_all

from . import cpu, deferred_compile, deferred_datasets
from .cpu import after_parallelize

# the deferred imports before anything imports TorchTitan
WORKAROUNDS = deferred_datasets.WORKAROUNDS + deferred_compile.WORKAROUNDS + cpu.WORKAROUNDS

__all__ = ["WORKAROUNDS", "apply", "after_parallelize"]


def apply(device: str) -> Dict[str, Any]:
    """Apply the workarounds that hold for this run (`device`: "cpu" | "cuda") before TorchTitan's Trainer is
    built. Returns {name: result}."""
    import torch

    return apply_all(WORKAROUNDS, Conditions(device=device, rocm=torch.version.hip is not None))
