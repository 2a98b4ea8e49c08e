"""Primus-Hydra entry point: compose -> validate -> resolve -> build the backend trainer -> train -> result.json.

    python train.py backend=megatron model=llama2_7b precision=fp8
    python train.py --help                          # modes, groups and their options, presets, examples
    python train.py --cfg job                       # print the composed config
    python train.py dry_run=true ...                # validate and print the backend arguments as JSON
    python train.py -m turbo.use_turbo_attention=true,false precision=bf16,fp8   # sweep
    python train.py --config-dir <run>/.hydra --config-name config               # rerun a finished run exactly
"""
import os
import sys

import hydra
from omegaconf import DictConfig

from primus.config.hydra_compat import (is_saved_run_dir, one_compose_per_run, quick_group_listing,
                                        quote_numeric_group_choices)
from primus.config.schema import register

register()


from primus import exit_codes

_entered = False  # Hydra's own compose errors exit 1 before main() runs; they are config errors too


def main(cfg: DictConfig):
    """One Hydra job. In a sweep it returns the point's sweep.objective (a number, for Hydra's sweepers); a run
    that only describes itself (dry run, plan, refused config) keeps no run dir (primus/results.py)."""
    global _entered
    _entered = True
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from primus.config.errors import ConfigError
    from primus.results import discard_described_run
    from primus.run import run

    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    try:
        status = run(cfg)
    except ConfigError as e:
        if sweep:
            raise  # a sweep records the failed point (primus/sweep.py) and goes on
        print(f"[primus] {e}", file=sys.stderr)
        discard_described_run(hc.runtime.output_dir)
        sys.exit(exit_codes.BAD_CONFIG)
    if sweep:
        from primus.sweep import job_objective

        return job_objective(cfg, hc.runtime.output_dir)
    if cfg.get("dry_run") or getattr(cfg.get("mode"), "value", cfg.get("mode")) == "plan":
        discard_described_run(hc.runtime.output_dir)
    from primus.launch.slurm import task_rank
    from primus.results import RESULT_FILE

    result = os.path.join(hc.runtime.output_dir, RESULT_FILE)
    if task_rank() == 0 and os.path.isfile(result):
        print(f"[primus] {status}: {os.path.relpath(result)}", flush=True)  # the last line: where the results are
    if status == "preempted":
        sys.exit(exit_codes.PREEMPTED)
    return status


if __name__ == "__main__":
    sys.argv[1:] = quote_numeric_group_choices(sys.argv[1:])
    quick_group_listing(sys.argv[1:])
    one_compose_per_run(sys.argv[1:])
    conf = None if is_saved_run_dir(sys.argv[1:]) else "conf"
    try:
        hydra.main(config_path=conf, config_name="config", version_base="1.3")(main)()
    except SystemExit as e:
        if e.code == exit_codes.FAILED and not _entered:
            sys.exit(exit_codes.BAD_CONFIG)  # an override Hydra could not compose (unknown key, bad value, no option)
        raise
