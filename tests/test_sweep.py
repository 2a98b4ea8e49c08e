"""A 4-point CPU sweep with one invalid point: the sweep runs every point, records the invalid one as a row, writes
results.csv / results.md / throughput.png in the sweep dir and exits 1 because a point failed."""
import csv
import os
import subprocess
import sys
import time

import pytest

from test_launch_common import PY, ROOT, SHORT, load, run_train, tail

# launcher.nproc_per_node x training.global_batch_size at micro batch 2: (1,4) (1,6) (2,4) are valid, (2,6) is not:
# micro_batch_size x dp = 4 does not divide 6 -> ConfigError from validation, in the last job.
# Also checks that a 1-process point (which sets RANK/WORLD_SIZE in the sweep's own process) does not leak into the
# 2-process points that follow it.
SWEEP = ["launcher.nproc_per_node=1,2", "training.global_batch_size=4,6", "training.micro_batch_size=2", *SHORT]


@pytest.fixture(scope="module")
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
def test_markdown_png_and_report_command(sweep):
    d, _ = sweep
    md = (d / "results.md").read_text()
    lines = [l for l in md.splitlines() if l.startswith("|")]
    assert len(lines) == 2 + 4 and "tokens/s/GPU" in lines[0] and "MFU" in lines[0]
    png = d / "throughput.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    # `python -m primus.report` prints the same table, for the sweep dir or for its job dirs given one by one
    rep = subprocess.run([PY, "-m", "primus.report", str(d)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == md
    dirs = [str(d / str(i)) for i in range(4)]
    rep2 = subprocess.run([PY, "-m", "primus.report", *dirs], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rep2.returncode == 0 and len([l for l in rep2.stdout.splitlines() if l.startswith("|")]) == 6
