"""hipblaslt-bench command lines: hipBLASLt's shape log (HIPBLASLT_LOG_MASK=32) and the tuning commands built from it.

Each logged GEMM call is a ready-to-run `hipblaslt-bench ...` line. Flags are `-m 1024` / `--transA T`, and some
take no value (`--bias_vector`), so a flag's value is the next token only when that token is not itself a flag.
"""
from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

from tuning.gemm_problem import GemmProblem

BENCH = "hipblaslt-bench"
# What the original offline tuner adds: every solution (-1), skip clearly slow ones early, rotate 512 MB of
# buffers so the L2 (MALL) cache does not flatter small problems, and print the winning kernel.
TUNE_FLAGS = ["--requested_solution", "-1", "--skip_slow_solution_ratio", "0.7", "--rotating", "512",
              "--cold_iters", "20", "--iters", "20", "--print_kernel_info"]
TIMING_FLAGS = ["--rotating", "512", "--cold_iters", "20", "--iters", "20"]
_DROP_FOR_TUNING = {"--algo_method", "--solution_index", "--requested_solution", "--skip_slow_solution_ratio",
                    "--rotating", "--cold_iters", "--iters", "--print_kernel_info"}
_NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and not _NUMBER.match(tok)


def split_bench_line(line: str) -> list[tuple[str, str | None]] | None:
    """Ordered (flag, value-or-None) pairs of a hipblaslt-bench line; None when the line is not one."""
    pos = line.find(BENCH)
    if pos < 0:
        return None
    toks = shlex.split(line[pos:])[1:]
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not _is_flag(tok):
            raise ValueError(f"unexpected token {tok!r} in hipblaslt-bench line: {line.strip()!r}")
        if i + 1 < len(toks) and not _is_flag(toks[i + 1]):
            out.append((tok, toks[i + 1]))
            i += 2
        else:
            out.append((tok, None))
            i += 1
    return out


def join_bench_args(pairs: list[tuple[str, str | None]]) -> list[str]:
    argv: list[str] = []
    for flag, value in pairs:
        argv.append(flag)
        if value is not None:
            argv.append(value)
    return argv


def normalize_bench_line(line: str) -> str | None:
    """The bench command alone (no log prefix, single spaces), so identical calls dedupe as equal strings."""
    pairs = split_bench_line(line)
    if pairs is None:
        return None
    return " ".join([BENCH] + join_bench_args(pairs))


def problem_from_bench_line(line: str, count: float = 1.0) -> GemmProblem:
    pairs = split_bench_line(line)
    if pairs is None:
        raise ValueError(f"not a hipblaslt-bench line: {line!r}")
    flags = {f.lstrip("-"): v for f, v in pairs}

    def num(name, default=0, conv=int):
        v = flags.get(name)
        return conv(v) if v is not None else default

    try:
        m, n, k = num("m", conv=int), num("n", conv=int), num("k", conv=int)
    except ValueError as e:
        raise ValueError(f"bad size in hipblaslt-bench line {line.strip()!r}: {e}") from None
    if not (m and n and k):
        raise ValueError(f"hipblaslt-bench line without -m/-n/-k: {line.strip()!r}")
    ldc = num("ldc", m)
    bias = "bias_vector" in flags and flags["bias_vector"] in (None, "1", "true")
    return GemmProblem(
        transA=flags.get("transA", "N"), transB=flags.get("transB", "N"), m=m, n=n, k=k,
        lda=num("lda", m), ldb=num("ldb", k), ldc=ldc, ldd=num("ldd", ldc),
        a_type=flags.get("a_type", "f32_r"), b_type=flags.get("b_type", "f32_r"),
        c_type=flags.get("c_type", "f32_r"), d_type=flags.get("d_type", flags.get("c_type", "f32_r")),
        compute_type=flags.get("compute_type", "f32_r"),
        batch_count=num("batch_count", 1),
        stride_a=num("stride_a"), stride_b=num("stride_b"), stride_c=num("stride_c"), stride_d=num("stride_d"),
        alpha=num("alpha", 1.0, float), beta=num("beta", 0.0, float),
        bias_vector=int(bias), bias_type=flags.get("bias_type", "f32_r"),
        activation_type=flags.get("activation_type", "none"),
        scaleA=num("scaleA"), scaleB=num("scaleB"),
        count=count, source="hipblaslt-log", bench_line=normalize_bench_line(line),
    )


def read_bench_lines(paths) -> Counter:
    """Distinct bench command lines of one or more logs, with how often each was logged."""
    counts: Counter = Counter()
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                norm = normalize_bench_line(line)
                if norm is not None:
                    counts[norm] += 1
    return counts


def problems_from_logs(paths) -> list[GemmProblem]:
    return [problem_from_bench_line(line, count) for line, count in read_bench_lines(paths).items()]


def tuning_argv(bench_line: str) -> list[str]:
    """The original tuner's command for one logged line: the solution pin removed, search flags added."""
    pairs = [(f, v) for f, v in split_bench_line(bench_line) if f not in _DROP_FOR_TUNING]
    return [BENCH] + join_bench_args(pairs) + TUNE_FLAGS


def default_timing_argv(bench_line: str) -> list[str]:
    """Time what training ran: the logged solution if pinned, else the heuristic's first choice."""
    pairs = [(f, v) for f, v in split_bench_line(bench_line)
             if f not in _DROP_FOR_TUNING - {"--algo_method", "--solution_index"}]
    if not any(f == "--algo_method" for f, _ in pairs):
        pairs += [("--algo_method", "heuristic"), ("--requested_solution", "1")]
    return [BENCH] + join_bench_args(pairs) + TIMING_FLAGS


def bench_line_from_problem(p: GemmProblem) -> str:
    """A hipblaslt-bench line for a problem recorded elsewhere (the torch recorder), for tuning on ROCm."""
    argv = [BENCH, "--api_method", "c", "-m", p.m, "-n", p.n, "-k", p.k, "--lda", p.lda, "--ldb", p.ldb,
            "--ldc", p.ldc, "--ldd", p.ldd, "--stride_a", p.stride_a, "--stride_b", p.stride_b,
            "--stride_c", p.stride_c, "--stride_d", p.stride_d, "--alpha", f"{p.alpha:f}", "--beta", f"{p.beta:f}",
            "--transA", p.transA, "--transB", p.transB, "--batch_count", p.batch_count,
            "--scaleA", p.scaleA, "--scaleB", p.scaleB, "--a_type", p.a_type, "--b_type", p.b_type,
            "--c_type", p.c_type, "--d_type", p.d_type, "--scale_type", "f32_r", "--bias_type", p.bias_type,
            "--compute_type", p.compute_type, "--activation_type", p.activation_type]
    if p.bias_vector:
        argv.append("--bias_vector")
    return " ".join(str(x) for x in argv)


def log_files(path: Path) -> list[Path]:
    """hipBLASLt shape logs in a dump folder (or the file itself)."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(p for p in path.glob("*.txt") if p.is_file())
