"""One run per dir (primus/locks.py): a held run or checkpoint dir refuses a second run, naming the holder; a lock
whose process died is taken over and said so."""
import json
import os
import socket
import subprocess
import sys

import pytest

from primus.config.errors import ConfigError
from primus.locks import LOCK_FILE, DirLock, DirLocked, lock_dirs


def test_second_holder_refused_with_pid_and_host_then_free_after_release(tmp_path):
    a = DirLock(str(tmp_path)).acquire()
    with pytest.raises(DirLocked) as e:
        DirLock(str(tmp_path)).acquire()
    assert f"pid {os.getpid()}" in str(e.value) and socket.gethostname() in str(e.value)
    a.release()
    b = DirLock(str(tmp_path)).acquire()
    assert b.took_over is None  # released cleanly: nobody to report
    b.release()


@pytest.mark.e2e
def test_lock_of_a_dead_process_is_taken_over_and_reported(tmp_path):
    # a process takes the lock and is killed without releasing it
    code = ("import os, sys; from primus.locks import DirLock; DirLock(sys.argv[1]).acquire(); "
            "os.kill(os.getpid(), 9)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert p.returncode == -9
    dead = json.loads((tmp_path / LOCK_FILE).read_text())["pid"]
    said = []
    locks = lock_dirs({"hydra.run.dir": str(tmp_path)}, say=said.append)
    assert len(said) == 1 and f"took over the lock of pid {dead}" in said[0]
    for lock in locks:
        lock.release()


def test_lock_dirs_names_the_key_and_releases_what_it_took(tmp_path):
    run, ck = tmp_path / "run", tmp_path / "ck"
    held = DirLock(str(ck)).acquire()
    with pytest.raises(ConfigError) as e:
        lock_dirs({"hydra.run.dir": str(run), "checkpoint.dir": str(ck)})
    msg = str(e.value)
    assert "checkpoint.dir" in msg and str(ck) in msg and f"pid {os.getpid()}" in msg and "own dir" in msg
    DirLock(str(run)).acquire().release()  # the run dir lock taken before the refusal was given back
    held.release()


@pytest.mark.slow
def test_a_second_run_on_a_held_checkpoint_dir_is_refused_before_it_starts(tmp_path):
    from test_launch_common import run_train, tail

    shared = tmp_path / "shared_ckpt"
    holder = DirLock(str(shared)).acquire()  # stands for a run in progress on that dir
    try:
        p = run_train(["training.train_iters=2", "training.lr_warmup_iters=0", "checkpoint.interval=1",
                       f"checkpoint.dir={shared}", f"hydra.run.dir={tmp_path / 'second'}"])
    finally:
        holder.release()
    assert p.returncode == 2, tail(p)
    assert "another run is using this dir" in p.stdout and f"pid {os.getpid()}" in p.stdout, tail(p)
    assert not (tmp_path / "second" / "result.json").exists()
    assert os.listdir(shared) == [LOCK_FILE]  # nothing of the refused run was written there
