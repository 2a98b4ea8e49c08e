"""Chaos: a run killed (SIGKILL) at random steps, mid-save included, restarted with resume=auto, rolled back once to
an earlier checkpoint, and finally run to the end. The last attempt's losses must equal a straight run's at the
same steps (CPU training is deterministic and resume is exact, so they are bitwise equal; the bound below is
float32's), and the checkpoint dir must hold what the history says: the final branch's newest keep_last
checkpoints, each valid, HEAD at the last step, and the abandoned branch's checkpoints kept off it, none deleted.

The kill points come from a seeded RNG; the seed is printed, and PRIMUS_CHAOS_SEED=N replays a sequence.
"""
import os
import random
import signal

import pytest

from primus import checkpoint as ck
from test_launch_common import TINY, load, run_train, start_train, tail

pytestmark = pytest.mark.slow
STEPS, EVERY, KEEP = 8, 2, 2  # three kills, a rollback and the final stretch fit in 8 steps
# the tiny batch: after any kill point a save is still ahead (EVERY=2 and the last step saves), which takes longer
# than the tiny steps: the SIGKILL lands while the run is still going
TRAIN = ["backend=torchtitan", f"training.train_iters={STEPS}", "training.lr_warmup_iters=0",
         "training.timing_warmup_steps=0", *TINY]
ARGS = [*TRAIN, f"checkpoint.interval={EVERY}", f"checkpoint.keep_last={KEEP}"]


def _run_until_killed(args, kill_at):
    """Run train.py; SIGKILL it as soon as step `kill_at` is logged (its save, when due, may be under way)."""
    p = start_train(args)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if line.startswith(f"step {kill_at:5d}/"):
                p.send_signal(signal.SIGKILL)
                break
        p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(out)


def test_random_kills_and_a_rollback_end_on_the_straight_runs_curve(tmp_path):
    seed = int(os.environ.get("PRIMUS_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (PRIMUS_CHAOS_SEED={seed} replays it)")

    straight = tmp_path / "straight"  # the reference curve only: no checkpoints (saving does not touch the losses)
    p = run_train([*TRAIN, f"hydra.run.dir={straight}"], timeout=600)
    assert p.returncode == 0, tail(p)
    ref = load(straight / "result.json")["losses"]

    run = tmp_path / "run"
    args = [*ARGS, "checkpoint.resume=auto", f"hydra.run.dir={run}"]
    root = run / "checkpoints"
    reached = 0
    for kill_at in sorted(rng.sample(range(2, STEPS), 3)):  # three kills, later each time
        code, out = _run_until_killed(args, kill_at)
        assert code == -signal.SIGKILL, out[-3000:]
        reached = kill_at
    # a rollback: back to the oldest checkpoint still kept, which starts a new branch
    kept = [s for s, _ in ck.list_checkpoints(str(root))]
    assert kept, f"no checkpoint survived kills up to step {reached}"
    back = min(kept)
    code, out = _run_until_killed([*ARGS, f"checkpoint.resume={root / ck.step_dir_name(back)}",
                                   f"hydra.run.dir={run}"], min(back + 3, STEPS - 1))
    assert code == -signal.SIGKILL, out[-3000:]
    assert f"starts from {ck.step_dir_name(back)}" in out or back == max(kept), out[-3000:]

    p = run_train(args, timeout=600)  # to the end
    assert p.returncode == 0, tail(p)
    r = load(run / "result.json")
    assert r["status"] == "ok" and r["last_step"] == STEPS
    first = r["first_step"]
    assert r["losses"] == pytest.approx(ref[first - 1:], rel=1e-6), (seed, r["losses"], ref[first - 1:])

    # the checkpoint set is what the history says
    h = r["checkpoint_history"]
    on = h["on_branch"]
    assert on[0] == str(root / ck.step_dir_name(STEPS)) and len(on) <= KEEP, (seed, h)
    assert all(ck.verify(pth, distributed=False) == [] for pth in on), (seed, h)
    head = ck.read_head(str(root))
    assert head["name"] == ck.step_dir_name(STEPS) and head["branch"] == h["branch"]
    for pth in h["off_branch"]:  # the abandoned branch is kept, never pruned
        assert os.path.isdir(pth), (seed, pth)
    # every killed attempt's .hydra files kept (killed attempts wrote no result.json)
    assert len(r["previous_attempts"]) == 4, r["previous_attempts"]
