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
  cpu_gemm.py            a CPU without AVX512-BF16 / AMX runs bf16 and fp16 GEMMs 10-40x slower than fp32 ones;
                         `apply_cpu_patches()`, called by the run path for a CPU run
  bufops.py              the analyzer the ROCm hook uses (pure text; `python -m primus.patches.bufops check`)
  submitit_requeue.py    submitit's Slurm watcher takes a requeued job's passing FAILED as final;
                         `apply_launcher_patches()`, called by the Slurm sweep launcher (primus/launch/submit.py)
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


def _cpu_gemm(_cond: Conditions) -> bool:
    from .cpu_gemm import install

    return install()


def _no_native_low_precision_gemm() -> bool:
    from .cpu_gemm import native_low_precision_gemm

    return not native_low_precision_gemm()


CPU_LOW_PRECISION_GEMM = Workaround(
    "torch.cpu.low_precision_gemm",
    "aten::mm / addmm / bmm / baddbmm, their CPU kernels for bfloat16 and float16 operands",
    "without AVX512-BF16 or AMX they run a scalar fallback 10-40x slower than the fp32 GEMM (a bf16 debug-model "
    "step spends 90% of its time there); run instead as fp32 GEMMs rounded once to the operands' dtype",
    (pin("torch", "2.13"),), "the run's device is the CPU and torch's CPU GEMMs take no bf16 operands natively",
    lambda c: c.device == "cpu" and _no_native_low_precision_gemm(), _cpu_gemm, every_run=True, on_mismatch="skip",
    mismatch_note="it only buys speed: without it the GEMMs run torch's own kernels")


def _submitit_requeue(_cond: Conditions) -> bool:
    from .submitit_requeue import install

    return install()


SUBMITIT_REQUEUED_STATE = Workaround(
    "submitit.slurm.requeued_state",
    "submitit.slurm.slurm.SlurmInfoWatcher.is_done (the job's state from sacct alone)",
    "a job that requeued itself can read FAILED for a moment before slurmctld holds it PENDING again: the sweep's "
    "launcher took it as finished without a result and stopped waiting for it; a final state now counts once it "
    "has held for 15 s with slurmctld (scontrol) holding no live one",
    (pin("submitit", "1.5.4"),), "a sweep submits its jobs to Slurm (hydra/launcher=slurm)",
    lambda _c: True, _submitit_requeue)
# Applied on another submitit too: it only makes a final state wait for slurmctld's agreement and the grace.

WORKAROUNDS = (ROCM_BUFOPS, COMPILE_CACHE_TAG, CPU_LOW_PRECISION_GEMM, SUBMITIT_REQUEUED_STATE) \
    + _interpreter.WORKAROUNDS


def _rocm() -> bool:
    from .triton_bufops_hook import is_rocm

    return is_rocm()


def apply_rocm_patches() -> bool:
    """Install the ROCm workarounds; a no-op (returns False) anywhere else."""
    return bool(apply_all([ROCM_BUFOPS], Conditions(rocm=_rocm())).get(ROCM_BUFOPS.name))


def apply_cpu_patches(device: str) -> bool:
    """On a CPU run: the fp32 route for bf16 / fp16 GEMMs where torch's CPU kernels have no native one
    (cpu_gemm.py). Returns whether it is in place (the run takes it out again: cpu_gemm.uninstall()); a no-op
    (False) on a GPU or a CPU with native bf16 GEMMs."""
    return bool(apply_all([CPU_LOW_PRECISION_GEMM], Conditions(device=device)).get(CPU_LOW_PRECISION_GEMM.name))


def tag_compile_caches() -> str:
    """primus' tag in torch.compile's cache keys (compile_cache.py); returns the tag in force."""
    return apply_all([COMPILE_CACHE_TAG], Conditions()).get(COMPILE_CACHE_TAG.name) or ""


def apply_launcher_patches() -> bool:
    """The submitting side of a Slurm sweep: submitit's watcher checks a final sacct state with slurmctld
    (submitit_requeue.py)."""
    return bool(apply_all([SUBMITIT_REQUEUED_STATE], Conditions()).get(SUBMITIT_REQUEUED_STATE.name))


def fix_triton_interpreter() -> None:
    """Triton's interpreter defects (triton_interpreter.py); each applies only under TRITON_INTERPRET=1."""
    apply_all(_interpreter.WORKAROUNDS, Conditions())
