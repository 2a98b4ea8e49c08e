"""The real megatron-core trainer on CPU (gloo), end to end through train.py: 1 process, and 2 processes with tp=2,
pp=2 and dp=2 whose losses must match the 1-process run (same weights by construction: layout-independent init;
same samples per step: Megatron-LM's sample order)."""

import pytest

from rank_script import point, run_points

# every run of this file is a point of one sweep (one interpreter start, one import of torch and megatron): its
# tests share one pytest-xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("megatron_e2e")]

# debug model (4 layers, dim 128), seq 128, global batch 8 = 2 micro batches of 4 on one rank
BASE = ["model=debug", "training.seq_length=128", "training.micro_batch_size=4", "training.global_batch_size=8",
        "training.lr=3e-3", "training.lr_warmup_iters=1", "training.timing_warmup_steps=0", "device=cpu"]

REFERENCE_STEPS = 20

# the 2-process layouts stop after the reference's first 5 steps, on the reference's learning-rate schedule (its
# decay over REFERENCE_STEPS), so each of their steps is the reference's step
LAYOUTS = {"tp2": ["parallel.tensor_model_parallel_size=2"],
           "pp2": ["parallel.pipeline_model_parallel_size=2"],
           "dp2": [],
           "tp2_sp": ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"]}
MLA = ["model=debug_moe", "model.multi_latent_attention=true", "model.kv_lora_rank=32", "model.qk_head_dim=32",
       "model.qk_pos_emb_head_dim=16", "model.v_head_dim=32", "model.num_query_groups=4", "model.moe_first_k_dense=1"]
TWO = ["launcher.nproc_per_node=2"]
POINTS = {  # name: (overrides, steps)
    "reference": ([], REFERENCE_STEPS),
    **{f"two_{k}": ([*TWO, f"training.lr_decay_iters={REFERENCE_STEPS}", *v], 5) for k, v in LAYOUTS.items()},
    "moe1": (["model=debug_moe"], 4),
    "moe2": (["model=debug_moe", *TWO, "parallel.expert_model_parallel_size=2"], 4),
    "gg": (["model=debug_moe", "moe.moe_grouped_gemm=true"], 4),
    "tied1": (["model.tie_word_embeddings=true"], 4),
    "tied2": (["model.tie_word_embeddings=true", *TWO, "parallel.pipeline_model_parallel_size=2"], 4),
    "mla": (MLA, 4),
    "fp16_dynamic": (["precision=fp16", "precision.hysteresis=1"], 6),
    "fp16_static": (["precision=fp16", "precision.loss_scale=128"], 8),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_points(tmp_path_factory.mktemp("e2e"), {
        name: [f"training.train_iters={steps}", *BASE, *o] for name, (o, steps) in POINTS.items()})


@pytest.fixture(scope="module")
def reference(runs):
    """The 1-process run of REFERENCE_STEPS steps: it must learn, and its first steps are what the 2-process layouts
    are compared with."""
    return point(runs, "reference")


def test_one_process_trains_and_loss_decreases(reference):
    res, out = reference
    losses = res["losses"]
    assert len(losses) == 20
    assert abs(losses[0] - 7.62) < 0.1  # ln(2048): a fresh model predicts uniformly
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses  # the mock data (counting sequences) is learnable
    assert "local spec + torch SDPA core attention" in out  # the log says which layer spec runs
    assert res["params"] == 1_311_872  # counted on the real model; matches primus.metrics.flops.param_counts
    split = res["step_split_s"]  # the trainer's split of the step, each part timed inside it
    assert set(split) == {"forward_backward_s", "optimizer_s", "other_s"}
    assert split["forward_backward_s"] > 0 and split["optimizer_s"] > 0
    assert max(split.values()) <= res["step_time_s"]["max"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_processes_match_one_process(runs, reference, layout):
    """The reference's first 5 steps against the 2-process layout's 5 (POINTS: on the reference's schedule)."""
    ref, _ = reference
    res, _ = point(runs, f"two_{layout}")
    first = ref["losses"][:5]
    assert res["world_size"] == 2 and len(res["losses"]) == 5
    assert res["params"] == ref["params"]
    for step, (a, b) in enumerate(zip(first, res["losses"]), 1):
        assert abs(a - b) < 2e-3, (step, first, res["losses"])
    assert first[-1] < first[0] - 0.2  # the compared steps are real training steps


def test_moe_expert_parallel_matches_one_process(runs):
    """debug_moe (8 experts, top-2, a shared expert) with ep=2 against 1 process: the alltoall dispatcher and the
    per-expert init line up."""
    (one, _), (two, _) = point(runs, "moe1"), point(runs, "moe2")
    assert two["params"] == one["params"] == 2_495_616
    assert two["losses"] == pytest.approx(one["losses"], abs=2e-3)
    assert one["losses"][-1] < one["losses"][0] - 0.2


def test_moe_grouped_gemm_without_te_trains(runs):
    """moe_grouped_gemm without TE: megatron's GroupedMLP on primus' grouped GEMM (grouped_gemm.py)."""
    res, _ = point(runs, "gg")
    assert res["losses"][-1] < res["losses"][0] - 0.2, res["losses"]


def test_tied_embeddings_across_pipeline_stages_match_one_process(runs):
    """Tied embeddings (Llama 3.2 style) with pp=2: the last stage's output copy starts equal and stays synced."""
    (one, _), (two, _) = point(runs, "tied1"), point(runs, "tied2")
    assert two["params"] == one["params"] == 1_049_728  # the output copy is not counted twice
    assert two["losses"] == pytest.approx(one["losses"], abs=2e-3)


def test_deepseek_style_mla_moe_trains(runs):
    """Multi-latent attention (SDPA core with q/k head dim != v head dim) + MoE with a leading dense layer."""
    res, _ = point(runs, "mla")  # POINTS: MLA
    assert res["losses"][-1] < res["losses"][0] - 0.2, res["losses"]


def test_fp16_loss_scaling_skips_overflows_says_so_and_then_trains(runs):
    """precision=fp16 on the real megatron optimizer: at megatron's initial scale 2^32 the first steps overflow and
    are skipped while the scale comes down; each step line shows the scale and says "update skipped", result.json
    lists the skipped steps; from a small static scale every step applies and the loss falls."""
    res, out = point(runs, "fp16_dynamic")
    lines = [l for l in out.splitlines() if l.startswith("step ")]
    assert len(lines) == 6 and all("| loss scale " in l for l in lines), lines
    scales = [float(l.split("| loss scale ")[1].split(" |")[0]) for l in lines]
    assert scales[0] == 2.0 ** 31  # hysteresis 1: the first overflow halves the 2^32 start
    assert res["skipped_steps"] and res["skipped_steps"][0] == 1, res["skipped_steps"]
    assert all(("update skipped" in lines[s - 1]) for s in res["skipped_steps"])
    assert res["loss_scale"] == scales[-1] and scales == sorted(scales, reverse=True)
    res2, out2 = point(runs, "fp16_static")
    assert res2["skipped_steps"] == [] and "update skipped" not in out2
    assert res2["loss_scale"] == 128.0
    assert sum(res2["losses"][-2:]) / 2 < res2["losses"][0] - 0.3, res2["losses"]
