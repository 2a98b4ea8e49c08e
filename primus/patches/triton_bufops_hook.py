"""Per-kernel workaround for Triton's AMD backend emitting a ``buffer_store_dwordx4``
whose data VGPRs are redefined by a later instruction with no ``s_waitcnt vmcnt`` in
between, so the store writes whatever the clobbering instruction left behind
(silent garbage; e.g. inductor's SwiGLU backward poisons MLP weight gradients).

Every kernel compiles normally.  On ROCm, a kernel whose emitted AMDGCN has the
hazard (see ``primus.patches.bufops``) is recompiled with buffer ops disabled for
that kernel only -- the global ``AMDGCN_USE_BUFFER_OPS=0`` would cost kernels that
never needed it (grouped GEMMs spill without buffer addressing).  The decision is
made from machine code, never from an architecture list, so new targets stay covered.

Paths covered: ``triton.compile`` (inductor's ``triton_heuristics`` calls it through
the module attribute), ``triton.compiler.compile`` (what ``@triton.jit`` binds
lazily), and inductor's compile-worker subprocesses (the task function it pickles by
reference is swapped for one that installs this hook first).  On an FX-graph cache hit
inductor never compiles, so a cache-key tag is added as well.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from .bufops import Hazard, find_hazards

log = logging.getLogger("primus.patches.bufops")

CACHE_TAG = "primus-bufops-v1"
CACHE_TAG_ENV = "TORCH_COMPILE_CACHE_KEY_TAG"
_KNOB_ENV = "AMDGCN_USE_BUFFER_OPS"
_MARK = "_primus_bufops_wrapped"

counters = {"scanned": 0, "patched": 0, "residual": 0}
_logged: set[str] = set()
# The buffer-ops knob is process-global; serialise recompiles so two never
# interleave their save/restore of it.
_lock = threading.RLock()


def is_rocm() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(getattr(torch.version, "hip", None))


def _amdgcn(compiled: Any) -> str | None:
    asm = getattr(compiled, "asm", None)
    text = asm.get("amdgcn") if isinstance(asm, dict) else None
    return text if isinstance(text, str) else None


def _is_hip(compiled: Any, kwargs: dict) -> bool:
    target = kwargs.get("target") or getattr(getattr(compiled, "metadata", None), "target", None)
    backend = getattr(target, "backend", None)
    if backend is not None:
        return backend == "hip"
    return _amdgcn(compiled) is not None


def _name(compiled: Any) -> str:
    return str(getattr(getattr(compiled, "metadata", None), "name", None) or getattr(compiled, "name", "?"))


def _knob_key_value() -> str:
    # Spell the knob as triton's own key does (it normalises "0" to "false").
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
        return get_cache_invalidating_env_vars().get(_KNOB_ENV, "0")
    except ImportError:
        return "0"


def _recompile(compile_fn: Callable, args: tuple, kwargs: dict, old: Any) -> Any:
    from triton import knobs

    with _lock, knobs.amd.scope():
        # Setting the knob also exports AMDGCN_USE_BUFFER_OPS=0, which triton 3.6
        # folds into the cache key via get_cache_invalidating_env_vars(); a caller
        # that pre-computed _env_vars (the async JIT path) must get it too, or the
        # key -- and so the cached hazardous binary -- would be reused.
        knobs.amd.use_buffer_ops = False
        kw = dict(kwargs)
        if kw.get("_env_vars") is not None:
            kw["_env_vars"] = {**kw["_env_vars"], _KNOB_ENV: _knob_key_value()}
        new = compile_fn(*args, **kw)
        if getattr(old, "hash", None) is not None and getattr(new, "hash", None) == old.hash:
            # Key did not change (a Triton whose key ignores the knob): bypass the cache.
            with knobs.compilation.scope():
                knobs.compilation.always_compile = True
                new = compile_fn(*args, **kw)
    return new


def _report(name: str, hazards: list[Hazard], residual: list[Hazard]) -> None:
    if name in _logged:
        return
    _logged.add(name)
    first = hazards[0]
    msg = ("kernel %s: %d buffer store(s) with data redefined before completion (first: %s); "
           "recompiled without buffer ops")
    if residual:
        log.warning(msg + "; %d hazard(s) remain", name, len(hazards), first, len(residual))
    else:
        log.info(msg, name, len(hazards), first)


def wrap_compile(compile_fn: Callable) -> Callable:
    if getattr(compile_fn, _MARK, False):
        return compile_fn

    def compile(*args: Any, **kwargs: Any) -> Any:
        compiled = compile_fn(*args, **kwargs)
        text = _amdgcn(compiled)
        if text is None or not _is_hip(compiled, kwargs):
            return compiled
        counters["scanned"] += 1
        hazards = find_hazards(text)
        if not hazards:
            return compiled
        fixed = _recompile(compile_fn, args, kwargs, compiled)
        residual = find_hazards(_amdgcn(fixed) or "")
        counters["patched"] += 1
        counters["residual"] += bool(residual)
        _report(_name(compiled), hazards, residual)
        return fixed

    compile.__wrapped__ = compile_fn  # type: ignore[attr-defined]
    compile.__doc__ = compile_fn.__doc__
    setattr(compile, _MARK, True)
    return compile


def add_cache_tag(tag: str = CACHE_TAG) -> None:
    """Append ``tag`` to the env var and torch's live setting, never twice."""
    def merged(current: str | None) -> str:
        parts = [p for p in (current or "").split(",") if p]
        return ",".join(parts if tag in parts else parts + [tag])

    os.environ[CACHE_TAG_ENV] = merged(os.environ.get(CACHE_TAG_ENV))
    try:  # torch reads the env var once at import; the live value is what FX-graph keys use
        import torch.compiler.config as cconfig
    except ImportError:
        return
    cconfig.cache_key_tag = merged(cconfig.cache_key_tag)


def _worker_compile_triton(*args: Any, **kwargs: Any) -> Any:
    # Runs inside an inductor compile-worker process: hook that process, then delegate.
    install()
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton as original
    return original(*args, **kwargs)


def install() -> bool:
    """Install on ROCm (idempotent); returns whether the hook is active."""
    if not is_rocm():
        return False
    import triton
    import triton.compiler

    for mod in (triton, triton.compiler):
        mod.compile = wrap_compile(mod.compile)
    add_cache_tag()
    try:
        import torch._inductor.async_compile as ac
    except ImportError:
        return True
    if hasattr(ac, "_worker_compile_triton"):
        ac._worker_compile_triton = _worker_compile_triton
    return True
