"""Stage 3: train with the tuned algorithms.

ROCm: hipBLASLt applies the results file itself (`rocm_override_env`, set before the process starts).
CUDA: `install_tuned_linear(results_file)` routes linear GEMMs (forward, dgrad, wgrad) whose problem was tuned
through cublasLtMatmul with the stored algorithm; every other GEMM runs torch's default. Eager, a linear with a
tuned GEMM goes through an autograd Function (cheap on the host) and a linear without one stays torch's F.linear;
under torch.compile the routing is a `torch.library` custom op (opaque, with a fake and an autograd formula). Both
launch on torch's current stream with a preallocated workspace and never sync, so they can be captured in a CUDA
graph.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Optional

import torch

from tuning.gemm_problem import problem_from_matmul
from tuning.results_file import CUBLASLT_ALGO_COLUMNS, ResultsFile, problem_from_row, read_results

WORKSPACE_BYTES = 32 << 20
ALIGNMENT = 256  # the tuner checked algorithms for buffers aligned like this


class TunedResultsMismatch(ValueError):
    """The results file was written for another library version or GPU."""


def rocm_override_env(results_file: str | os.PathLike) -> dict[str, str]:
    """Environment for stage 3 on ROCm: hipBLASLt reads the tuned solutions from this file."""
    path = Path(results_file)
    if not path.is_file():
        raise FileNotFoundError(f"tuning results file {path} does not exist (run stage 2 first)")
    return {"HIPBLASLT_TUNING_OVERRIDE_FILE": str(path.resolve())}


def tuned_table(results: ResultsFile) -> dict[tuple, dict[str, int]]:
    """Tune key -> cuBLASLt algorithm configuration, for rows that carry one (a later row wins)."""
    table = {}
    for row in results.rows:
        if all(row.get(c, "") != "" for c in CUBLASLT_ALGO_COLUMNS):
            table[problem_from_row(row).tune_key()] = {c: int(row[c]) for c in CUBLASLT_ALGO_COLUMNS}
    return table


def check_compatible(results: ResultsFile, library_version: int, gpu_name: str, path="results file") -> None:
    """Refuse results tuned with another cuBLASLt version or on another GPU (algorithms do not carry over)."""
    if not results.rows:
        return
    libs = {r.get("library", "") for r in results.rows}
    if libs != {"cublasLt"}:
        raise TunedResultsMismatch(
            f"{path} was not written by the CUDA tuner (library column: {sorted(libs)}); a hipBLASLt file is "
            f"applied on ROCm through HIPBLASLT_TUNING_OVERRIDE_FILE (tuning.apply.rocm_override_env)")
    versions = {r.get("library_version") for r in results.rows}
    if versions != {str(library_version)}:
        raise TunedResultsMismatch(
            f"{path} was tuned with cuBLASLt {sorted(versions)}, this process loads cuBLASLt {library_version}: "
            f"re-run stage 2 (tuning) with this library")
    gpus = {r.get("gcnArchName") for r in results.rows}
    if gpus != {gpu_name.replace(",", " ")}:  # the tuner writes the name without commas
        raise TunedResultsMismatch(f"{path} was tuned on {sorted(gpus)}, this GPU is '{gpu_name}': re-run stage 2")


def _routable(t: torch.Tensor) -> bool:
    return t.dim() == 2 and (t.is_contiguous() or t.t().is_contiguous()) and t.data_ptr() % ALIGNMENT == 0


class LtExecutor:
    """Runs tuned problems through cuBLASLt: per device a handle, per stream a workspace, per problem cached
    descriptors and the restored algorithm."""

    def __init__(self, table: dict[tuple, dict[str, int]]):
        from tuning.lt_bindings import Lt
        self.lt = Lt.load("cublaslt")
        self.table = table
        self._handles: dict[int, int] = {}
        self._workspaces: dict[tuple[int, int], torch.Tensor] = {}
        self._prepared: dict[tuple, tuple | None] = {}
        self._keys: dict[tuple, tuple] = {}
        self._lock = threading.Lock()
        self.calls: Counter = Counter()
        if torch.cuda.is_available():  # the common stream's workspace exists before any graph capture
            stream = torch.cuda.current_stream()
            self._workspaces[(stream.device.index, stream.cuda_stream)] = torch.empty(
                WORKSPACE_BYTES, dtype=torch.uint8, device=stream.device)

    def check_compatible(self, results: ResultsFile, path) -> None:
        check_compatible(results, self.lt.version(), torch.cuda.get_device_name(), path)

    def _prepare(self, dev: int, key: tuple, p):
        """Descriptors + algorithm for a problem, checked once; None when the algorithm cannot run it."""
        handle = self._handles.get(dev)
        if handle is None:
            with torch.cuda.device(dev):
                handle = self._handles[dev] = self.lt.create_handle()
        descs = self.lt.create_descs(p)
        try:
            algo = self.lt.restore(handle, descs, self.table[key])
            needed = self.lt.algo_check(handle, descs, algo)
        except Exception:  # noqa: BLE001 - an unusable entry falls back to torch
            needed = None
        if needed is None or needed > WORKSPACE_BYTES:
            self.lt.destroy_descs(descs)
            return None
        return handle, descs, algo

    def run(self, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if not (a.is_cuda and _routable(a) and _routable(b) and a.dtype == b.dtype and a.shape[0] and b.shape[1]):
            return None
        if bias is not None and not (bias.is_contiguous() and bias.data_ptr() % ALIGNMENT == 0):
            return None
        # the problem's tune key depends only on shapes, strides and dtypes: built once per signature (this runs
        # for every routed GEMM call, on the host, between kernel launches)
        sig = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, None if bias is None else bias.dtype)
        hit = self._keys.get(sig)
        if hit is None:
            p = problem_from_matmul(a, b, bias=bias)
            hit = self._keys[sig] = (p.tune_key(), p)
        key, p = hit
        if key not in self.table:
            return None
        dev = a.device.index
        with self._lock:
            prep = self._prepared.get((dev, key), False)
            if prep is False:
                prep = self._prepared[(dev, key)] = self._prepare(dev, key, p)
        if prep is None:
            return None
        handle, descs, algo = prep
        stream = torch.cuda.current_stream(a.device).cuda_stream
        ws = self._workspaces.get((dev, stream))
        if ws is None:
            ws = self._workspaces[(dev, stream)] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=a.device)
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        with self._lock:  # the bias pointer lives on the shared descriptor until the launch
            if bias is not None:
                self.lt.set_bias_pointer(descs, bias.data_ptr())
            self.lt.matmul(handle, descs, algo, b.data_ptr(), a.data_ptr(), out.data_ptr(), out.data_ptr(),
                           ws.data_ptr(), WORKSPACE_BYTES, stream)
        self.calls["tuned"] += 1
        return out


_EXECUTOR = None  # the installed executor; the custom op reads it at run time (so compiled graphs switch too)
_ORIGINAL_LINEAR = None
_STATS: Counter = Counter()


def _lt_mm(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """a @ b (+ bias): the tuned cuBLASLt algorithm when this problem was tuned, else torch's default."""
    ex = _EXECUTOR
    if ex is not None:
        out = ex.run(a, b, bias)
        if out is not None:
            _STATS["tuned"] += 1
            return out
    _STATS["default"] += 1
    return torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)


@torch.library.custom_op("primus_tuning::lt_matmul", mutates_args=())
def lt_matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """`_lt_mm` as a torch op: what torch.compile sees (opaque, with a fake and an autograd formula) and what a
    CUDA graph captures."""
    return _lt_mm(a, b, bias)


@lt_matmul.register_fake
def _(a, b, bias):
    return a.new_empty((a.shape[0], b.shape[1]))


def _is_col_major(t: torch.Tensor) -> bool:
    # torch's own test in its mm backward
    return t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _setup_context(ctx, inputs, output):
    a, b, bias = inputs
    ctx.save_for_backward(a, b)
    ctx.has_bias = bias is not None
    ctx.a_col_major = _is_col_major(a)
    ctx.b_col_major = _is_col_major(b)


def _grads(ctx, grad, mm):
    # The same products, in the same layouts, as torch's own mm backward (so stage 1 recorded exactly these
    # problems): a column-major operand gets its gradient computed transposed, which keeps it column-major
    # (for a linear weight b = W^T: dW = grad^T @ a comes out contiguous).
    a, b = ctx.saved_tensors
    ga = gb = gbias = None
    if ctx.needs_input_grad[0]:
        ga = mm(b, grad.t(), None).t() if ctx.a_col_major else mm(grad, b.t(), None)
    if ctx.needs_input_grad[1]:
        gb = mm(grad.t(), a, None).t() if ctx.b_col_major else mm(a.t(), grad, None)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        gbias = grad.sum(0)
    return ga, gb, gbias


def _backward(ctx, grad):
    return _grads(ctx, grad, lt_matmul)


lt_matmul.register_autograd(_backward, setup_context=_setup_context)


class _LtMatmulFn(torch.autograd.Function):
    """The eager twin of `lt_matmul`: same products and routing, without the custom-op dispatch. Host time of a
    small linear's forward + backward on this project's 2-core CPU machine (best of 3): torch's linear 96 us,
    through the custom op 193 us, through this Function 121 us. The custom op's extra ~0.1 ms per linear, on each
    of a step's linears, is the suspect for the eager tuned step running 0.977x the default on the H200."""

    @staticmethod
    def forward(ctx, a, b, bias):
        _setup_context(ctx, (a, b, bias), None)
        return _lt_mm(a, b, bias)

    @staticmethod
    def backward(ctx, grad):
        return _grads(ctx, grad, _lt_mm)


def _matmul(a, b, bias):
    if torch.compiler.is_compiling():
        return lt_matmul(a, b, bias)
    return _LtMatmulFn.apply(a, b, bias)


def _autocast(*ts):
    """Custom ops are not autocast: cast like autocast would cast linear (to its lower-precision dtype)."""
    dev = ts[0].device.type
    if not torch.is_autocast_enabled(dev):
        return ts
    dt = torch.get_autocast_dtype(dev)
    return tuple(t.to(dt) if t is not None and t.is_floating_point() and t.dtype != dt else t for t in ts)


def tuned_mm(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """2-D a @ b (+ bias) through the tuned path (e.g. for megatron's linear, which calls torch.matmul)."""
    a, b, bias = _autocast(a, b, bias)
    return _matmul(a, b, bias)


_LINEAR_ROUTED: dict[tuple, bool] = {}  # linear signature -> is any of its three GEMMs tuned


def _linear_routed(a: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Does one of this linear's GEMMs (forward a @ W^T, dgrad grad @ W, wgrad grad^T @ a; the products
    `_grads` issues) have a tuned algorithm? A linear with none keeps torch's own F.linear: no Python autograd, no
    per-call lookup (on the H200, when every linear of an eager step went through the tuned op, tuned or not,
    and the tuned step ran 0.977x the default one)."""
    ex = _EXECUTOR
    table = getattr(ex, "table", None)
    if not table:
        return False
    sig = (a.shape, a.stride(), weight.shape, weight.stride(), a.dtype, weight.dtype,
           None if bias is None else bias.dtype, id(table))
    hit = _LINEAR_ROUTED.get(sig)
    if hit is None:
        M, K = a.shape
        N = weight.shape[0]

        def meta(shape, stride, dtype):
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")

        am = meta((M, K), a.stride(), a.dtype)
        wm = meta((N, K), weight.stride(), weight.dtype)
        grad = meta((M, N), (N, 1), a.dtype)
        problems = [problem_from_matmul(am, wm.t(), bias=bias), problem_from_matmul(grad, wm),
                    problem_from_matmul(grad.t(), am)]
        hit = _LINEAR_ROUTED[sig] = any(p.tune_key() in table for p in problems)
    return hit


def tuned_linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Drop-in for torch.nn.functional.linear: y = input @ weight^T + bias through the tuned path when one of the
    linear's GEMMs was tuned; otherwise torch's own linear (eager; under torch.compile every linear takes the op)."""
    input, weight, bias = _autocast(input, weight, bias)
    a = input.reshape(-1, input.shape[-1])
    if not torch.compiler.is_compiling() and _ORIGINAL_LINEAR is not None and not _linear_routed(a, weight, bias):
        _STATS["untuned_linear"] += 1
        return _ORIGINAL_LINEAR(input, weight, bias)
    out = _matmul(a, weight.t(), bias)
    return out.view(*input.shape[:-1], weight.shape[0])


class TunedLinearHandle:
    def __init__(self, executor, table_size: int):
        self.executor, self.table_size = executor, table_size

    def stats(self) -> dict:
        """Since install: GEMM calls that ran a tuned algorithm ("tuned") or torch's default inside the tuned op
        ("default"), and eager linear calls left to torch's F.linear because none of their GEMMs was tuned
        ("untuned_linear")."""
        return dict(_STATS)

    def uninstall(self) -> None:
        uninstall_tuned_linear()


def install_tuned_linear(results_file: str | os.PathLike, *, patch_functional: bool = True,
                         executor=None) -> TunedLinearHandle:
    """Route tuned linear GEMMs through cuBLASLt; patches torch.nn.functional.linear (so nn.Linear) unless
    patch_functional=False, in which case call `tuned_linear` / `tuned_mm` yourself. Undo with uninstall.

    Raises TunedResultsMismatch for a file tuned with another cuBLASLt version or GPU.
    `executor` replaces the cuBLASLt executor (tests).
    """
    global _EXECUTOR, _ORIGINAL_LINEAR
    if getattr(torch.version, "hip", None):
        raise RuntimeError("on ROCm, tuned GEMMs are applied by hipBLASLt: export the variables from "
                           "tuning.apply.rocm_override_env(results_file) before the training process starts")
    path = Path(results_file)
    if not path.is_file():
        raise FileNotFoundError(f"tuning results file {path} does not exist (run stage 2 first)")
    results = read_results(path)
    table = tuned_table(results)
    if executor is None:
        executor = LtExecutor(table)
        executor.check_compatible(results, path)
    else:
        executor.table = table
    uninstall_tuned_linear()
    _EXECUTOR = executor
    _STATS.clear()
    _LINEAR_ROUTED.clear()
    if patch_functional:
        _ORIGINAL_LINEAR = torch.nn.functional.linear
        torch.nn.functional.linear = tuned_linear
    return TunedLinearHandle(executor, len(table))


def uninstall_tuned_linear() -> None:
    global _EXECUTOR, _ORIGINAL_LINEAR
    _EXECUTOR = None
    if _ORIGINAL_LINEAR is not None:
        torch.nn.functional.linear = _ORIGINAL_LINEAR
        _ORIGINAL_LINEAR = None


def is_installed() -> bool:
    return _EXECUTOR is not None
