"""Shared test helpers: compose configs offline with Hydra's compose API, exactly as train.py would."""
import os
import sys

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
