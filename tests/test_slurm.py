"""Real Slurm: a one-node cluster on this machine (Debian's slurm-wlm + munge, installed with apt-get when missing),
then `python train.py -m hydra/launcher=slurm +cluster=local launcher.nproc_per_node=2`: one Slurm job of 2 tasks,
each task runs the Hydra job, the two ranks train as one world of size 2, rank 0 writes result.json.

Needs root (the cluster runs as root). The cluster is conftest's session fixture `cluster`: its state, config and
logs live in a temp dir, on free ports, so a cluster someone else runs on this machine is left alone.
"""
import os
import pickle
import re
import subprocess
import time

import pytest

from test_launch_common import SHORT, load, result_files, run_train, tail, train_env

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]


def test_two_task_job_trains_as_one_world(cluster, tmp_path):
    # a node of fewer than 2 CPUs would leave the 2-task job pending forever (reason PartitionConfig): say so now
    # instead of after run_train's timeout
    q = subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True, timeout=30,
                       env=train_env(cluster))
    assert q.stdout.split() and int(q.stdout.split()[0]) >= 2, f"the node has CPUs={q.stdout.strip()}: {q.stderr}"
    sweep = tmp_path / "sweep"
    t0 = time.time()
    p = run_train(["-m", "hydra/launcher=slurm", "+cluster=local", "hydra.launcher.timeout_min=5",
                   "launcher.nproc_per_node=2", *SHORT, f"hydra.sweep.dir={sweep}"],
                  env=cluster, timeout=420)
    took = time.time() - t0
    assert p.returncode == 0, tail(p, 80)
    assert "Bypassing sacct error" not in p.stdout  # the sacct stand-in answers submitit's job-state queries

    # the submitting command reports the job id and where its logs are
    m = re.search(r"\[slurm\] job (\S+) submitted: (\S+_0_log\.out)", p.stdout)
    assert m, tail(p)
    job_id, log0 = m.group(1), m.group(2)
    assert os.path.isfile(log0), log0
    job_folder = os.path.dirname(log0)

    # rank 0 alone wrote one result.json, in the job's shared run dir; the world was the 2 Slurm tasks
    assert result_files(sweep) == [str(sweep / "0" / "result.json")]
    r = load(sweep / "0" / "result.json")
    assert r["status"] == "ok", r.get("error")
    assert r["world_size"] == 2 and r["resolved"]["dp"] == 2
    assert r["resolved"]["world_size_from"] == "Slurm: SLURM_NTASKS=2", r["resolved"]
    assert r["resolved"]["global_batch_size"] == 8  # micro 4 x dp 2: sized from the world
    assert r["env"].get("SLURM_JOB_ID") == job_id.split("_")[0]
    assert len(r["losses"]) == 3

    # both tasks ran the job function to completion (submitit keeps each task's return value)
    for task in (0, 1):
        with open(os.path.join(job_folder, f"{job_id}_{task}_result.pkl"), "rb") as f:
            outcome, job_return = pickle.load(f)
        assert outcome == "success", job_return
        # the job returns sweep.objective for Hydra's sweepers (tokens/s/GPU by default): task 0 holds the result,
        # the other tasks return the failure value (submitit hands task 0's to the sweeper)
        want = r["tokens_per_s_per_gpu"] if task == 0 else float("-inf")
        assert job_return.return_value == pytest.approx(want)
        assert os.path.isfile(os.path.join(job_folder, f"{job_id}_{task}_log.err"))

    # one world over the two tasks, not two worlds (each task starting its own local workers would also report
    # world_size 2): task 0 is rank 0 and logs the steps, task 1 is rank 1 and trains without logging them
    logs = [open(os.path.join(job_folder, f"{job_id}_{t}_log.out")).read() for t in (0, 1)]
    steps = [len(re.findall(r"^step +\d+/3 ", log, re.M)) for log in logs]
    assert steps == [3, 0], (steps, logs[1][-3000:])

    # the sweep table covers the job
    rows = (sweep / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and ",ok," in rows[1]
    # the job ends: no rank left hanging after writing its result (submitit returns as soon as the results exist)
    deadline = time.time() + 90
    while True:
        q = subprocess.run(["squeue", "-h", "-j", job_id.split("_")[0]], capture_output=True, text=True, timeout=30,
                           env=train_env(cluster))
        if q.stdout.strip() == "" or time.time() > deadline:
            break
        time.sleep(1)
    assert q.stdout.strip() == "", f"job still queued/running 90 s after its results: {q.stdout}"
    print(f"slurm 2-task job: {took:.1f}s")


def _job_ids(cluster):
    q = subprocess.run(["scontrol", "-o", "show", "jobs"], capture_output=True, text=True, timeout=30,
                       env=train_env(cluster))
    return set(re.findall(r"JobId=(\d+)", q.stdout))


def test_bad_sweep_queues_nothing(cluster, tmp_path):
    """Invalid points are found in the submitting process, all of them, and nothing goes to the queue: not even the
    valid point."""
    before = _job_ids(cluster)
    sweep = tmp_path / "sweep"
    p = run_train(["-m", "hydra/launcher=slurm", "+cluster=local", "model=debug_moe", *SHORT,
                   "parallel.expert_model_parallel_size=1,2,3", f"hydra.sweep.dir={sweep}"], env=cluster, timeout=300)
    assert p.returncode == 2, tail(p)
    assert "nothing submitted: 2 of 3 sweep point(s) are invalid" in p.stdout, tail(p)
    assert re.search(r"#1 .*parallel\.expert_model_parallel_size=2\n", p.stdout), tail(p)
    assert re.search(r"#2 .*parallel\.expert_model_parallel_size=3\n", p.stdout) and "#0 " not in p.stdout
    assert "expert tp x ep x pp = 1 x 2 x 1 = 2" in p.stdout and "launcher.nproc_per_node=2" in p.stdout
    assert "experts must be divisible by ep" in p.stdout  # ep=3: every problem of the point, not only the first
    assert not (sweep / ".submitit").exists()
    assert _job_ids(cluster) == before  # nothing queued, nothing ran
