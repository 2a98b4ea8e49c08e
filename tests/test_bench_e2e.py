"""bench/e2e.py's points: what its options add to each train.py point composes and passes validation."""
import os
import sys

import pytest

from conftest import ROOT, compose_cfg
from primus.config.validate import RULES, validate
from primus.context import RunContext

sys.path.insert(0, os.path.join(ROOT, "bench"))
import e2e  # noqa: E402

TRAIN_POINTS = [(suite, name, argv) for suite, points in e2e.SUITES.items() for name, argv in points
                if argv[0] == "train.py"]


@pytest.mark.parametrize("suite,name,argv", TRAIN_POINTS, ids=[f"{s}:{n}" for s, n, _ in TRAIN_POINTS])
def test_micro_batch_option_gives_one_micro_batch_per_step_for_every_point(suite, name, argv):
    """`--micro-batch 4` (how the suites run on an H100, where micro batch 16 does not fit) runs every point at
    micro and global batch 4: a preset that accumulates (llama3_2_1b_torchtitan_bf16 sets
    gradient_accumulation_steps: 2) was refused before it started (global 4 != 4 x 2)."""
    [(_, point)] = e2e.at_micro_batch(e2e.with_iters([(name, argv)], 12), 4)
    cfg = compose_cfg(point[1:])
    validate(cfg, RunContext(device="cuda", world_size=1, planned=True), rules=RULES)
    t = cfg.training
    assert (t.micro_batch_size, t.global_batch_size, t.gradient_accumulation_steps) == (4, 4, 1)
    assert (t.train_iters, t.timing_warmup_steps) == (12, 4)


def test_the_torchtitan_preset_accumulates_so_the_option_must_say_so():
    """The case above is not vacuous: without the option's gradient_accumulation_steps=1 the TorchTitan preset at
    micro and global batch 4 is refused, naming the keys."""
    from primus.config.errors import ConfigError

    cfg = compose_cfg(["experiment=llama3_2_1b_torchtitan_bf16", "training.micro_batch_size=4",
                       "training.global_batch_size=4"])
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        validate(cfg, RunContext(device="cuda", world_size=1, planned=True), rules=RULES)


@pytest.mark.e2e
@pytest.mark.parametrize("option,value,why", [("--micro-batch", "0", "at least 1"), ("--iters", "0", "at least 6")])
def test_a_zero_count_is_refused_before_any_point_runs(tmp_path, option, value, why):
    """0 used to read as 'not given': every point then ran at its own micro batch / step count, unasked."""
    import subprocess

    r = subprocess.run([sys.executable, "bench/e2e.py", "--suite", "presets", option, value], cwd=ROOT,
                       env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{option} {value}: " in r.stderr and why in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []
