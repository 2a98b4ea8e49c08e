"""Shared helpers for the turbo kernels: output allocation that tests can poison, device queries."""
from __future__ import annotations

import os

import torch

# Tests set POISON = True: every output buffer a kernel wrapper allocates is filled with NaN (floats) or the
# smallest integer (ints) before the kernel runs, so an element the kernel forgot to write shows up.
POISON = os.environ.get("PRIMUS_TURBO_POISON", "0") == "1"


def _poison(t: torch.Tensor) -> torch.Tensor:
    if POISON and t.numel():
        if t.dtype.is_floating_point:
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                t.view(torch.uint8).fill_(0x7F if t.dtype == torch.float8_e4m3fn else 0x7E)  # NaN bit patterns
            else:
                t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).min)
    return t


def empty(shape, dtype, device) -> torch.Tensor:
    return _poison(torch.empty(shape, dtype=dtype, device=device))


def empty_like(t: torch.Tensor, dtype=None) -> torch.Tensor:
    return _poison(torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device))


def num_sms(device) -> int:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _fix_triton_interpreter() -> None:
    """Triton 3.6's interpreter converts scalar handles with `int(ndarray)`, which numpy >= 2.4 rejects for the
    1-element arrays it holds ("only 0-dimensional arrays can be converted"): every `range(n)` over a runtime int
    fails. Re-patch `__index__` to take the single element. Only touches the interpreter (TRITON_INTERPRET=1)."""
    try:
        from triton.runtime import interpreter as _interp
    except Exception:  # pragma: no cover
        return
    orig = getattr(_interp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_primus_fixed", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._primus_fixed = True
    _interp._patch_lang_tensor = patched


if interpreting():
    _fix_triton_interpreter()
