"""ctypes bindings to cuBLASLt / hipBLASLt: handle, descriptors, heuristics, matmul, algorithm save/restore.

One class for both libraries; every name and constant that differs comes from the `LibrarySpec` table.
Pointers are passed as plain ints (device addresses from torch), so nothing here imports torch.
"""
from __future__ import annotations

import ctypes
import struct
from ctypes import c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass

from tuning.gemm_problem import GemmProblem
from tuning.lt_library import LibrarySpec, load_library


class LtError(RuntimeError):
    pass


class Algo:
    """An opaque <lib>MatmulAlgo_t, owned as bytes, plus the workspace the heuristic / check asked for."""

    __slots__ = ("buf", "workspace_size", "waves")

    def __init__(self, size: int, raw: bytes | None = None, workspace_size: int = 0, waves: float = 0.0):
        self.buf = ctypes.create_string_buffer(raw if raw is not None else b"\0" * size, size)
        self.workspace_size = workspace_size
        self.waves = waves

    @property
    def ptr(self) -> int:
        return ctypes.addressof(self.buf)

    def raw(self) -> bytes:
        return self.buf.raw


@dataclass
class ProblemDescs:
    """Matmul descriptor and the four layouts of one problem (owned; release with Lt.destroy_descs)."""
    desc: int
    a: int
    b: int
    c: int
    d: int
    problem: GemmProblem


class Lt:
    def __init__(self, spec: LibrarySpec, lib: ctypes.CDLL, path: str):
        self.spec, self.lib, self.path = spec, lib, path
        self._fns: dict = {}
        self._one, self._zero = c_float(1.0), c_float(0.0)

    @classmethod
    def load(cls, library: str | None = None) -> "Lt":
        return cls(*load_library(library))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def can_enumerate(self) -> bool:
        """Whether algorithms can be listed and rebuilt from their attributes (cuBLASLt) or only searched."""
        return bool(self.spec.algo_config)

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _fn(self, suffix: str, argtypes, restype=c_int):
        fn = self._fns.get(suffix)
        if fn is None:
            sym = self.spec.prefix + suffix
            try:
                fn = getattr(self.lib, sym)
            except AttributeError:
                raise LtError(f"{self.path} has no {sym}") from None
            fn.argtypes, fn.restype = argtypes, restype
            self._fns[suffix] = fn
        return fn

    def _call(self, suffix: str, argtypes, *args) -> None:
        status = self._fn(suffix, argtypes)(*args)
        if status != 0:
            raise LtError(f"{self.spec.prefix}{suffix} failed with status {status}")

    def _dtype(self, name: str) -> int:
        try:
            return self.spec.dtypes[name]
        except KeyError:
            raise LtError(f"{self.name} binding has no data type {name!r}") from None

    # -- library and handle --------------------------------------------------------------------------------------

    def version(self, handle: int | None = None) -> int:
        if self.spec.prefix == "cublasLt":
            return int(self._fn("GetVersion", [], c_size_t)())
        v = c_int(0)
        self._call("GetVersion", [c_void_p, c_void_p], handle or self.create_handle(), ctypes.addressof(v))
        return v.value

    def git_version(self, handle: int | None = None) -> str:
        """The line the results file starts with: hipBLASLt's git revision, cuBLASLt's version number."""
        if self.spec.prefix == "cublasLt":
            return f"cublasLt-{self.version()}"
        rev = ctypes.create_string_buffer(128)
        self._call("GetGitRevision", [c_void_p, c_void_p], handle or self.create_handle(), ctypes.addressof(rev))
        return rev.value.decode(errors="replace")

    def create_handle(self) -> int:
        h = c_void_p()
        self._call("Create", [c_void_p], ctypes.addressof(h))
        return h.value

    def destroy_handle(self, handle: int) -> None:
        self._call("Destroy", [c_void_p], handle)

    # -- descriptors ---------------------------------------------------------------------------------------------

    def _set_attr(self, suffix: str, obj: int, attr: int, value) -> None:
        self._call(suffix, [c_void_p, c_int, c_void_p, c_size_t], obj, attr, ctypes.addressof(value),
                   ctypes.sizeof(value))

    def _layout(self, type_name: str, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        lay = c_void_p()
        self._call("MatrixLayoutCreate", [c_void_p, c_int, c_uint64, c_uint64, c_int64], ctypes.addressof(lay),
                   self._dtype(type_name), rows, cols, ld)
        if batch > 1:
            self._set_attr("MatrixLayoutSetAttribute", lay.value, self.spec.layout_attr["BATCH_COUNT"],
                           c_int32(batch))
            self._set_attr("MatrixLayoutSetAttribute", lay.value, self.spec.layout_attr["STRIDED_BATCH_OFFSET"],
                           c_int64(stride))
        return lay.value

    def create_descs(self, p: GemmProblem) -> ProblemDescs:
        if p.compute_type != "f32_r":
            raise LtError(f"compute type {p.compute_type} is not bound (only f32_r)")
        modes = self._scale_modes(p)
        d = c_void_p()
        self._call("MatmulDescCreate", [c_void_p, c_int, c_int], ctypes.addressof(d), self.spec.compute_32f,
                   self._dtype("f32_r"))
        attr = self.spec.desc_attr
        set_desc = "MatmulDescSetAttribute"
        self._set_attr(set_desc, d.value, attr["TRANSA"], c_int32(self.spec.op[p.transA]))
        self._set_attr(set_desc, d.value, attr["TRANSB"], c_int32(self.spec.op[p.transB]))
        if modes is not None:  # the scale tensors' pointers are set per call (set_scale_pointers)
            self._set_attr(set_desc, d.value, attr["A_SCALE_MODE"], c_int32(modes[0]))
            self._set_attr(set_desc, d.value, attr["B_SCALE_MODE"], c_int32(modes[1]))
        if p.bias_vector:
            self._set_attr(set_desc, d.value, attr["EPILOGUE"], c_uint32(self.spec.epilogue["BIAS"]))
            self._set_attr(set_desc, d.value, attr["BIAS_DATA_TYPE"], c_int32(self._dtype(p.bias_type)))
        ar, ac = (p.m, p.k) if p.transA == "N" else (p.k, p.m)
        br, bc = (p.k, p.n) if p.transB == "N" else (p.n, p.k)
        bt = p.batch_count
        return ProblemDescs(
            desc=d.value,
            a=self._layout(p.a_type, ar, ac, p.lda, bt, p.stride_a),
            b=self._layout(p.b_type, br, bc, p.ldb, bt, p.stride_b),
            c=self._layout(p.c_type, p.m, p.n, p.ldc, bt, p.stride_c),
            d=self._layout(p.d_type, p.m, p.n, p.ldd, bt, p.stride_d),
            problem=p,
        )

    def _scale_modes(self, p: GemmProblem) -> tuple[int, int] | None:
        """The library's (A, B) scale-mode enums of a scaled (fp8) problem; None when it is not scaled."""
        if not (p.scaleA or p.scaleB):
            return None
        if not (p.scaleA and p.scaleB):
            raise LtError(f"{p.label()}: a scaled GEMM scales both operands (scaleA={p.scaleA}, "
                          f"scaleB={p.scaleB})")
        table = self.spec.scale_modes
        missing = [c for c in (p.scaleA, p.scaleB) if c not in table]
        if missing or "A_SCALE_MODE" not in self.spec.desc_attr:
            raise LtError(f"scale mode(s) {missing or [p.scaleA, p.scaleB]} are not bound for {self.name}")
        return table[p.scaleA], table[p.scaleB]

    def set_scale_pointers(self, descs: ProblemDescs, a_scale: int, b_scale: int) -> None:
        """Device pointers of A's and B's scale tensors (cuBLAS terms: A is torch's right-hand operand)."""
        attr = self.spec.desc_attr
        self._set_attr("MatmulDescSetAttribute", descs.desc, attr["A_SCALE_POINTER"], c_void_p(a_scale))
        self._set_attr("MatmulDescSetAttribute", descs.desc, attr["B_SCALE_POINTER"], c_void_p(b_scale))

    def destroy_descs(self, descs: ProblemDescs) -> None:
        for lay in (descs.a, descs.b, descs.c, descs.d):
            self._call("MatrixLayoutDestroy", [c_void_p], lay)
        self._call("MatmulDescDestroy", [c_void_p], descs.desc)

    def set_bias_pointer(self, descs: ProblemDescs, ptr: int) -> None:
        self._set_attr("MatmulDescSetAttribute", descs.desc, self.spec.desc_attr["BIAS_POINTER"], c_void_p(ptr))

    def create_preference(self, workspace_bytes: int, min_alignment: int | None = None) -> int:
        pref = c_void_p()
        self._call("MatmulPreferenceCreate", [c_void_p], ctypes.addressof(pref))
        set_pref = "MatmulPreferenceSetAttribute"
        self._set_attr(set_pref, pref.value, self.spec.pref_attr["MAX_WORKSPACE_BYTES"], c_uint64(workspace_bytes))
        if min_alignment is not None:
            for which in "ABCD":
                attr = self.spec.pref_attr.get(f"MIN_ALIGNMENT_{which}_BYTES")
                if attr is not None:
                    self._set_attr(set_pref, pref.value, attr, c_uint32(min_alignment))
        return pref.value

    def destroy_preference(self, pref: int) -> None:
        self._call("MatmulPreferenceDestroy", [c_void_p], pref)

    # -- algorithms ----------------------------------------------------------------------------------------------

    def _parse_heuristics(self, raw: bytes, count: int) -> list[Algo]:
        size, asz = self.spec.heuristic_size, self.spec.algo_size
        out = []
        for i in range(count):
            off = i * size
            ws, state, waves = struct.unpack_from("<Qif", raw, off + asz)
            if state == 0:
                out.append(Algo(asz, raw[off:off + asz], ws, waves))
        return out

    def heuristics(self, handle: int, descs: ProblemDescs, pref: int, count: int = 32) -> list[Algo]:
        """The library's ranked candidates (first = what the library would pick)."""
        buf = ctypes.create_string_buffer(self.spec.heuristic_size * count)
        returned = c_int(0)
        self._call("MatmulAlgoGetHeuristic",
                   [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_void_p],
                   handle, descs.desc, descs.a, descs.b, descs.c, descs.d, pref, count, ctypes.addressof(buf),
                   ctypes.addressof(returned))
        return self._parse_heuristics(buf.raw, returned.value)

    def matmul(self, handle: int, descs: ProblemDescs, algo: Algo | None, a: int, b: int, c: int, d: int,
               workspace: int, workspace_bytes: int, stream: int, beta: float = 0.0, alpha: float = 1.0) -> None:
        """D = alpha A @ B (+ beta C) (+ bias, set on the descriptor); scalars on the host."""
        beta_c = self._zero if beta == 0.0 else c_float(beta)
        alpha_c = self._one if alpha == 1.0 else c_float(alpha)
        status = self._fn("Matmul", [c_void_p] * 14 + [c_size_t, c_void_p])(
            handle, descs.desc, ctypes.addressof(alpha_c), a, descs.a, b, descs.b, ctypes.addressof(beta_c),
            c, descs.c, d, descs.d, algo.ptr if algo is not None else None, workspace, workspace_bytes, stream)
        if status != 0:
            raise LtError(f"{self.spec.prefix}Matmul failed with status {status}")

    def _type_args(self, p: GemmProblem) -> list[int]:
        return [self.spec.compute_32f, self._dtype("f32_r"), self._dtype(p.a_type), self._dtype(p.b_type),
                self._dtype(p.c_type), self._dtype(p.d_type)]

    def algo_ids(self, handle: int, p: GemmProblem, limit: int = 256) -> list[int]:
        """Every algorithm id the library has for these types (cuBLASLt)."""
        ids = (c_int * limit)()
        returned = c_int(0)
        self._call("MatmulAlgoGetIds", [c_void_p] + [c_int] * 6 + [c_int, c_void_p, c_void_p], handle,
                   *self._type_args(p), limit, ctypes.addressof(ids), ctypes.addressof(returned))
        return list(ids[:returned.value])

    def algo_init(self, handle: int, p: GemmProblem, algo_id: int) -> Algo | None:
        algo = Algo(self.spec.algo_size)
        status = self._fn("MatmulAlgoInit", [c_void_p] + [c_int] * 6 + [c_int, c_void_p])(
            handle, *self._type_args(p), algo_id, algo.ptr)
        return algo if status == 0 else None

    def algo_check(self, handle: int, descs: ProblemDescs, algo: Algo) -> int | None:
        """Workspace bytes the algorithm needs for this problem, or None when it cannot run it."""
        res = ctypes.create_string_buffer(self.spec.heuristic_size)
        status = self._fn("MatmulAlgoCheck", [c_void_p] * 8)(
            handle, descs.desc, descs.a, descs.b, descs.c, descs.d, algo.ptr, ctypes.addressof(res))
        if status != 0:
            return None
        ws, state, _ = struct.unpack_from("<Qif", res.raw, self.spec.algo_size)
        return ws if state == 0 else None

    def cap_list(self, algo: Algo, cap: str) -> list[int]:
        attr = self.spec.algo_caps[cap]
        fn = self._fn("MatmulAlgoCapGetAttribute", [c_void_p, c_int, c_void_p, c_size_t, c_void_p])
        written = c_size_t(0)
        if fn(algo.ptr, attr, None, 0, ctypes.addressof(written)) != 0 or written.value == 0:
            return []
        arr = (c_uint32 * (written.value // 4))()
        if fn(algo.ptr, attr, ctypes.addressof(arr), ctypes.sizeof(arr), ctypes.addressof(written)) != 0:
            return []
        return list(arr)

    def cap_int(self, algo: Algo, cap: str, default: int = 0) -> int:
        v = c_int32(0)
        written = c_size_t(0)
        status = self._fn("MatmulAlgoCapGetAttribute", [c_void_p, c_int, c_void_p, c_size_t, c_void_p])(
            algo.ptr, self.spec.algo_caps[cap], ctypes.addressof(v), 4, ctypes.addressof(written))
        return v.value if status == 0 else default

    def get_config(self, algo: Algo) -> dict[str, int]:
        fn = self._fn("MatmulAlgoConfigGetAttribute", [c_void_p, c_int, c_void_p, c_size_t, c_void_p])
        out = {}
        for name, attr, ctype in self.spec.algo_config:
            v, written = ctype(0), c_size_t(0)
            if fn(algo.ptr, attr, ctypes.addressof(v), ctypes.sizeof(v), ctypes.addressof(written)) != 0:
                raise LtError(f"cannot read algorithm attribute {name}")
            out[name] = int(v.value)
        return out

    def set_config(self, algo: Algo, config: dict[str, int]) -> None:
        for name, attr, ctype in self.spec.algo_config:
            if name != "algo_id" and name in config:
                self._set_attr("MatmulAlgoConfigSetAttribute", algo.ptr, attr, ctype(int(config[name])))

    # -- save / restore a chosen algorithm -----------------------------------------------------------------------

    def save(self, algo: Algo) -> dict[str, int]:
        """What the results file keeps: cuBLASLt's configuration attributes, or hipBLASLt's solution index."""
        if self.can_enumerate:
            return self.get_config(algo)
        return {"solution_index": struct.unpack_from("<i", algo.raw(), 0)[0]}

    def restore(self, handle: int, descs: ProblemDescs, saved: dict[str, int],
                workspace_bytes: int = 1 << 25) -> Algo:
        p = descs.problem
        if self.can_enumerate:
            algo = self.algo_init(handle, p, int(saved["algo_id"]))
            if algo is None:
                raise LtError(f"algorithm id {saved['algo_id']} does not exist for {p.label()}")
            self.set_config(algo, saved)
            return algo
        # hipBLASLt rebuilds an algorithm from an index only through its C++ API; among the heuristic's
        # candidates the index is found by value.
        want = int(saved["solution_index"])
        pref = self.create_preference(workspace_bytes)
        try:
            for algo in self.heuristics(handle, descs, pref, 256):
                if struct.unpack_from("<i", algo.raw(), 0)[0] == want:
                    return algo
        finally:
            self.destroy_preference(pref)
        raise LtError(f"solution index {want} is not among {self.name}'s candidates for {p.label()}")
