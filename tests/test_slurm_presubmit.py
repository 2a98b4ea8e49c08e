"""The Slurm launcher's checks in the submitting process, on a machine without Slurm: `python train.py -m
hydra/launcher=slurm ...` without sbatch/srun on PATH exits 2 naming them, and queues nothing; a dry_run=true sweep
needs no Slurm at all: it answers here. (A bad sweep on the real cluster: tests/test_slurm.py.)"""
import os

import pytest

from test_launch_common import PY, SHORT, dry_run_jobs, run_train, tail

pytestmark = pytest.mark.e2e

NO_SLURM = {"PATH": os.path.dirname(PY)}  # the venv's bin: python, no sbatch, no srun


def test_without_slurm_commands_exit_2_and_nothing_submitted(tmp_path):
    assert not any(os.path.exists(os.path.join(os.path.dirname(PY), c)) for c in ("sbatch", "srun"))
    sweep = tmp_path / "sweep"
    p = run_train(["-m", "hydra/launcher=slurm", "launcher.nproc_per_node=2", "training.train_iters=3,4", *SHORT[1:],
                   f"hydra.sweep.dir={sweep}"], env=NO_SLURM, timeout=300)
    assert p.returncode == 2, tail(p)
    assert "Slurm's client commands sbatch, srun are not on PATH" in p.stdout and "nothing submitted" in p.stdout
    assert "Traceback" not in p.stdout and not (sweep / ".submitit").exists()


def test_dry_run_sweep_answers_locally(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_train(["-m", "hydra/launcher=slurm", "+cluster=h200", "launcher.nnodes=2", "launcher.nproc_per_node=8",
                   "parallel.tensor_model_parallel_size=1,2", "dry_run=true", f"hydra.sweep.dir={sweep}",
                   # a dry run writes no result.json: its rows are no_result, as under the default launcher
                   "hydra.callbacks.primus_sweep.exit_nonzero_on_failure=false"],
                  env=NO_SLURM, timeout=300)
    assert p.returncode == 0, tail(p)
    assert "answered here, nothing queued (2 point(s))" in p.stdout
    blocks = dry_run_jobs(p.stdout)
    assert [(b["resolved"]["world_size"], b["resolved"]["dp"], b["resolved"]["global_batch_size"]) for b in blocks] \
        == [(16, 16, 64), (16, 8, 32)], blocks
    assert all(b["resolved"]["world_size_from"] == "launcher.nnodes x launcher.nproc_per_node = 2 x 8" for b in blocks)
    assert not (sweep / ".submitit").exists()
