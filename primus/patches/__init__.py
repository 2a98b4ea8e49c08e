"""Workarounds of torch and Triton behaviour shared by every backend, registered as data (see registry.py, which
also holds the registry every backend's `primus/backends/<backend>/patches/` package uses).

  triton_bufops_hook.py  ROCm: Triton's AMD backend emits buffer stores whose data registers are overwritten
                         before the store completes (docs/rocm-bufops.md); `apply_rocm_patches()`, called by the
                         run path (primus/train_loop.py) before the backend's trainer is built
  compile_cache.py       torch.compile's on-disk caches are not keyed by the custom ops a graph calls;
                         `tag_compile_caches()`, applied where primus.turbo's kernels are imported
  triton_interpreter.py  TRITON_INTERPRET=1: four defects of Triton 3.6's interpreter (scalar index with numpy >= 2.4,
                         float down/up casts, low-precision dot); `fix_triton_interpreter()`, applied where
                         primus.turbo's kernels are imported
  bufops.py              the analyzer the ROCm hook uses (pure text; `python -m primus.patches.bufops check`)
"""
from __future__ import annotations

from . import triton_interpreter as _interpreter
from .registry import TORCH, TRITON, Conditions, Workaround, apply_all, pin


def _install_bufops_hook(_cond: Conditions) -> bool:
    from .triton_bufops_hook import install

    return install()


def _tag(_cond: Conditions) -> str:
    from .compile_cache import tag_compile_caches

    return tag_compile_caches()


ROCM_BUFOPS = Workaround(
    "triton.rocm.buffer_store_clobber",
    "triton.compile / triton.compiler.compile on the AMD backend (and inductor's compile workers)",
    "a buffer_store_dwordx3/x4 whose data VGPRs a later instruction redefines before any wait: the store writes "
    "garbage, silently; such kernels are recompiled without buffer ops",
    (pin("triton", *TRITON),), "torch is a ROCm build (torch.version.hip set)",
    lambda c: c.rocm, _install_bufops_hook, every_run=True)
# Applied on another Triton too (with the registry's warning): a kernel is only recompiled when its machine code
# shows the hazard, and the recompile is checked against the cached binary's hash.

COMPILE_CACHE_TAG = Workaround(
    "torch.compile.cache_key_tag",
    "inductor's FX graph cache and AOT autograd's cache (torch.compiler.config.cache_key_tag)",
    "a graph's key holds a custom op's name and arguments, not its schema or body: after one of primus' ops "
    "changes, a cached graph compiled against the old op is served",
    (pin("torch", *TORCH),), "a primus.turbo kernel module is imported",
    lambda _c: True, _tag, every_run=True)
# Applied on another torch too: a tag only makes cache keys more specific.

WORKAROUNDS = (ROCM_BUFOPS, COMPILE_CACHE_TAG) + _interpreter.WORKAROUNDS


def _rocm() -> bool:
    from .triton_bufops_hook import is_rocm

    return is_rocm()


def apply_rocm_patches() -> bool:
    """Install the ROCm workarounds; a no-op (returns False) anywhere else."""
    return bool(apply_all([ROCM_BUFOPS], Conditions(rocm=_rocm())).get(ROCM_BUFOPS.name))


def tag_compile_caches() -> str:
    """primus' tag in torch.compile's cache keys (compile_cache.py); returns the tag in force."""
    return apply_all([COMPILE_CACHE_TAG], Conditions()).get(COMPILE_CACHE_TAG.name) or ""


def fix_triton_interpreter() -> None:
    """Triton's interpreter defects (triton_interpreter.py); each applies only under TRITON_INTERPRET=1."""
    apply_all(_interpreter.WORKAROUNDS, Conditions())
