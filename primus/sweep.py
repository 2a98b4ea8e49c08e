"""Hydra callback for sweeps (`python train.py -m a=1,2 b=x,y`): progress lines, failed points as rows, one table.

Registered in conf/config.yaml (hydra.callbacks.primus_sweep); it does nothing in single runs.

What Hydra 1.3 does on its own when a job raises: run_job() catches the exception into the JobReturn (status
FAILED), the launcher goes on with the other jobs of the batch, then BasicSweeper reads every `return_value` and
re-raises the first failure: the sweep dies with a traceback after the batch, on_multirun_end never runs (no table)
and, with hydra.sweeper.max_batch_size set, later batches never run. Here:

* on_job_end (runs where the job ran: in-process for the basic launcher, inside the Slurm task for submitit) records a
  failed point: when the job died before training wrote result.json (e.g. primus.config.errors.ConfigError from
  validation), it writes a result.json with status "invalid" (ConfigError), "oom" or "failed" and the error, plus
  error.txt with the traceback; then it marks the JobReturn completed, with the objective's failure value as its
  return value (primus/features/sweep.py), so the sweep goes on with the next point. A point the planner says cannot
  fit is recorded as "pruned: needs X GiB of Y" without a run (primus/features/plan.py: Pruned).
* every job returns a number, sweep.objective (train.py's main: job_objective below), so Hydra's Optuna, Nevergrad
  and Ax sweepers optimise it; on_multirun_start refuses a sweeper whose direction contradicts sweep.direction.
* on_multirun_end gathers every job's result.json into results.csv, results.md and throughput.png in the sweep dir
  (primus/report.py; `python -m primus.report SWEEP_DIR` prints the same table later) and, when a point did not end
  "ok" (nor "pruned", nor a dry run's "valid" or a plan's "planned"; in a dry-run or plan sweep an "invalid" point
  is a finding too), exits with status 1 (exit_nonzero_on_failure) after writing the table: scripts see that
  something failed, the table says what. If the sweep dies before on_multirun_end (a Slurm job killed by its time limit or the OOM
  killer makes the submitit launcher raise), an exit hook still writes the table of what finished.
* one progress line per point: `[sweep 2/4 #####-----] job 1 precision=fp8: ok 1,234 tokens/s/GPU in 12.3s (ETA 25s)`;
  the ETA is the mean duration of the finished points times the points left, shown only where both are known
  (the submitting process of an in-process launcher).
  Under the submitit launcher the submitting process also prints each Slurm job id with its log files as the jobs
  are submitted, and a line as each one finishes.
* in a task of a multi-task submitit Slurm job, on_job_start exports the task's rank and the rendezvous address
  (primus.launch.slurm.slurm_task_env) before the job function runs, unless WORLD_SIZE is already set.
* the process env is restored after every in-process point, so one point's env (RANK/WORLD_SIZE of a one-process
  run, tuning-stage variables) cannot leak into the next.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from primus.results import RESULT_FILE, write_json_atomic

BAR = 20


def _is_multirun(config: DictConfig) -> bool:
    try:
        from hydra.types import RunMode

        return OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001
        return False


def _rank0() -> bool:
    from primus.launch.slurm import task_rank

    return task_rank() == 0


DONE_OK = ("ok", "pruned", "valid", "planned")  # statuses that are results, not failures


def count_points(config: DictConfig) -> Optional[int]:
    """Number of jobs the sweeper will run: n_trials for a sweeper that has it (Optuna), else the product of the
    discrete sweep overrides (basic sweeper); None when unknown."""
    n_trials = OmegaConf.select(config, "hydra.sweeper.n_trials", default=None)
    if isinstance(n_trials, int):
        return n_trials
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if target and not target.endswith("BasicSweeper"):
        budget = OmegaConf.select(config, "hydra.sweeper.optim.budget", default=None)  # Nevergrad
        return budget if isinstance(budget, int) else None
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        params = OmegaConf.select(config, "hydra.sweeper.params")
        if params:
            args += [f"{k}={v}" for k, v in params.items()]
        n = 1
        for o in OverridesParser.create().parse_overrides(args):
            if o.is_sweep_override():
                if o.is_discrete_sweep():
                    n *= len(list(o.sweep_iterator()))
                else:
                    return None
        return n
    except Exception:  # noqa: BLE001 - progress is best effort
        return None


def classify(exc: BaseException) -> str:
    from primus.config.errors import ConfigError
    from primus.features.plan import Pruned

    if isinstance(exc, Pruned):
        return "pruned"
    if isinstance(exc, ConfigError):
        return "invalid"
    msg = str(exc).lower()
    if "out of memory" in msg or type(exc).__name__ == "OutOfMemoryError":
        return "oom"
    return "failed"


def error_text(exc: BaseException) -> str:
    from primus.features.plan import Pruned

    return str(exc) if isinstance(exc, Pruned) else f"{type(exc).__name__}: {exc}"


def job_objective(cfg: DictConfig, run_dir: str) -> float:
    """What a sweep job returns to the sweeper: sweep.objective from the point's result.json, or the failure value
    (with the reason, written into result.json as objective.error and printed). Also records the objective, its
    direction and value in result.json, for the table."""
    import math

    from primus.features.sweep import direction_of, failure_value, objective_of, objective_value
    from primus.report import _load_json

    sweep = cfg.get("sweep")
    if not _rank0():
        return failure_value(direction_of(sweep))  # task 0 holds the job's result (submitit returns task 0's)
    path = os.path.join(run_dir, RESULT_FILE)
    res = _load_json(path) or {"status": "no_result"}
    if res.get("status") == "planned" and isinstance(res.get("plan"), dict):
        # a plan sweep optimises the estimate: its tokens/s/GPU where the point fits
        p = res["plan"]
        est = {"tokens_per_s_per_gpu": p.get("tokens_per_s_per_gpu")} if p.get("fits") else {}
        value, why = objective_value({"status": "ok", **est}, sweep)
        if not p.get("fits"):
            why = f"the estimate does not fit: needs {p.get('needed_gib')} GiB of {p.get('capacity_gib')} GiB"
    elif res.get("status") == "valid":
        return failure_value(direction_of(sweep))  # a dry run measures nothing: the worst value, no objective
    else:
        value, why = objective_value(res, sweep)
    if os.path.exists(path):
        res["objective"] = {"name": objective_of(sweep).value, "direction": direction_of(sweep).value,
                            "value": value if math.isfinite(value) else None, **({"error": why} if why else {})}
        write_json_atomic(path, res)
    if why and res.get("status") == "ok":
        print(f"[sweep] objective: {why}", file=sys.stderr, flush=True)
    return value


def _fmt_s(s: float) -> str:
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}min"


class SweepCallback(Callback):
    def __init__(self, exit_nonzero_on_failure: bool = True, plot: bool = True, poll_s: float = 1.0) -> None:
        self.exit_nonzero_on_failure = exit_nonzero_on_failure
        self.plot = plot
        self.poll_s = poll_s
        self.total: Optional[int] = None
        self.done = 0
        self.durations: list = []  # seconds of each finished point, for the ETA
        self.t0 = time.time()
        self.job_t0 = time.time()
        self._env: Optional[Dict[str, str]] = None
        self._env_pid: Optional[int] = None
        self._watch_stop: Optional[threading.Event] = None
        self._watch: Optional[threading.Thread] = None
        self._sweep_dir: Optional[str] = None
        self._ended = False

    def __getstate__(self) -> Dict[str, Any]:
        # submitit pickles the callbacks into every job: leave the watcher thread and the env snapshot behind
        state = dict(self.__dict__)
        state.update(_watch_stop=None, _watch=None, _env=None, _env_pid=None, _sweep_dir=None)
        return state

    # ------------------------------------------------------------------ multirun (submitting process)
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.t0 = time.time()
        self._check_direction(config)
        self.total = count_points(config)
        self.done = 0
        self.durations = []
        self._env, self._env_pid = dict(os.environ), os.getpid()
        self._sweep_dir, self._ended = str(config.hydra.sweep.dir), False
        atexit.register(self._at_exit)
        n = self.total if self.total is not None else "?"
        print(f"[sweep] {n} point(s) -> {config.hydra.sweep.dir}", flush=True)
        target = str(OmegaConf.select(config, "hydra.launcher._target_") or "")
        if "submitit" in target:
            folder = str(OmegaConf.select(config, "hydra.launcher.submitit_folder"))
            base = folder.split("%j")[0].rstrip("/") if "%j" in folder else folder
            print(f"[slurm] job logs: {base}/<job id>/<job id>_<task>_log.out|err (task 0 = rank 0)", flush=True)
            self._watch_stop = threading.Event()
            self._watch = threading.Thread(target=self._watch_jobs, args=(base,), daemon=True, name="primus-sweep")
            self._watch.start()

    @staticmethod
    def _check_direction(config: DictConfig) -> None:
        from primus.features.sweep import sweeper_direction_issue

        sweep = OmegaConf.select(config, "sweep")
        sweeper = OmegaConf.select(config, "hydra.sweeper")
        if sweep is None or sweeper is None:
            return
        try:
            why = sweeper_direction_issue(sweeper, sweep)
        except ValueError as e:  # not an objective / direction the schema knows: the job's validation names it
            why = None if "is not a valid" in str(e) else str(e)
        if why:
            print(f"[sweep] {why}", file=sys.stderr, flush=True)
            raise SystemExit(2)

    def _watch_jobs(self, base: str) -> None:
        """Print each submitit job as its folder appears (= submitted) and when its result file appears (= done)."""
        seen: Dict[str, bool] = {}
        stop = self._watch_stop
        assert stop is not None
        while True:
            final = stop.is_set()
            try:
                names = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))
            except OSError:
                names = []
            for name in names:
                d = os.path.join(base, name)
                if not os.path.exists(os.path.join(d, f"{name}_submitted.pkl")):
                    continue  # not a job (yet): an array's own folder holds only the batch script
                if name not in seen:
                    seen[name] = False
                    print(f"[slurm] job {name} submitted: {d}/{name}_0_log.out (and .err)", flush=True)
                if not seen[name] and os.path.exists(os.path.join(d, f"{name}_0_result.pkl")):
                    seen[name] = True
                    k = sum(seen.values())
                    print(f"[slurm] job {name} finished ({k}/{self.total or len(seen)})", flush=True)
            if final:
                return
            stop.wait(self.poll_s)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._ended = True
        mode = OmegaConf.select(config, "mode", default="train")
        describe_only = bool(OmegaConf.select(config, "dry_run", default=False)) or \
            getattr(mode, "value", mode) == "plan"
        bad = self._finish(str(config.hydra.sweep.dir), also_ok=("invalid",) if describe_only else ())
        if bad and self.exit_nonzero_on_failure:
            print(f"[sweep] {bad} point(s) did not finish ok: exit status 1", file=sys.stderr, flush=True)
            # SystemExit is not an Exception: Hydra's callback runner and run_and_report let it through.
            raise SystemExit(1)

    def _at_exit(self) -> None:
        """The sweep died before on_multirun_end (e.g. a Slurm job killed by its time limit makes the submitit
        launcher raise): still leave the table of what finished."""
        if self._ended or self._sweep_dir is None or self._env_pid != os.getpid():
            return
        print("[sweep] the sweep stopped early; table of the jobs so far:", flush=True)
        try:
            self._finish(self._sweep_dir)
        except Exception as e:  # noqa: BLE001 - never mask the sweep's own error
            print(f"[sweep] could not write the table: {e}", file=sys.stderr, flush=True)

    def _finish(self, sweep_dir: str, also_ok: tuple = ()) -> int:
        """Stop the job watcher, write results.csv/.md (+ PNG), print the table; returns the number of bad points."""
        if self._watch_stop is not None:
            self._watch_stop.set()
            if self._watch is not None:
                self._watch.join(timeout=5)
        from primus.report import collect, to_csv, to_markdown, write_reports

        rows = collect([sweep_dir])
        if not rows:
            print(f"[sweep] no job dirs in {sweep_dir}", flush=True)
            return 0
        if self.plot:
            paths = write_reports(sweep_dir, rows)
        else:
            paths = {"csv": os.path.join(sweep_dir, "results.csv"), "md": os.path.join(sweep_dir, "results.md")}
            with open(paths["csv"], "w", newline="") as f:
                f.write(to_csv(rows))
            with open(paths["md"], "w") as f:
                f.write(to_markdown(rows))
        statuses: Dict[str, int] = {}
        for r in rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in sorted(statuses.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
        bad = sum(v for k, v in statuses.items() if k not in DONE_OK + tuple(also_ok))
        print("\n" + to_markdown(rows), flush=True)
        print(f"[sweep] {len(rows)} point(s): {summary}; {_fmt_s(time.time() - self.t0)}", flush=True)
        for k, p in paths.items():
            print(f"[sweep] {k}: {p}", flush=True)
        return bad

    # ------------------------------------------------------------------ each job (where the job runs)
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _is_multirun(config):
            return
        if "WORLD_SIZE" not in os.environ:
            from primus.launch.slurm import slurm_task_env

            env = slurm_task_env()  # a task of a multi-task Slurm job: its rank and the job's rendezvous address
            if env:
                os.environ.update(env)
        self.job_t0 = time.time()
        if _rank0():
            num = OmegaConf.select(config, "hydra.job.num")
            ovr = " ".join(OmegaConf.to_container(config.hydra.overrides.task)) or "(defaults)"
            print(f"[sweep {self._pos(num)}] job {num} start: {ovr}", flush=True)

    def _pos(self, num: Optional[int]) -> str:
        i = (num if isinstance(num, int) else self.done) + 1
        return f"{i}/{self.total}" if self.total else f"{i}"

    def _bar(self) -> str:
        if not self.total:
            return ""
        k = min(BAR, round(BAR * self.done / self.total))
        return " " + "#" * k + "-" * (BAR - k)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not _is_multirun(config):
            return
        from hydra.core.utils import JobStatus

        job_dir = str(OmegaConf.select(config, "hydra.runtime.output_dir"))
        num = OmegaConf.select(config, "hydra.job.num")
        rank0 = _rank0()
        status, error = None, None
        if job_return.status == JobStatus.FAILED:
            from primus.features.sweep import direction_of, failure_value

            exc = job_return._return_value
            status, error = classify(exc), error_text(exc)
            if rank0:
                self._record_failure(config, job_dir, exc, status)
            # the point is recorded: let the sweep go on (BasicSweeper would re-raise it after the batch) with the
            # worst value for the sweeper (a NaN makes optuna's tell() raise)
            job_return.status = JobStatus.COMPLETED
            try:
                job_return.return_value = failure_value(direction_of(OmegaConf.select(config, "sweep")))
            except ValueError:
                job_return.return_value = float("nan")
        self._restore_env()
        self.done += 1
        if not rank0:
            return
        from primus.report import _load_json

        res = _load_json(os.path.join(job_dir, RESULT_FILE)) or {}
        status = res.get("status", status or "?")
        error = res.get("error", error)
        tps = res.get("tokens_per_s_per_gpu")
        what = f"{status}"
        if status == "ok" and isinstance(tps, (int, float)):
            mfu = res.get("mfu")
            what += f" {tps:,.0f} tokens/s/GPU" + (f" ({100 * mfu:.1f}% MFU)" if mfu else "")
        elif status == "planned" and isinstance(res.get("plan"), dict):
            p = res["plan"]
            what += f": needs {p.get('needed_gib')} GiB of {p.get('capacity_gib')} ({p.get('gpu')})" + \
                ("" if p.get("fits") else ", does not fit")
        elif error:
            what += f" ({' '.join(str(error).split())[:160]})"
        obj = res.get("objective") or {}
        if obj.get("value") is not None and obj.get("name") not in (None, "tokens_per_s_per_gpu", "mfu"):
            what += f", {obj['name']} {obj['value']:.4g}"
        took = time.time() - self.job_t0
        elapsed = time.time() - self.t0
        eta = ""
        if self._env_pid == os.getpid():  # the submitting process sees every point; a submitit task sees one
            self.durations.append(took)
            left = (self.total - self.done) if self.total else 0
            if left > 0:
                eta = f", ETA {_fmt_s(sum(self.durations) / len(self.durations) * left)} for {left} point(s) left"
        ovr = " ".join(OmegaConf.to_container(config.hydra.overrides.task)) or "(defaults)"
        print(f"[sweep {self._pos(num)}{self._bar()}] job {num} {ovr}: {what} in {_fmt_s(took)}"
              f" (elapsed {_fmt_s(elapsed)}{eta})", flush=True)

    def _record_failure(self, config: DictConfig, job_dir: str, exc: BaseException, status: str) -> None:
        """result.json for a point that died before the trainer wrote one; error.txt with the traceback."""
        try:
            with open(os.path.join(job_dir, "error.txt"), "w") as f:
                f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        except OSError:
            pass
        path = os.path.join(job_dir, RESULT_FILE)
        if os.path.exists(path):
            return  # the trainer's own record (status failed/oom, metrics so far) is better
        try:
            choices = {k: v for k, v in OmegaConf.to_container(config.hydra.runtime.choices).items()
                       if not str(k).startswith("hydra")}
        except Exception:  # noqa: BLE001
            choices = {}
        write_json_atomic(path, {
            "status": status,
            "error": error_text(exc),
            "run_dir": job_dir,
            "job_num": OmegaConf.select(config, "hydra.job.num"),
            "overrides": list(OmegaConf.to_container(config.hydra.overrides.task)),
            "choices": choices,
            "recorded_by": "primus.sweep (the job raised before training wrote result.json)",
        })

    def _restore_env(self) -> None:
        if self._env is None or self._env_pid != os.getpid():
            return  # not the submitting process (a submitit job): nothing of ours to restore
        for k in [k for k in os.environ if k not in self._env]:
            del os.environ[k]
        for k, v in self._env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
