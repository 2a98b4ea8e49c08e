"""Model presets that share a name with Primus's models carry Primus's router, balancing loss and RoPE scaling; the
presets of the models Primus's examples train compose with their published sizes."""
import pytest

from conftest import compose_cfg
from primus.backends.megatron.args import build_args
from primus.backends.torchtitan import flavors
from primus.context import RunContext
from primus.features import RULES

# (preset, layers, hidden, heads, kv heads, experts): published sizes (HF configs)
PRESETS = [
    ("llama2_13b", 40, 5120, 40, 40, None), ("llama2_70b", 80, 8192, 64, 8, None),
    ("llama3_1_8b", 32, 4096, 32, 8, None), ("llama3_1_70b", 80, 8192, 64, 8, None),
    ("llama3_1_405b", 126, 16384, 128, 8, None), ("llama3_2_3b", 28, 3072, 24, 8, None),
    ("llama3_3_70b", 80, 8192, 64, 8, None), ("qwen3_0_6b", 28, 1024, 16, 8, None), ("qwen3_1_7b", 28, 2048, 16, 8, None),
    ("qwen3_4b", 36, 2560, 32, 8, None), ("qwen3_8b", 36, 4096, 32, 8, None), ("qwen3_14b", 40, 5120, 40, 8, None),
    ("qwen3_32b", 64, 5120, 64, 8, None), ("qwen3_235b_a22b", 94, 4096, 64, 4, 128),
    ("deepseek_v2", 60, 5120, 128, 128, 160), ("deepseek_v3", 61, 7168, 128, 128, 256),
    ("mixtral_8x22b", 56, 6144, 48, 8, 8),
]


def _ctx():
    return RunContext(device="cuda", world_size=1, dist_backend="nccl", planned=True)


@pytest.mark.parametrize("name,layers,hidden,heads,kv,experts", PRESETS)
def test_preset_composes_with_its_published_sizes_and_passes_the_model_rules(name, layers, hidden, heads, kv, experts):
    cfg = compose_cfg([f"model={name}"])
    m = cfg.model
    assert (m.name, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.num_experts) == \
        (name, layers, hidden, heads, kv, experts)
    issues = [i for r in RULES if r.__module__.endswith(".model") for i in r(cfg, _ctx())]
    assert issues == [], issues


def test_deepseek_v2_lite_router_and_yarn_reach_megatron():
    tc = build_args(compose_cfg(["model=deepseek_v2_lite"]), _ctx())["transformer_config"]
    assert tc["moe_router_load_balancing_type"] == "seq_aux_loss" and tc["moe_aux_loss_coeff"] == 0.001
    assert tc["moe_router_pre_softmax"] is True and tc["moe_router_score_function"] == "softmax"
    assert tc["rope_type"] == "yarn" and tc["rotary_scaling_factor"] == 40.0
    assert tc["original_max_position_embeddings"] == 4096 and tc["mscale"] == tc["mscale_all_dim"] == 0.707


def test_an_experiment_s_moe_setting_overrides_the_model_s_router():
    tc = build_args(compose_cfg(["model=deepseek_v2_lite", "moe.moe_aux_loss_coeff=0.01",
                                 "moe.moe_router_load_balancing_type=aux_loss"]), _ctx())["transformer_config"]
    assert tc["moe_aux_loss_coeff"] == 0.01 and tc["moe_router_load_balancing_type"] == "aux_loss"
    assert tc["moe_router_pre_softmax"] is True  # still the model's


def test_yarn_reaches_torchtitan_s_deepseek_v3_and_a_second_mscale_is_refused():
    cfg = compose_cfg(["backend=torchtitan", "model=deepseek_v2_lite", "moe.moe_router_load_balancing_type=none"])
    f = flavors.build_flavor(cfg)
    assert (f.args["rope_factor"], f.args["original_seq_len"], f.args["mscale"]) == (40.0, 4096, 0.707)
    assert f.issues == []
    f = flavors.build_flavor(compose_cfg(["backend=torchtitan", "model=deepseek_v2_lite", "model.mscale=1.0",
                                          "moe.moe_router_load_balancing_type=none"]))
    assert any("model.mscale" in i.keys for i in f.issues)


def test_yarn_without_multi_latent_attention_is_refused():
    cfg = compose_cfg(["model=llama3_8b", "model.rope_type=yarn", "model.original_max_position_embeddings=8192"])
    issues = [i for r in RULES for i in r(cfg, _ctx())]
    assert any("model.rope_type" in i.keys and "multi-latent" in i.rule for i in issues)
