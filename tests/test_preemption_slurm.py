"""Preemption on the real local Slurm cluster (launchers/slurm_cluster.sh, conftest's session fixture `cluster`).

A one-task job trains with a checkpoint every 5 steps and is stopped mid run, in one of two ways:

* `scancel --signal=USR1` (a requeue asked for): the trainer finishes the step, saves, hands over to submitit,
  which requeues the job;
* `scontrol requeue` (Slurm's own requeue, as preemption does): Slurm sends SIGTERM; the trainer finishes the step,
  saves and ends without returning a result, and Slurm runs the job again.

Either way the requeued job runs the same pickled Hydra call in the same run dir, resumes from the newest
checkpoint there and finishes; the submitting command waits for it (it used to report "job finished" and
`preempted` after a Slurm requeue) and exits 0: the final result.json has status ok, the full step count, and
records where it resumed from.
"""
import os
import re
import subprocess
import time

import pytest

from test_launch_common import PY, ROOT, load, train_env

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
STEPS = 10  # stopped after step 3 (the signal lands within a step or two), resumed to the end


def slurm_story(cluster, job_id, states) -> str:
    """What Slurm did with the job, for a failure's message: the states the test saw after the stop, the job's
    record now, and slurmctld's log lines about it (the cluster's dir is gone once the session ends)."""
    record = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], env={**os.environ, **cluster},
                            capture_output=True, text=True, timeout=30)
    log = os.path.join(os.path.dirname(cluster["SLURM_CONF"]), "log", "slurmctld.log")
    lines = [line for line in open(log)] if os.path.exists(log) else []
    about = [line for line in lines if re.search(rf"\bJobId={job_id}\b|\bjob {job_id}\b|requeue", line)]
    return ("\n\nstates after the stop (s since the start, state):\n" + "\n".join(f"  {t} {s}" for t, s in states)
            + f"\njob record now: {(record.stdout + record.stderr).strip()}"
            + "\nslurmctld.log about the job (last 40 lines):\n" + "".join(about[-40:]))


@pytest.mark.parametrize("stop", ["usr1", "scontrol_requeue"])
def test_stopped_job_checkpoints_requeues_and_resumes(cluster, tmp_path, stop):
    sweep = tmp_path / "sweep"
    env = train_env({**cluster})
    t0 = time.time()
    proc = subprocess.Popen(
        [PY, "train.py", "-m", "hydra/launcher=slurm", "+cluster=local", "hydra.launcher.timeout_min=10",
         "launcher.nproc_per_node=1", "backend=torchtitan", f"training.train_iters={STEPS}",
         "training.lr_warmup_iters=0", "checkpoint.interval=5", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job_id = log0 = None
    out = []
    states = []  # (s since the start, the job's state as slurmctld showed it) after the stop, each change once
    try:
        for line in proc.stdout:
            out.append(line)
            m = re.search(r"\[slurm\] job (\S+) submitted: (\S+_0_log\.out)", line)
            if m:
                job_id, log0 = m.group(1), m.group(2)
                break
        assert job_id, "".join(out)
        # wait for step 3 in the job's log, then send Slurm's warning signal to the job's tasks
        deadline = time.time() + 240
        while time.time() < deadline:
            if os.path.exists(log0) and re.search(rf"^step +3/{STEPS} ", open(log0).read(), re.M):
                break
            time.sleep(0.2)
        else:
            pytest.fail("job never reached step 3:\n" + (open(log0).read()[-3000:] if os.path.exists(log0) else ""))
        cmd = ["scancel", "--signal=USR1", job_id] if stop == "usr1" else ["scontrol", "requeue", job_id]
        subprocess.run(cmd, env=env, check=True, timeout=30)
        # Slurm holds a requeued job back (BeginTime about 2 min ahead) before it may start again: once the job is
        # pending after its requeue, make it eligible now, so the test does not sit out that delay
        deadline = time.time() + 120
        while time.time() < deadline:
            q = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                               timeout=30).stdout
            seen = " ".join(re.findall(r"\b(?:JobState|Reason|Restarts|ExitCode)=\S+", q))
            if not states or states[-1][1] != seen:
                states.append((round(time.time() - t0, 1), seen))
            if "Restarts=1" in q and "JobState=PENDING" in q:
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, timeout=30)
                break
            time.sleep(0.5)
        rest, _ = proc.communicate(timeout=400)
        out.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out)
    assert proc.returncode == 0, text[-4000:] + slurm_story(cluster, job_id, states)
    log = open(log0).read() + open(log0.replace("_log.out", "_log.err")).read()

    r = load(sweep / "0" / "result.json")
    assert r["status"] == "ok", r.get("error")
    assert r["last_step"] == STEPS
    stopped = r["resumed_from"]["step"]
    assert 3 <= stopped < STEPS and r["first_step"] == stopped + 1, r["resumed_from"]
    assert r["resumed_from"]["path"] == str(sweep / "0" / "checkpoints" / f"step_{stopped:06d}")
    assert r["resumed_from"]["slurm_restart_count"] == 1
    sig, handover = ("SIGUSR1", "requeueing Slurm job") if stop == "usr1" else ("SIGTERM", "Slurm is stopping job")
    assert f"caught {sig}" in log and handover in log, log[-3000:]
    assert f"preempted ({sig}) after step {stopped}" in log
    first = load(sweep / "0" / "attempts" / "1" / "result.json")  # the stopped attempt's result, kept
    assert first["status"] == "preempted" and first["preempted"]["signal"] == sig
    assert "requeued Slurm job (SLURM_RESTART_COUNT=1)" in log
    print(f"slurm {stop} + requeue + resume: {time.time() - t0:.1f}s (stopped after step {stopped})")
