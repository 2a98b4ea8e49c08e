"""The real megatron-core trainer on CPU (gloo), end to end through train.py: 1 process, and 2 processes with tp=2,
pp=2 and dp=2 whose losses must match the 1-process run (same weights by construction: layout-independent init;
same samples per step: Megatron-LM's sample order)."""

import pytest

from rank_script import run_train

pytestmark = pytest.mark.slow

# debug model (4 layers, dim 128), seq 128, global batch 8 = 2 micro batches of 4 on one rank
BASE = ["model=debug", "training.seq_length=128", "training.micro_batch_size=4", "training.global_batch_size=8",
        "training.lr=3e-3", "training.lr_warmup_iters=1", "training.timing_warmup_steps=0", "device=cpu"]


def train(tmp_path, name, overrides, steps):
    res, out = run_train(tmp_path / name, [f"training.train_iters={steps}", *BASE, *overrides])
    return res, out


REFERENCE_STEPS = 20


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The 1-process run of REFERENCE_STEPS steps: it must learn, and its first steps are what the 2-process layouts
    are compared with (its tests share one pytest-xdist worker)."""
    return train(tmp_path_factory.mktemp("ref"), "one", [], steps=REFERENCE_STEPS)


@pytest.mark.xdist_group("megatron_e2e_reference")
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


@pytest.mark.parametrize("layout", [
    ["parallel.tensor_model_parallel_size=2"],
    ["parallel.pipeline_model_parallel_size=2"],
    [],  # dp=2
    ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"],
], ids=["tp2", "pp2", "dp2", "tp2_sp"])
@pytest.mark.xdist_group("megatron_e2e_reference")
def test_two_processes_match_one_process(tmp_path, reference, layout):
    """The reference's first 5 steps: the 2-process run stops there on the reference's learning-rate schedule
    (its decay over REFERENCE_STEPS), so each of its steps is the reference's step."""
    ref, _ = reference
    res, _ = train(tmp_path, "two", ["launcher.nproc_per_node=2", f"training.lr_decay_iters={REFERENCE_STEPS}",
                                     *layout], steps=5)
    first = ref["losses"][:5]
    assert res["world_size"] == 2 and len(res["losses"]) == 5
    assert res["params"] == ref["params"]
    for step, (a, b) in enumerate(zip(first, res["losses"]), 1):
        assert abs(a - b) < 2e-3, (step, first, res["losses"])
    assert first[-1] < first[0] - 0.2  # the compared steps are real training steps


def test_moe_expert_parallel_matches_one_process(tmp_path):
    """debug_moe (8 experts, top-2, a shared expert) with ep=2 against 1 process: the alltoall dispatcher and the
    per-expert init line up."""
    one, _ = train(tmp_path, "moe1", ["model=debug_moe"], steps=4)
    two, _ = train(tmp_path, "moe2", ["model=debug_moe", "launcher.nproc_per_node=2",
                                      "parallel.expert_model_parallel_size=2"], steps=4)
    assert two["params"] == one["params"] == 2_495_616
    assert two["losses"] == pytest.approx(one["losses"], abs=2e-3)
    assert one["losses"][-1] < one["losses"][0] - 0.2


def test_moe_grouped_gemm_without_te_trains(tmp_path):
    """moe_grouped_gemm without TE: megatron's GroupedMLP on primus' grouped GEMM (grouped_gemm.py)."""
    res, _ = train(tmp_path, "gg", ["model=debug_moe", "moe.moe_grouped_gemm=true"], steps=4)
    assert res["losses"][-1] < res["losses"][0] - 0.2, res["losses"]


def test_tied_embeddings_across_pipeline_stages_match_one_process(tmp_path):
    """Tied embeddings (Llama 3.2 style) with pp=2: the last stage's output copy starts equal and stays synced."""
    one, _ = train(tmp_path, "tied1", ["model.tie_word_embeddings=true"], steps=4)
    two, _ = train(tmp_path, "tied2", ["model.tie_word_embeddings=true", "launcher.nproc_per_node=2",
                                       "parallel.pipeline_model_parallel_size=2"], steps=4)
    assert two["params"] == one["params"] == 1_049_728  # the output copy is not counted twice
    assert two["losses"] == pytest.approx(one["losses"], abs=2e-3)


def test_deepseek_style_mla_moe_trains(tmp_path):
    """Multi-latent attention (SDPA core with q/k head dim != v head dim) + MoE with a leading dense layer."""
    mla = ["model=debug_moe", "model.multi_latent_attention=true", "model.kv_lora_rank=32", "model.qk_head_dim=32",
           "model.qk_pos_emb_head_dim=16", "model.v_head_dim=32", "model.num_query_groups=4",
           "model.moe_first_k_dense=1"]
    res, _ = train(tmp_path, "mla", mla, steps=4)
    assert res["losses"][-1] < res["losses"][0] - 0.2, res["losses"]


def test_fp16_loss_scaling_skips_overflows_says_so_and_then_trains(tmp_path):
    """precision=fp16 on the real megatron optimizer: at megatron's initial scale 2^32 the first steps overflow and
    are skipped while the scale comes down; each step line shows the scale and says "update skipped", result.json
    lists the skipped steps; from a small static scale every step applies and the loss falls."""
    res, out = train(tmp_path, "dynamic", ["precision=fp16", "precision.hysteresis=1"], steps=6)
    lines = [l for l in out.splitlines() if l.startswith("step ")]
    assert len(lines) == 6 and all("| loss scale " in l for l in lines), lines
    scales = [float(l.split("| loss scale ")[1].split(" |")[0]) for l in lines]
    assert scales[0] == 2.0 ** 31  # hysteresis 1: the first overflow halves the 2^32 start
    assert res["skipped_steps"] and res["skipped_steps"][0] == 1, res["skipped_steps"]
    assert all(("update skipped" in lines[s - 1]) for s in res["skipped_steps"])
    assert res["loss_scale"] == scales[-1] and scales == sorted(scales, reverse=True)
    res2, out2 = train(tmp_path, "static", ["precision=fp16", "precision.loss_scale=128"], steps=8)
    assert res2["skipped_steps"] == [] and "update skipped" not in out2
    assert res2["loss_scale"] == 128.0
    assert sum(res2["losses"][-2:]) / 2 < res2["losses"][0] - 0.3, res2["losses"]
