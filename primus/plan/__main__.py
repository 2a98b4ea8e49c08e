"""`python -m primus.plan [--pick] <hydra overrides>`: the plan without train.py (same composition, the plan's own
checks and the counts only, no run dir).

    python -m primus.plan model=llama3_70b training=bench plan.gpu=H100
    python -m primus.plan --pick experiment=llama3_8b_megatron_fp8   # the recompute / offload / micro batch it picks

Options: --pick prints the planner's pick as overrides (exit 1 when nothing fits); -h / --help prints this text.
Everything else is a Hydra override, as train.py takes them (`plan.gpu=MI300X` plans for another GPU).
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
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = [a for a in argv if a.startswith("-")]
    if "-h" in flags or "--help" in flags:
        print(__doc__.strip())
        return 0
    bad = [a for a in flags if a != "--pick"]
    if bad:
        print(f"[primus plan] {bad[0]}: not an option; the options are --pick and --help, and everything else is a "
              "Hydra override (key=value, e.g. plan.gpu=H100)", file=sys.stderr)
        return 2
    want_pick = "--pick" in argv

    def composed(ovs) -> PrimusConfig:
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            dcfg = compose("config", overrides=quote_numeric_group_choices(ovs))
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), dcfg))

    overrides = [a for a in argv if a != "--pick"]
    cfg = composed(overrides)
    ctx = RunContext(device="cuda", world_size=world_size_of(cfg))
    try:  # the plan's own settings and the counts it divides by (the full validation is train.py's)
        validate(cfg, ctx, rules=[plan_values])
    except ConfigError as e:
        print(f"[primus plan] {e}", file=sys.stderr)
        return 2
    if want_pick:
        return run_pick(cfg, ctx, lambda ovs: composed(overrides + ovs))
    return run_plan(cfg, ctx)


def picked_settings(cfg) -> tuple:
    """What a pick sets: the recompute, the optimizer offload (its share and overlap only where it offloads) and
    the micro batch."""
    r, m = cfg.recompute, cfg.memory
    offload = (m.optimizer_offload_fraction, m.overlap_cpu_optimizer_d2h_h2d) if m.optimizer_cpu_offload else ()
    return (r.recompute_granularity, r.recompute_method, r.recompute_num_layers, r.recompute_layer_ids,
            r.activation_checkpoint_mode, m.optimizer_cpu_offload, offload, cfg.training.micro_batch_size)


def run_pick(cfg, ctx, with_overrides) -> int:
    """Print the planner's pick (primus.plan.advice.pick) as overrides and its estimate, and whether the config
    has those settings already (`with_overrides`: the config composed again with the pick's overrides); 1 when
    nothing fits."""
    from primus.plan import target_gpu
    from primus.plan.advice import pick

    gpu = target_gpu(cfg, ctx)
    v = pick(cfg, gpu, ctx.world_size)
    if v is None:
        print(f"[primus plan] pick: nothing fits {gpu.label} with 10% free on {ctx.world_size} GPU(s); "
              "see the plan's variants without --pick", file=sys.stderr)
        return 1
    b, G = v.breakdown, float(1 << 30)
    print(f"[primus plan] pick: {v.label}: {b.needed / G:.1f} GiB needed of {b.capacity / G:.1f} GiB ({v.note}), "
          f"peak during {b.peak_phase}, {b.optimizer_cpu / G:.1f} GiB of Adam states on the CPU\n"
          + (f"  why: {v.why}\n" if v.why else "") + f"  overrides: {' '.join(v.overrides)}")
    if picked_settings(with_overrides(v.overrides)) == picked_settings(cfg):
        print("  the config has these settings already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
