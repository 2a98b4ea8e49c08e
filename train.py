"""Primus-Hydra entry point: compose -> validate -> resolve -> build the backend trainer -> train -> result.json.

    python train.py backend=megatron model=llama2_7b precision=fp8
    python train.py --cfg job                       # print the composed config
    python train.py dry_run=true ...                # validate and print the backend arguments as JSON
    python train.py -m turbo.use_turbo_attention=true,false precision=bf16,fp8   # sweep
    python train.py --config-dir <run>/.hydra --config-name config               # rerun a finished run exactly
"""
import sys

import hydra
from omegaconf import DictConfig

from primus.config.hydra_compat import is_saved_run_dir, quote_numeric_group_choices
from primus.config.schema import register

register()


def main(cfg: DictConfig):
    from primus.config.errors import ConfigError
    from primus.run import run

    try:
        return run(cfg)
    except ConfigError as e:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # a sweep records the failed point (primus/sweep.py) and goes on
        print(f"[primus] {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    sys.argv[1:] = quote_numeric_group_choices(sys.argv[1:])
    conf = None if is_saved_run_dir(sys.argv[1:]) else "conf"
    hydra.main(config_path=conf, config_name="config", version_base="1.3")(main)()
