"""Triton 3.6's interpreter (TRITON_INTERPRET=1: kernels run in numpy, on CPU machines and in tests) gets four
things wrong that primus' kernels hit. Each is one registered workaround (`WORKAROUNDS`), applied when primus.turbo
is imported in an interpreting process; none touches compiled kernels.

1. Scalar handles are converted with `int(ndarray)`, which numpy >= 2.4 rejects for the 1-element arrays it holds
   ("only 0-dimensional arrays can be converted"): every `range(n)` over a runtime int fails. `__index__` is
   re-patched to take the single element.
2. Float downcasts (fp32 -> bf16 / fp8) truncate or round half-up without carrying a mantissa overflow into the
   exponent (127.2 -> e4m3 gives 64, not 128). Downcasts go through torch's round-to-nearest-even instead.
3. fp8 -> wider float casts reinterpret the raw bits as integers (e5m2 1.0 becomes 60.0). They go through torch.
4. `tl.dot` multiplies bf16 operands as their raw uint16 bit patterns. bf16 / fp8 operands are upcast through torch.

All are applied on another Triton too (with the registry's warning): each computes the value the operation is
defined to give, so on an interpreter that got fixed upstream it changes nothing.
"""
from __future__ import annotations

from .registry import TRITON, Conditions, Workaround, pin


def _names() -> dict:
    """Triton's float type names -> torch dtypes (torch imported here, not when the package is: the bufops audit
    CLI must run without it)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8e4nv": torch.float8_e4m3fn,
            "fp8e5": torch.float8_e5m2, "fp8e4b8": torch.float8_e4m3fnuz, "fp8e5b16": torch.float8_e5m2fnuz}


def _interpreter():
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no interpreter in this Triton: nothing to fix
        return None
    return interpreter


def _target(owner, name: str):
    """`owner.name` if it is there and not ours yet, else None (each fix is applied once, and only where found)."""
    fn = getattr(owner, name, None) if owner is not None else None
    return None if fn is None or getattr(fn, "_primus_fixed", False) else fn


def _builder_method(name: str):
    """(interpreter module, InterpreterBuilder, its method `name`) if that method is there and not ours yet."""
    interp = _interpreter()
    builder = getattr(interp, "InterpreterBuilder", None)
    orig = _target(builder, name)
    return (interp, builder, orig) if orig is not None else None


def _as_torch(data, dtype):
    """numpy data holding raw `dtype` values, as a flat torch tensor of that dtype (callers reshape)."""
    import numpy as np
    import torch

    arr = np.ascontiguousarray(data)
    return torch.frombuffer(bytearray(arr.tobytes()), dtype=dtype) if arr.size else torch.empty(0, dtype=dtype)


def _scalar_index(_cond: Conditions) -> None:
    """(1)"""
    _interp = _interpreter()
    orig = _target(_interp, "_patch_lang_tensor")
    if orig is None:
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._primus_fixed = True
    _interp._patch_lang_tensor = patched


def _float_downcast(_cond: Conditions) -> None:
    """(2)"""
    import torch

    _interp = _interpreter()
    names = _names()
    orig_conv = _target(_interp, "_convert_float")
    if orig_conv is None:
        return

    def convert(input, input_dtype, output_dtype, rounding_mode):
        src, dst = names.get(str(input_dtype)), names.get(str(output_dtype))
        if src is None or dst is None or input_dtype.primitive_bitwidth <= output_dtype.primitive_bitwidth:
            return orig_conv(input, input_dtype, output_dtype, rounding_mode)
        out = _as_torch(input, src).to(dst).view(getattr(torch, f"uint{output_dtype.primitive_bitwidth}") if
                             output_dtype.primitive_bitwidth != 8 else torch.uint8)
        return out.numpy().reshape(input.shape)

    convert._primus_fixed = True
    _interp._convert_float = convert


def _fp8_upcast(_cond: Conditions) -> None:
    """(3)"""
    import numpy as np
    import torch

    found = _builder_method("cast_impl")
    if found is None:
        return
    _interp, builder_cls, orig_cast = found
    names = _names()

    def cast_impl(self, src, dst_type):
        a, b = str(src.dtype.scalar), str(dst_type.scalar)
        if a in names and b in names and a != b and a.startswith("fp8"):
            t = _as_torch(src.data, names[a]).to(names[b])
            raw = t.view(torch.uint16) if names[b] == torch.bfloat16 else t
            out = np.frombuffer(raw.numpy().tobytes(), dtype=_interp._get_np_dtype(dst_type))
            return _interp.TensorHandle(out.reshape(src.data.shape).copy(), dst_type.scalar)
        return orig_cast(self, src, dst_type)

    cast_impl._primus_fixed = True
    builder_cls.cast_impl = cast_impl


def _low_precision_dot(_cond: Conditions) -> None:
    """(4)"""
    import numpy as np

    found = _builder_method("create_dot")
    if found is None:
        return
    _interp, builder_cls, orig_dot = found
    names = _names()

    def to_f32(h):
        name = str(h.dtype.scalar)
        if name not in names or name in ("fp32", "fp16"):
            return h.data
        return _as_torch(h.data, names[name]).float().numpy().reshape(h.data.shape)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if str(a.dtype.scalar) in names and str(b.dtype.scalar) in names and (
                str(a.dtype.scalar) not in ("fp32", "fp16") or str(b.dtype.scalar) not in ("fp32", "fp16")):
            out = np.matmul(to_f32(a), to_f32(b)).astype(d.data.dtype) + d.data
            return _interp.TensorHandle(out, d.dtype.scalar)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._primus_fixed = True
    builder_cls.create_dot = create_dot


def _interpreting(_cond: Conditions) -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_TRITON = pin("triton", *TRITON)

WORKAROUNDS = (
    Workaround(
        "triton.interpreter.scalar_index",
        "triton.runtime.interpreter._patch_lang_tensor (the tensor's __index__)",
        "int(ndarray) on 1-element arrays, which numpy >= 2.4 rejects: every range(n) over a runtime int fails",
        (_TRITON, pin("numpy", "2.4")), "TRITON_INTERPRET=1", _interpreting, _scalar_index),
    Workaround(
        "triton.interpreter.float_downcast",
        "triton.runtime.interpreter._convert_float",
        "fp32 -> bf16 / fp8 truncates or rounds half-up without carrying a mantissa overflow into the exponent",
        (_TRITON,), "TRITON_INTERPRET=1", _interpreting, _float_downcast),
    Workaround(
        "triton.interpreter.fp8_upcast",
        "triton.runtime.interpreter.InterpreterBuilder.cast_impl",
        "fp8 -> wider float reinterprets the raw bits as integers (e5m2 1.0 becomes 60.0)",
        (_TRITON,), "TRITON_INTERPRET=1", _interpreting, _fp8_upcast),
    Workaround(
        "triton.interpreter.low_precision_dot",
        "triton.runtime.interpreter.InterpreterBuilder.create_dot",
        "bf16 / fp8 operands multiplied as their raw bit patterns",
        (_TRITON,), "TRITON_INTERPRET=1", _interpreting, _low_precision_dot),
)
