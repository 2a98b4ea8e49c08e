"""Workaround: `import megatron.core` pays for torch.compile's whole compiler stack and compiles nothing.

Upstream behaviour (megatron-core 0.16.1, torch 2.11 / 2.13): megatron/core/jit.py sets `jit_fuser = torch.compile`,
and the fused helpers (fusions/fused_bias_geglu.py, fused_bias_swiglu.py, fused_cross_entropy.py, ...) are
decorated with it when their modules load, which `import megatron.core` does. Each torch.compile() call looks up
the inductor backend's configuration there and then, importing torch._dynamo and torch._inductor: about 3 of the
5 s that `import megatron.core` takes on a CPU, in every megatron process, while a run compiles those helpers at
their first call if at all (an eager CPU run never: cpu.py item 7 switches dynamo off).

`import_megatron_core()` imports megatron.core with torch.compile replaced, for the import only, by `deferred`:
each function it decorates is handed to the real torch.compile, with the same arguments, at its first call
(torch.compile compiles at the first call too: only the configuration look-up moves there). Called inside a region
dynamo is tracing (training.compile's compiled layers), it calls the undecorated function, which is what dynamo
does with a nested torch.compile'd one (inlines it). megatron's `jit_fuser` keeps `deferred`, so helpers of modules
loaded later are deferred alike. Pinned to megatron-core 0.16.1; on another version it is applied anyway (with the
registry's warning): it changes when a helper is compiled, never what runs.
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Optional

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import TORCH, Conditions, Workaround, apply_all, pin

log = logging.getLogger("primus.megatron")


def deferred(model: Optional[Callable] = None, **kwargs: Any):
    """torch.compile(model, **kwargs), built at the function's first call. Modules and anything not a plain
    function go to torch.compile at once."""
    import torch

    if model is None:  # @torch.compile(mode=...) form
        return lambda fn: deferred(fn, **kwargs)
    if isinstance(model, torch.nn.Module) or not callable(model):
        return _REAL_COMPILE[0](model, **kwargs)
    compiled: list = []

    @functools.wraps(model)
    def call(*args, **kw):
        if torch.compiler.is_compiling():
            return model(*args, **kw)
        if not compiled:
            compiled.append(_REAL_COMPILE[0](model, **kwargs))
        return compiled[0](*args, **kw)

    call.primus_deferred_compile = compiled  # [] until the first call built it
    return call


_REAL_COMPILE: list = []


def _import_deferred(_cond: Conditions) -> bool:
    """Import megatron.core with torch.compile deferred; False where it was imported already (nothing to defer)."""
    if "megatron.core" in sys.modules:
        return False
    import torch

    _REAL_COMPILE[:] = [torch.compile]
    torch.compile = deferred
    try:
        import megatron.core  # noqa: F401
    finally:
        torch.compile = _REAL_COMPILE[0]
    return True


DEFERRED_COMPILE = Workaround(
    "megatron.import.deferred_jit_fuser",
    "megatron.core.jit.jit_fuser (torch.compile applied to the fused helpers when their modules are imported)",
    "each torch.compile() call imports torch._dynamo and torch._inductor to read their configuration: about 3 s "
    "of every megatron process's start, for helpers an eager run never compiles",
    (pin("megatron-core", PINNED_MCORE), pin("torch", *TORCH)), "megatron.core is not imported yet",
    lambda _c: True, _import_deferred)


def import_megatron_core() -> bool:
    """Import megatron.core (the first import in a process defers its torch.compile decorations); returns whether
    this call imported it."""
    return bool(apply_all([DEFERRED_COMPILE], Conditions()).get(DEFERRED_COMPILE.name))
