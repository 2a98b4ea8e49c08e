"""torch.compile deferred to a function's first call, for the import of a library that compiles at import time.

megatron-core and TorchTitan apply torch.compile to helpers when their modules load (megatron's `jit_fuser`,
TorchTitan's compiled attention entry points). Each torch.compile() call looks up the inductor backend's
configuration there and then, which imports torch._dynamo and torch._inductor: about 1 s of CPU in every process
that imports the library, for helpers a run compiles at their first call if at all. `import_deferring_compile()`
imports a module with torch.compile replaced, for the import only, by `deferred`: each function it is applied to
is handed to the real torch.compile, with the same arguments, at its first call (torch.compile compiles at the
first call too: only the configuration look-up moves there). Called inside a region dynamo is tracing (a compiled
layer), it calls the undecorated function, which is what dynamo does with a nested torch.compile'd one (inlines
it). The backends' patches packages register where it is used (primus/backends/<backend>/patches/deferred_compile.py).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from typing import Any, Callable, Optional

_REAL_COMPILE: list = []  # torch.compile as it was when the deferring import began


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


class _OnFirstUse(types.ModuleType):
    """A module's stand-in in sys.modules until the first use of an attribute it lacks, which imports the module
    and answers from it. It carries the module's `__file__`, so that `inspect.getmodule` (torch reads the source
    of each custom op it registers, which scans sys.modules) does not import it; importlib's LazyLoader module
    would, as it runs its code at any attribute access."""

    def __getattr__(self, attr: str):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)  # later accesses through this reference go straight to the module
        return getattr(real, attr)


def lazy_import(name: str) -> bool:
    """Put a stand-in for `name` in sys.modules that imports it at its first use (_OnFirstUse): an `import name`
    a library does at import time, for an optional integration it uses only when asked, then costs nothing. False
    where it is imported already or not installed."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    stand_in = _OnFirstUse(name)
    stand_in.__file__ = spec.origin
    sys.modules[name] = stand_in
    return True


def import_deferring_compile(module: str, lazy: tuple = ()) -> bool:
    """Import `module` with torch.compile deferred (torch.compile restored after) and the modules `lazy` loaded
    lazily (lazy_import); False where it was imported already (nothing to defer)."""
    if module in sys.modules:
        return False
    import torch

    for name in lazy:
        lazy_import(name)
    _REAL_COMPILE[:] = [torch.compile]
    torch.compile = deferred
    try:
        importlib.import_module(module)
    finally:
        torch.compile = _REAL_COMPILE[0]
    return True
