"""`python -m primus.plan <hydra overrides>`: the plan without train.py (same composition, the plan's own checks
and the counts only, no run dir).

    python -m primus.plan model=llama3_70b training=bench plan.gpu=H100
"""
import os
import sys


def main(argv=None) -> int:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from primus.config.hydra_compat import quote_numeric_group_choices
    from primus.config.schema import PrimusConfig, register
    from primus.context import RunContext, world_size_of
    from primus.config.errors import ConfigError
    from primus.config.validate import validate
    from primus.features.plan import plan_values
    from primus.plan import run_plan

    register()
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")
    overrides = quote_numeric_group_choices(list(sys.argv[1:] if argv is None else argv))
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        dcfg = compose("config", overrides=overrides)
    cfg: PrimusConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), dcfg))
    ctx = RunContext(device="cuda", world_size=world_size_of(cfg))
    try:  # the plan's own settings and the counts it divides by (the full validation is train.py's)
        validate(cfg, ctx, rules=[plan_values])
    except ConfigError as e:
        print(f"[primus plan] {e}", file=sys.stderr)
        return 2
    return run_plan(cfg, ctx)


if __name__ == "__main__":
    sys.exit(main())
