"""Stage 2 orchestration with a fake timing backend: resumability, parallel workers, report, CLI errors."""
import json
import time

import pytest

from tuning.gemm_problem import GemmProblem, write_shapes
from tuning.results_file import read_results, row_from_problem
from tuning.tune import tune
from tuning.tune_journal import DEFAULT, TUNED, TuneOutcome, journal_path, read_journal


def _problems(n):
    # m identifies a problem; counts 1..n
    return [GemmProblem("T", "N", 64 * (i + 1), 128, 256, 256, 256, 64 * (i + 1), 64 * (i + 1), count=float(i + 1))
            for i in range(n)]


class FakeTuner:
    """Default time = m us; problems with even index get 20% faster, odd ones keep the default."""

    def __init__(self, device, log=None, interrupt_after=None, delay=0.0):
        self.device, self.log, self.interrupt_after, self.delay, self.done = device, log, interrupt_after, delay, 0

    def tune_one(self, p):
        if self.interrupt_after is not None and self.done >= self.interrupt_after:
            raise KeyboardInterrupt  # what a kill looks like to the loop: not caught as a per-problem failure
        time.sleep(self.delay)
        self.done += 1
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps([self.device, p.m]) + "\n")
        if p.m == 64 * 3:
            raise RuntimeError("boom")
        if (p.m // 64 - 1) % 2 == 0:
            row = row_from_problem(p, us=0.8 * p.m)
            return TuneOutcome(TUNED, default_us=float(p.m), tuned_us=0.8 * p.m, row=row, git_version="fake-1",
                               device=self.device)
        return TuneOutcome(DEFAULT, default_us=float(p.m), tuned_us=float(p.m), device=self.device)


def make_fake(device, **kw):
    return FakeTuner(device, **kw)


def _logged(log):
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []


def test_resume_after_kill(tmp_path):
    shapes = write_shapes(tmp_path / "gemm_shape" / "gemm_shapes_rank0.jsonl", _problems(6))
    results = tmp_path / "gemm_tune" / "tune_hipblas_gemm_results.txt"
    log = tmp_path / "calls.jsonl"
    with pytest.raises(KeyboardInterrupt):
        tune(shapes.parent, results, tuner_factory=make_fake, tuner_kwargs={"log": str(log), "interrupt_after": 2},
             devices=[0], progress=False)
    # problems are tuned largest count*flops first: m = 384, 320 finished before the kill
    first = [m for _, m in _logged(log)]
    assert first == [384, 320]
    assert [r["m"] for r in read_results(results).rows] == ["320"]  # only the even index (m=320) was tuned
    assert len(read_journal(journal_path(results))) == 2

    rep = tune(shapes.parent, results, tuner_factory=make_fake, tuner_kwargs={"log": str(log)}, devices=[0],
               progress=False)
    second = [m for _, m in _logged(log)][2:]
    assert sorted(second) == [64, 128, 192, 256]  # only what was left
    res = read_results(results)
    assert res.git_version == "fake-1"
    assert sorted(int(r["m"]) for r in res.rows) == [64, 320]  # m=192 is index 2 (even) but failed
    status = {line.label.split()[1]: line.status for line in rep.lines}
    assert status["m=192"] == "failed" and status["m=128"] == DEFAULT and status["m=64"] == TUNED

    # a third run has nothing to do; failed problems are retried only on request
    tune(shapes.parent, results, tuner_factory=make_fake, tuner_kwargs={"log": str(log)}, devices=[0], progress=False)
    assert len(_logged(log)) == 6
    tune(shapes.parent, results, tuner_factory=make_fake, tuner_kwargs={"log": str(log)}, devices=[0], progress=False,
         retry_failed=True)
    assert [m for _, m in _logged(log)][6:] == [192]


def test_report_weights_by_call_count(tmp_path):
    shapes = write_shapes(tmp_path / "s.jsonl", _problems(4))
    results = tmp_path / "out" / "r.txt"
    rep = tune(shapes, results, tuner_factory=make_fake, devices=[0], progress=False)
    # counts 1..4 for m = 64..256; m=192 failed (untimed); tuned: m=64 (x0.8), m=192 failed; kept: 128, 256
    timed = {int(l.label.split()[1][2:]): l for l in rep.timed}
    assert sorted(timed) == [64, 128, 256]
    assert rep.step_default_us == pytest.approx(1 * 64 + 2 * 128 + 4 * 256)
    assert rep.step_tuned_us == pytest.approx(1 * 64 * 0.8 + 2 * 128 + 4 * 256)
    md = (results.parent / "tune_report.md").read_text()
    assert "speedup" in md and "m=256" in md
    js = json.loads((results.parent / "tune_report.json").read_text())
    assert js["step_speedup"] == pytest.approx(rep.step_speedup) and js["status_counts"]["failed"] == 1


@pytest.mark.e2e
def test_parallel_workers_one_per_device(tmp_path):
    shapes = write_shapes(tmp_path / "s.jsonl", _problems(8))
    results = tmp_path / "r.txt"
    log = tmp_path / "calls.jsonl"
    rep = tune(shapes, results, tuner_factory=make_fake, tuner_kwargs={"log": str(log), "delay": 0.3},
               devices=[0, 1], progress=False)
    calls = _logged(log)
    assert sorted(m for _, m in calls) == [64 * (i + 1) for i in range(8)]  # each problem exactly once
    assert {d for d, _ in calls} == {0, 1}
    assert len(read_journal(journal_path(results))) == 8 and len(rep.lines) == 8
    assert len(read_results(results).rows) == 3  # even indices 0, 4, 6 (index 2 fails)


def test_version_mismatch_refused(tmp_path):
    shapes = write_shapes(tmp_path / "s.jsonl", _problems(1))
    results = tmp_path / "r.txt"
    results.write_text("Git Version: other-lib-0\n")
    from tuning.tune import ResultsVersionMismatch
    with pytest.raises(ResultsVersionMismatch, match="other-lib-0"):
        tune(shapes, results, tuner_factory=make_fake, devices=[0], progress=False)


def test_cli_errors_and_listing(tmp_path, capsys):
    from tuning.offline_tune_gemm import default_results_path, main
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err
    shapes = write_shapes(tmp_path / "gemm_shape" / "gemm_shapes_rank0.jsonl", _problems(2))
    assert main([str(shapes.parent), "--list"]) == 0
    out = capsys.readouterr().out
    assert "2 distinct GEMM problems" in out and "m=128" in out
    assert default_results_path(shapes.parent) == tmp_path / "gemm_tune" / "tune_hipblas_gemm_results.txt"
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--list"]) == 1
    assert "no GEMM shapes" in capsys.readouterr().err
    import torch
    if not torch.cuda.is_available():
        assert main([str(shapes.parent), "--no-progress"]) == 1
        assert "no GEMM tuning backend" in capsys.readouterr().err


def test_rocm_bench_backend_commands_and_parsing(tmp_path, monkeypatch):
    """hipblaslt-bench is faked: checks the commands, the env, and reading back what the bench writes."""
    import subprocess
    from tests.test_tuning_formats import FULL_HEADER, FULL_VALUES, LOG_LINE
    from tuning.bench_log import TUNE_FLAGS, problem_from_bench_line
    from tuning.rocm_bench import HipblasltBenchTuner, parse_bench_stdout

    bench = tmp_path / "hipblaslt-bench"
    bench.write_text("#!/bin/sh\n")
    bench.chmod(0o755)
    monkeypatch.setenv("HIPBLASLT_TUNING_OVERRIDE_FILE", "/old/results.txt")
    calls = []

    def fake_run(argv, env, **kw):
        calls.append((argv, env))
        if "--requested_solution" in argv and "-1" in argv:
            with open(env["HIPBLASLT_TUNING_FILE"], "w") as f:
                f.write(f"Git Version: abc123\n    {FULL_HEADER}\n    {FULL_VALUES}\n")
            return subprocess.CompletedProcess(argv, 0, "", "")
        header = "transA,transB,grouped_gemm,batch_count,m,n,k,hipblaslt-Gflops,hipblaslt-GB/s,us"
        return subprocess.CompletedProcess(argv, 0, f"noise\n[0]:{header}\n    T,N,0,1,1024,512,1024,1,2,40.5\n", "")

    tuner = HipblasltBenchTuner(3, bench=str(bench), scratch_dir=str(tmp_path / "scratch"), runner=fake_run)
    o = tuner.tune_one(problem_from_bench_line(LOG_LINE))
    (tune_argv, tune_env), (base_argv, base_env) = calls
    assert tune_argv[0] == str(bench) and tune_argv[-len(TUNE_FLAGS):] == TUNE_FLAGS
    assert "--solution_index" not in tune_argv and "56073" in base_argv
    assert tune_env["HIP_VISIBLE_DEVICES"] == "3" and "HIPBLASLT_TUNING_OVERRIDE_FILE" not in tune_env
    assert tune_env["HIPBLASLT_TUNING_FILE"].startswith(str(tmp_path / "scratch"))
    assert "HIPBLASLT_TUNING_FILE" not in base_env
    assert o.status == TUNED and o.git_version == "abc123" and o.row["solution_index"] == "24641"
    assert o.default_us == 40.5 and o.tuned_us == pytest.approx(33.0588)
    assert parse_bench_stdout("[1]:transA,m,us\n  T,8,1.5\n") == [{"transA": "T", "m": "8", "us": "1.5"}]


def test_problems_reach_the_tuner_heaviest_first(tmp_path):
    """count x 2mnk x batch, descending; ties keep the dump's order; the report does not depend on it."""
    from tuning.shapes import heaviest_first as tune_order

    def prob(m, n, count, batch=1):
        return GemmProblem("T", "N", m, n, 64, 64, 64, m, m, count=float(count), batch_count=batch,
                           stride_a=64 * m, stride_b=64 * n, stride_c=m * n, stride_d=m * n)

    # weights (count x m x n x batch): 1024, 8192 (batch), 5120 (count), 2048, 2048 (tie, file order), 512
    problems = [prob(64, 16, 1), prob(64, 16, 1, batch=8), prob(16, 64, 5), prob(128, 16, 1), prob(64, 32, 1),
                prob(32, 16, 1)]
    want = [1, 2, 3, 4, 0, 5]
    assert tune_order(problems) == [problems[i] for i in want]
    assert tune_order(problems[::-1])[2:4] == [problems[4], problems[3]]  # the tie follows the input order

    shapes = write_shapes(tmp_path / "s.jsonl", problems)  # not in weight order
    seen = []

    class Recording(FakeTuner):
        def tune_one(self, p):
            seen.append((p.m, p.n, p.batch_count, p.count))
            return TuneOutcome(DEFAULT, default_us=1.0, tuned_us=1.0, device=self.device)

    rep = tune(shapes, tmp_path / "r.txt", tuner_factory=lambda d: Recording(d), devices=[0], progress=False,
               report=False)
    assert seen == [(p.m, p.n, p.batch_count, p.count) for p in (problems[i] for i in want)]
    assert len(rep.lines) == 6 and {line.status for line in rep.lines} == {DEFAULT}
