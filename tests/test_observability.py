"""Issue 12 on CPU: TensorBoard events read back with the expected tags and steps; a profiled run writes a trace."""
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import PY, ROOT
from primus.metrics.profiler import categorize, kernel_breakdown, trace_steps
from primus.metrics.sinks import TAGS


def run(args, tmp_path):
    p = subprocess.run([PY, "train.py", "backend=torchtitan", f"hydra.run.dir={tmp_path}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One 5-step run read by the sink tests (they share one pytest-xdist worker): TensorBoard, the profiler over
    steps 3-4, and W&B offline where wandb is installed. Returns (the run dir, its stdout)."""
    d = tmp_path_factory.mktemp("profiled")
    p = run(["training.train_iters=5", "profile.enabled=true", "profile.start_step=3", "profile.steps=2",
             f"logging.wandb={str(WANDB).lower()}"], d)
    return d, p.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("observability")
def test_tensorboard_events_and_profiler_trace(profiled):
    tmp_path, stdout = profiled
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tensorboard"
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {t for t in TAGS if t not in ("perf/mfu", "train/loss_scale")}  # null on CPU / in bf16: not written
    assert expected <= tags, expected - tags
    assert "train/loss_scale" not in tags  # bf16: no loss scaling
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5]
    res = json.load(open(tmp_path / "result.json"))
    assert [round(e.value, 4) for e in acc.Scalars("train/loss")] == [round(x, 4) for x in res["losses"]]
    trace = res["profile"]["trace"]
    assert trace and os.path.isfile(trace)
    assert trace_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert "| category |" in stdout and "gemm" in stdout


@pytest.mark.slow
@pytest.mark.xdist_group("observability")
@pytest.mark.skipif(not WANDB, reason="wandb is not installed")
def test_wandb_offline_run_has_the_same_metrics(profiled):
    """logging.wandb=true: a W&B offline run in the run dir whose history holds the same tags and values as the
    TensorBoard events (both sinks get every step line)."""
    from wandb_offline import history

    tmp_path, _ = profiled
    rows = history(str(tmp_path))
    res = json.load(open(tmp_path / "result.json"))
    assert [int(r["_step"]) for r in rows] == [1, 2, 3, 4, 5]
    assert [round(r["train/loss"], 4) for r in rows] == [round(x, 4) for x in res["losses"]]
    expected = {t for t in TAGS if t not in ("perf/mfu", "train/loss_scale")}  # null on CPU / in bf16
    assert all(expected <= set(r) for r in rows), [expected - set(r) for r in rows]


def test_wandb_missing_is_a_config_error(monkeypatch):
    import importlib.util
    import types

    from primus.features.logging import wandb_installed

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    issues = wandb_installed(types.SimpleNamespace(logging=types.SimpleNamespace(wandb=True)), None)
    assert [i.keys for i in issues] == [["logging.wandb"]] and "pip install wandb" in issues[0].fix


@pytest.mark.slow
def test_tensorboard_off(tmp_path):
    run(["training.train_iters=2", "training.lr_warmup_iters=1", "logging.tensorboard=false"], tmp_path)
    assert not os.path.exists(tmp_path / "tensorboard")


@pytest.mark.e2e
def test_bad_profile_window_is_error_before_launch(tmp_path):
    p = subprocess.run([PY, "train.py", "profile.enabled=true", "profile.start_step=40", f"hydra.run.dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "profile.start_step = 40" in p.stderr
    assert not os.path.exists(tmp_path / "result.json")


@pytest.mark.parametrize("name,cat", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "gemm"), ("nvjet_tst_128x256_64x4", "gemm"),
    ("aten::mm", "gemm"), ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("flash_fwd_kernel", "attention"), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("multi_tensor_apply_kernel<...FusedAdam", "optimizer"), ("triton_poi_fused_mul_silu_0", "elementwise/other"),
])
def test_kernel_categories(name, cat):
    assert categorize(name) == cat


def test_gpu_annotations_are_not_counted_twice():
    """kineto mirrors record_function ranges on the GPU timeline (inductor's "## Call CompiledFxGraph ##"); their
    GPU time is their kernels' time, already counted in the kernels' own rows."""
    import types

    def ev(key, t, annotation=False):
        return types.SimpleNamespace(key=key, self_device_time_total=t, count=1, device_type="DeviceType.CUDA",
                                     is_user_annotation=annotation)

    events = [ev("## Call CompiledFxGraph fabc ##", 300.0, annotation=True),
              ev("## Call CompiledFxGraph fdef ##", 50.0),  # older torch without the flag: recognised by name
              ev("triton_poi_fused_mul_silu_0", 100.0), ev("nvjet_sm90_tst_128x256", 200.0)]
    per_cat, rows = kernel_breakdown(events, on_gpu=True)
    assert per_cat == {"elementwise/other": 100.0, "gemm": 200.0}
    assert [r[0] for r in rows] == ["nvjet_sm90_tst_128x256", "triton_poi_fused_mul_silu_0"]
