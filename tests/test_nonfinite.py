"""Non-finite guard, OOM status, through `python train.py` on CPU with the test hooks of primus/fault_injection.py.

PRIMUS_INJECT_NAN_AT_STEP=2 multiplies step 2's loss (and so its gradients) by NaN.
* on_nonfinite=skip: the run goes on, the log names the step and the value, the optimizer update of step 2 really
  does not happen: the model saved after step 2 equals the one saved after step 1, and step 3 updates again.
* on_nonfinite=stop: the run ends with status failed and an error naming the step and the value.
PRIMUS_INJECT_OOM_AT_STEP=2 raises torch.OutOfMemoryError: status oom with the memory figures.
"""
import math
import os

import pytest
import torch

from test_launch_common import TINY, load, run_train, tail

pytestmark = pytest.mark.e2e

THREE = ["training.train_iters=3", "training.lr_warmup_iters=0", "training.timing_warmup_steps=0", *TINY]


def _model_tensors(ckpt_dir, backend, tmp_path):
    """Model weights of one checkpoint (both formats are torch.distributed.checkpoint underneath)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    sub = "dcp" if backend == "torchtitan" else "megatron"
    out = tmp_path / f"{os.path.basename(ckpt_dir)}.pt"
    dcp_to_torch_save(os.path.join(ckpt_dir, sub), str(out))
    sd = torch.load(out, weights_only=False)
    flat = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif torch.is_tensor(v):
            flat[prefix] = v

    walk("", sd)
    # model weights only (not optimizer moments, step counters or data position)
    keys = [k for k in flat if ("layers" in k or "embed" in k) and "optim" not in k and flat[k].is_floating_point()]
    assert keys, sorted(flat)[:20]
    return {k: flat[k] for k in keys}


@pytest.mark.parametrize("backend", ["torchtitan", "megatron"])
def test_nan_skip_leaves_parameters_unchanged(tmp_path, backend):
    run = tmp_path / "run"
    p = run_train([f"backend={backend}", *THREE, "training.on_nonfinite=skip", "checkpoint.interval=1",
                   "checkpoint.keep_last=0", f"hydra.run.dir={run}"], env={"PRIMUS_INJECT_NAN_AT_STEP": "2"})
    assert p.returncode == 0, tail(p)
    assert "non-finite loss=nan" in p.stdout and "at step 2: update skipped" in p.stdout, tail(p)
    r = load(run / "result.json")
    assert r["status"] == "ok" and len(r["losses"]) == 3
    assert math.isnan(r["losses"][1]) and math.isfinite(r["losses"][2])
    assert [s["step"] for s in r["nonfinite_steps"]] == [2] and r["nonfinite_steps"][0]["skipped"] is True

    w1, w2, w3 = (_model_tensors(str(run / "checkpoints" / f"step_00000{s}"), backend, tmp_path) for s in (1, 2, 3))
    assert w1.keys() == w2.keys()
    assert all(torch.equal(w1[k], w2[k]) for k in w1), "step 2 changed the weights although it was skipped"
    assert all(torch.isfinite(w2[k]).all() for k in w2)
    assert any(not torch.equal(w2[k], w3[k]) for k in w2), "step 3 did not update"


@pytest.mark.parametrize("backend", ["torchtitan", "megatron"])
def test_nan_stop_names_step_and_value(tmp_path, backend):
    p = run_train([f"backend={backend}", *THREE, "training.on_nonfinite=stop", f"hydra.run.dir={tmp_path}"],
                  env={"PRIMUS_INJECT_NAN_AT_STEP": "2"})
    assert p.returncode != 0
    r = load(tmp_path / "result.json")
    assert r["status"] == "failed" and len(r["losses"]) == 2
    assert "NonFiniteError" in r["error"] and "at step 2" in r["error"] and "loss=nan" in r["error"], r["error"]


def test_oom_status_with_memory_figures(tmp_path):
    p = run_train(["backend=torchtitan", *THREE, f"hydra.run.dir={tmp_path}"], env={"PRIMUS_INJECT_OOM_AT_STEP": "2"})
    assert p.returncode != 0
    r = load(tmp_path / "result.json")
    assert r["status"] == "oom", r.get("error")
    assert "OutOfMemoryError" in r["error"] and "PRIMUS_INJECT_OOM_AT_STEP" in r["error"]
    assert r["memory"]["max_rss_gib"] > 0 and r["memory"]["host_total_gib"] > 0
    assert r["last_step"] == 1 and len(r["losses"]) == 1
