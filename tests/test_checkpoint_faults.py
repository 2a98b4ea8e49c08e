"""A full disk, for real: the run dir on a small tmpfs. The checkpoint save runs out of space inside
torch.distributed.checkpoint; the run must end with a clear error naming the dir and the sizes, no partial
checkpoint, and its result.json written (it used to be lost to a second ENOSPC in the result writer)."""
import contextlib
import os
import subprocess

import pytest

from test_launch_common import load, run_train, tail


@contextlib.contextmanager
def small_disk(path, size):
    path.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
def test_a_save_that_fills_the_disk_fails_clearly_and_keeps_result_json(tmp_path):
    with small_disk(tmp_path / "disk", "10m") as disk:  # a debug-model checkpoint is ~18 MiB
        run = disk / "run"
        p = run_train(["training.train_iters=2", "training.lr_warmup_iters=0", "checkpoint.interval=1",
                       f"hydra.run.dir={run}"])
        assert p.returncode == 1, tail(p)
        r = load(run / "result.json")
        assert r["status"] == "failed" and r["last_step"] == 1
        assert r["error"].startswith("OutOfSpace:") and "ran out of space while saving" in r["error"]
        assert str(run / "checkpoints") in r["error"] and "bytes free" in r["error"], r["error"]
        assert sorted(os.listdir(run / "checkpoints")) == [".primus.lock"]  # the partial save was removed
        assert not (run / ".primus-reserve").exists()
