"""Checkpoint / resume end to end through `python train.py`, both backends, on CPU.

6 steps straight == 3 steps (stopped as if preempted, checkpoint at step 3) + resume=auto + 3 steps, in the same
run dir: same losses (tolerance 1e-6 relative; on CPU they come out bitwise equal). A damaged newest checkpoint
makes resume=auto fall back to the previous one and say so. A real SIGTERM stops a run after its current step with
a checkpoint and status "preempted".
"""
import os
import signal
import time

import pytest

from test_launch_common import TINY, load, run_train, start_train, tail

from primus.exit_codes import PREEMPTED  # "resume me"

pytestmark = pytest.mark.e2e

SIX = ["training.train_iters=6", "training.lr_warmup_iters=0", "training.timing_warmup_steps=0", *TINY]


def _losses(d):
    r = load(d / "result.json")
    assert r["status"] in ("ok", "preempted"), r.get("error")
    return r


@pytest.mark.parametrize("backend", ["torchtitan", "megatron"])
def test_six_steps_equal_three_plus_resume_plus_three(tmp_path, backend):
    t0 = time.time()
    straight, split = tmp_path / "straight", tmp_path / "split"
    p = run_train([f"backend={backend}", *SIX, f"hydra.run.dir={straight}"])
    assert p.returncode == 0, tail(p)
    ref = _losses(straight)["losses"]
    assert len(ref) == 6

    # first half: the run is stopped after step 3 (test hook = SIGTERM during step 3) with the 6-step schedule
    p = run_train([f"backend={backend}", *SIX, "checkpoint.interval=3", f"hydra.run.dir={split}"],
                  env={"PRIMUS_INJECT_PREEMPT_AT_STEP": "3"})
    assert p.returncode == PREEMPTED, tail(p)
    r1 = _losses(split)
    assert r1["status"] == "preempted" and r1["last_step"] == 3 and len(r1["losses"]) == 3
    assert r1["preempted"]["after_step"] == 3 and r1["checkpoints"] == [str(split / "checkpoints" / "step_000003")]
    assert r1["losses"] == pytest.approx(ref[:3], rel=1e-6)

    # second half: same command plus resume=auto in the same run dir
    p = run_train([f"backend={backend}", *SIX, "checkpoint.interval=3", "checkpoint.resume=auto",
                   f"hydra.run.dir={split}"])
    assert p.returncode == 0, tail(p)
    r2 = _losses(split)
    assert r2["status"] == "ok" and r2["first_step"] == 4 and r2["last_step"] == 6
    assert r2["resumed_from"]["step"] == 3 and r2["resumed_from"]["path"].endswith("step_000003")
    assert "resumed from" in p.stdout and "next step 4" in p.stdout
    assert r2["losses"] == pytest.approx(ref[3:], rel=1e-6), (r2["losses"], ref[3:])
    # the first attempt's result and overrides were kept, not overwritten by the resumed one
    first = split / "attempts" / "1"
    assert r2["previous_attempts"] == [str(first)] and load(first / "result.json")["status"] == "preempted"
    assert "checkpoint.resume=auto" not in (first / ".hydra" / "overrides.yaml").read_text()
    assert "checkpoint.resume=auto" in (split / ".hydra" / "overrides.yaml").read_text()
    log = (split / "train.log").read_text()  # both attempts' step lines, in the run dir's log
    assert "step     3/6 | loss" in log and "step     6/6 | loss" in log and "resumed from" in log
    assert sorted(os.listdir(split / "checkpoints")) == [".primus.lock", "HEAD.json", "step_000003", "step_000006"]

    if backend == "torchtitan":
        # damage the newest checkpoint: resume=auto falls back to step 3, says so, and steps 4-6 come out the same
        ckdir = split / "checkpoints" / "step_000006"
        biggest = max((os.path.join(r, f) for r, _, fs in os.walk(ckdir) for f in fs), key=os.path.getsize)
        with open(biggest, "r+b") as f:
            f.truncate(os.path.getsize(biggest) // 2)
        p = run_train([f"backend={backend}", *SIX, "checkpoint.resume=auto", f"hydra.run.dir={split}"])
        assert p.returncode == 0, tail(p)
        assert "step_000006 is not valid" in p.stdout and "truncated" in p.stdout and "falling back" in p.stdout
        r3 = _losses(split)
        assert r3["resumed_from"]["step"] == 3 and r3["resumed_from"]["skipped"][0]["path"].endswith("step_000006")
        assert r3["losses"] == pytest.approx(ref[3:], rel=1e-6)

        # an explicit resume path that is damaged: a clear error before training, exit status 2
        p = run_train([f"backend={backend}", *SIX, f"checkpoint.resume={ckdir}", f"hydra.run.dir={tmp_path / 'x'}"])
        assert p.returncode == 2, tail(p)
        assert "checkpoint.resume" in p.stdout and str(ckdir) in p.stdout and "truncated" in p.stdout
    print(f"{backend} 6 vs 3+3: {time.time() - t0:.1f}s")


@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_finishes_step_checkpoints_and_exits(tmp_path, nproc):
    """A real SIGTERM to a local run: the current step completes, a checkpoint is written, result.json says
    preempted, the process exits with the preempted code (with 2 workers too: the launching process forwards the
    signal and waits; it used to exit 1 with torch elastic's SignalException), and resume=auto continues from
    there to the full step count."""
    t0 = time.time()
    steps = 6  # the signal after step 2 lands within a step or two: room to stop before the end, and little to resume
    args = ["backend=torchtitan", f"training.train_iters={steps}", "training.lr_warmup_iters=0",
            f"hydra.run.dir={tmp_path}", f"launcher.nproc_per_node={nproc}"]
    proc = start_train(args)
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if line.startswith(f"step     2/{steps}"):
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out) + rest
    assert proc.returncode == PREEMPTED, text[-3000:]
    assert "caught SIGTERM" in text
    r = load(tmp_path / "result.json")
    assert r["status"] == "preempted" and r["preempted"]["signal"] == "SIGTERM", r.get("error")
    stopped = r["last_step"]
    assert 2 <= stopped < steps and len(r["losses"]) == stopped
    assert os.path.isdir(tmp_path / "checkpoints" / f"step_{stopped:06d}")
    if nproc > 1:
        return  # resuming is the same as with one process (the 6 vs 3+3 tests)

    p = run_train([*args, "checkpoint.resume=auto"])
    assert p.returncode == 0, tail(p)
    r = load(tmp_path / "result.json")
    assert r["status"] == "ok" and r["first_step"] == stopped + 1 and r["last_step"] == steps
    print(f"SIGTERM + resume: {time.time() - t0:.1f}s")
