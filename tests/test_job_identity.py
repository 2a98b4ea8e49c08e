"""A job's stable identity (primus/features/checkpoint.py): the same command with checkpoint.resume=auto runs in
the same dir (outputs/jobs/<id>) and continues the job; every attempt's result is kept."""
import os
import shutil
import uuid

import pytest

from primus.features.checkpoint import job_id_for, run_dir


def test_identity_leaves_out_what_does_not_change_the_job():
    base = ["model=debug", "training.lr=0.01"]
    a = job_id_for(None, "auto", base, "debug")
    assert a.startswith("debug-") and len(a) == len("debug-") + 8
    # resuming, running longer, logging differently: the same job
    assert job_id_for(None, "auto", base + ["checkpoint.resume=auto", "training.train_iters=99",
                                            "logging.tensorboard=false", "+profile.enabled=true"], "debug") == a
    assert job_id_for("auto", None, list(reversed(base)), "debug") == a  # order does not matter
    assert job_id_for(None, "auto", base + ["training.lr=0.02"], "debug") != a  # another job
    assert job_id_for(None, None, base, "debug") is None  # a one-off run
    assert job_id_for("mine", None, base, "debug") == "mine"
    assert run_dir(None, None, base, None, "debug", "2026-01-01_00-00-00-000000") == os.path.join(
        "outputs", "runs", "2026-01-01_00-00-00-000000")
    assert run_dir("mine", None, base, "exp", "debug", "x") == os.path.join("outputs", "jobs", "mine")
    assert run_dir(None, "auto", base, "exp", "debug", "x").startswith(os.path.join("outputs", "jobs", "exp-"))


@pytest.mark.slow
def test_the_same_command_with_resume_auto_continues_the_job():
    from test_launch_common import ROOT, TINY, load, run_train, tail

    tag = uuid.uuid4().hex[:8]  # a job of its own (the id hashes the overrides)
    args = ["backend=torchtitan", "training.train_iters=4", "training.lr_warmup_iters=0", "checkpoint.interval=2",
            "checkpoint.resume=auto", f"+extra.test={tag}", *TINY]
    jid = job_id_for(None, "auto", args, "debug")
    job = os.path.join(ROOT, "outputs", "jobs", jid)
    try:
        p = run_train(args, env={"PRIMUS_INJECT_PREEMPT_AT_STEP": "2"})
        assert p.returncode == 75, tail(p)
        p = run_train(args)
        assert p.returncode == 0, tail(p)
        r = load(os.path.join(job, "result.json"))
        assert r["status"] == "ok" and r["first_step"] == 3 and r["last_step"] == 4
        assert r["previous_attempts"] == [os.path.join(job, "attempts", "1")]
        assert load(os.path.join(job, "attempts", "1", "result.json"))["status"] == "preempted"
    finally:
        shutil.rmtree(job, ignore_errors=True)
