"""Sizes from the world: the global batch (-1 = micro x dp x accumulation steps), the world size and where it came
from, and every product / divisibility rule of the parallel layout, each refused before anything starts with the
fix named."""
import json

import pytest

from conftest import compose_cfg, compose_dict
from primus import run as primus_run
from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext, resolve, world_size_and_source


def judged(overrides, env=None, monkeypatch=None):
    """validate() as train.py runs it: the world from the launcher's keys (or the env), every rule, the backend's."""
    cfg = compose_cfg(overrides)
    ctx = resolve(cfg)
    ctx.device = "cpu"
    validate(cfg, ctx)
    return cfg, ctx


def refused(overrides):
    with pytest.raises(ConfigError) as e:
        judged(overrides)
    return str(e.value)


@pytest.fixture(autouse=True)
def no_outer_launcher(monkeypatch):
    for k in ("WORLD_SIZE", "SLURM_JOB_ID", "SLURM_NTASKS", "SUBMITIT_EXECUTOR", "SLURM_JOB_NUM_NODES",
              "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(k, raising=False)


# ------------------------------------------------------------------------------------------------ the global batch

@pytest.mark.parametrize("overrides,expected", [
    ([], (4, 1)),  # micro 4 x dp 1 x 1
    (["launcher.nproc_per_node=2"], (8, 1)),  # dp 2
    (["launcher.nproc_per_node=4", "parallel.tensor_model_parallel_size=2"], (8, 1)),  # dp 2
    (["launcher.nproc_per_node=2", "training.gradient_accumulation_steps=3"], (24, 3)),
    (["training.global_batch_size=12"], (12, 3)),  # explicit: the accumulation steps follow
    (["launcher.nproc_per_node=2", "training.global_batch_size=16", "training.gradient_accumulation_steps=2"], (16, 2)),
])
def test_global_batch_from_the_world(overrides, expected):
    cfg, _ = judged(overrides)
    assert (cfg.training.global_batch_size, cfg.training.gradient_accumulation_steps) == expected


def test_both_backends_receive_the_resolved_global_batch():
    from primus.backends import backend_args

    for backend, get in (("megatron", lambda a: a["schedule"]["global_batch_size"]),
                         ("torchtitan", lambda a: a["training"]["global_batch_size"])):
        cfg, ctx = judged([f"backend={backend}", "launcher.nproc_per_node=2", "training.gradient_accumulation_steps=2"])
        assert get(backend_args(cfg, ctx)) == 16, backend
    cfg, ctx = judged(["launcher.nproc_per_node=2", "training.gradient_accumulation_steps=2"])
    assert backend_args(cfg, ctx)["schedule"]["num_microbatches"] == 2


def test_explicit_global_batch_names_values_that_work():
    msg = refused(["launcher.nproc_per_node=2", "training.micro_batch_size=3", "training.global_batch_size=8"])
    assert "training.global_batch_size" in msg and "micro x dp = 3 x 2 = 6" in msg
    assert "e.g. 6, 12" in msg and "or -1" in msg


def test_explicit_global_batch_and_accumulation_steps_must_agree():
    msg = refused(["training.global_batch_size=8", "training.gradient_accumulation_steps=3"])
    assert "training.gradient_accumulation_steps" in msg and "4 x 3 = 12" in msg
    assert "training.global_batch_size=12" in msg and "training.gradient_accumulation_steps=2" in msg


def test_global_batch_other_negatives_are_refused():
    msg = refused(["training.global_batch_size=-2"])
    assert "training.global_batch_size = -2" in msg and "or -1" in msg
    assert "must be >= 1" in refused(["training.gradient_accumulation_steps=0"])


def test_interleaved_pipeline_gets_whole_groups_of_pp():
    cfg, _ = judged(["launcher.nproc_per_node=2", "parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"])
    assert cfg.training.gradient_accumulation_steps == 2  # the default with vpp: pp micro batches
    msg = refused(["launcher.nproc_per_node=2", "parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2",
                   "training.gradient_accumulation_steps=3"])
    assert "whole groups of pp" in msg and "multiple of 2" in msg


# ------------------------------------------------------------------------------------------------ the world

def test_world_size_and_where_it_came_from(monkeypatch):
    cfg = compose_cfg(["launcher.nnodes=2", "launcher.nproc_per_node=8"])
    assert world_size_and_source(cfg) == (16, "launcher.nnodes x launcher.nproc_per_node = 2 x 8")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert world_size_and_source(cfg) == (8, "Slurm: SLURM_JOB_NUM_NODES x SLURM_NTASKS_PER_NODE = 2 x 4")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert world_size_and_source(cfg) == (8, "Slurm: SLURM_NTASKS=8")
    monkeypatch.setenv("WORLD_SIZE", "8")  # a task's rank env, from Slurm's (primus/launch/slurm.py)
    assert world_size_and_source(cfg) == (8, "Slurm: SLURM_NTASKS=8")
    monkeypatch.setenv("WORLD_SIZE", "4")  # workers a one-task job started itself
    assert world_size_and_source(cfg)[0] == 4 and "WORLD_SIZE=4" in world_size_and_source(cfg)[1]


def test_dry_run_states_the_world_and_the_resolved_batch(capsys):
    assert primus_run.run(compose_dict(["launcher.nnodes=2", "launcher.nproc_per_node=8",
                                        "parallel.tensor_model_parallel_size=2", "dry_run=true"])) == 0
    out = json.loads(capsys.readouterr().out)
    r = out["resolved"]
    assert r["world_size"] == 16 and r["world_size_from"] == "launcher.nnodes x launcher.nproc_per_node = 2 x 8"
    assert (r["dp"], r["global_batch_size"], r["gradient_accumulation_steps"]) == (8, 32, 1)
    assert out["backend_args"]["schedule"]["global_batch_size"] == 32


def test_tp8_on_one_process_names_the_launcher_fix():
    """README's llama3_8b tp 8 without the 8 processes: refused, naming launcher.nproc_per_node=8, not 'dp': None."""
    msg = refused(["model=llama3_8b", "parallel.tensor_model_parallel_size=8"])
    assert "launcher.nproc_per_node=8" in msg and "None" not in msg and "1/8: not whole" in msg
    assert "launcher.nnodes x launcher.nproc_per_node = 1 x 1" in msg
    msg = refused(["model=llama3_8b", "parallel.tensor_model_parallel_size=8", "launcher.nnodes=2",
                   "launcher.nproc_per_node=2", "dry_run=true"])
    assert "launcher.nproc_per_node=4 (x launcher.nnodes=2)" in msg


def test_a_full_node_short_of_ranks_is_told_to_add_nodes_first():
    """Primus's imports give each node 8 ranks (one per GPU): a layout needing 16 asks for a second node of 8 before
    16 ranks on one node (which would need 16 GPUs there)."""
    msg = refused(["model=debug_moe", "launcher.nproc_per_node=8", "parallel.expert_model_parallel_size=8",
                   "parallel.pipeline_model_parallel_size=2", "dry_run=true"])
    assert "(launcher.nnodes=2 (x launcher.nproc_per_node=8), or launcher.nproc_per_node=16)" in msg, msg


# ------------------------------------------------------------------------------------------------ layout rules

def test_expert_parallel_must_tile_the_world():
    """megatron-core: world % (expert tp x ep x pp) == 0, else initialize_model_parallel raises mid-run."""
    msg = refused(["model=debug_moe", "parallel.expert_model_parallel_size=2"])
    assert "parallel.expert_model_parallel_size" in msg and "expert tp x ep x pp = 1 x 2 x 1 = 2" in msg
    assert "launcher.nproc_per_node=2" in msg and "one of [1]" in msg
    judged(["model=debug_moe", "parallel.expert_model_parallel_size=2", "launcher.nproc_per_node=2"])
    msg = refused(["model=debug_moe", "parallel.expert_model_parallel_size=4", "parallel.tensor_model_parallel_size=2",
                   "parallel.sequence_parallel=true", "launcher.nproc_per_node=4"])
    assert "2 x 4 x 1 = 8" in msg and "one of [1, 2]" in msg


@pytest.mark.parametrize("overrides,words", [
    (["parallel.data_parallel_shard_degree=4"], ["parallel.data_parallel_shard_degree", "replicate x shard must equal dp",
                                                 "shard_degree=-1", "launcher.nproc_per_node=4"]),
    (["parallel.data_parallel_replicate_degree=0"], ["parallel.data_parallel_replicate_degree = 0", ">= 1"]),
    (["parallel.data_parallel_shard_degree=0"], ["parallel.data_parallel_shard_degree = 0", "-1"]),
    (["launcher.nproc_per_node=4", "parallel.data_parallel_replicate_degree=3"],
     ["replicate must divide it", "one of [1, 2, 4]"]),
    (["launcher.nproc_per_node=4", "parallel.data_parallel_replicate_degree=2", "parallel.data_parallel_shard_degree=4"],
     ["replicate x shard must equal dp", "= 2 here"]),
])
def test_torchtitan_fsdp_degrees(overrides, words):
    msg = refused(["backend=torchtitan", *overrides])
    for w in words:
        assert w in msg, (w, msg)


def test_torchtitan_hsdp_and_ep_layouts_that_work():
    judged(["backend=torchtitan", "launcher.nproc_per_node=4", "parallel.data_parallel_replicate_degree=2"])
    judged(["backend=torchtitan", "launcher.nproc_per_node=4", "parallel.data_parallel_replicate_degree=2",
            "parallel.data_parallel_shard_degree=2"])
    msg = refused(["backend=torchtitan", "model=debug_moe", "moe.moe_router_load_balancing_type=none",
                   "launcher.nproc_per_node=2", "parallel.data_parallel_replicate_degree=2",
                   "parallel.expert_model_parallel_size=2"])
    assert "ep must divide them" in msg


def test_layout_context_defaults_to_the_launcher_keys():
    """A context built without a source (tests, tools) still names the launcher fix."""
    cfg = compose_cfg(["parallel.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError) as e:
        validate(cfg, RunContext(device="cpu", world_size=1))
    assert "launcher.nproc_per_node=2" in str(e.value)
