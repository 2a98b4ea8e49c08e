"""CPU end-to-end runs of the TorchTitan backend: TorchTitan's own Trainer on the debug model (seq 128)."""
import json
import math
import os
import socket
import uuid

import pytest

pytest.importorskip("torchtitan")

from conftest import compose_cfg  # noqa: E402
from parity import set_same_weights  # noqa: E402

pytestmark = pytest.mark.slow
BASE = ["backend=torchtitan", "device=cpu", "training.seq_length=128"]
FP32 = ["precision.bf16=false", "precision.mixed_precision_param=float32"]


def run_trainer(overrides, run_dir, steps, same_weights=False):
    """Build the trainer, run `steps` steps, close; returns setup info and per-step results (this process)."""
    import torch

    from primus.backends.torchtitan.trainer import TorchTitanTrainer
    from primus.context import resolve

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.set_num_threads(1)
    cfg = compose_cfg(BASE + list(overrides))
    os.makedirs(run_dir, exist_ok=True)
    tr = TorchTitanTrainer(cfg, resolve(cfg, run_dir))
    try:
        info = tr.setup()
        if same_weights:
            set_same_weights(tr.tt.model_parts[0])
        results = [tr.train_step(s + 1) for s in range(steps)]
    finally:
        tr.close()
    return {"info": info, "losses": [r.loss for r in results], "grad_norms": [r.grad_norm for r in results],
            "lrs": [r.lr for r in results], "tied": getattr(tr.model_args, "tie_word_embeddings", None)}


def run_trainers(runs):
    """run_trainer for each (overrides, run_dir, steps, same_weights) of `runs`, one after another in this process
    and one process group (each trainer finds it up and leaves it up); returns their results."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        return [run_trainer(*r) for r in runs]
    finally:
        dist.destroy_process_group()


def launch(nproc, runs):
    """`run_trainers(runs)` on nproc fresh processes (torch elastic launch, gloo); returns rank 0's results."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:8],
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=0,
                      monitor_interval=0.5, start_method="spawn")
    return elastic_launch(lc, run_trainers)(runs)[0]


FSDP_STEPS = 6
FSDP_MATCH = FP32 + ["training.micro_batch_size=4", "training.global_batch_size=8",
                     f"training.train_iters={FSDP_STEPS}"]
FSDP_TIED = FP32 + ["model.tie_word_embeddings=true", "training.train_iters=4"]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """The FSDP tests' 2-rank runs, in one launch (one start of 2 processes): {"match": ..., "tied": ...}."""
    d = tmp_path_factory.mktemp("fsdp")
    match, tied = launch(2, [(FSDP_MATCH, str(d / "two"), FSDP_STEPS, True), (FSDP_TIED, str(d / "tied"), 4, False)])
    return {"match": match, "tied": tied}


def test_single_process_debug_model_loss_decreases(tmp_path):
    out = run_trainer(["training.train_iters=12", "training.lr=3e-3", "training.min_lr=3e-4",
                       "training.lr_warmup_iters=3", "training.lr_decay_style=cosine",
                       "training.global_batch_size=8"], str(tmp_path), 12)
    losses = out["losses"]
    assert abs(losses[0] - math.log(2048)) < 1.0, losses[0]  # starts near chance
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses  # learns the synthetic n-grams
    assert all(math.isfinite(g) and g > 0 for g in out["grad_norms"])
    lrs = out["lrs"]
    assert lrs[:3] == pytest.approx([1e-3, 2e-3, 3e-3])  # linear warm-up over 3 steps
    assert all(a > b for a, b in zip(lrs[3:], lrs[4:])) and lrs[-1] > 3e-4  # cosine decay towards min_lr
    assert out["info"]["gradient_accumulation_steps"] == 2  # global 8 / micro 4
    assert out["info"]["params"] == 1_311_872  # 2 * 2048 * 128 + 4 layers + final norm
    text = open(out["info"]["job_config_toml"]).read()
    assert "[training]" in text and "seq_len = 128" in text


@pytest.mark.xdist_group("torchtitan_e2e_fsdp")
def test_fsdp_two_processes_match_one_process(tmp_path, fsdp_runs):
    steps = FSDP_STEPS
    two = fsdp_runs["match"]
    # the reference runs in this process: one rank, the whole global batch in one micro batch
    one = run_trainer(FP32 + ["training.micro_batch_size=8", "training.global_batch_size=8",
                              f"training.train_iters={steps}"], str(tmp_path / "one"), steps, same_weights=True)
    assert two["info"]["parallel_dims"]["dp_shard"] == 2  # FSDP really sharded over both ranks
    assert one["info"]["parallel_dims"]["dp_shard"] == 1
    assert two["info"]["params"] == one["info"]["params"]
    for a, b in zip(two["losses"], one["losses"]):
        assert a == pytest.approx(b, rel=1e-4), (two["losses"], one["losses"])
    for a, b in zip(two["grad_norms"], one["grad_norms"]):
        assert a == pytest.approx(b, rel=1e-3), (two["grad_norms"], one["grad_norms"])
    assert two["losses"][-1] < two["losses"][0]


def test_tied_embeddings_train_and_share_one_table(tmp_path):
    out = run_trainer(FP32 + ["model.tie_word_embeddings=true", "training.train_iters=10"], str(tmp_path), 10)
    assert out["tied"] is True
    assert out["info"]["params"] == 1_311_872 - 2048 * 128  # one table, not two
    assert out["losses"][-1] < out["losses"][0] - 0.5, out["losses"]


@pytest.mark.xdist_group("torchtitan_e2e_fsdp")
def test_tied_embeddings_under_fsdp(fsdp_runs):
    out = fsdp_runs["tied"]
    assert out["info"]["parallel_dims"]["dp_shard"] == 2
    assert out["losses"][-1] < out["losses"][0], out["losses"]


def _byte_bpe(folder, texts, vocab_size=512):
    """A tiny byte-level BPE trained on local text: tokenizer.json + tokenizer_config.json, as TorchTitan reads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
    return tok.get_vocab_size()


def test_local_jsonl_with_local_tokenizer(tmp_path):
    import random

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "train", "model", "token", "layer", "shard"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(300)]
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):  # a folder of jsonl files, `text` field
        with open(data / f"part{i}.jsonl", "w") as f:
            for t in texts[i::2]:
                f.write(json.dumps({"text": t}) + "\n")
    vocab = _byte_bpe(str(tmp_path / "tok"), texts)
    assert vocab <= 2048
    out = run_trainer(FP32 + ["data=jsonl", f"data.path={data}", f"data.tokenizer={tmp_path / 'tok'}",
                       "training.train_iters=12"], str(tmp_path / "run"), 12)
    assert out["losses"][-1] < out["losses"][0] - 1.0, out["losses"]


def test_own_text_file_with_the_built_in_byte_tokenizer(tmp_path, caplog):
    """data=jsonl data.path=<a text file>, nothing else: TorchTitan's text dataset through the byte tokenizer; the
    run claims no A100 peak, runs no lspci and finds the HF assets it is pointed at (none of their warnings)."""
    import glob
    import logging

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(tmp_path / "docs.txt", "w", encoding="utf-8") as out:
        for p in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
            out.writelines(line for line in open(p, encoding="utf-8") if line.strip())
    with caplog.at_level(logging.WARNING):
        out = run_trainer(FP32 + ["data=jsonl", f"data.path={tmp_path / 'docs.txt'}", "training.seq_length=64",
                                  "training.global_batch_size=4", "training.micro_batch_size=4",
                                  "training.lr=1e-2", "training.train_iters=12"], str(tmp_path / "run"), 12)
    assert out["losses"][0] > 7.0 and sum(out["losses"][-3:]) / 3 < 5.0, out["losses"]  # under ln(256) = 5.55
    noise = [r.getMessage() for r in caplog.records
             if any(s in r.getMessage() for s in ("Peak flops", "lspci", "HF assets path"))]
    assert not noise, noise


def test_activation_checkpointing_modes_run(tmp_path):
    for mode in ("full", "selective"):
        out = run_trainer([f"recompute.activation_checkpoint_mode={mode}", "training.train_iters=2",
                           "training.global_batch_size=4"], str(tmp_path / mode), 2)
        assert all(math.isfinite(x) for x in out["losses"])


TINY_MOE = ["moe.moe_router_load_balancing_type=none", "training.micro_batch_size=4", "training.global_batch_size=4",
            "training.seq_length=64", "training.train_iters=10", "training.lr_warmup_iters=2", "training.lr=3e-3"]


def test_moe_qwen3_family_trains(tmp_path):
    out = run_trainer(["model=debug_moe"] + TINY_MOE, str(tmp_path), 10)
    assert out["info"]["torchtitan_model"].startswith("primus_qwen3/")
    assert all(math.isfinite(x) for x in out["losses"]) and max(out["losses"][-3:]) < out["losses"][0] - 0.3, \
        out["losses"]


def test_moe_mla_deepseek_v3_family_trains(tmp_path):
    tiny_mla = ["model=deepseek_v2_lite", "model.num_layers=2", "model.hidden_size=128", "model.ffn_hidden_size=256",
                "model.num_attention_heads=4", "model.num_query_groups=4", "model.vocab_size=2048",
                "model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64",
                "model.moe_shared_expert_intermediate_size=64", "model.kv_lora_rank=32", "model.qk_head_dim=16",
                "model.qk_pos_emb_head_dim=8", "model.v_head_dim=16", "model.max_position_embeddings=2048"]
    out = run_trainer(tiny_mla + TINY_MOE, str(tmp_path), 10)
    assert out["info"]["torchtitan_model"].startswith("primus_deepseek_v3/")
    assert all(math.isfinite(x) for x in out["losses"]) and max(out["losses"][-3:]) < out["losses"][0] - 0.3, \
        out["losses"]
