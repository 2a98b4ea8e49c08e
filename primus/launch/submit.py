"""The Slurm launcher of `python train.py -m hydra/launcher=slurm ...`: hydra-submitit-launcher's, with the checks a
sweep needs before anything is queued.

submitit's launcher pickles each point and lets its Slurm job compose and validate it: a bad point would cost a
queue wait and an allocation, and the rest of the sweep would already be queued. Here, in the submitting process:

1. every point of the sweep (all of Hydra's basic sweeper's points, not only the first batch) is composed and
   validated at the world size its job will have: `hydra.launcher.nodes x tasks_per_node` (launcher.nnodes x
   launcher.nproc_per_node unless the cluster preset or the command line changed them), on GPUs when the job asks
   for them (gpus_per_node, gpus_per_task or gres);
2. invalid points are reported all at once and nothing is submitted, not even the valid points (exit 2): a sweep
   is one experiment, and half of it queued would be compared against a table with holes;
3. a sweep of `dry_run=true` or `mode=plan` points answers here, in this process, as the basic launcher would:
   nothing is queued (a sweep mixing them with training points is refused: split it);
4. a machine without Slurm's client commands (sbatch, srun) is told so (exit 2) instead of submitit's traceback.
"""
from __future__ import annotations

import shutil
import sys
from typing import Any, List, Optional, Sequence, Tuple

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf

from primus import exit_codes

SLURM_COMMANDS = ("sbatch", "srun")  # submitit submits with sbatch; the batch script starts the tasks with srun


def job_world(sweep_cfg: DictConfig) -> Tuple[int, str]:
    """(world size, where it came from) of the Slurm job a composed point becomes: one rank per task."""
    hl = sweep_cfg.hydra.launcher
    nodes, per_node = int(hl.nodes or 1), int(hl.tasks_per_node or 1)
    if nodes * per_node > 1:
        return nodes * per_node, f"Slurm job: hydra.launcher.nodes x tasks_per_node = {nodes} x {per_node}"
    # a job of one task starts launcher.nproc_per_node workers itself (primus/launch/slurm.py)
    lc = sweep_cfg.launcher
    return (int(lc.nnodes) * int(lc.nproc_per_node),
            f"launcher.nnodes x launcher.nproc_per_node = {lc.nnodes} x {lc.nproc_per_node} (in a one-task Slurm job)")


def job_has_gpus(sweep_cfg: DictConfig) -> bool:
    hl = sweep_cfg.hydra.launcher
    return any(OmegaConf.select(hl, k) for k in ("gpus_per_node", "gpus_per_task", "gres"))


def check_point(sweep_cfg: DictConfig):
    """Validate one composed point (a config with its hydra node) as its Slurm job will: returns (cfg, ctx), or
    raises ConfigError."""
    from hydra.core.hydra_config import HydraConfig

    from primus.run import checked

    hc = HydraConfig.instance()
    saved = hc.cfg
    hc.set_config(sweep_cfg)  # interpolations into hydra.* resolve as they will in the job
    try:
        job = OmegaConf.masked_copy(sweep_cfg, [k for k in sweep_cfg if k != "hydra"])
        overrides = list(OmegaConf.to_container(sweep_cfg.hydra.overrides.task))
        return checked(job, overrides, world=job_world(sweep_cfg), gpus=job_has_gpus(sweep_cfg))
    finally:
        hc.cfg = saved


def missing_slurm_commands() -> List[str]:
    return [c for c in SLURM_COMMANDS if shutil.which(c) is None]


def all_points(config: DictConfig, config_loader) -> Optional[List[List[str]]]:
    """Every point of the sweep as Hydra's basic sweeper will launch it (over all its batches), or None for another
    sweeper (optuna's points are chosen as it goes: each batch is then checked before it is queued)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "BasicSweeper" not in str(OmegaConf.select(config, "hydra.sweeper._target_") or ""):
        return None
    args = list(OmegaConf.to_container(config.hydra.overrides.task))
    params = OmegaConf.select(config, "hydra.sweeper.params")
    if params:
        args += [f"{k}={v}" for k, v in params.items()]
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(args)
    return [list(p) for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]


def refuse(lines: List[str]) -> None:
    print("\n".join(lines), file=sys.stderr, flush=True)
    raise SystemExit(exit_codes.BAD_CONFIG)  # not an Exception: Hydra lets it through, train.py keeps the code


class CheckedSlurmLauncher(SlurmLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._checked = False

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from primus.config.errors import ConfigError
        from primus.config.schema import Mode

        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        points = None if self._checked else all_points(self.config, loader)
        if points is None:
            points = [list(o) for o in job_overrides]
        self._checked = True

        bad, describe = [], []
        for num, overrides in enumerate(points):
            sweep_cfg = loader.load_sweep_config(self.config, overrides)
            try:
                cfg, _ = check_point(sweep_cfg)
            except ConfigError as e:
                bad.append((num, overrides, e))
                continue
            describe.append(cfg.dry_run or cfg.mode == Mode.plan)
        if bad:
            lines = [f"[slurm] nothing submitted: {len(bad)} of {len(points)} sweep point(s) are invalid at the "
                     "world size their Slurm job would have:"]
            for num, overrides, e in bad:
                lines.append(f"  #{num} {' '.join(overrides) or '(defaults)'}")
                lines += [f"    {line}" for line in str(e).splitlines()]
            lines.append("[slurm] fix these points or leave them out of the sweep; the valid ones wait with them.")
            refuse(lines)
        if describe and all(describe):
            # a dry run / plan describes the jobs; it needs no allocation: answer here, as the basic launcher does
            print(f"[slurm] dry_run / mode=plan: answered here, nothing queued ({len(job_overrides)} point(s))",
                  flush=True)
            from hydra._internal.core_plugins.basic_launcher import BasicLauncher

            local = BasicLauncher()
            local.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
            return local.launch(job_overrides, initial_job_idx)
        if any(describe):
            refuse(["[slurm] nothing submitted: this sweep mixes dry_run=true / mode=plan points (answered here, "
                    "never queued) with training points (queued): run them as two sweeps"])
        missing = missing_slurm_commands()
        if missing:
            refuse([f"[slurm] nothing submitted: Slurm's client commands {', '.join(missing)} are not on PATH, so this "
                    "machine cannot submit jobs. Run on a Slurm login node (or load its module / source its env), "
                    "start the local cluster (launchers/slurm_cluster.sh start, then eval \"$(launchers/"
                    "slurm_cluster.sh env)\"), or drop hydra/launcher=slurm to run here."])
        from primus.patches import apply_launcher_patches

        apply_launcher_patches()  # submitit waits out a requeued job's passing FAILED (patches/submitit_requeue.py)
        return super().launch(job_overrides, initial_job_idx)
