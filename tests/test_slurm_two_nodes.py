"""Two nodes on one machine: `python train.py -m hydra/launcher=slurm launcher.nnodes=2 launcher.nproc_per_node=2`
on the local cluster with two slurmd daemons (conftest's `cluster2`: nodes node1 and node2, SLURM_NODES=2). One
Slurm job of 2 nodes x 2 tasks trains as one world of 4 whose rendezvous address is node1's NodeAddr (the node
names are no host names), and its losses match the same job run as 4 local processes.

Both runs are dp4 over the same 4 samples per step with the same all-reduce over 4 gloo ranks, so they are held
to the parity matrix's fp32 bound (tests/parity.py) and, as observed, agree bitwise.
"""
import os
import re
import subprocess

import pytest

from parity import COMMON, REL
from rank_script import run_train as run_local
from test_launch_common import load, run_train, tail

pytestmark = [pytest.mark.slurm, pytest.mark.scale, pytest.mark.xdist_group("slurm")]

JOB = [*COMMON, "training.micro_batch_size=1"]  # dp4: one sample per rank and step, global batch 4


def test_two_node_job_matches_four_local_processes(cluster2, tmp_path):
    sweep = tmp_path / "sweep"
    p = run_train(["-m", "hydra/launcher=slurm", "+cluster=local", "hydra.launcher.timeout_min=10",
                   "launcher.nnodes=2", "launcher.nproc_per_node=2", *JOB, f"hydra.sweep.dir={sweep}"],
                  env=cluster2, timeout=900)
    assert p.returncode == 0, tail(p, 80)
    m = re.search(r"\[slurm\] job (\S+) submitted", p.stdout)
    assert m, tail(p)
    job = subprocess.run(["scontrol", "-o", "show", "job", m.group(1)], capture_output=True, text=True, timeout=30,
                         env={**os.environ, **cluster2}).stdout
    assert "NumNodes=2 " in job and "NodeList=node[1-2] " in job, job

    r = load(sweep / "0" / "result.json")
    assert r["status"] == "ok", r.get("error")
    assert r["world_size"] == 4 and r["resolved"]["dp"] == 4

    local, _ = run_local(tmp_path / "local", ["launcher.nproc_per_node=4", *JOB])
    assert local["world_size"] == 4
    assert len(r["losses"]) == len(local["losses"]) == 4
    for step, (a, b) in enumerate(zip(local["losses"], r["losses"]), 1):
        assert abs(a - b) <= REL * abs(a), (step, local["losses"], r["losses"])
    assert local["losses"][-1] < local["losses"][0]
