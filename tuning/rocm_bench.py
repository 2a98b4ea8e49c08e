"""Stage 2 on ROCm: hipblaslt-bench tunes each logged problem, as the original offline tuner did.

hipblaslt-bench appends its winner to HIPBLASLT_TUNING_FILE. Each call gets its own scratch file (workers on
several GPUs would interleave lines in a shared one); the orchestrator copies the row into the results file.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tuning.bench_log import BENCH, bench_line_from_problem, default_timing_argv, tuning_argv
from tuning.gemm_problem import GemmProblem
from tuning.results_file import read_results
from tuning.tune_journal import FAILED, TUNED, TuneOutcome

_RANK_PREFIX = re.compile(r"^\[\d+\]:")


def find_bench(explicit: str | None = None) -> str | None:
    for cand in (explicit, os.environ.get("HIPBLASLT_BENCH"), shutil.which(BENCH), f"/opt/rocm/bin/{BENCH}"):
        if cand and (shutil.which(cand) or os.path.isfile(cand)):
            return cand
    return None


def parse_bench_stdout(text: str) -> list[dict]:
    """Result records hipblaslt-bench prints: a `transA,...` header line (maybe `[0]:`-prefixed), then values."""
    out: list[dict] = []
    header = None
    for raw in text.splitlines():
        line = _RANK_PREFIX.sub("", raw.strip()).strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if "transA" in cells and "us" in cells:
            header = cells
        elif header is not None and len(cells) == len(header):
            out.append(dict(zip(header, cells)))
            header = None
    return out


class HipblasltBenchTuner:
    def __init__(self, device: int = 0, *, bench: str | None = None, scratch_dir: str | None = None,
                 timeout_s: float = 3600, runner=subprocess.run):
        self.device = device
        self.bench = find_bench(bench)
        if self.bench is None:
            raise FileNotFoundError(f"{BENCH} not found (looked at --bench, $HIPBLASLT_BENCH, PATH, /opt/rocm/bin)")
        self.scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="hipblaslt_tune_"))
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.timeout_s, self.runner = timeout_s, runner
        self._n = 0

    def _env(self, tuning_file: Path | None) -> dict:
        env = dict(os.environ)
        env["HIP_VISIBLE_DEVICES"] = str(self.device)
        env.pop("HIPBLASLT_TUNING_OVERRIDE_FILE", None)  # time the library's own choices, not a previous tuning
        env.pop("HIPBLASLT_LOG_MASK", None)
        if tuning_file is not None:
            env["HIPBLASLT_TUNING_FILE"] = str(tuning_file)
        return env

    def _run(self, argv: list[str], tuning_file: Path | None):
        argv = [self.bench] + argv[1:]
        return self.runner(argv, env=self._env(tuning_file), capture_output=True, text=True, timeout=self.timeout_s)

    def tune_one(self, p: GemmProblem) -> TuneOutcome:
        line = p.bench_line or bench_line_from_problem(p)
        self._n += 1
        scratch = self.scratch / f"gpu{self.device}_{os.getpid()}_{self._n}.txt"
        scratch.unlink(missing_ok=True)
        proc = self._run(tuning_argv(line), scratch)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "")[-500:]
            return TuneOutcome(FAILED, detail=f"{BENCH} exited {proc.returncode}: {tail}", device=self.device)
        if not scratch.exists():
            return TuneOutcome(FAILED, detail=f"{BENCH} wrote no tuning file", device=self.device)
        res = read_results(scratch)
        if not res.rows:
            return TuneOutcome(FAILED, detail=f"{BENCH} tuning file has no entry", device=self.device)
        row = res.rows[-1]
        tuned_us = float(row["us"]) if row.get("us") else None
        default_us = None
        base = self._run(default_timing_argv(line), None)
        if base.returncode == 0:
            recs = [r for r in parse_bench_stdout(base.stdout) if r.get("us")]
            if recs:
                default_us = float(recs[-1]["us"])
        # hipBLASLt's winner is chosen among all solutions, the default included: it never loses to it.
        if default_us is not None and tuned_us is not None:
            tuned_us = min(tuned_us, default_us)
        return TuneOutcome(TUNED, default_us=default_us, tuned_us=tuned_us, row=row, git_version=res.git_version,
                           device=self.device, detail=f"solution {row.get('solution_index', '?')}")

    def close(self) -> None:
        pass


def make_rocm_tuner(device: int, **kwargs) -> HipblasltBenchTuner:
    return HipblasltBenchTuner(device, **kwargs)
