"""The tuning results file: hipBLASLt's override-file layout, shared by the CUDA path.

    Git Version: <library revision>
        transA,transB,...,us,solution_index,gcnArchName,CUs[,extra CUDA columns]
        T,N,...

Each problem is a header line and a values line, both indented by four spaces. Columns vary across hipBLASLt
versions (older ones have no swizzle/aux/flush/gpu-timer columns), so every reader goes by header name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tuning.gemm_problem import GemmProblem

HIPBLASLT_COLUMNS = (
    "transA,transB,grouped_gemm,batch_count,m,n,k,alpha,lda,stride_a,beta,ldb,stride_b,ldc,stride_c,ldd,stride_d,"
    "a_type,b_type,c_type,d_type,compute_type,scaleA,scaleB,scaleC,scaleD,amaxD,swizzle_a,swizzle_b,"
    "activation_type,bias_vector,bias_type,aux_type,rotating_buffer,flush,use_gpu_timer,hipblaslt-Gflops,"
    "hipblaslt-GB/s,us,solution_index,gcnArchName,CUs"
).split(",")

# The cuBLASLt algorithm configuration attributes, in enum order (CUBLASLT_ALGO_CONFIG_*), and what restores it.
CUBLASLT_ALGO_COLUMNS = ("algo_id", "tile_id", "splitk_num", "reduction_scheme", "cta_swizzling",
                         "custom_option", "stages_id", "inner_shape_id", "cluster_shape_id")
CUDA_EXTRA_COLUMNS = ("library", "library_version") + CUBLASLT_ALGO_COLUMNS + ("default_us", "heuristic_us")

INDENT = "    "
HEADER_PREFIX = "Git Version:"


@dataclass
class ResultsFile:
    git_version: str = ""
    rows: list[dict] = field(default_factory=list)


def _csv_safe(v) -> str:
    return str(v).replace(",", ";").replace("\n", " ")


def read_results(path: Path | str) -> ResultsFile:
    lines = Path(path).read_text(errors="replace").splitlines()
    out = ResultsFile()
    header: list[str] | None = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(HEADER_PREFIX):
            out.git_version = line[len(HEADER_PREFIX):].strip()
            continue
        cells = [c.strip() for c in line.split(",")]
        if "transA" in cells and "m" in cells:  # a header (column order varies across versions)
            header = cells
            continue
        if header is None:
            raise ValueError(f"{path}:{lineno}: values line before any header line: {line!r}")
        if len(cells) != len(header):
            raise ValueError(f"{path}:{lineno}: {len(cells)} values for {len(header)} header columns")
        out.rows.append(dict(zip(header, cells)))
        header = None
    return out


def write_header(path: Path | str, git_version: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{HEADER_PREFIX} {git_version}\n")


def append_row(path: Path | str, row: dict, git_version: str = "unknown") -> None:
    """Append one problem, creating the file with its version line first; flushed so a kill loses nothing."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        write_header(path, git_version)
    cols = list(row.keys())
    with open(path, "a") as f:
        f.write(INDENT + ",".join(cols) + "\n")
        f.write(INDENT + ",".join(_csv_safe(row[c]) for c in cols) + "\n")
        f.flush()
        os.fsync(f.fileno())


def row_from_problem(p: GemmProblem, *, us: float, solution_index: int = -1, arch: str = "", cus: int = 0,
                     rotating_mb: int = 0) -> dict:
    """The 42 standard columns for a problem and its tuned time."""
    secs = us * 1e-6 if us > 0 else float("inf")
    elem = {"f32_r": 4, "f16_r": 2, "bf16_r": 2, "f8_r": 1, "bf8_r": 1, "f8_fnuz_r": 1, "bf8_fnuz_r": 1}
    moved = p.batch_count * (p.m * p.k * elem.get(p.a_type, 2) + p.k * p.n * elem.get(p.b_type, 2)
                             + p.m * p.n * elem.get(p.d_type, 2))
    return {
        "transA": p.transA, "transB": p.transB, "grouped_gemm": 0, "batch_count": p.batch_count,
        "m": p.m, "n": p.n, "k": p.k, "alpha": f"{p.alpha:g}", "lda": p.lda, "stride_a": p.stride_a,
        "beta": f"{p.beta:g}", "ldb": p.ldb, "stride_b": p.stride_b, "ldc": p.ldc, "stride_c": p.stride_c,
        "ldd": p.ldd, "stride_d": p.stride_d, "a_type": p.a_type, "b_type": p.b_type, "c_type": p.c_type,
        "d_type": p.d_type, "compute_type": p.compute_type, "scaleA": p.scaleA, "scaleB": p.scaleB,
        "scaleC": 0, "scaleD": 0, "amaxD": 0, "swizzle_a": 0, "swizzle_b": 0,
        "activation_type": p.activation_type, "bias_vector": int(p.bias_vector), "bias_type": p.bias_type,
        "aux_type": "f32_r", "rotating_buffer": rotating_mb, "flush": 0, "use_gpu_timer": 1,
        "hipblaslt-Gflops": f"{p.flops() / secs / 1e9:.0f}", "hipblaslt-GB/s": f"{moved / secs / 1e9:.2f}",
        "us": f"{us:.4f}", "solution_index": solution_index, "gcnArchName": arch, "CUs": cus,
    }


def problem_from_row(row: dict) -> GemmProblem:
    """The problem a results row describes; absent columns (older files) take the bench defaults."""
    def g(name, default, conv=str):
        v = row.get(name)
        return conv(v) if v not in (None, "") else default

    m = g("m", 0, int)
    ldc = g("ldc", m, int)
    return GemmProblem(
        transA=g("transA", "N"), transB=g("transB", "N"), m=m, n=g("n", 0, int), k=g("k", 0, int),
        lda=g("lda", 0, int), ldb=g("ldb", 0, int), ldc=ldc, ldd=g("ldd", ldc, int),
        a_type=g("a_type", "f32_r"), b_type=g("b_type", "f32_r"), c_type=g("c_type", "f32_r"),
        d_type=g("d_type", g("c_type", "f32_r")), compute_type=g("compute_type", "f32_r"),
        batch_count=g("batch_count", 1, int), stride_a=g("stride_a", 0, int), stride_b=g("stride_b", 0, int),
        stride_c=g("stride_c", 0, int), stride_d=g("stride_d", 0, int), alpha=g("alpha", 1.0, float),
        beta=g("beta", 0.0, float), bias_vector=g("bias_vector", 0, int), bias_type=g("bias_type", "f32_r"),
        activation_type=g("activation_type", "none"), scaleA=g("scaleA", 0, int), scaleB=g("scaleB", 0, int),
    )


def latest_rows_by_key(results: ResultsFile) -> dict[tuple, dict]:
    """One row per problem; a later row wins (a resumed run may have appended a problem twice)."""
    return {problem_from_row(r).tune_key(): r for r in results.rows}


def merge_into(dest: Path | str, src: Path | str) -> int:
    """Append src's rows to dest (hipblaslt-bench writes one file per worker); returns rows appended."""
    res = read_results(src)
    for row in res.rows:
        append_row(dest, row, res.git_version or "unknown")
    return len(res.rows)
