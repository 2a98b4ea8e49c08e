"""Attention sinks (model.use_sink_attention, gpt-oss; Primus's use_sink_attention / sink_sliding_window /
sink_window_even_layers_only): their rules, megatron's settings and TorchTitan's flavor, the FLOPs and parameters
counted, the import of Primus's gpt-oss configs, and training with them on CPU on both backends (the kernel itself:
tests/test_megatron_modules.py)."""
import os

import pytest

from conftest import compose_cfg, compose_dict
from primus.backends.megatron import args as margs
from primus.config.errors import ConfigError
from primus.context import RunContext

CPU = RunContext(device="cpu", world_size=1)
SINKS = ["model.use_sink_attention=true"]
DATA = os.path.join(os.path.dirname(__file__), "data", "primus")
ROOT = os.path.join(DATA, "root")


def _checked(overrides):
    from primus.run import checked

    return checked(compose_dict(overrides), overrides)


def _resumed(tmp_path, first, second):
    """`first` for 4 steps with a checkpoint at step 2, then `second` resumed from it: steps 3-4 must continue the
    first run's losses (the parity matrix's bound). Returns both runs' result.json."""
    from parity import COMMON, REL
    from rank_script import run_train

    a, _ = run_train(tmp_path / "a", [*COMMON, *first, "checkpoint.interval=2"])
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    b, _ = run_train(tmp_path / "b", [*COMMON, *second, f"checkpoint.resume={ckpt}"])
    assert b["first_step"] == 3 and len(b["losses"]) == 2
    for x, y in zip(a["losses"][2:], b["losses"]):
        assert abs(x - y) <= REL * abs(x), (a["losses"], b["losses"])
    return a, b


def _warned(overrides):
    _, ctx = _checked(overrides)
    return {k: i.rule for i in ctx.warnings for k in i.keys}


def test_megatron_gets_the_learnable_softmax_and_the_alternating_window():
    tc = margs.build_args(compose_cfg(["backend=megatron", *SINKS, "model.sink_sliding_window=128"]), CPU)[
        "transformer_config"]
    assert tc["softmax_type"] == "learnable"
    assert tc["window_size"] == [128, 0] and tc["window_attn_skip_freq"] == 2  # layers 1, 3, ... windowed
    tc = margs.build_args(compose_cfg(["backend=megatron", *SINKS, "model.sink_sliding_window=128",
                                       "model.sink_window_even_layers_only=false"]), CPU)["transformer_config"]
    assert tc["window_size"] == [128, 0] and tc["window_attn_skip_freq"] is None  # every layer
    tc = margs.build_args(compose_cfg(["backend=megatron", *SINKS]), CPU)["transformer_config"]
    assert tc["softmax_type"] == "learnable" and "window_size" not in tc
    tc = margs.build_args(compose_cfg(["backend=megatron"]), CPU)["transformer_config"]
    assert "softmax_type" not in tc and "window_size" not in tc  # megatron's vanilla softmax


def test_the_window_without_sinks_is_listed_not_silently_dropped():
    warned = _warned(["backend=megatron", "model.sink_sliding_window=128"])
    assert "acts only with attention sinks" in warned["model.sink_sliding_window"]
    warned = _warned(["backend=megatron", *SINKS, "model.sink_window_even_layers_only=false"])
    assert "acts only with a sliding window" in warned["model.sink_window_even_layers_only"]


def test_a_negative_window_is_refused():
    with pytest.raises(ConfigError, match=r"model.sink_sliding_window = -1: must be >= 0 \(a count that may be 0\)"):
        _checked(["backend=megatron", *SINKS, "model.sink_sliding_window=-1"])


def test_torchtitan_builds_the_sinks_into_its_qwen3_family():
    from primus.backends.torchtitan.flavors import QWEN3, build_flavor

    flavor = build_flavor(compose_cfg(["backend=torchtitan", "model=debug", *SINKS, "model.sink_sliding_window=8"]))
    assert flavor.spec == QWEN3 and not flavor.issues  # a dense Llama-shaped model, in the family with the sinks
    assert (flavor.args["use_sink_attention"], flavor.args["sink_sliding_window"],
            flavor.args["sink_window_even_layers_only"]) == (True, 8, True)
    assert "use_sink_attention" not in build_flavor(compose_cfg(["backend=torchtitan", "model=debug_moe"])).args


@pytest.mark.parametrize("overrides,match", [
    (["launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2"], "no tensor or context parallelism"),
    (["model=deepseek_v2_lite"], "not its deepseek_v3 \\(multi-latent attention\\)"),
    (["turbo=torchtitan"], "the turbo attention kernel has no attention sinks"),
])
def test_torchtitan_refuses_what_its_sinks_cannot_serve(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _checked(["backend=torchtitan", *overrides, *SINKS, "dry_run=true"])


@pytest.mark.parametrize("te,refused", [("2.5.0+cu12", True), ("2.8.0", False), (None, False)])
def test_transformer_engine_older_than_2_8_is_refused_for_sinks_before_start(monkeypatch, te, refused):
    """megatron-core asserts TE >= 2.8.0 for softmax_type only when it builds the model: said before start."""
    from primus.backends.megatron import args as margs_mod
    from primus.features import model

    monkeypatch.setattr(margs_mod, "resolved_layer_spec", lambda cfg: "te")
    monkeypatch.setattr(model, "_te_version", lambda: te)
    issues = model.megatron_issues(compose_cfg(["backend=megatron", *SINKS]), RunContext(device="cuda", world_size=1))
    named = [i for i in issues if "need TE >= 2.8.0" in i.rule]
    assert bool(named) == refused
    if refused:
        assert "backend.layer_spec=local" in named[0].fix and "2.5.0+cu12" in named[0].rule


def test_turbo_attention_with_sinks_is_warned_not_swapped_silently():
    """Primus runs sinks inside its turbo attention; here that kernel has no sink, so SDPA runs those layers."""
    from primus.features import turbo

    cfg = compose_cfg(["backend=megatron", "backend.layer_spec=local", *SINKS, "turbo.enable_primus_turbo=true",
                       "turbo.use_turbo_attention=true"])
    issues = turbo.megatron_issues(cfg, RunContext(device="cpu", world_size=1, planned=True))
    warned = [i for i in issues if "model.use_sink_attention" in i.keys]
    assert len(warned) == 1 and warned[0].severity == "warning" and "turbo.use_turbo_attention" in warned[0].keys


def test_flops_count_the_window_s_keys_on_the_windowed_layers():
    from primus.metrics.flops import flops_per_token, param_counts

    base = compose_cfg(["model=debug"]).model  # 4 layers, 4 heads of 32
    win = compose_cfg(["model=debug", *SINKS, "model.sink_sliding_window=127"]).model
    s = 4096
    per_key = 12.0 * 4 * 32  # forward + backward QK^T and AV per head dim and key
    # layers 0 and 2 see the window's 128 keys, layers 1 and 3 all 4096
    assert flops_per_token(base, s) - flops_per_token(win, s) == pytest.approx(2 * per_key * (s - 128))
    # causal: a window of w keys averages w - w^2 / 2s per query, all s keys s / 2
    causal = flops_per_token(base, s, causal=True) - flops_per_token(win, s, causal=True)
    assert causal == pytest.approx(2 * per_key * (s / 2 - (128 - 128 ** 2 / (2 * s))))
    assert param_counts(win).total - param_counts(base).total == 4 * 4  # a sink per head and layer
    assert param_counts(win).matmul_active == param_counts(base).matmul_active


def test_primus_s_megatron_gpt_oss_imports_its_sinks_and_the_window_only_where_it_acts(monkeypatch):
    from primus.importer.core import import_experiment

    imp = import_experiment(os.path.join(DATA, "gpt_oss.yaml"), ROOT)
    assert imp.sets["model.use_sink_attention"] is True
    assert "model.sink_window_even_layers_only" not in imp.sets  # no window: listed
    listed = {x.key: x.reason for x in imp.listed}
    assert listed["sink_window_even_layers_only"] == (
        "no effect: acts only with a sliding window (model.sink_sliding_window > 0)")
    monkeypatch.setenv("PRIMUS_SINK_WINDOW", "8")
    imp = import_experiment(os.path.join(DATA, "gpt_oss.yaml"), ROOT)
    assert imp.sets["model.sink_sliding_window"] == 8
    assert imp.sets["model.sink_window_even_layers_only"] is True


def test_the_new_preset_leaves_megatron_s_kernel_switches_to_the_experiment_so_torchtitan_builds_it(tmp_path):
    """Primus's model config carries megatron's fusion switches; in the new preset they would make it megatron's
    only (TorchTitan has no such settings), so they go to the (megatron) experiment."""
    from primus.importer import write
    from primus.importer.core import import_experiment

    imp = import_experiment(os.path.join(DATA, "gpt_oss.yaml"), ROOT)
    assert not {"apply_rope_fusion", "bias_activation_fusion"} & set(imp.new_model)
    assert imp.sets["model.apply_rope_fusion"] is False and imp.sets["model.bias_activation_fusion"] is True
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "gpt_oss_tiny.yaml").write_text(write.model_yaml(imp))
    cfg, _ = _checked([f"hydra.searchpath=[file://{conf}]", "backend=torchtitan", "model=gpt_oss_tiny",
                       "moe.moe_router_load_balancing_type=none", *SINKS])
    assert cfg.model.name == "gpt_oss_tiny" and cfg.model.use_sink_attention


def test_primus_s_torchtitan_gpt_oss_is_refused_naming_what_is_missing():
    from primus.importer.core import CannotImport, import_experiment

    with pytest.raises(CannotImport, match=r"TorchTitan's gpt_oss model .*clamped SwiGLU.*megatron gpt-oss configs "
                                           r"import"):
        import_experiment(os.path.join(DATA, "gpt_oss_torchtitan.yaml"), ROOT)


@pytest.mark.e2e
def test_sinks_and_window_train_and_resume_from_a_checkpoint(tmp_path):
    """The imported gpt-oss shape (a MoE with sinks, a window on layers 0 and 2) trains on megatron; its sinks are
    in the checkpoint: resuming at step 2 continues the same losses (without them the resumed model would differ)."""
    from parity import COMMON
    from rank_script import run_train

    model = ["model=debug_moe", *SINKS, "model.sink_sliding_window=8", "training.train_iters=4"]
    a, _ = _resumed(tmp_path, model, model)
    plain, _ = run_train(tmp_path / "plain", [*COMMON, "model=debug_moe", "training.train_iters=4"])
    assert all(abs(x - y) > 1e-4 for x, y in zip(a["losses"], plain["losses"]))  # the sinks act from step 1


@pytest.mark.e2e
def test_torchtitan_trains_with_sinks_and_resumes_them_from_a_checkpoint(tmp_path):
    """TorchTitan's qwen3 with the sinks and a window on layers 0 and 2 trains; the model it builds has a sink per
    head and layer, and they are in its DCP checkpoint (resuming at step 2 continues the same losses)."""
    from parity import COMMON, TORCHTITAN
    from rank_script import run_train

    model = [*TORCHTITAN, "model=debug", "training.train_iters=4"]
    sinks = [*model, *SINKS, "model.sink_sliding_window=8"]
    a, _ = _resumed(tmp_path, sinks, sinks)
    plain, _ = run_train(tmp_path / "plain", [*COMMON, *model])
    assert a["params"] == plain["params"] + 4 * 4


@pytest.mark.scale
def test_sinks_saved_at_tp2_resume_at_tp1(tmp_path):
    """The sinks are split over tp ranks by head (as megatron-core saves its softmax_offset): a tp 2 checkpoint
    resumes at tp 1 with the same losses."""
    model = ["model=debug", *SINKS, "model.sink_sliding_window=8", "training.train_iters=4"]
    _resumed(tmp_path, [*model, "launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2"], model)


@pytest.mark.e2e
def test_the_bench_entry_runs_on_cpu():
    """bench/turbo_kernels.py --only sink_attention (the GPU figure beside plain SDPA) at its smoke size on CPU."""
    from conftest import turbo_kernels_smoke

    rows = turbo_kernels_smoke("sink_attention")
    assert len(rows) == 3 and "(baseline)" in rows[0] and "window 8: speed" in rows[2], rows


@pytest.mark.e2e
def test_an_imported_primus_gpt_oss_experiment_trains_on_the_first_try(tmp_path):
    """python -m primus.importer <gpt-oss experiment> --out ..., then train.py on it: it trains (one CPU rank, the
    sinks with a window of 8 on layers 0 and 2), the sinks in the model megatron builds."""
    import json
    import subprocess
    import sys

    from conftest import ROOT as REPO

    conf = tmp_path / "conf"
    out = conf / "experiment" / "oss.yaml"
    env = {**os.environ, "GPUS_PER_NODE": "1", "NNODES": "1", "PRIMUS_SINK_WINDOW": "8"}
    r = subprocess.run([sys.executable, "-m", "primus.importer", os.path.join(DATA, "gpt_oss.yaml"), "--primus-root",
                        ROOT, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "train.py", f"hydra.searchpath=[file://{conf}]", "experiment=oss",
                        "device=cpu", "logging.tensorboard=false", f"hydra.run.dir={run}"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((run / "result.json").read_text())
    assert res["status"] == "ok" and len(res["losses"]) == 4 and all(x == x for x in res["losses"])
    model = res["config"]["model"]
    assert (model["use_sink_attention"], model["sink_sliding_window"], model["sink_window_even_layers_only"]) == (
        True, 8, True)
    # the model megatron built has a sink per head and layer (its parameter count is the planner's, sinks included)
    from primus.config.schema import ModelConfig
    from primus.metrics.flops import param_counts

    without = param_counts(ModelConfig(**{**model, "use_sink_attention": False})).total
    assert res["params"] == without + model["num_attention_heads"] * model["num_layers"]


@pytest.mark.scale
@pytest.mark.parametrize("layout", [["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"],
                                    ["parallel.pipeline_model_parallel_size=2",
                                     "parallel.decoder_first_pipeline_num_layers=1"]], ids=["tp2+sp", "pp2 1+3"])
def test_sinks_and_window_train_alike_split_over_two_ranks(tmp_path, layout):
    """tp 2 splits the sinks with their heads; pp 2 with 1 + 3 layers numbers the layers across stages, so the
    window stays on layers 0 and 2 (a stage counting its own layers would put it on 1 and 3): both train like one
    process (the parity matrix's bound)."""
    from parity import COMMON, REL
    from rank_script import run_train

    model = ["model=debug", *SINKS, "model.sink_sliding_window=8"]
    one, _ = run_train(tmp_path / "one", [*COMMON, *model])
    two, _ = run_train(tmp_path / "two", [*COMMON, *model, "launcher.nproc_per_node=2", *layout])
    for x, y in zip(one["losses"], two["losses"]):
        assert abs(x - y) <= REL * abs(x), (one["losses"], two["losses"])
