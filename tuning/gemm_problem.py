"""One GEMM problem in cuBLAS / hipBLASLt (column-major) terms, and its mapping from torch tensors.

Field names follow hipblaslt-bench flags and the hipBLASLt override-file columns, so one record moves between
the torch recorder, hipBLASLt logs, the tuner and the results file without renaming.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

SHAPES_FORMAT = "primus-gemm-shapes/1"

# torch dtype name -> hipBLASLt type name (the spelling used by hipblaslt-bench and the override file).
TORCH_TO_TYPE_NAME = {
    "bfloat16": "bf16_r",
    "float16": "f16_r",
    "float32": "f32_r",
    "float64": "f64_r",
    "float8_e4m3fn": "f8_r",
    "float8_e5m2": "bf8_r",
    "float8_e4m3fnuz": "f8_fnuz_r",
    "float8_e5m2fnuz": "bf8_fnuz_r",
    "int8": "i8_r",
}


def type_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    try:
        return TORCH_TO_TYPE_NAME[name]
    except KeyError:
        raise ValueError(f"no GEMM type name for torch dtype {dtype}") from None


@dataclass
class GemmProblem:
    """D[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C (+ bias[m]), all column-major, batched."""

    transA: str
    transB: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    ldd: int
    a_type: str = "bf16_r"
    b_type: str = "bf16_r"
    c_type: str = "bf16_r"
    d_type: str = "bf16_r"
    compute_type: str = "f32_r"
    batch_count: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    stride_d: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    bias_vector: int = 0
    bias_type: str = "f32_r"
    activation_type: str = "none"
    scaleA: int = 0
    scaleB: int = 0
    # Calls per training step (recorded calls / recorded steps); not part of the identity.
    count: float = 1.0
    # Where it came from: aten op names, or the original hipblaslt-bench command line.
    source: str = ""
    bench_line: str = field(default="", repr=False)

    def tune_key(self) -> tuple:
        """Identity of a problem for tuning and for routing at training time.

        Leading dimensions are part of it (an algorithm is checked for one layout); alpha only matters through
        beta's zero-ness, and bias_type only when there is a bias (hipBLASLt logs f32_r even without one).
        """
        return (
            self.transA, self.transB, self.batch_count, self.m, self.n, self.k,
            self.lda, self.ldb, self.ldc, self.ldd,
            self.stride_a if self.batch_count > 1 else 0,
            self.stride_b if self.batch_count > 1 else 0,
            self.stride_c if self.batch_count > 1 else 0,
            self.a_type, self.b_type, self.c_type, self.d_type, self.compute_type,
            int(self.bias_vector), self.bias_type if self.bias_vector else "", self.activation_type,
            self.beta != 0, int(self.scaleA), int(self.scaleB),
        )

    def label(self) -> str:
        b = f" x{self.batch_count}" if self.batch_count > 1 else ""
        bias = " +bias" if self.bias_vector else ""
        return f"{self.transA}{self.transB} m={self.m} n={self.n} k={self.k}{b} {self.a_type}->{self.d_type}{bias}"

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch_count

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GemmProblem":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ----------------------------------------------------------------------------------------------------------------
# torch tensors -> cuBLAS terms
#
# Row-major Y[M,N] = X[M,K] @ W[K,N] is, read column-major, Y^T[N,M] = W^T[N,K] @ X^T[K,M]: cuBLAS m=N, n=M, k=K
# with A = the right-hand torch operand and B = the left-hand one. A row-major torch operand is already the
# transposed matrix in column-major memory (op N); a column-major one (a transposed view) needs op T.


def _layout(t) -> tuple[str, int]:
    """'row' or 'col' for the last two dims of t, and the leading dimension, following torch's cuBLAS rules."""
    r, c = t.shape[-2], t.shape[-1]
    sr, sc = t.stride(-2), t.stride(-1)
    if _is_contig_2d(r, c, sr, sc):
        return "row", max(1, c)
    if _is_contig_2d(c, r, sc, sr):
        return "col", max(1, r)
    if sr == 1 and sc >= max(1, r):
        return "col", sc
    if sc == 1 and sr >= max(1, c):
        return "row", sr
    return "row", max(1, c)  # torch copies such a tensor to a contiguous one first


def _is_contig_2d(r, c, sr, sc) -> bool:
    return (c <= 1 or sc == 1) and (r <= 1 or sr == c)


def _batch_stride(t) -> int:
    if t.dim() < 3 or t.shape[0] <= 1:
        return t.shape[-2] * t.shape[-1]
    return t.stride(0)


def problem_from_matmul(a, b, *, bias=None, c=None, alpha=1.0, beta=0.0, out_dtype=None,
                        scale_a=None, scale_b=None, block_a=None, block_b=None, source="") -> GemmProblem:
    """The cuBLAS problem torch runs for a @ b (2D mm or 3D bmm), row-major torch operands. block_a / block_b:
    "1x128" / "128x128" when scale_a / scale_b are block scales (torch.nn.functional.scaled_mm's BlockWise
    recipes), else the scale's size says scalar or vector."""
    la, lda_torch = _layout(a)  # a is cuBLAS B
    lb, ldb_torch = _layout(b)  # b is cuBLAS A
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    out_type = type_name(out_dtype if out_dtype is not None else a.dtype)
    bias_vec = bias is not None
    c_type = type_name(c.dtype) if c is not None else out_type
    return GemmProblem(
        transA="N" if lb == "row" else "T",
        transB="N" if la == "row" else "T",
        m=N, n=M, k=K,
        lda=ldb_torch, ldb=lda_torch, ldc=max(1, N), ldd=max(1, N),
        a_type=type_name(b.dtype), b_type=type_name(a.dtype), c_type=c_type, d_type=out_type,
        compute_type="f32_r",
        batch_count=batch,
        stride_a=_batch_stride(b) if batch > 1 else 0,
        stride_b=_batch_stride(a) if batch > 1 else 0,
        stride_c=M * N if batch > 1 else 0,
        stride_d=M * N if batch > 1 else 0,
        alpha=float(alpha), beta=float(beta) if c is not None else 0.0,
        bias_vector=int(bias_vec), bias_type=type_name(bias.dtype) if bias_vec else "f32_r",
        scaleA=_scale_mode(scale_b, block_b), scaleB=_scale_mode(scale_a, block_a),
        source=source,
    )


# GemmProblem.scaleA / scaleB: hipblaslt-bench's codes (0 none, 1 one scalar per tensor, 2 a vector: one scale per
# row of A / column of B), and this project's codes for the block modes of torch.nn.functional.scaled_mm on CUDA
# (cuBLASLt's VEC128_32F and BLK128x128_32F; hipBLASLt logs never carry them).
SCALE_NONE, SCALE_SCALAR, SCALE_VECTOR, SCALE_1X128, SCALE_128X128 = 0, 1, 2, 3, 4
BLOCK_SCALES = {"1x128": SCALE_1X128, "128x128": SCALE_128X128}


def _scale_mode(scale, block: str | None = None) -> int:
    if scale is None:
        return SCALE_NONE
    if block is not None:
        try:
            return BLOCK_SCALES[block]
        except KeyError:
            raise ValueError(f"block scaling must be one of {sorted(BLOCK_SCALES)}, not {block!r}") from None
    return SCALE_SCALAR if scale.numel() == 1 else SCALE_VECTOR


def is_bias_vector(bias, n: int) -> bool:
    """addmm's input is a bias vector (epilogue) when it broadcasts along the rows."""
    if bias.dim() == 1:
        return bias.shape[0] == n
    return bias.dim() == 2 and bias.shape[-1] == n and (bias.shape[0] == 1 or bias.stride(0) == 0)


# ----------------------------------------------------------------------------------------------------------------
# JSONL shape files: a meta line, then one problem per line with its call count.


def write_shapes(path: Path | str, problems: Iterable[GemmProblem], *, meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"format": SHAPES_FORMAT, **(meta or {})}) + "\n")
        for p in problems:
            f.write(json.dumps(p.to_dict()) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


def read_shapes(path: Path | str) -> tuple[dict, list[GemmProblem]]:
    meta, problems = {}, []
    with open(path) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if i == 0 and "format" in d:
                if d["format"] != SHAPES_FORMAT:
                    raise ValueError(f"{path}: unknown shapes format {d['format']!r} (expected {SHAPES_FORMAT})")
                meta = d
                continue
            problems.append(GemmProblem.from_dict(d))
    return meta, problems
