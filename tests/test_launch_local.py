"""`python train.py launcher.nproc_per_node=2`: two worker processes from inside the Hydra job (elastic launch API),
one world of size 2 over gloo, rank 0 alone writes result.json."""
import math
import time

import pytest

from test_launch_common import SHORT, load, result_files, run_train, tail


@pytest.mark.slow
def test_two_local_processes_train_as_one_world(tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.time()
    p = run_train(["launcher.nproc_per_node=2", *SHORT, f"hydra.run.dir={run_dir}"])
    took = time.time() - t0
    assert p.returncode == 0, tail(p)
    # exactly one result.json, in the Hydra run dir (no per-rank output dirs)
    assert result_files(tmp_path) == [str(run_dir / "result.json")]
    r = load(run_dir / "result.json")
    assert r["status"] == "ok", r.get("error")
    assert r["world_size"] == 2
    assert r["resolved"]["dp"] == 2  # both ranks are data-parallel replicas of one run
    losses = r["losses"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(2048)) < 0.5  # random init: loss starts near ln(vocab)
    assert r["tokens_per_s_per_gpu"] > 0
    # one step log line per step, printed once (rank 0), not once per rank
    assert sum(1 for l in p.stdout.splitlines() if l.startswith("step     1/3")) == 1, tail(p)
    print(f"local 2-process run: {took:.1f}s")

