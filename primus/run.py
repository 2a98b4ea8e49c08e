"""What train.py does inside the Hydra job: validate, resolve, then plan / dry-run / tune / train.

Order matters: validation runs before any worker process, Slurm task or heavy import, so a bad config costs a
second, not a GPU allocation.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Dict, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from primus.config.errors import ConfigError, ConfigIssue
from primus.config.schema import Device, Mode, PrimusConfig
from primus.config.validate import validate
from primus.context import RunContext, gpu_present, resolve


def hydra_meta() -> Dict[str, Any]:
    """Group choices and command-line overrides of this job (for result.json and sweep tables)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return {"choices": {}, "overrides": [], "run_dir": os.getcwd(), "multirun": False}
    from hydra.types import RunMode

    choices = {k: v for k, v in OmegaConf.to_container(hc.runtime.choices).items() if not k.startswith("hydra")}
    return {"choices": choices, "overrides": list(hc.overrides.task), "run_dir": hc.runtime.output_dir,
            "job_num": hc.job.get("num"), "multirun": hc.mode == RunMode.MULTIRUN}


def resolved_summary(cfg: PrimusConfig, ctx: RunContext) -> Dict[str, Any]:
    from primus.context import data_parallel_size

    p = cfg.precision
    prec = "fp16" if p.fp16 else "bf16"
    if p.fp8 is not None:
        prec += f"+fp8({p.fp8.value}, {p.fp8_recipe.value})"
    if p.fp4 is not None:
        prec += f"+fp4({p.fp4_recipe.value})"
    out = {"device": ctx.device if not ctx.gpu_name else f"{ctx.device} ({ctx.gpu_name})",
           "backend": cfg.backend.name.value, "model": cfg.model.name, "precision": prec,
           "world_size": ctx.world_size, "world_size_from": ctx.world_from or "launcher",
           "tp": cfg.parallel.tensor_model_parallel_size,
           "pp": cfg.parallel.pipeline_model_parallel_size, "cp": cfg.parallel.context_parallel_size,
           "ep": cfg.parallel.expert_model_parallel_size, "dp": data_parallel_size(cfg, ctx.world_size),
           "micro_batch_size": cfg.training.micro_batch_size, "global_batch_size": cfg.training.global_batch_size,
           "gradient_accumulation_steps": cfg.training.gradient_accumulation_steps}
    if cfg.parallel.pipeline_model_parallel_size > 1:
        from primus.features.parallel import stage_layer_counts

        out["layers_per_pipeline_stage"] = stage_layer_counts(cfg)  # each pp rank's layers, all its virtual stages
    return out


def checked(dcfg: DictConfig, overrides, run_dir: str = ".", world: Optional[Tuple[int, str]] = None,
            gpus: Optional[bool] = None) -> Tuple[PrimusConfig, RunContext]:
    """Everything that judges a composed config before any work: unknown keys, the typed merge, the run context
    and every rule. `world` (size, where it came from) and `gpus` (whether the run gets GPUs) describe a run
    judged elsewhere than where it will run: a Slurm job checked in the submitting process."""
    from primus.config.keys import non_bool_overrides, unknown_keys

    unknown = unknown_keys(OmegaConf.to_container(dcfg, resolve=False))  # `+key` typos: nothing would read them
    unknown += non_bool_overrides(overrides)  # omegaconf reads precision.bf16=2 as true
    if unknown:
        raise ConfigError(unknown)
    # merge onto the schema so a saved run config (`--config-dir <run>/.hydra`) is typed and checked as well
    cfg: PrimusConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), dcfg))
    from primus.config.env import apply_env, explicit_keys

    explicit = explicit_keys(overrides)
    env_decided, env_issues = apply_env(cfg, explicit)  # the guide's exported variables (primus/config/env.py)
    ctx = resolve(cfg, run_dir)
    ctx.explicit, ctx.env_decided = explicit, env_decided
    if world is not None:
        ctx.world_size, ctx.world_from = world
    describe_only = cfg.dry_run or cfg.mode == Mode.plan
    if gpus is not None:  # judged for the machines the job will get
        if gpus and cfg.device != Device.cpu and not gpu_present():
            ctx.device, ctx.dist_backend, ctx.planned = "cuda", "nccl", True
        elif not gpus and cfg.device != Device.cuda:
            ctx.device, ctx.dist_backend = "cpu", "gloo"
    elif describe_only and cfg.device != Device.cpu and not gpu_present():
        # a dry run describes the GPU run the config is meant for (nothing touches a GPU): judge it as one;
        # device=cpu asks for the CPU run explicitly
        ctx.device, ctx.dist_backend, ctx.planned = "cuda", "nccl", True
    elif cfg.device == Device.cuda and not gpu_present():
        raise ConfigError(ConfigIssue(["device"], "cuda", "no CUDA / ROCm GPU is visible on this machine",
                                      "use device=auto (CPU here) or device=cpu, or run where a GPU is"))
    try:
        validate(cfg, ctx)  # raises ConfigError naming key, value, rule and fix
    except ConfigError as e:
        if env_issues:  # one round: the exported variables' problems with the rest
            raise ConfigError(env_issues + e.issues) from None
        raise
    if env_issues:
        raise ConfigError(env_issues)
    return cfg, ctx


def run(dcfg: DictConfig):
    """One Hydra job. The process env it changes is restored afterwards, so sweep points never leak into each
    other (a WORLD_SIZE left by a 1-process point would turn the next 2-process point into a Slurm-style task)."""
    saved = dict(os.environ)
    try:
        return _run(dcfg)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run(dcfg: DictConfig):
    from primus import warnings_filters
    from primus.launch.slurm import slurm_task_env

    warnings_filters.install()

    os.environ.update(slurm_task_env() or {})  # a task of a multi-task Slurm job: rank + rendezvous from Slurm
    meta = hydra_meta()
    cfg, ctx = checked(dcfg, meta["overrides"], meta["run_dir"])
    env_decided = ctx.env_decided
    findings = {"env": env_decided, "implied_settings": [i.as_ignored() for i in ctx.notes],
                "ignored_settings": [i.as_ignored() for i in ctx.warnings]}
    if ctx.needed_on_target:
        findings["needed_on_target"] = [i.as_needed() for i in ctx.needed_on_target]
    # a training run logs these (train_loop.py: console and train.log); a dry run prints them in its JSON
    # validate() may normalise values (e.g. recompute_layer_ids sorted): workers get the normalised config
    cfg_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))

    if cfg.mode == Mode.plan:
        from primus.plan import plan

        p = plan(cfg, ctx)
        print(p.text, flush=True)
        if meta["multirun"]:  # a sweep tabulates each point's estimate (primus/sweep.py)
            G = float(1 << 30)
            record_described(meta, "planned", resolved=resolved_summary(cfg, ctx), plan={
                "gpu": p.breakdown.gpu, "fits": p.fits, "needed_gib": round(p.breakdown.needed / G, 2),
                "capacity_gib": round(p.breakdown.capacity / G, 2),
                "tokens_per_s_per_gpu": p.throughput.tokens_per_s_per_gpu})
        return 0

    if cfg.dry_run:
        from primus.backends import backend_args

        summary = resolved_summary(cfg, ctx)
        print(json.dumps({"resolved": summary, **findings, "backend_args": backend_args(cfg, ctx)}, indent=2,
                         default=str))
        if meta["multirun"]:
            record_described(meta, "valid", resolved=summary)
        return 0

    from primus.features.logging import apply_levels, levels

    apply_levels(cfg)  # Hydra's console and train.log handlers, in this (launching) process
    summary = resolved_summary(cfg, ctx)
    if ctx.is_rank0 and levels(cfg)[0] <= logging.INFO:
        print("[primus] resolved: " + ", ".join(f"{k}={v}" for k, v in summary.items()), flush=True)

    from primus.backends import backend_env
    from primus.tuning_env import effective_stage, tuning_env

    # the env a run needs, set per job (also per Slurm task): tuning stage, the user's launcher.env, and what the
    # backend's settings require (e.g. CUDA_DEVICE_MAX_CONNECTIONS=1 for megatron's overlap)
    env = {**tuning_env(cfg, ctx.rocm), **cfg.launcher.env, **backend_env(cfg, ctx)}
    os.environ.update(env)
    meta = {**meta, "resolved": summary, "env": env, "config": OmegaConf.to_container(OmegaConf.structured(cfg)),
            "env_settings": env_decided, "implied_settings": findings["implied_settings"],
            "ignored_settings": findings["ignored_settings"]}

    if effective_stage(cfg) == 2:  # the guide: stage 2 tunes offline and does not train
        from primus.tuning_stage2 import run_stage2

        return run_stage2(cfg, ctx, meta)

    from primus.plan import check_fits  # refuse a run the memory estimate says cannot fit (plan.enforce=false overrides)

    issue = check_fits(cfg, ctx)
    if issue is not None:
        from primus.features.plan import Pruned

        raise Pruned(issue) if meta["multirun"] else ConfigError(issue)  # a sweep records the point as pruned

    locks = lock_run_dirs(cfg, meta["run_dir"])
    try:
        from primus.launch.local import launch_local, single_process_env

        nproc = cfg.launcher.nproc_per_node
        if "WORLD_SIZE" in os.environ or nproc == 1:
            if "WORLD_SIZE" not in os.environ:
                os.environ.update(single_process_env(cfg.launcher.master_port or None, cfg.launcher.master_addr))
            from primus.train_loop import train

            ctx = resolve(cfg, meta["run_dir"])
            ctx.env = env
            res = train(cfg, ctx, meta)
            return res.get("status")
        res = launch_local(cfg_yaml, meta["run_dir"], nproc, meta, cfg.launcher.master_port,
                           cfg.launcher.master_addr)
        return (res or {}).get("status")
    finally:
        for lock in locks:
            lock.release()


def record_described(meta: Dict[str, Any], status: str, **found: Any) -> None:
    """result.json of a describe-only sweep point (dry run: "valid"; plan: "planned" with the estimate), so the
    sweep's table shows what each point would be. A single describe-only run prints and keeps nothing."""
    from primus.results import RESULT_FILE, write_json_atomic

    write_json_atomic(os.path.join(meta["run_dir"], RESULT_FILE), {
        "status": status, "describe_only": True, "run_dir": meta["run_dir"], "job_num": meta.get("job_num"),
        "overrides": meta["overrides"], "choices": meta["choices"], **found})


def lock_run_dirs(cfg: PrimusConfig, run_dir: str) -> list:
    """One process per job (the local launcher, or global rank 0 of a torchrun / Slurm job) locks the run dir and,
    when the run saves checkpoints, the checkpoint dir; a second run on either is refused (primus/locks.py)."""
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return []
    from primus.checkpoint import default_root
    from primus.locks import lock_dirs

    dirs = {"hydra.run.dir": run_dir}
    if cfg.checkpoint.interval > 0 or cfg.checkpoint.save_at_end:
        dirs["checkpoint.dir"] = default_root(cfg, run_dir)
    return lock_dirs(dirs, say=lambda m: print(m, flush=True))


def main_error_exit(e: Exception) -> None:
    print(str(e), file=sys.stderr)
    sys.exit(2)
