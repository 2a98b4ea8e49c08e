"""Every experiment preset under conf/experiment/ composes into the typed schema, passes validation and dry-runs:
in-process, judged as train.py judges a dry run (a preset meant for a GPU is judged as the GPU run it describes),
then all of them in one `train.py -m experiment=... dry_run=true` as a user runs them."""
import json
import os
import subprocess

import pytest

from conftest import CONF, PY, ROOT, compose_cfg
from test_launch_common import dry_run_jobs
from primus import run as primus_run
from primus.backends import backend_args
from primus.config.schema import Device, PrimusConfig

# a stage-3 preset trains with the GEMMs that stages 1 and 2 tuned: it is valid only once their results file exists
TUNED = "HIPBLASLT_TUNING_OVERRIDE_FILE"

PRESETS = sorted(n[:-5] for n in os.listdir(os.path.join(CONF, "experiment")) if n.endswith(".yaml"))


def test_there_are_presets():
    assert len(PRESETS) >= 5, PRESETS


def _dry_run_context(cfg, run_dir):
    ctx = primus_run.resolve(cfg, str(run_dir))
    if cfg.device != Device.cpu and not primus_run.gpu_present():  # as primus.run does for a dry run
        ctx.device, ctx.dist_backend, ctx.planned = "cuda", "nccl", True
    return ctx


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_validates_and_describes_its_backend_args(preset, tmp_path, monkeypatch):
    (tmp_path / "tuned.txt").write_text("")
    monkeypatch.setenv(TUNED, str(tmp_path / "tuned.txt"))
    cfg = compose_cfg([f"experiment={preset}"])
    assert isinstance(cfg, PrimusConfig)
    ctx = _dry_run_context(cfg, tmp_path)
    primus_run.validate(cfg, ctx)  # raises ConfigError naming key, value, rule and fix
    args = backend_args(cfg, ctx)
    assert args, f"{preset}: no backend arguments"
    json.dumps(args, default=str)  # what dry_run prints


@pytest.mark.e2e
def test_every_preset_dry_runs_through_train_py(tmp_path):
    (tmp_path / "tuned.txt").write_text("")
    # a dry-run sweep records each point as valid (or invalid), tabulates them and exits 0
    p = subprocess.run([PY, "train.py", "-m", f"experiment={','.join(PRESETS)}", "dry_run=true",
                        f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, TUNED: str(tmp_path / "tuned.txt")})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = (tmp_path / "results.csv").read_text().splitlines()
    assert table[0].startswith("experiment,status,") and len(table) == 1 + len(PRESETS)
    assert all(",valid," in line for line in table[1:]), table
    outs = dry_run_jobs(p.stdout)
    assert len(outs) == len(PRESETS), [o["resolved"] for o in outs]
    for preset, out in zip(PRESETS, outs):
        assert out["backend_args"], preset
        assert out["resolved"]["backend"] == compose_cfg([f"experiment={preset}"]).backend.name.value, (preset, out)
