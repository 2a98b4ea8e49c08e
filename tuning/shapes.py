"""Stage 1: record the GEMMs a training step runs.

ROCm: hipBLASLt logs every call itself; `rocm_dump_env` gives the variables to set before the process starts.
CUDA (and CPU): `record_gemms` is a torch dispatch mode that sees every aten mm/addmm/bmm/baddbmm/_scaled_mm
(linear and matmul decompose to these, forward and backward), maps each to cuBLAS terms and counts it.
"""
from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

from tuning import bench_log
from tuning.gemm_problem import GemmProblem, is_bias_vector, problem_from_matmul, read_shapes, write_shapes

SHAPE_SUBDIR = "gemm_shape"


def rocm_dump_env(root: str | os.PathLike, node_rank: int) -> dict[str, str]:
    """Environment for a stage-1 run on ROCm (set before any GPU work; hipBLASLt reads it once).

    The override file is set to empty so the dump logs the default solutions, and Transformer Engine's
    in-process tuning is off so it does not add its own GEMMs.
    """
    shape_dir = Path(root) / SHAPE_SUBDIR
    shape_dir.mkdir(parents=True, exist_ok=True)
    return {
        "HIPBLASLT_LOG_MASK": "32",
        "HIPBLASLT_LOG_FILE": str(shape_dir / f"dump_hipblaslt_gemm_shape_{node_rank}.txt"),
        "HIPBLASLT_TUNING_OVERRIDE_FILE": "",
        "TE_HIPBLASLT_TUNING_RUN_COUNT": "0",
        "TE_HIPBLASLT_TUNING_ALGO_COUNT": "0",
    }


def _map_call(func, args, kwargs) -> GemmProblem | None:
    """cuBLAS problem of one aten GEMM call, or None for anything else."""
    import torch
    aten = torch.ops.aten
    packet = func.overloadpacket
    name = f"aten.{packet.__name__}"
    kw = dict(kwargs or {})
    if packet in (aten.mm, aten.bmm):
        return problem_from_matmul(args[0], args[1], source=name)
    if packet in (aten.addmm, aten.baddbmm, aten._addmm_activation):
        c, a, b = args[:3]
        beta = kw.get("beta", args[3] if len(args) > 3 else 1)
        alpha = kw.get("alpha", args[4] if len(args) > 4 else 1)
        n_out = b.shape[-1]
        if packet is not aten.baddbmm and beta == 1 and is_bias_vector(c, n_out):
            p = problem_from_matmul(a, b, bias=c if c.dim() == 1 else c[0], alpha=alpha,
                                    source=name)
        else:
            p = problem_from_matmul(a, b, c=c, alpha=alpha, beta=beta, source=name)
        if packet is aten._addmm_activation:
            gelu = kw.get("use_gelu", args[5] if len(args) > 5 else False)
            p.activation_type = "gelu" if gelu else "relu"
        return p
    if str(func).startswith("primus_tuning.lt_matmul"):
        bias = args[2] if len(args) > 2 else kw.get("bias")  # tuning.apply's op: a @ b (+ bias)
        return problem_from_matmul(args[0], args[1], bias=bias, source="aten.addmm" if bias is not None
                                   else "aten.mm")
    if packet is aten._scaled_mm:
        names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
        v = dict(zip(names, args))
        v.update(kw)
        return problem_from_matmul(v["self"], v["mat2"], bias=v.get("bias"), out_dtype=v.get("out_dtype"),
                                   scale_a=v["scale_a"], scale_b=v["scale_b"], source=name)
    return None


class GemmRecorder:
    """Counts of distinct GEMM problems; the dispatch mode feeds it."""

    def __init__(self):
        self.problems: dict[tuple, GemmProblem] = {}
        self.counts: Counter = Counter()
        self.errors: Counter = Counter()

    def add(self, p: GemmProblem) -> None:
        key = p.tune_key()
        known = self.problems.get(key)
        if known is None:
            self.problems[key] = p
        elif p.source not in known.source.split("+"):
            known.source += "+" + p.source
        self.counts[key] += 1

    def results(self, steps: int = 1) -> list[GemmProblem]:
        out = []
        for key, p in self.problems.items():
            p.count = self.counts[key] / max(steps, 1)
            out.append(p)
        return heaviest_first(out)


def _make_mode(recorder: GemmRecorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    class _GemmDispatchMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            try:
                p = _map_call(func, args, kwargs)
            except Exception as e:  # noqa: BLE001 - recording must never break the training step
                recorder.errors[f"{func}: {type(e).__name__}: {e}"] += 1
                p = None
            if p is not None:
                recorder.add(p)
            return func(*args, **(kwargs or {}))

    return _GemmDispatchMode()


@contextlib.contextmanager
def record_gemms(out_dir: str | os.PathLike | None, rank: int = 0, *, steps: int = 1):
    """Record the GEMMs run inside the block; on exit write `<out_dir>/gemm_shapes_rank<rank>.jsonl`.

    `steps`: training steps the block runs, so counts are per step. Run it eagerly (not under torch.compile).
    Yields the GemmRecorder (its `results()` are available after the block even without out_dir).
    """
    recorder = GemmRecorder()
    mode = _make_mode(recorder)
    with mode:
        yield recorder
    if out_dir is not None:
        import torch
        meta = {"rank": rank, "steps": steps, "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "errors": dict(recorder.errors)}
        write_shapes(shape_file(out_dir, rank), recorder.results(steps), meta=meta)


def shape_file(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / f"gemm_shapes_rank{rank}.jsonl"


def heaviest_first(problems) -> list[GemmProblem]:
    """Calls per step x flops, descending; stable for ties. The order dumps and loads hand problems on in, so a
    tuning run stopped by a time limit has tuned what matters most (the report and the results file do not depend
    on it: report in this order, results read back by key)."""
    return sorted(problems, key=lambda q: -q.count * q.flops())


def load_shapes(path: str | os.PathLike) -> list[GemmProblem]:
    """All problems of a dump: a folder (our jsonl files and/or hipBLASLt logs) or one such file.

    Ranks run the same step shapes in data parallel but different ones under tensor / pipeline parallelism, so a
    problem seen by several ranks counts as the most any one rank ran it (one step of the busiest rank).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no GEMM shape dump at {path}")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    merged: dict[tuple, GemmProblem] = {}
    found = False
    for f in files:
        if f.suffix == ".jsonl":
            _, problems = read_shapes(f)
        elif f.suffix in (".txt", ".log"):
            problems = bench_log.problems_from_logs([f])
        else:
            continue
        found = found or bool(problems)
        for p in problems:
            key = p.tune_key()
            known = merged.get(key)
            if known is None:
                merged[key] = p
            else:
                known.count = max(known.count, p.count)
                known.bench_line = known.bench_line or p.bench_line
    if not found:
        raise ValueError(f"no GEMM shapes in {path} (expected gemm_shapes_rank*.jsonl from record_gemms or "
                         f"hipBLASLt logs with hipblaslt-bench lines)")
    return heaviest_first(merged.values())
