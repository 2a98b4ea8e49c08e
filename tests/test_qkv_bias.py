"""model.add_qkv_bias (Qwen2 / Qwen2.5): megatron-core builds the q/k/v projection biases and trains them, the
planner counts them, and TorchTitan (whose attention has none) refuses the setting before anything starts."""
import os

import pytest

from conftest import compose_cfg
from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext

GPU = RunContext(device="cuda", world_size=1, dist_backend="nccl", planned=True)


def _bias_numel(m):
    dh = m.hidden_size // m.num_attention_heads
    return m.num_layers * (m.num_attention_heads + 2 * m.num_query_groups) * dh


def test_megatron_gets_add_qkv_bias_and_the_planner_counts_the_biases():
    from primus.backends.megatron.args import build_args
    from primus.metrics.flops import param_counts
    from primus.plan.gpus import resolve_gpu
    from primus.plan.memory import estimate_memory

    plain, biased = compose_cfg(["model=debug"]), compose_cfg(["model=debug", "model.add_qkv_bias=true"])
    assert build_args(plain, GPU)["transformer_config"]["add_qkv_bias"] is False
    assert build_args(biased, GPU)["transformer_config"]["add_qkv_bias"] is True
    extra = _bias_numel(biased.model)
    assert extra == 4 * (4 + 2 * 2) * 32
    assert param_counts(biased.model).total - param_counts(plain.model).total == extra
    # biases are vectors, not matmul weights: the MFU's N is unchanged
    assert param_counts(biased.model).matmul_active == param_counts(plain.model).matmul_active
    gpu = resolve_gpu("H200", None)
    assert estimate_memory(biased, gpu, world=1).params_numel - estimate_memory(plain, gpu, world=1).params_numel \
        == extra
    # tp=2 shards each layer's biases with their column-parallel projection
    tp2 = ["parallel.tensor_model_parallel_size=2"]
    assert estimate_memory(compose_cfg(["model=debug", "model.add_qkv_bias=true"] + tp2), gpu, world=2).params_numel \
        - estimate_memory(compose_cfg(["model=debug"] + tp2), gpu, world=2).params_numel == extra // 2


def test_torchtitan_refuses_qkv_biases_by_name():
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(["backend=torchtitan", "model=debug", "model.add_qkv_bias=true"]), GPU)
    (issue,) = [i for i in e.value.issues if "model.add_qkv_bias" in i.keys]
    assert issue.value is True and "bias=False" in issue.rule and "backend=megatron" in issue.fix


def test_multi_latent_attention_with_qkv_biases_is_refused():
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(["model=deepseek_v2_lite", "model.add_qkv_bias=true"]), GPU)
    assert any(i.keys == ["model.add_qkv_bias", "model.multi_latent_attention"] for i in e.value.issues)


@pytest.mark.parametrize("name,layers,hidden,heads,kv,ffn,vocab,tied", [
    ("qwen2_5_3b", 36, 2048, 16, 2, 11008, 151936, True), ("qwen2_5_7b", 28, 3584, 28, 4, 18944, 152064, False),
    ("qwen2_5_14b", 48, 5120, 40, 8, 13824, 152064, False), ("qwen2_5_32b", 64, 5120, 40, 8, 27648, 152064, False),
    ("qwen2_5_72b", 80, 8192, 64, 8, 29568, 152064, False)])
def test_qwen2_5_presets_have_their_published_sizes_and_biases(name, layers, hidden, heads, kv, ffn, vocab, tied):
    from primus.features import RULES
    from primus.metrics.flops import param_counts

    m = compose_cfg([f"model={name}"]).model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size,
            m.vocab_size, m.tie_word_embeddings, m.add_qkv_bias) == (layers, hidden, heads, kv, ffn, vocab, tied, True)
    assert [i for r in RULES if r.__module__.endswith(".model") for i in r(compose_cfg([f"model={name}"]), GPU)] == []
    if name == "qwen2_5_7b":  # the published count: 7.62B parameters
        assert round(param_counts(m).total / 1e9, 2) == 7.62


@pytest.mark.e2e
def test_megatron_builds_the_biases_and_they_train(tmp_path):
    """The real megatron-core GPTModel on CPU: one bias per layer's q/k/v projection, counted as the planner counts
    them, and one optimizer step moves them off their zero init (they receive gradients)."""
    pytest.importorskip("megatron.core")
    import torch

    from primus.backends.megatron.trainer import MegatronTrainer
    from primus.context import resolve
    from primus.launch.local import single_process_env
    from primus.metrics.flops import param_counts

    cfg = compose_cfg(["backend=megatron", "device=cpu", "model=debug", "model.add_qkv_bias=true",
                       "training.seq_length=64", "training.train_iters=1", "training.lr_warmup_iters=0",
                       "training.micro_batch_size=2", "training.global_batch_size=2"])
    os.environ.update(single_process_env(None))
    tr = MegatronTrainer(cfg, resolve(cfg, str(tmp_path)))
    try:
        tr.setup()
        named = {n: p for chunk in tr.model for n, p in chunk.named_parameters()}
        biases = {n: p for n, p in named.items() if n.endswith("linear_qkv.bias")}
        assert len(biases) == cfg.model.num_layers, sorted(named)
        assert sum(p.numel() for p in biases.values()) == _bias_numel(cfg.model)
        assert tr.params == sum(p.numel() for p in named.values()) == param_counts(cfg.model).total
        before = {n: p.detach().clone() for n, p in biases.items()}
        assert all(torch.count_nonzero(b) == 0 for b in before.values())  # biases start at zero
        step = tr.train_step(1)
        assert not step.skipped and step.lr > 0 and abs(step.loss - 7.62) < 0.2  # ln(2048): a fresh model
        still = [n for n, p in biases.items() if torch.equal(p.detach(), before[n])]
        assert still == [], f"q/k/v biases that received no gradient: {still}"
    finally:
        tr.close()


@pytest.mark.e2e
def test_train_py_on_torchtitan_exits_2_naming_the_key_before_building_anything(tmp_path):
    from test_launch_common import run_train

    p = run_train(["backend=torchtitan", "model=debug", "model.add_qkv_bias=true", "device=cpu",
                   f"hydra.run.dir={tmp_path}"], timeout=300)
    assert p.returncode == 2, p.stdout[-3000:]
    assert "model.add_qkv_bias" in p.stdout and "backend=megatron" in p.stdout
    assert not (tmp_path / "result.json").exists() or '"ok"' not in (tmp_path / "result.json").read_text()
