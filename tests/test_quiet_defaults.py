"""Quiet, sensible defaults: the LR warm-up follows train_iters unless set, upstream warnings that concern no user
are hidden (and only those), and a CPU TorchTitan run claims no A100 peak."""
import logging
import math
import os
import tomllib
import warnings

import pytest

from conftest import compose_cfg
from primus import warnings_filters
from primus.config.validate import RULES, validate
from primus.context import RunContext
from primus.features.training import warmup_iters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = RunContext(device="cpu", world_size=1, run_dir="/tmp/r")


# ------------------------------------------------------------------------------------------------ LR warm-up


@pytest.mark.parametrize("train_iters, expected", [(1, 0), (2, 0), (19, 0), (20, 1), (30, 1), (1000, 50),
                                                   (40_000, 2000), (500_000, 2000)])
def test_warmup_defaults_to_five_percent_of_the_run_at_most_2000(train_iters, expected):
    cfg = compose_cfg([f"training.train_iters={train_iters}"])
    assert cfg.training.lr_warmup_iters is None
    assert warmup_iters(cfg) == expected
    validate(cfg, CPU, rules=RULES)  # every length is valid by default, training.train_iters=2 included


def test_a_set_warmup_is_kept_and_reaches_both_backends():
    from primus.backends.megatron.args import build_args as megatron_args
    from primus.backends.torchtitan.args import build_args as torchtitan_args

    for over, steps in (([], 1), (["training.lr_warmup_iters=0"], 0), (["training.lr_warmup_iters=7"], 7)):
        cfg = compose_cfg(["training.train_iters=30"] + over)
        assert megatron_args(cfg, CPU)["scheduler"]["lr_warmup_steps"] == steps
        cfg = compose_cfg(["backend=torchtitan", "training.train_iters=30"] + over)
        assert torchtitan_args(cfg, CPU)["lr_scheduler"]["warmup_steps"] == steps


# ------------------------------------------------------------------------------------------------ warnings


@pytest.fixture
def fresh_install(monkeypatch):
    """install() may run again in this test; the process' filters are restored afterwards."""
    monkeypatch.setattr(warnings_filters, "_installed", False)
    for name, _, _ in warnings_filters.LOG_RECORDS:
        log = logging.getLogger(name)
        monkeypatch.setattr(log, "filters", list(log.filters))


def _raised(category, module, message):
    """Whether `message`, raised from `module`, would be shown after install()."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        warnings_filters.install()
        warnings.warn_explicit(message, category, filename=module.replace(".", "/") + ".py", lineno=1,
                               module=module)
    return bool(seen)


@pytest.mark.parametrize("category, module, message", [
    (UserWarning, "megatron.core.optimizer", "Transformer Engine and Apex are not installed. Falling back to Torch "
                                             "optimizers."),
    (UserWarning, "megatron.core.models.backends", "Apex is not installed. Falling back to Torch Norm"),
    (UserWarning, "megatron.core.transformer.transformer_config",
     "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer."),
    (DeprecationWarning, "megatron.core.inference.contexts",
     "The following imports from `dynamic_context.py` will be removed in this file in `megatron-core` 0.14."),
    (DeprecationWarning, "megatron.core.transformer.multi_latent_attention",
     "The 'megatron.core.transformer.custom_layers.transformer_engine' \n    module is deprecated"),
    (DeprecationWarning, "torch.jit._script", "`torch.jit.script_method` is deprecated. Please switch to "
                                              "`torch.compile` or `torch.export`."),
    (UserWarning, "torchdata.stateful_dataloader.stateful_dataloader", "'set_vital' is deprecated, please do not "
                                                                        "call"),
    (UserWarning, "torchtitan.distributed.utils", "In CPU autocast, but the target dtype is not supported. "
                                                  "Disabling autocast."),
])
def test_listed_upstream_warnings_are_hidden(fresh_install, category, module, message):
    assert not _raised(category, module, message)


@pytest.mark.parametrize("category, module, message", [
    # about the user's own choices: these must still be seen
    (UserWarning, "megatron.core.model_parallel_config",
     "When using expert parallelism and tensor parallelism for training, sequence parallelism must be used"),
    (UserWarning, "megatron.core.transformer.transformer_config",
     "Using a large number of experts (e.g. >=32) without fp32 routing."),
    # a listed message from some other module is that module's own
    (UserWarning, "primus.features.precision", "Apex is not installed. Falling back to Torch Norm"),
])
def test_other_warnings_still_show(fresh_install, category, module, message):
    assert _raised(category, module, message)


def test_every_hidden_warning_says_why_and_pytest_hides_the_same():
    assert all(h.why and h.message and h.module for h in warnings_filters.WARNINGS)
    assert all(why for _, _, why in warnings_filters.LOG_RECORDS)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        lines = tomllib.load(f)["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert lines == warnings_filters.pytest_lines()


def test_the_uncached_mock_dataset_log_record_is_dropped(fresh_install, caplog):
    log = logging.getLogger("megatron.core.datasets.gpt_dataset")
    warnings_filters.install()
    with caplog.at_level(logging.INFO, logger=log.name):
        log.warning("Unable to save MockGPTDataset indexes because path_to_cache is None")
        log.warning("Unable to save GPTDataset indexes to /x: read-only file system")
    assert [r.getMessage() for r in caplog.records] == ["Unable to save GPTDataset indexes to /x: read-only file "
                                                        "system"]


# ------------------------------------------------------------------------------------------------ TorchTitan noise


def test_cpu_torchtitan_claims_no_a100_and_runs_no_lspci(monkeypatch, caplog):
    """TorchTitan 0.2.2 runs lspci and falls back to an A100's peak for MFU; on CPU the peak is unknown (NaN)."""
    pytest.importorskip("torchtitan")
    import subprocess

    import torchtitan.tools.utils as tt_utils

    from primus.backends.torchtitan.patches import cpu
    from primus.patches.registry import Conditions

    (w,) = [w for w in cpu.WORKAROUNDS if w.name == "torchtitan.cpu.peak_flops"]
    assert w.applies(Conditions(device="cpu")) and not w.applies(Conditions(device="cuda"))
    monkeypatch.setattr(tt_utils, "get_peak_flops", tt_utils.get_peak_flops)  # restored afterwards

    def no_process(*a, **k):
        raise AssertionError(f"started a process: {a}")

    monkeypatch.setattr(subprocess, "run", no_process)
    w.fix(Conditions(device="cpu"))
    with caplog.at_level(logging.WARNING):
        assert math.isnan(tt_utils.get_peak_flops("cpu"))
    assert not caplog.records


def test_synthetic_torchtitan_runs_point_hf_assets_at_a_folder_that_exists():
    """TorchTitan warns when model.hf_assets_path (default ./tests/assets/tokenizer) is missing; a synthetic run
    reads no assets, and its run dir exists."""
    from primus.backends.torchtitan.args import build_args

    cfg = compose_cfg(["backend=torchtitan"])
    assert build_args(cfg, CPU)["model"]["hf_assets_path"] == os.path.abspath(CPU.run_dir)
