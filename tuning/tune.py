"""Stage 2: tune every recorded GEMM problem offline (no training), resumable, one process per GPU.

    tune(shape_dir, results_file)   # e.g. <root>/gemm_shape, <root>/gemm_tune/tune_hipblas_gemm_results.txt

Backends: hipblaslt-bench on ROCm (`rocm_bench`), cuBLASLt candidates on CUDA (`cuda_tuner`). Each finished
problem is appended to the results file (tuned ones) and to the journal (all) before the next one starts, so a
killed run continues where it stopped. The report goes next to the results file (tune_report.md / .json).
"""
from __future__ import annotations

import queue
import sys
import traceback
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from tuning.gemm_problem import GemmProblem
from tuning.report import Report, build_report
from tuning.results_file import append_row, read_results
from tuning.shapes import load_shapes
from tuning.tune_journal import FAILED, TuneOutcome, append_journal, journal_path, read_journal

RESULTS_NAME = "tune_hipblas_gemm_results.txt"
REPORT_STEM = "tune_report"


class ResultsVersionMismatch(ValueError):
    pass


def _torch_gpu():
    try:
        import torch
    except ImportError:
        return None, 0
    kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return kind, n


def pick_backend(backend: str = "auto", **options) -> tuple[Callable, dict]:
    """(factory(device, **kwargs) -> tuner, kwargs) for 'cuda', 'rocm' or 'auto'."""
    kind, n = _torch_gpu()
    if backend == "auto":
        from tuning.rocm_bench import find_bench
        if kind == "rocm" or (n == 0 and find_bench(options.get("bench"))):
            backend = "rocm"
        elif kind == "cuda" and n > 0:
            backend = "cuda"
        else:
            raise RuntimeError("no GEMM tuning backend here: no CUDA GPU visible to torch and no hipblaslt-bench "
                               "found (set $HIPBLASLT_BENCH or pass bench=...)")
    if backend == "cuda":
        from tuning.cuda_tuner import make_cuda_tuner
        keys = ("max_candidates", "warmup", "iters", "rotating_mb", "min_gain", "workspace_mb", "confirm_top")
        return make_cuda_tuner, {k: options[k] for k in keys if options.get(k) is not None}
    if backend == "rocm":
        from tuning.rocm_bench import make_rocm_tuner
        return make_rocm_tuner, {k: options[k] for k in ("bench", "scratch_dir") if options.get(k) is not None}
    raise ValueError(f"unknown backend {backend!r}: expected auto, cuda or rocm")


def _safe_tune(tuner, p: GemmProblem, device: int) -> TuneOutcome:
    try:
        return tuner.tune_one(p)
    except Exception as e:  # noqa: BLE001 - one bad problem must not end the run
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return TuneOutcome(FAILED, detail=f"{type(e).__name__}: {e} [{tb}]", device=device)


def _worker(factory, kwargs, device, tasks, results):
    try:
        tuner = factory(device, **kwargs)
    except BaseException as e:  # noqa: BLE001
        results.put(("dead", device, f"{type(e).__name__}: {e}"))
        return
    while True:
        item = tasks.get()
        if item is None:
            break
        p = GemmProblem.from_dict(item)
        results.put(("start", device, item))
        results.put(("done", device, item, _safe_tune(tuner, p, device).to_dict()))
    try:
        tuner.close()
    finally:
        results.put(("exit", device, None))


class _Writer:
    """The only writer of the results file and journal (workers send outcomes here)."""

    def __init__(self, results_file: Path):
        self.results_file = results_file
        self.journal = journal_path(results_file)
        self.git_version = read_results(results_file).git_version if results_file.exists() else None

    def record(self, p: GemmProblem, outcome: TuneOutcome) -> None:
        if outcome.row:
            version = outcome.git_version or "unknown"
            if self.git_version and outcome.git_version and outcome.git_version != self.git_version:
                raise ResultsVersionMismatch(
                    f"{self.results_file} holds results for '{self.git_version}', this run tunes with "
                    f"'{outcome.git_version}': algorithms do not carry over; use a new results file")
            append_row(self.results_file, outcome.row, version)
            self.git_version = self.git_version or version
        append_journal(self.journal, p.tune_key(), p.label(), p.count, outcome)


def tune(shape_dir, results_file, *, backend: str = "auto", devices: list[int] | None = None,
         max_candidates: int | None = None, warmup: int | None = None, iters: int | None = None,
         rotating_mb: int | None = None, min_gain: float | None = None, bench: str | None = None,
         retry_failed: bool = False, progress: bool = True, report: bool = True,
         tuner_factory: Callable | None = None, tuner_kwargs: dict | None = None) -> Report:
    """Tune the GEMMs dumped under `shape_dir` (folder or file) into `results_file`; returns the report.

    devices: GPU indices (default: every visible GPU; one worker process each when more than one).
    min_gain: a CUDA algorithm is kept only when it beats the default by this fraction (default 0.01).
    tuner_factory/tuner_kwargs: a custom timing backend `factory(device, **kwargs)` with `tune_one(problem)`.
    """
    results_file = Path(results_file)
    results_file.parent.mkdir(parents=True, exist_ok=True)
    problems = load_shapes(shape_dir)
    if tuner_factory is None:
        tuner_factory, tuner_kwargs = pick_backend(
            backend, max_candidates=max_candidates, warmup=warmup, iters=iters, rotating_mb=rotating_mb,
            min_gain=min_gain, bench=bench)
    tuner_kwargs = tuner_kwargs or {}
    if devices is None:
        devices = list(range(max(1, _torch_gpu()[1])))

    writer = _Writer(results_file)
    done = read_journal(writer.journal)
    # load_shapes hands them heaviest first (shapes.heaviest_first): a stopped run has tuned what matters most
    todo = [p for p in problems
            if p.tune_key() not in done or (retry_failed and done[p.tune_key()].outcome.status == FAILED)]
    bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc="GEMM tuning", unit="shape",
               disable=not progress, file=sys.stderr)
    try:
        if todo and len(devices) <= 1:
            _run_inline(tuner_factory, tuner_kwargs, devices[0] if devices else 0, todo, writer, bar)
        elif todo:
            _run_workers(tuner_factory, tuner_kwargs, devices, todo, writer, bar)
    finally:
        bar.close()

    rep = build_report(problems, read_journal(writer.journal))
    if report:
        rep.write(results_file.parent / REPORT_STEM)
        if progress:
            print(rep.markdown())
    return rep


def _postfix(bar, p: GemmProblem, o: TuneOutcome) -> None:
    sp = f"{o.default_us / o.tuned_us:.3f}x" if o.default_us and o.tuned_us else o.status
    bar.set_postfix_str(f"{p.m}x{p.n}x{p.k} {sp}", refresh=False)
    bar.update(1)


def _run_inline(factory, kwargs, device, todo, writer: _Writer, bar) -> None:
    tuner = factory(device, **kwargs)
    try:
        for p in todo:
            o = _safe_tune(tuner, p, device)
            writer.record(p, o)
            _postfix(bar, p, o)
    finally:
        close = getattr(tuner, "close", None)
        if close:
            close()


def _run_workers(factory, kwargs, devices, todo, writer: _Writer, bar) -> None:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    tasks, results = ctx.Queue(), ctx.Queue()
    for p in todo:
        tasks.put(p.to_dict())
    for _ in devices:
        tasks.put(None)
    procs = {d: ctx.Process(target=_worker, args=(factory, kwargs, d, tasks, results), daemon=True) for d in devices}
    for proc in procs.values():
        proc.start()
    by_key = {p.tune_key(): p for p in todo}
    inflight: dict[int, GemmProblem] = {}
    finished: set[int] = set()
    errors: list[str] = []
    remaining = len(todo)
    try:
        while remaining > 0:
            try:
                msg = results.get(timeout=2.0)
            except queue.Empty:
                for d, proc in procs.items():
                    if d not in finished and not proc.is_alive():
                        finished.add(d)
                        lost = inflight.pop(d, None)
                        if lost is not None:  # the worker died inside this problem (e.g. a GPU fault)
                            o = TuneOutcome(FAILED, detail=f"worker on GPU {d} died (exit {proc.exitcode})", device=d)
                            writer.record(lost, o)
                            _postfix(bar, lost, o)
                            remaining -= 1
                if len(finished) == len(procs):
                    break
                continue
            kind, d = msg[0], msg[1]
            if kind == "start":
                inflight[d] = by_key[GemmProblem.from_dict(msg[2]).tune_key()]
            elif kind == "done":
                p = by_key[GemmProblem.from_dict(msg[2]).tune_key()]
                inflight.pop(d, None)
                o = TuneOutcome.from_dict(msg[3])
                writer.record(p, o)
                _postfix(bar, p, o)
                remaining -= 1
            elif kind == "dead":
                errors.append(f"GPU {d}: {msg[2]}")
                finished.add(d)
            elif kind == "exit":
                finished.add(d)
        if remaining > 0:
            raise RuntimeError(f"{remaining} GEMM problems left untuned: every worker stopped "
                               f"({'; '.join(errors) or 'see stderr'}); run again to resume")
    finally:
        for proc in procs.values():
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
