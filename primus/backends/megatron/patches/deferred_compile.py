"""Workaround: `import megatron.core` pays for torch.compile's compiler stack and compiles nothing.

Upstream behaviour (megatron-core 0.16.1, torch 2.11 / 2.13): megatron/core/jit.py sets `jit_fuser = torch.compile`,
and the fused helpers (fusions/fused_bias_geglu.py, fused_bias_swiglu.py, fused_cross_entropy.py, ...) are
decorated with it when their modules load, which `import megatron.core` does. Each torch.compile() call imports
torch._dynamo and torch._inductor to read their configuration: about 1 s of CPU in every megatron process, while a
run compiles those helpers at their first call if at all (an eager CPU run never: cpu.py item 7 switches dynamo
off).

`import_megatron_core()` imports megatron.core with torch.compile deferred to each helper's first call
(primus/patches/deferred_compile.py says how, and why it runs the same code). megatron's `jit_fuser` keeps the
deferred form, so helpers of modules loaded later are deferred alike. Applied on another version too (with the
registry's warning): it changes when a helper is compiled, never what runs.

The same import also loads `wandb` (inference/contexts/dynamic_context.py and timers.py import it, for logging that
training never uses here): about 0.5 s of CPU. It gets a stand-in that imports it at its first use, by megatron or
by the W&B sink (logging.wandb=true): primus/patches/deferred_compile.py's `lazy_import`.
"""
from __future__ import annotations

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.deferred_compile import import_deferring_compile
from primus.patches.registry import TORCH, Conditions, Workaround, apply_all, pin

DEFERRED_COMPILE = Workaround(
    "megatron.import.deferred_jit_fuser",
    "megatron.core.jit.jit_fuser (torch.compile applied to the fused helpers when their modules are imported)",
    "each torch.compile() call imports torch._dynamo and torch._inductor to read their configuration: about 1 s "
    "of CPU in every megatron process, for helpers an eager run never compiles",
    (pin("megatron-core", PINNED_MCORE), pin("torch", *TORCH)), "megatron.core is not imported yet",
    lambda _c: True, lambda _c: import_deferring_compile("megatron.core", lazy=("wandb",)))


def import_megatron_core() -> bool:
    """Import megatron.core (the first import in a process defers its torch.compile decorations); returns whether
    this call imported it."""
    return bool(apply_all([DEFERRED_COMPILE], Conditions()).get(DEFERRED_COMPILE.name))
