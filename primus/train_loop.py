"""The per-rank worker: build the backend trainer, run the step loop, log, and (rank 0) write result.json.

One loop for every backend, so timing, log lines, MFU, the non-finite guard and result.json mean the same thing
whichever trainer runs the steps.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from primus.config.schema import PrimusConfig
from primus import fault_injection
from primus.context import RunContext, resolve
from primus.metrics.meter import Meter, is_finite
from primus.results import env_snapshot, git_sha, package_versions, reserve_space, write_result

log = logging.getLogger("primus")


class NonFiniteError(RuntimeError):
    pass


def config_from_yaml(text: str) -> PrimusConfig:
    """Rebuild the typed config in a worker process (workers get the composed config as YAML text)."""
    base = OmegaConf.structured(PrimusConfig)
    return OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.create(text)))


def _is_oom(e: BaseException) -> bool:
    try:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except ImportError:
        pass
    return "out of memory" in str(e).lower()


LOG_FILE = "train.log"  # Hydra's job log (${hydra.job.name}.log); the loop's own lines join it


_LOGS: Dict[str, Any] = {}  # run dir -> its train.log, open in append mode for the run (rank 0)
_LEVELS: Dict[str, Any] = {}  # run dir -> (console, file) levels (logging.console_level / file_level)


def _say(ctx: RunContext, msg: str, level: int = logging.INFO) -> None:
    """Rank 0's run lines (steps, checkpoints, resume) go to the console and to <run_dir>/train.log, so the loss
    history survives a SIGKILL without TensorBoard. Written by this process, line-buffered: in a multi-process run
    Hydra's file handler lives in the launching process, not in this one. Each sink shows the lines at or above its
    level (logging.console_level, logging.file_level)."""
    if not ctx.is_rank0:
        return
    console, file = _LEVELS.get(ctx.run_dir, (logging.INFO, logging.INFO))
    if level >= console:
        print(msg, flush=True)
    if level < file:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    name = logging.getLevelName(level)
    try:
        f = _LOGS.get(ctx.run_dir)
        if f is None:
            f = _LOGS[ctx.run_dir] = open(os.path.join(ctx.run_dir, LOG_FILE), "a", buffering=1)
        f.write("".join(f"[{stamp}][primus][{name}] - {line}\n" for line in msg.splitlines()))
    except OSError:
        pass  # a full or read-only run dir: the console still has the line


def _close_log(ctx: RunContext) -> None:
    _LEVELS.pop(ctx.run_dir, None)
    f = _LOGS.pop(ctx.run_dir, None)
    if f is not None:
        try:
            f.close()
        except OSError:
            pass


def _tuning_hooks(cfg: PrimusConfig, ctx: RunContext, result: Dict[str, Any]):
    """GEMM tuning on CUDA/CPU inside the worker: stage 1 records the step's GEMMs at the torch level; stage 3
    routes tuned shapes through cuBLASLt. (On ROCm both happen through hipBLASLt's env, set in run.py.)"""
    import contextlib

    from primus.tuning_env import effective_stage, results_file, shape_dir

    stage = effective_stage(cfg)
    if ctx.rocm or stage not in (1, 3):
        return contextlib.nullcontext()
    if stage == 1:
        from tuning.shapes import record_gemms

        result["gemm_shape_dir"] = os.path.abspath(shape_dir(cfg))
        _say(ctx, f"[primus] tuning stage 1: recording GEMM shapes to {result['gemm_shape_dir']}")
        return record_gemms(shape_dir(cfg), rank=ctx.rank, steps=cfg.training.train_iters)
    from tuning.apply import install_tuned_linear

    handle = install_tuned_linear(results_file(cfg))
    result["tuned_gemms"] = handle
    _say(ctx, f"[primus] tuning stage 3: tuned GEMMs from {results_file(cfg)}")
    return contextlib.nullcontext()


def _device_patches(ctx: RunContext) -> bool:
    """The device's torch / Triton workarounds, on every rank, before the backend builds anything. On ROCm
    (torch.version.hip set): the per-kernel fix of Triton's buffer-store hazard (docs/rocm-bufops.md; compile
    workers install it themselves). On a CPU without native bf16 GEMMs: bf16 / fp16 GEMMs as fp32 ones
    (primus/patches/cpu_gemm.py) for the run; returns whether those are in place."""
    from primus.patches import apply_cpu_patches, apply_rocm_patches

    if apply_rocm_patches():
        _say(ctx, "[primus] ROCm: Triton kernels whose buffer stores are clobbered get recompiled without buffer "
                  "ops (docs/rocm-bufops.md)")
    if apply_cpu_patches(ctx.device):
        _say(ctx, "[primus] CPU without native bf16 GEMMs: bf16 / fp16 GEMMs run as fp32 ones, rounded once "
                  "(primus/patches/cpu_gemm.py)")
        return True
    return False


def _say_findings(ctx: RunContext, meta: Dict[str, Any]) -> None:
    """What validation decided besides errors (primus/run.py): exported variables against config keys, values other
    settings implied, settings ignored where they do not apply."""
    from primus.config.env import describe

    for d in meta.get("env_settings") or []:
        _say(ctx, "[primus] env: " + describe(d))
    for i in meta.get("implied_settings") or []:
        _say(ctx, f"[primus] implied: {i['key']} = {i['value']!r}: {i['why']}")
    for i in meta.get("ignored_settings") or []:
        _say(ctx, f"[primus] WARNING: {i['key']} = {i['value']!r}: {i['why']}", logging.WARNING)


def _evaluate(cfg: PrimusConfig, ctx: RunContext, trainer, step: int, sinks, result: Dict[str, Any]) -> None:
    """The held-out loss after `step` (training.eval_interval): a step-log line, TensorBoard's val/loss, and
    result.json's val_loss (the last) and val_losses ([step, loss] each)."""
    from primus.metrics.sinks import VAL_LOSS_TAG

    v = trainer.evaluate(step)
    if v is None:
        return
    _say(ctx, f"step {step:>5}/{cfg.training.train_iters} | val_loss {v:.4f} "
              f"({cfg.training.eval_iters} held-out batches)")
    for sink in sinks:
        sink.scalars({VAL_LOSS_TAG: v}, step)
    result.setdefault("val_losses", []).append([step, v])
    result["val_loss"] = v


def train(cfg: PrimusConfig, ctx: RunContext, meta: Dict[str, Any]) -> Dict[str, Any]:
    """Run the training steps on this rank; returns the result dict (rank 0 also writes it)."""
    from primus import warnings_filters
    from primus.backends import trainer_class
    from primus.features.training import evaluates

    warnings_filters.install()  # before the backend is imported (a spawned worker starts here)

    from primus.features.logging import apply_levels, levels

    _LEVELS[ctx.run_dir] = levels(cfg)
    apply_levels(cfg)
    t = cfg.training
    meter = Meter(cfg, ctx)
    result: Dict[str, Any] = {
        "status": "running",
        "run_dir": os.path.abspath(ctx.run_dir),
        "backend": cfg.backend.name.value,
        "model": cfg.model.name,
        **meta,
        "world_size": ctx.world_size,
        "device": ctx.device,
        "gpu": ctx.gpu_name,
        "git_sha": git_sha(),
        "versions": package_versions(),
    }
    trainer = ckpt = None
    sinks = prof = None
    cpu_gemm = False  # the run's CPU GEMM route (_device_patches), taken out when it ends
    from primus.checkpoint import CheckpointManager
    from primus.preemption import Preemption

    preempt = Preemption(ctx.device)
    if ctx.is_rank0:
        from primus.attempts import archive, previous_attempts

        archive(ctx.run_dir, hydra_files=False)  # a requeued job's earlier result.json (a rerun's went at start)
        result["previous_attempts"] = previous_attempts(ctx.run_dir)
        reserve_space(ctx.run_dir)  # so that result.json is written even when the disk fills up during the run
    try:
        preempt.install()  # SIGTERM/SIGUSR1 (+ submitit's signal): stop after the current step, checkpoint, exit
        from primus import determinism

        ctx.env.update(determinism.apply(cfg, ctx.rank))
        if determinism.deterministic_on(cfg):
            # PRIMUS_DETERMINISTIC=1 alone must reach the backends' own switches too (megatron's
            # deterministic_mode, TorchTitan's debug.deterministic), which read the config
            cfg.training.deterministic = True
        from primus.metrics.profiler import StepProfiler
        from primus.metrics.sinks import open_sinks

        sinks = open_sinks(cfg, ctx)
        _say_findings(ctx, meta)
        prof = StepProfiler(cfg, ctx)
        gemm_recording = _tuning_hooks(cfg, ctx, result)
        cpu_gemm = _device_patches(ctx)
        trainer = trainer_class(cfg)(cfg, ctx)
        ckpt = CheckpointManager(cfg, ctx, trainer, say=lambda m: _say(ctx, m))
        ckpt.precheck()  # an explicit checkpoint.resume path must be a whole checkpoint: fail before building
        info = trainer.setup() or {}
        prof.attach(trainer)
        result["params"] = info.get("params")
        result["backend_info"] = {k: v for k, v in info.items() if k != "params"}
        _say(ctx, f"[primus] model {cfg.model.name}: {result['params']:,} parameters; "
                  + "; ".join(f"{k}: {v}" for k, v in result["backend_info"].items()))
        resumed = ckpt.resume()
        start = 1
        if resumed is not None:
            start = resumed["step"] + 1
            result["resumed_from"] = {"path": resumed["path"], "step": resumed["step"],
                                      "skipped": [{"path": p, "reason": why} for p, why in resumed["skipped"]],
                                      "slurm_restart_count": resumed.get("slurm_restart_count", 0)}
        result["first_step"] = start
        result["last_step"] = start - 1
        # a `with`, so that a step that raises leaves the GEMM-recording dispatch mode too: left active, it would
        # record (and slow) every later torch op of this process
        with gemm_recording:
            for step in range(start, t.train_iters + 1):
                prof.before_step(step)
                fault_injection.maybe_oom(step)
                t0 = time.perf_counter()
                r = trainer.train_step(step)
                dt = time.perf_counter() - t0
                prof.after_step(step)
                line = meter.step(step, r.loss, r.grad_norm, r.lr, dt, r.skipped, r.loss_scale, r.phases,
                                  r.optimizer_split)
                for sink in sinks:
                    sink.write(line)
                if step % t.log_interval == 0 or step == t.train_iters:
                    _say(ctx, line.format(t.train_iters))
                result["last_step"] = step
                if evaluates(cfg, step):
                    _evaluate(cfg, ctx, trainer, step, sinks, result)
                bad = [(n, v) for n, v in (("loss", r.loss), ("grad_norm", r.grad_norm)) if not is_finite(v)]
                if bad:
                    what = ", ".join(f"{n}={v}" for n, v in bad)
                    if cfg.training.on_nonfinite.value == "stop":
                        raise NonFiniteError(f"non-finite {what} at step {step}; stopping (training.on_nonfinite=stop)")
                    done = "update skipped" if r.skipped else "the backend did NOT skip the update"
                    _say(ctx, f"[primus] non-finite {what} at step {step}: {done} (training.on_nonfinite=skip)",
                         logging.WARNING)
                    result.setdefault("nonfinite_steps", []).append(
                        {"step": step, **{n: str(v) for n, v in bad}, "skipped": r.skipped})
                last = step == t.train_iters
                if ckpt.due(step, last):
                    ckpt.save(step)
                if not last and preempt.requested(step):
                    if ckpt.last_saved_step != step:
                        ckpt.save(step)
                    result["preempted"] = {"signal": preempt.signal_name, "after_step": step,
                                           "checkpoint": ckpt.saved[-1]}
                    _say(ctx, f"[primus] preempted ({preempt.signal_name}) after step {step}: checkpoint "
                              f"{ckpt.saved[-1]}; resume with checkpoint.resume=auto in this run dir")
                    break
        result["status"] = "preempted" if "preempted" in result else "ok"
    except BaseException as e:  # noqa: BLE001 - every ending gets a status in result.json, then re-raised
        result["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "oom" if _is_oom(e) else "failed"
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        raise
    finally:
        preempt.restore()
        _close_log(ctx)
        from primus.metrics.sinks import close_sinks

        close_sinks(sinks)
        if prof is not None:
            prof.close()
            result["profile"] = {"trace": prof.trace_path, "memory_snapshot": prof.snapshot_path}
            if prof.phases is not None:
                result["profile"]["phases"] = prof.phases
        handle = result.pop("tuned_gemms", None)
        if handle is not None:
            result["tuned_gemm_stats"] = handle.stats()
            handle.uninstall()
        result.update(meter.summary())
        if cfg.training.compile:
            result["compile"] = compile_stats()
        result["env"] = {**env_snapshot(), **ctx.env}
        turbo = sys.modules.get("primus.turbo._common")  # only where a turbo kernel was imported
        picks = turbo.autotune_picks() if turbo is not None else []
        if picks:
            result["turbo_autotune"] = picks  # this rank's picks (rank 0 writes the file)
        if ckpt is not None and (ckpt.saved or ckpt.branch is not None):
            result["checkpoints"] = [p for p in ckpt.saved if os.path.isdir(p)]  # what keep_last left on disk
            result["checkpoint_history"] = ckpt.history()
        if ctx.device != "cuda":
            result["memory"] = host_memory()
        else:
            import torch

            result["memory"] = {"max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                                "max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                                "device_total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30}
        try:
            if ctx.is_rank0:
                write_result(ctx.run_dir, result)
        finally:
            if trainer is not None:
                try:
                    trainer.close()
                except Exception:  # noqa: BLE001 - closing must not hide the run's own error
                    log.exception("trainer.close failed")
            if cpu_gemm:
                from primus.patches.cpu_gemm import uninstall

                uninstall()
    if result["status"] == "preempted":
        preempt.exit_for_requeue(ctx.rank)  # in a submitit Slurm job: requeue (rank 0 exits here)
    return result


def compile_stats() -> Dict[str, Any]:
    """torch.compile's counters for this process: graph breaks (each one returns from compiled code to Python and
    splits the fusions around it), their distinct reasons, and the graphs compiled."""
    import sys

    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:  # nothing was compiled
        return {"graph_breaks": 0, "break_reasons": [], "unique_graphs": 0}
    breaks = dynamo_utils.counters["graph_break"]
    return {"graph_breaks": sum(breaks.values()), "break_reasons": sorted(breaks)[:10],
            "unique_graphs": dynamo_utils.counters["stats"]["unique_graphs"]}


def host_memory() -> Dict[str, Any]:
    """Memory figures of a CPU run: this process's peak resident set and the machine's total."""
    import resource

    out: Dict[str, Any] = {"max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    try:
        out["host_total_gib"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    return out


def worker(cfg_yaml: str, run_dir: str, meta: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Entry point of each spawned rank (torch elastic launch / Slurm task)."""
    cfg = config_from_yaml(cfg_yaml)
    ctx = resolve(cfg, run_dir)
    ctx.env = dict(meta.get("env", {}))
    res = train(cfg, ctx, meta)
    return {k: res.get(k) for k in ("status", "final_loss", "tokens_per_s")} if ctx.is_rank0 else None
