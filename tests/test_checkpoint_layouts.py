"""A checkpoint written at one layout resumes at another and continues the same loss curve, through train.py:
megatron tp2 -> tp1, dp2 -> dp4 and pp2 with 1 + 3 layers -> 3 + 1 (megatron.core.dist_checkpointing), TorchTitan
FSDP2 on 2 ranks -> 4 ranks (DCP).

Each case runs 4 steps at the first layout with a checkpoint at step 2, then resumes that checkpoint at the second
layout and runs steps 3-4. Those must match the first run's steps 3-4 within the parity matrix's fp32 bound
(tests/parity.py: the layouts reorder reductions, so not bitwise); the data position continues at the samples
consumed, whatever the new dp. Where a backend cannot reshard (TorchTitan's per-rank position of a jsonl stream
across a dp change) the resume is refused before anything is loaded, naming both layouts (the unit tests here).
"""
import json

import pytest

from parity import COMMON, REL, TORCHTITAN
from rank_script import run_train

STEP2 = ["checkpoint.interval=2"]


def resumed_at_other_layout(tmp_path, first, second):
    a, _ = run_train(tmp_path / "a", [*COMMON, *STEP2, *first])
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    meta = json.loads((ckpt / "primus_meta.json").read_text())
    b, out = run_train(tmp_path / "b", [*COMMON, f"checkpoint.resume={ckpt}", *second])
    assert b["resumed_from"]["step"] == 2 and b["first_step"] == 3, b.get("resumed_from")
    assert "was written at layout" in out and "resharded" in out, out[-3000:]
    assert len(a["losses"]) == 4 and len(b["losses"]) == 2
    for step, (x, y) in enumerate(zip(a["losses"][2:], b["losses"]), 3):
        assert abs(x - y) <= REL * abs(x), (step, a["losses"], b["losses"])
    return meta, a, b


@pytest.mark.scale
def test_megatron_tp2_checkpoint_resumes_at_tp1(tmp_path):
    meta, a, b = resumed_at_other_layout(
        tmp_path, ["launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2"], [])
    assert meta["layout"]["tp"] == 2 and meta["layout"]["world_size"] == 2
    assert b["world_size"] == 1


@pytest.mark.scale
def test_megatron_dp2_checkpoint_resumes_at_dp4(tmp_path):
    # one micro batch of 1 per rank at dp4, two at dp2: the position (4 samples per step) converts exactly
    mbs1 = ["training.micro_batch_size=1"]
    meta, a, b = resumed_at_other_layout(tmp_path, ["launcher.nproc_per_node=2", *mbs1],
                                         ["launcher.nproc_per_node=4", *mbs1])
    assert meta["layout"]["dp"] == 2 and meta["trainer_state"]["consumed_samples"] == 8
    assert b["world_size"] == 4


@pytest.mark.scale
def test_megatron_uneven_pipeline_checkpoint_resumes_at_another_split(tmp_path):
    """pp2 with 1 + 3 layers -> 3 + 1 layers: the layers move between stages, keyed by their global numbers."""
    pp2 = ["launcher.nproc_per_node=2", "parallel.pipeline_model_parallel_size=2"]
    meta, a, b = resumed_at_other_layout(tmp_path, [*pp2, "parallel.decoder_first_pipeline_num_layers=1"],
                                         [*pp2, "parallel.decoder_last_pipeline_num_layers=1"])
    assert meta["layout"]["pp_layers"] == [1, 3]


@pytest.mark.scale
def test_torchtitan_fsdp2_checkpoint_resumes_on_4_ranks(tmp_path):
    mbs1 = [*TORCHTITAN, "training.micro_batch_size=1"]
    meta, a, b = resumed_at_other_layout(tmp_path, [*mbs1, "launcher.nproc_per_node=2"],
                                         [*mbs1, "launcher.nproc_per_node=4"])
    assert meta["layout"]["dp"] == 2 and b["world_size"] == 4


# ------------------------------------------------------------------------------------------------ refusals (unit)

def _meta(backend, layout):
    return {"backend": backend, "layout": layout}


def test_torchtitan_jsonl_dp_change_is_refused_naming_both_layouts(cfg_of):
    from primus.checkpoint import layout_of, reshard_problem

    cfg = cfg_of(["backend=torchtitan", "data=jsonl", "data.path=/data/x.jsonl", "data.tokenizer=/data/tok"])
    saved = layout_of(cfg, 2)
    why = reshard_problem(cfg, _meta("torchtitan", saved), 4)
    assert why and "dp=2" in why and "dp=4" in why and "world_size=2" in why and "world_size=4" in why, why
    assert "data.kind=jsonl" in why and "resume with dp=2" in why
    assert reshard_problem(cfg, _meta("torchtitan", saved), 2) is None  # same layout


def test_layout_changes_that_upstream_reshards_pass(cfg_of):
    from primus.checkpoint import layout_of, reshard_problem

    tt = cfg_of(["backend=torchtitan"])  # synthetic data: the position is re-derived from the step
    assert reshard_problem(tt, _meta("torchtitan", layout_of(tt, 2)), 4) is None
    mg = cfg_of(["parallel.tensor_model_parallel_size=2"])
    assert reshard_problem(cfg_of([]), _meta("megatron", layout_of(mg, 2)), 1) is None
    assert reshard_problem(mg, {"backend": "megatron"}, 2) is None  # written before layouts were recorded


def test_explicit_resume_is_refused_before_the_trainer_is_built(tmp_path, cfg_of):
    """precheck() (before the trainer exists) reads the checkpoint's layout and refuses with exit-2 ConfigError."""
    from primus.checkpoint import CheckpointManager, layout_of
    from primus.config.errors import ConfigError
    from primus.context import RunContext

    ckpt = tmp_path / "step_000002"
    ckpt.mkdir()
    jsonl = ["backend=torchtitan", "data=jsonl", "data.path=/data/x.jsonl", "data.tokenizer=/data/tok"]
    saved = layout_of(cfg_of(jsonl), 2)
    (ckpt / "primus_meta.json").write_text(json.dumps({"format": 1, "step": 2, "backend": "torchtitan",
                                                       "world_size": 2, "layout": saved, "files": {}}))
    cfg = cfg_of([*jsonl, f"checkpoint.resume={ckpt}"])
    mgr = CheckpointManager(cfg, RunContext(device="cpu", world_size=4, run_dir=str(tmp_path)), trainer=None,
                            say=lambda *_: None)
    with pytest.raises(ConfigError, match="checkpoint.resume") as e:
        mgr.precheck()
    assert "dp=4" in str(e.value) and str(ckpt) in str(e.value)
