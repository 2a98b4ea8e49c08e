"""An fp8 GEMM that adds into an fp32 matrix in place: cuBLASLt's D = scale_a * scale_b * (A @ B) + C, with C = D.

    scaled_mm_add_(out, a, b, scale_a, scale_b)     # out (M, N) fp32 += (a (M, K) @ b (K, N)) * scale_a * scale_b

Why: training.gradient_accumulation_fusion on the portable fp8 linears. Their weight-gradient GEMM is torch's
`torch._scaled_mm` (torch 2.11), which always writes a fresh output (no beta, no C input), so each micro batch wrote
a bf16 weight gradient and megatron's DDP hook then added it into the fp32 main_grad: 10 bytes a parameter a micro
batch in a kernel of its own, estimated at 6% of a Llama-2-7B fp8 step at micro batch 2 on an H100
(docs/benchmarks.md, "Still to run").
cuBLASLt itself takes C (fp32 C and D with fp8 A and B, the form Transformer Engine's fp8 weight gradient uses to
accumulate into main_grad): the add rides in the GEMM's epilogue, 6 more bytes a parameter beside a K of thousands.

The library is the libcublasLt torch's CUDA build has already loaded (found in the process's memory map, so the same
copy torch's own GEMMs use), called through ctypes; a matmul descriptor, layouts and cuBLASLt's heuristic pick are
cached per shape and dtypes, the scales (device pointers) set at each call. `unusable(device)` says why it cannot
run here (None: it can): it needs CUDA (not ROCm: hipBLASLt is another library), the library found, and a check on
a small problem against `torch._scaled_mm` plus the add passed, once per process and device. Where it cannot,
`scaled_mm_add_` runs that unfused sum itself (the log says why once).
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Dict, Optional

import torch

log = logging.getLogger("primus.turbo")

# cublasLt.h / library_types.h (CUDA 12 and 13)
_CUDA_R_32F, _CUDA_R_8F_E4M3, _CUDA_R_8F_E5M2 = 0, 28, 29
_CUBLAS_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB, _DESC_A_SCALE, _DESC_B_SCALE, _DESC_FAST_ACCUM = 3, 4, 17, 18, 25
_PREF_MAX_WORKSPACE, _PREF_MIN_ALIGN_A, _PREF_MIN_ALIGN_B, _PREF_MIN_ALIGN_C, _PREF_MIN_ALIGN_D = 1, 5, 6, 7, 8
_WORKSPACE = 32 << 20  # what cuBLASLt's heuristic may ask for on Hopper (torch gives its own Lt calls the same)

_FP8 = {torch.float8_e4m3fn: _CUDA_R_8F_E4M3, torch.float8_e5m2: _CUDA_R_8F_E5M2}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


def _loaded_path() -> Optional[str]:
    """The libcublasLt this process has mapped (torch loads it with its first CUDA GEMM), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "libcublasLt.so" in path:
                    return path
    except OSError:
        pass
    return None


_LIB: Dict[str, object] = {}


def _lib():
    if "lib" not in _LIB:
        path = _loaded_path()
        if path is None:  # torch loads cuBLASLt lazily: one small GEMM maps it
            a = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
            (a @ a).sum().item()
            path = _loaded_path()
        if path is None:
            raise CublasLtError("libcublasLt is not loaded in this process (torch's CUDA GEMMs did not map it)")
        lib = ctypes.CDLL(path)
        vp, p = ctypes.c_void_p, ctypes.POINTER
        sig = {
            "cublasLtCreate": [p(vp)],
            "cublasLtMatmulDescCreate": [p(vp), ctypes.c_int, ctypes.c_int],
            "cublasLtMatmulDescSetAttribute": [vp, ctypes.c_int, vp, ctypes.c_size_t],
            "cublasLtMatrixLayoutCreate": [p(vp), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
            "cublasLtMatmulPreferenceCreate": [p(vp)],
            "cublasLtMatmulPreferenceSetAttribute": [vp, ctypes.c_int, vp, ctypes.c_size_t],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int, p(_Heuristic),
                                               p(ctypes.c_int)],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, p(_Algo), vp, ctypes.c_size_t, vp],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _LIB["lib"], _LIB["path"] = lib, path
    return _LIB["lib"]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned cublasStatus {status}")


class _Plan:
    """One shape's descriptor, layouts and heuristic algo (cuBLASLt objects live for the process: a few per shape)."""

    def __init__(self, lib, handle, m, n, k, lda, ldb, aligns, a_type, b_type, fast):
        vp = ctypes.c_void_p
        self.desc, self.la, self.lb, self.lc, pref = vp(), vp(), vp(), vp(), vp()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _CUBLAS_COMPUTE_32F, _CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        # the attributes' C types: cublasOperation_t (int32) for the transposes, int8_t for fast accumulation
        for attr, v in ((_DESC_TRANSA, ctypes.c_int32(_OP_T)), (_DESC_TRANSB, ctypes.c_int32(_OP_N)),
                        (_DESC_FAST_ACCUM, ctypes.c_int8(int(fast)))):
            _check(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), ctypes.sizeof(v)),
                   f"set matmul attribute {attr}")
        # column-major, as cuBLAS sees it: A (k x m) transposed, B (k x n), C = D (m x n); A's and B's leading
        # dimensions are their row strides (a view's may exceed k)
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self.la), a_type, k, m, lda), "layout A")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self.lb), b_type, k, n, ldb), "layout B")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self.lc), _CUDA_R_32F, m, n, m), "layout C")
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(_WORKSPACE)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws), 8),
               "set the workspace limit")
        # the heuristic assumes 256-byte aligned pointers unless told otherwise (torch tells its own Lt calls too):
        # a main_grad inside megatron's grad buffer, or an operand that is a view, may be less aligned
        for attr, align in zip((_PREF_MIN_ALIGN_A, _PREF_MIN_ALIGN_B, _PREF_MIN_ALIGN_C, _PREF_MIN_ALIGN_D), aligns):
            v = ctypes.c_uint32(align)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4),
                   f"set preference {attr}")
        heur, found = _Heuristic(), ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.la, self.lb, self.lc, self.lc, pref, 1,
                                                  ctypes.byref(heur), ctypes.byref(found)),
               f"cublasLtMatmulAlgoGetHeuristic (m={m}, n={n}, k={k}, fp8 A and B, fp32 C and D)")
        if found.value < 1:
            raise CublasLtError(f"cuBLASLt has no algorithm for m={m}, n={n}, k={k} with fp8 A and B, fp32 C and D")
        self.algo = heur.algo


_TLS = threading.local()  # per thread: {device index: (handle, workspace, {key: _Plan})}


def _device_state(dev: int):
    states = getattr(_TLS, "states", None)
    if states is None:
        states = _TLS.states = {}
    if dev not in states:
        handle = ctypes.c_void_p()
        with torch.cuda.device(dev):
            _check(_lib().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
            states[dev] = (handle, torch.empty(_WORKSPACE, dtype=torch.uint8, device=f"cuda:{dev}"), {})
    return states[dev]


def _alignment(t: torch.Tensor) -> int:
    """The largest power of two up to 256 that divides t's address (cuBLASLt's alignment preferences)."""
    ptr, align = t.data_ptr(), 256
    while ptr % align:
        align //= 2
    return align


def _scaled_mm_add_lt(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                      scale_b: torch.Tensor, fast: bool) -> None:
    M, K = a.shape
    N = b.shape[1]
    dev = out.device.index if out.device.index is not None else torch.cuda.current_device()
    handle, workspace, plans = _device_state(dev)
    # out (M, N) row-major is cuBLAS's column-major (N x M): out^T = b^T @ a^T, b^T (N, K) and a^T (K, M) both
    # K-major in memory, the only fp8 layout Hopper's kernels take (TRANSA = T, TRANSB = N)
    lda, ldb = b.stride(1), a.stride(0)
    aligns = (_alignment(b), _alignment(a), _alignment(out), _alignment(out))
    key = (N, M, K, lda, ldb, aligns, b.dtype, a.dtype, fast)
    plan = plans.get(key)
    lib = _lib()
    if plan is None:
        plan = plans[key] = _Plan(lib, handle, N, M, K, lda, ldb, aligns, _FP8[b.dtype], _FP8[a.dtype], fast)
    pa, pb = ctypes.c_void_p(scale_b.data_ptr()), ctypes.c_void_p(scale_a.data_ptr())
    _check(lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_A_SCALE, ctypes.byref(pa), 8), "set scale A")
    _check(lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_B_SCALE, ctypes.byref(pb), 8), "set scale B")
    one = ctypes.c_float(1.0)
    stream = torch.cuda.current_stream(out.device).cuda_stream
    _check(lib.cublasLtMatmul(handle, plan.desc, ctypes.byref(one), ctypes.c_void_p(b.data_ptr()), plan.la,
                              ctypes.c_void_p(a.data_ptr()), plan.lb, ctypes.byref(one),
                              ctypes.c_void_p(out.data_ptr()), plan.lc, ctypes.c_void_p(out.data_ptr()), plan.lc,
                              ctypes.byref(plan.algo), ctypes.c_void_p(workspace.data_ptr()), _WORKSPACE,
                              ctypes.c_void_p(stream)),
           "cublasLtMatmul")


def _unfused(out, a, b, scale_a, scale_b, fast) -> None:
    out.add_(torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32, use_fast_accum=fast))


_OK: Dict[int, Optional[str]] = {}  # device index -> None (usable) or why not


def unusable(device) -> Optional[str]:
    """Why the in-GEMM add cannot run on `device` (None: it can). Checked once per process and device: the
    library is found and a small problem matches torch._scaled_mm plus the add."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"{device.type} is not a CUDA device"
    if torch.version.hip is not None:
        return "ROCm: cuBLASLt is CUDA's library (hipBLASLt is not bound here)"
    dev = device.index if device.index is not None else torch.cuda.current_device()
    if dev not in _OK:
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            a = (torch.randn(64, 96, generator=g) * 4).to(f"cuda:{dev}", torch.float8_e5m2)
            b = (torch.randn(48, 96, generator=g) * 4).to(f"cuda:{dev}", torch.float8_e4m3fn).t()
            sa, sb = torch.tensor(0.5, device=f"cuda:{dev}"), torch.tensor(0.25, device=f"cuda:{dev}")
            acc = torch.randn(64, 48, generator=g).to(f"cuda:{dev}")
            want = acc.clone()
            _unfused(want, a, b, sa, sb, False)
            _scaled_mm_add_lt(acc, a, b, sa, sb, False)
            err = (acc - want).abs().max().item()
            _OK[dev] = None if err <= 1e-3 * max(1.0, want.abs().max().item()) else \
                f"it differs from torch._scaled_mm plus the add by {err:.3g}"
        except (CublasLtError, OSError, AttributeError, RuntimeError) as e:
            _OK[dev] = str(e).splitlines()[0][:200]
        if _OK[dev]:
            log.warning("fp8 weight gradients: cuBLASLt's in-GEMM add into main_grad is not usable here (%s): "
                        "computed, then added", _OK[dev])
        else:
            log.info("fp8 weight gradients accumulate into main_grad in the GEMM (cuBLASLt, %s)", _LIB.get("path"))
    return _OK[dev]


def scaled_mm_add_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                   scale_b: torch.Tensor, use_fast_accum: bool = False) -> torch.Tensor:
    """out += (a @ b) * scale_a * scale_b, summed in fp32; returns out. a (M, K) row-major and b (K, N) column-major,
    fp8 (not both e5m2), as torch._scaled_mm takes them; scale_a and scale_b fp32 one-element tensors (tensorwise);
    out (M, N) fp32, contiguous. On CUDA with cuBLASLt (`unusable` None) the add is the GEMM's epilogue; elsewhere
    torch._scaled_mm then the add (the same sum up to the order of fp32 rounding)."""
    M, K = a.shape
    if b.shape[0] != K or out.shape != (M, b.shape[1]):
        raise ValueError(f"scaled_mm_add_: a {tuple(a.shape)} @ b {tuple(b.shape)} does not fit out {tuple(out.shape)}")
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"scaled_mm_add_: out must be a contiguous fp32 matrix, not {out.dtype} with strides "
                         f"{out.stride()}")
    if a.dtype not in _FP8 or b.dtype not in _FP8 or a.stride(1) != 1 or b.stride(0) != 1:
        raise ValueError(f"scaled_mm_add_: a must be row-major and b column-major fp8 (got {a.dtype} strides "
                         f"{a.stride()}, {b.dtype} strides {b.stride()})")
    if a.stride(0) < K or b.stride(1) < K:
        raise ValueError(f"scaled_mm_add_: a's row stride {a.stride(0)} and b's column stride {b.stride(1)} must be at "
                         f"least K = {K}")
    if scale_a.numel() != 1 or scale_b.numel() != 1:
        raise ValueError("scaled_mm_add_: tensorwise scales only (one-element scale_a and scale_b)")
    if unusable(out.device) is None:
        _scaled_mm_add_lt(out, a, b, scale_a, scale_b, use_fast_accum)
    else:
        _unfused(out, a, b, scale_a, scale_b, use_fast_accum)
    return out
