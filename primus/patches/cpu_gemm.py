"""bf16 / fp16 GEMMs on a CPU without native low-precision GEMMs, run as fp32 GEMMs.

torch's CPU kernels of aten::mm, addmm, bmm and baddbmm hand bfloat16 and float16 operands to oneDNN only where the
CPU has AVX512 (BF16) or AMX (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`); elsewhere (an AVX2 CPU, most CI
machines) they run a scalar fallback. On a 2-core AVX2 machine, torch 2.13: a (512 x 128) @ (128 x 2048) bf16 GEMM
takes 44 ms against 5 ms in fp32, and the backward's transposed shapes 120-160 ms against 3-4 ms, so a debug-model
run in the default precision (bf16) spends 90% of its step in them.

The replacement kernels upcast both operands to fp32, run the fp32 GEMM and round the result to the operands'
dtype once. That is the fallback's own arithmetic (fp32 accumulation, one rounding: what a GPU's tensor cores do
too); only the order of the fp32 sums differs, so a result may differ from the fallback's in the last bit of an
element (about 1 in 10,000 at the debug model's shapes). Any other dtype goes to torch's own kernel (the `out=`
overloads, which stay registered).

Registered on the CPU dispatch key below autograd, so gradients, torch.compile (its extern GEMM calls) and every
caller of these ops get them; `install()` is the workaround's fix, `uninstall()` puts torch's kernels back.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

_LOW = (torch.bfloat16, torch.float16)
_LIB: Optional[torch.library.Library] = None


def native_low_precision_gemm() -> bool:
    """Whether torch's CPU GEMMs take bf16 operands natively (oneDNN on AVX512-BF16 / AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _routed(out_op):
    """The kernel for one op: its tensors (the last two the GEMM's operands, an addend first for addmm / baddbmm)
    all bf16 or all fp16 -> the op's fp32 `out=` kernel on fp32 copies, rounded once; else torch's own `out=`."""

    def kernel(*ts, **scalars):
        a, b = ts[-2], ts[-1]
        shape = (*a.shape[:-1], b.shape[-1])  # (m, n), or (batch, m, n)
        if a.dtype in _LOW and all(t.dtype == a.dtype for t in ts):
            out = a.new_empty(shape, dtype=torch.float32)
            return out_op(*(t.float() for t in ts), **scalars, out=out).to(a.dtype)
        return out_op(*ts, **scalars, out=a.new_empty(shape))

    return kernel


KERNELS = {name: _routed(getattr(torch.ops.aten, name).out) for name in ("mm", "addmm", "bmm", "baddbmm")}


def install() -> bool:
    """Register the kernels on the CPU key (once per process); returns True once they are in place."""
    global _LIB
    if _LIB is None:
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # torch warns that a registered kernel is overridden: that is the point
            warnings.simplefilter("ignore")
            for name, fn in KERNELS.items():
                lib.impl(name, fn, "CPU")
        _LIB = lib
    return True


def installed() -> bool:
    return _LIB is not None


def uninstall() -> None:
    """torch's own CPU kernels back (the registrations are dropped with the library object)."""
    global _LIB
    if _LIB is not None:
        _LIB._destroy()
        _LIB = None
