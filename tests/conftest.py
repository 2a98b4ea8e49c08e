"""Shared test helpers: compose configs offline with Hydra's compose API, exactly as train.py would."""
import os
import sys

# Without a GPU, Triton kernels run in Triton's interpreter. It must be chosen before triton is first imported
# (torch and torchtitan import it early), so it is set here, for the whole session and its subprocesses.
if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "conf")
PY = sys.executable

from primus.config.hydra_compat import quote_numeric_group_choices  # noqa: E402
from primus.config.schema import register  # noqa: E402

register()


def compose_dict(overrides=()):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=quote_numeric_group_choices(list(overrides)))


def compose_cfg(overrides=()):
    """The typed PrimusConfig for these overrides."""
    return OmegaConf.to_object(compose_dict(overrides))


@pytest.fixture
def cfg_of():
    return compose_cfg


@pytest.fixture
def weight_casts():
    """primus.turbo.fp8_linear.WEIGHT_CASTS on, counters at 0, off again after the test (imported here, after the
    test module's turbo_util has chosen Triton's interpreter on CPU)."""
    from primus.turbo.fp8_linear import WEIGHT_CASTS

    WEIGHT_CASTS.enable(True)
    WEIGHT_CASTS.hits = WEIGHT_CASTS.misses = 0
    yield WEIGHT_CASTS
    WEIGHT_CASTS.enable(False)


@pytest.fixture(autouse=True)
def _restore_environ():
    """Tests that drive trainers in-process set RANK/WORLD_SIZE/MASTER_PORT... and process-wide switches: never
    let them leak into later tests (a leaked MASTER_PORT sends the next train.py subprocess to a port this process still listens on)."""
    saved = dict(os.environ)
    dynamo = sys.modules.get("torch._dynamo")
    dynamo_disabled = dynamo.config.disable if dynamo else None
    yield
    os.environ.clear()
    os.environ.update(saved)
    # megatron's CPU redirections switch torch.compile off for their process (patches/cpu.py, item 7): a test that
    # drives megatron in-process must not leave later compile tests running with dynamo disabled
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.config.disable = bool(dynamo_disabled)
