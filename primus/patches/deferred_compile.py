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

The same import can defer a library the module only from-imports names of (`from datasets import load_dataset`):
`from_imports` binds each such name to a stand-in that imports the library at its first call, isinstance or
attribute use (_NameOnFirstUse), for a library a run may never use.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from typing import Any, Callable, Dict, Optional, Tuple

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


class _NameOnFirstUse:
    """What `from lib import name` binds during a deferring import: `lib` is imported, and the name looked up, at
    the first call, isinstance / issubclass check or attribute access; each answers from the real object."""

    __slots__ = ("_lib", "_name", "_obj")

    def __init__(self, lib: str, name: str):
        self._lib, self._name, self._obj = lib, name, None

    def _real(self):
        if self._obj is None:
            self._obj = getattr(importlib.import_module(self._lib), self._name)
        return self._obj

    def __call__(self, *args, **kwargs):
        return self._real()(*args, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self._real())

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, self._real())

    def __getattr__(self, attr: str):
        return getattr(self._real(), attr)

    def __repr__(self) -> str:
        return f"<{self._lib}.{self._name}, imported at first use>"


class _FromImportStandIn(types.ModuleType):
    """`lib` in sys.modules for the length of a deferring import: the listed names are _NameOnFirstUse stand-ins;
    any other attribute (a use the list did not foresee) puts the real libraries back and answers from them. Dunder
    look-ups (the import system's `__path__`, inspect's `__file__`) find nothing, as on a module without them."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        for name in self.primus_group:
            if isinstance(sys.modules.get(name), _FromImportStandIn):
                del sys.modules[name]
        return getattr(importlib.import_module(self.__name__), attr)


def import_deferring_compile(module: str, lazy: tuple = (),
                             from_imports: Optional[Dict[str, Tuple[str, ...]]] = None) -> bool:
    """Import `module` with torch.compile deferred (torch.compile restored after), the modules `lazy` loaded
    lazily (lazy_import) and the names `from_imports` ({library: names}) from-imported as _NameOnFirstUse
    stand-ins (the libraries are out of sys.modules again after the import; one imported already is left as it
    is); False where `module` was imported already (nothing to defer)."""
    if module in sys.modules:
        return False
    import torch

    for name in lazy:
        lazy_import(name)
    group = [lib for lib in (from_imports or {}) if lib not in sys.modules
             and importlib.util.find_spec(lib.split(".")[0]) is not None]
    for lib in group:
        stand_in = _FromImportStandIn(lib)
        stand_in.primus_group = group
        for name in from_imports[lib]:
            setattr(stand_in, name, _NameOnFirstUse(lib, name))
        sys.modules[lib] = stand_in
    _REAL_COMPILE[:] = [torch.compile]
    torch.compile = deferred
    try:
        importlib.import_module(module)
    finally:
        torch.compile = _REAL_COMPILE[0]
        for lib in group:
            if isinstance(sys.modules.get(lib), _FromImportStandIn):
                del sys.modules[lib]
    return True
