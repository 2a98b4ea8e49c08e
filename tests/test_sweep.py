"""A 4-point CPU sweep with one invalid point: the sweep runs every point, records the invalid one as a row, writes
results.csv / results.md / throughput.png in the sweep dir and exits 1 because a point failed."""
import csv
import subprocess
import time

import pytest

from test_launch_common import PY, ROOT, SHORT, load, run_train, tail

# launcher.nproc_per_node x training.global_batch_size at micro batch 2: (1,4) (1,6) (2,4) are valid, (2,6) is not:
# micro_batch_size x dp = 4 does not divide 6 -> ConfigError from validation, in the last job.
# Also checks that a 1-process point (which sets RANK/WORLD_SIZE in the sweep's own process) does not leak into the
# 2-process points that follow it.
SWEEP = ["launcher.nproc_per_node=1,2", "training.global_batch_size=4,6", "training.micro_batch_size=2", *SHORT]


@pytest.fixture(scope="module")  # tests using it carry xdist_group("sweep"): one sweep, on one worker
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep") / "s"
    t0 = time.time()
    p = run_train(["-m", *SWEEP, f"hydra.sweep.dir={d}"], timeout=400)
    print(f"4-point sweep: {time.time() - t0:.1f}s")
    return d, p


def rows_of(d):
    with open(d / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.xdist_group("sweep")
def test_sweep_runs_every_point_and_exits_1(sweep):
    d, p = sweep
    assert p.returncode == 1, tail(p)  # one point failed: the table is written, the exit status says so
    assert "Traceback" not in p.stdout, tail(p)  # a failed point is a row, not a crash of the sweep
    for i in range(4):
        assert (d / str(i) / "result.json").is_file(), f"job {i}: {tail(p)}"
    # one progress line per point, the last one complete
    assert sum(1 for l in p.stdout.splitlines() if l.startswith("[sweep ") and "] job " in l and " start: " not in l) == 4
    assert "[sweep 4/4 ####################]" in p.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("sweep")
def test_table_has_each_point_with_its_status(sweep):
    d, p = sweep
    rows = rows_of(d)
    assert len(rows) == 4, tail(p)
    # the swept choices are columns; fixed overrides (train_iters) are not
    assert "launcher.nproc_per_node" in rows[0] and "training.global_batch_size" in rows[0]
    assert "training.train_iters" not in rows[0]
    by_point = {(r["launcher.nproc_per_node"], r["training.global_batch_size"]): r for r in rows}
    assert set(by_point) == {("1", "4"), ("1", "6"), ("2", "4"), ("2", "6")}
    bad = by_point[("2", "6")]
    assert bad["status"] == "invalid" and "global_batch_size" in bad["error"] and "ConfigError" in bad["error"]
    assert bad["tokens/s/GPU"] == ""
    for key in (("1", "4"), ("1", "6"), ("2", "4")):
        r = by_point[key]
        assert r["status"] == "ok", r
        assert float(r["tokens/s/GPU"]) > 0 and float(r["step time (s)"]) > 0 and float(r["peak mem (GiB)"]) > 0
        assert float(r["TFLOP/s/GPU"]) > 0
        assert int(r["world"]) == int(key[0])  # the 2-process point really ran 2 ranks after a 1-process point
    # sorted by throughput, the failed point last
    tps = [float(r["tokens/s/GPU"]) for r in rows[:3]]
    assert tps == sorted(tps, reverse=True) and rows[3]["status"] == "invalid"
    # the failed point's result.json was written by the sweep callback, with its error traceback beside it
    r = load(d / "3" / "result.json")
    assert r["status"] == "invalid" and r["overrides"]
    assert "ConfigError" in (d / "3" / "error.txt").read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("sweep")
def test_markdown_png_and_report_command(sweep):
    d, _ = sweep
    md = (d / "results.md").read_text()
    lines = [l for l in md.splitlines() if l.startswith("|")]
    assert len(lines) == 2 + 4 and "tokens/s/GPU" in lines[0] and "objective" in lines[0]
    assert "MFU" not in lines[0]  # a metric no point has (CPU: no peak FLOP/s) is no column
    png = d / "throughput.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    # `python -m primus.report` prints the same table, for the sweep dir or for its job dirs given one by one
    rep = subprocess.run([PY, "-m", "primus.report", str(d)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == md
    dirs = [str(d / str(i)) for i in range(4)]
    rep2 = subprocess.run([PY, "-m", "primus.report", *dirs], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rep2.returncode == 0 and len([l for l in rep2.stdout.splitlines() if l.startswith("|")]) == 6


# ---------------------------------------------------------------- primus.report on synthetic dirs (fast, no training)
def _job(d, overrides, result=None):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if result is not None:
        import json

        (d / "result.json").write_text(json.dumps({"overrides": overrides, **result}))


def test_report_collects_sweep_and_run_dirs(tmp_path):
    from primus.report import collect, main, sort_rows, swept_keys, to_csv

    sw = tmp_path / "sweep"
    ok = {"status": "ok", "world_size": 8, "tokens_per_s_per_gpu": 1000.0, "tflops_per_gpu": 400.0, "mfu": 0.4,
          "step_time_s": {"median": 2.0}, "memory": {"max_allocated_gib": 70.0}, "final_loss": 3.1}
    _job(sw / "0", ["precision=bf16", "model=llama3_8b"], ok)
    _job(sw / "1", ["precision=fp8", "model=llama3_8b"], {**ok, "tokens_per_s_per_gpu": 1500.0, "mfu": 0.6})
    _job(sw / "2", ["precision=fp4", "model=llama3_8b"], {"status": "oom", "error": "OutOfMemoryError: CUDA out of memory"})
    _job(sw / "10", ["precision=mxfp8", "model=llama3_8b"])  # killed: no result.json
    (sw / ".submitit").mkdir()
    run = tmp_path / "run"
    _job(run, ["precision=bf16", "model=llama3_8b", "training.seq_length=8192"], {**ok, "tokens_per_s_per_gpu": 900.0})

    rows = collect([str(sw)])
    assert [r["job_num"] for r in rows] == [0, 1, 2, 10]  # numeric order, hidden dirs skipped
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "no_result"]
    assert swept_keys(rows) == ["precision"]
    assert [r["job_num"] for r in sort_rows(rows)] == [1, 0, 2, 10]  # best throughput first, failures last
    both = collect([str(sw), str(run)])
    assert len(both) == 5 and swept_keys(both) == ["precision", "training.seq_length"]
    head, first = to_csv(both).splitlines()[:2]
    assert head.startswith("precision,training.seq_length,status,tokens/s/GPU,TFLOP/s/GPU,MFU,peak mem (GiB)")
    assert first.startswith("fp8,,ok,1500.0,400.0,0.6,70.0,2.0,8,")
    assert main([str(tmp_path / "nope")]) == 2
    assert main([str(sw), "--png", str(tmp_path / "t.png")]) == 0 and (tmp_path / "t.png").stat().st_size > 1000
