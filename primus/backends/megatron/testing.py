"""Helpers for tests and quick experiments: compose a config, run the megatron trainer in-process for N steps."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

CONF_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "conf")


def compose(overrides: Sequence[str] = ()):
    """The typed PrimusConfig for `python train.py <overrides>` (no validation)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from primus.config.schema import register

    register()
    with initialize_config_dir(config_dir=os.path.abspath(CONF_DIR), version_base="1.3"):
        c = hydra_compose("config", overrides=list(overrides))
    return OmegaConf.to_object(c)


def train_steps(overrides: Sequence[str], run_dir: str, steps: Optional[int] = None, check: bool = True):
    """Build MegatronTrainer for `train.py <overrides>` and train N steps; returns (ctx, setup info, per-step losses;
    every rank gets the same list). check=False skips validate() (test scripts that fake a GPU-only path on CPU)."""
    from primus.backends.megatron.trainer import MegatronTrainer
    from primus.config.validate import validate
    from primus.context import resolve
    from primus.patches import apply_cpu_patches

    cfg = compose(overrides)
    ctx = resolve(cfg, run_dir)
    if check:
        validate(cfg, ctx)
    cpu_gemm = apply_cpu_patches(ctx.device)  # as the run path does (primus/train_loop.py), for this run
    trainer = MegatronTrainer(cfg, ctx)
    losses = []
    try:
        info = trainer.setup()
        for step in range(1, (steps or cfg.training.train_iters) + 1):
            losses.append(trainer.train_step(step).loss)
    finally:
        trainer.close()
        if cpu_gemm:
            from primus.patches.cpu_gemm import uninstall

            uninstall()
    return ctx, info, losses


def run_steps(overrides: Sequence[str], run_dir: str, steps: Optional[int] = None) -> List[float]:
    """Validate, build MegatronTrainer, train; returns the per-step losses (every rank gets the same list)."""
    return train_steps(overrides, run_dir, steps)[2]
