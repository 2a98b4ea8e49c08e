"""Sweeps that optimise: each job returns sweep.objective (a number, in its direction) so Hydra's Optuna sweeper
works unchanged; failed, refused and pruned points return the worst value and the sweep goes on; plan sweeps
tabulate their estimates and exit 0; the planner prunes a point that cannot fit before spending a run."""
import csv
import enum
import math

import pytest
from omegaconf import OmegaConf

from conftest import compose_cfg
from test_launch_common import load, run_train, tail

from primus.features.sweep import (Direction, Objective, SweepConfig, direction_of, failure_value, objective_value,
                                   sweeper_direction_issue)
from primus.sweep import count_points

OK = {"status": "ok", "tokens_per_s_per_gpu": 1234.5, "mfu": 0.41, "final_loss": 3.2}


def test_each_objective_has_its_direction_and_failure_value():
    assert direction_of(SweepConfig()) == Direction.maximize
    assert direction_of(SweepConfig(objective=Objective.mfu)) == Direction.maximize
    assert direction_of(SweepConfig(objective=Objective.final_loss)) == Direction.minimize
    assert direction_of(SweepConfig(objective=Objective.val_loss)) == Direction.minimize
    assert direction_of(SweepConfig(objective=Objective.final_loss, direction=Direction.maximize)) == Direction.maximize
    assert failure_value(Direction.maximize) == -math.inf and failure_value(Direction.minimize) == math.inf
    # the composed config node (enums inside a DictConfig) reads the same
    assert direction_of(OmegaConf.structured(SweepConfig(objective=Objective.final_loss))) == Direction.minimize


def test_objective_value_reads_result_json_and_fails_with_the_worst_value():
    assert objective_value(OK, SweepConfig()) == (1234.5, None)
    assert objective_value(OK, SweepConfig(objective=Objective.mfu)) == (0.41, None)
    assert objective_value(OK, SweepConfig(objective=Objective.final_loss)) == (3.2, None)
    assert objective_value({**OK, "val_loss": 2.9}, SweepConfig(objective=Objective.val_loss)) == (2.9, None)
    v, why = objective_value(OK, SweepConfig(objective=Objective.val_loss))
    assert v == math.inf and "sweep.objective=val_loss" in why and "without evaluation" in why and "final_loss" in why
    v, why = objective_value({"status": "oom", "error": "CUDA out of memory"}, SweepConfig())
    assert v == -math.inf and "'oom'" in why and "CUDA out of memory" in why
    v, why = objective_value({**OK, "mfu": None}, SweepConfig(objective=Objective.mfu))  # CPU: no peak, no MFU
    assert v == -math.inf and "mfu=None" in why


class OptunaDirection(enum.Enum):  # hydra-optuna-sweeper's config holds an enum of its own
    minimize = 1
    maximize = 2


def test_a_sweeper_that_optimises_the_other_way_is_refused_with_the_fix():
    sweep = SweepConfig()
    assert sweeper_direction_issue({"direction": "maximize"}, sweep) is None
    why = sweeper_direction_issue({"direction": OptunaDirection.minimize}, sweep)
    assert "hydra.sweeper.direction=maximize" in why and "sweep.direction=minimize" in why
    assert sweeper_direction_issue({"direction": "minimize"}, SweepConfig(objective=Objective.final_loss)) is None
    why = sweeper_direction_issue({"optim": {"maximize": False}}, sweep)  # Nevergrad
    assert "hydra.sweeper.optim.maximize=true" in why
    assert sweeper_direction_issue({"max_batch_size": None}, sweep) is None  # the basic sweeper has no direction


def test_point_count_of_an_optuna_sweep_is_its_trial_budget():
    cfg = OmegaConf.create({"hydra": {"sweeper": {"_target_": "x.OptunaSweeper", "n_trials": 3,
                                                  "params": {"training.micro_batch_size": "choice(1,2)"}},
                                      "overrides": {"task": []}}})
    assert count_points(cfg) == 3
    cfg.hydra.sweeper = {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": None}
    cfg.hydra.overrides.task = ["precision=bf16,fp8", "training.micro_batch_size=1,2,4"]
    assert count_points(cfg) == 6


def _rows(d):
    with open(d / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.e2e
def test_three_trial_optuna_sweep_optimises_tokens_per_s(tmp_path):
    d = tmp_path / "optuna"
    p = run_train(["-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=3",
                   "hydra.sweeper.sampler.seed=0", "training.micro_batch_size=choice(1,2)",
                   "training.global_batch_size=4", "training.seq_length=32", "training.train_iters=2",
                   "training.lr_warmup_iters=0", "training.timing_warmup_steps=0", f"hydra.sweep.dir={d}"], timeout=500)
    assert p.returncode == 0, tail(p)
    results = [load(d / str(i) / "result.json") for i in range(3)]
    values = [r["objective"]["value"] for r in results]
    assert all(r["status"] == "ok" and r["objective"]["name"] == "tokens_per_s_per_gpu" for r in results)
    assert values == [r["tokens_per_s_per_gpu"] for r in results] and min(values) > 0
    best = OmegaConf.load(d / "optimization_results.yaml")  # the sweeper's own verdict, from the returned numbers
    assert best.best_value == max(values)
    rows = _rows(d)
    assert len(rows) == 3 and list(rows[0])[:2] == ["training.micro_batch_size", "status"]
    assert "training.train_iters" not in rows[0]  # fixed overrides are not columns
    assert "[sweep 3/3 ####################]" in p.stdout


@pytest.mark.e2e
def test_plan_sweep_tabulates_estimates_and_exits_0(tmp_path):
    d = tmp_path / "plan"
    p = run_train(["-m", "mode=plan", "model=llama3_8b,llama3_70b", "plan.gpu=H200", f"hydra.sweep.dir={d}"],
                  timeout=300)
    assert p.returncode == 0, tail(p)
    rows = {r["model"]: r for r in _rows(d)}
    assert set(rows) == {"llama3_8b", "llama3_70b"}
    assert rows["llama3_70b"]["status"] == "planned" and rows["llama3_70b"]["fits"] == "no"
    assert float(rows["llama3_70b"]["est. mem (GiB)"]) > float(rows["llama3_70b"]["GPU mem (GiB)"]) > 100
    assert float(rows["llama3_8b"]["est. tokens/s/GPU"]) > float(rows["llama3_70b"]["est. tokens/s/GPU"]) > 0
    r = load(d / "0" / "result.json")
    assert r["describe_only"] and r["plan"]["gpu"].startswith("H200")


@pytest.mark.e2e
def test_a_point_that_cannot_fit_is_pruned_without_a_run(tmp_path):
    """On CPU the gate sets the estimate against this machine's memory: a 70B model needs over a TiB."""
    d = tmp_path / "pruned"
    p = run_train(["-m", "model=llama3_70b", "training.train_iters=2", "training.lr_warmup_iters=0",
                   f"hydra.sweep.dir={d}"], timeout=300)
    assert p.returncode == 0, tail(p)  # pruning is the planner's answer, not a failure
    r = load(d / "0" / "result.json")
    assert r["status"] == "pruned" and r["error"].startswith("pruned: needs ") and " GiB of " in r["error"]
    assert "plan.enforce=false" in r["error"] and "step " not in p.stdout
    row = _rows(d)[0]
    assert row["status"] == "pruned" and row["error"] == " ".join(r["error"].split())  # the whole message


def test_val_loss_objective_without_evaluation_is_refused_before_the_run():
    from primus.config.errors import ConfigError
    from primus.config.validate import RULES, validate
    from primus.context import RunContext

    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(["sweep.objective=val_loss"]), RunContext(device="cpu", world_size=1), rules=RULES)
    assert "sweep.objective" in str(e.value) and "training.eval_interval" in str(e.value)
    validate(compose_cfg(["sweep.objective=val_loss", "training.eval_interval=5", "training.eval_iters=2"]),
             RunContext(device="cpu", world_size=1), rules=RULES)
