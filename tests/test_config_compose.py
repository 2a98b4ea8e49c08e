"""Every option of every config group composes offline into the typed schema; bad keys/types/options fail."""
import os

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from conftest import CONF, compose_cfg, compose_dict
from primus.config.schema import GROUPS, PrimusConfig

OPTIONS = sorted(
    (group, name[:-5])
    for group in list(GROUPS) + ["experiment"]
    if os.path.isdir(os.path.join(CONF, group))
    for name in os.listdir(os.path.join(CONF, group))
    if name.endswith(".yaml") and not name.startswith("_")
)


def test_every_group_has_options():
    groups = {g for g, _ in OPTIONS}
    assert set(GROUPS) <= groups, set(GROUPS) - groups


@pytest.mark.parametrize("group,option", OPTIONS)
def test_option_composes_into_schema(group, option):
    extra = []
    if group == "data" and option != "synthetic":
        extra = ["data.path=/x", "data.tokenizer=/y"]
    cfg = compose_cfg([f"{group}={option}"] + extra)
    assert isinstance(cfg, PrimusConfig)
    if group in GROUPS:
        key = GROUPS[group][0]
        assert type(getattr(cfg, key)) is GROUPS[group][1]


def test_model_presets_carry_published_architecture():
    m = compose_cfg(["model=llama3_8b"]).model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups,
            m.vocab_size, m.rotary_base) == (32, 4096, 14336, 32, 8, 128256, 500000.0)
    m = compose_cfg(["model=mixtral_8x7b"]).model
    assert (m.num_experts, m.moe_router_topk, m.num_query_groups) == (8, 2, 8)
    m = compose_cfg(["model=deepseek_v2_lite"]).model
    assert (m.num_experts, m.moe_router_topk, m.multi_latent_attention, m.moe_first_k_dense) == (64, 6, True, 1)
    m = compose_cfg(["model=qwen3_30b_a3b"]).model
    assert (m.num_experts, m.moe_router_topk, m.qk_layernorm, m.kv_channels) == (128, 8, True, 128)
    assert compose_cfg(["model=llama3_2_1b"]).model.tie_word_embeddings is True


def test_numeric_tuning_stage_choice_works_unquoted():
    assert compose_cfg(["tuning_stage=3"]).tuning.stage == 3


def test_experiment_preset_bundles_groups():
    if not os.path.exists(os.path.join(CONF, "experiment", "llama2_7b_fp8.yaml")):
        pytest.skip("no llama2_7b_fp8 experiment yet")
    cfg = compose_cfg(["experiment=llama2_7b_fp8"])
    assert cfg.model.name == "llama2_7b" and cfg.precision.fp8 is not None


def test_unknown_key_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_dict(["model.num_layer=3"])
    assert "num_layer" in str(e.value.__cause__ or e.value)


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_dict(["model.num_layers=many"])
    assert "num_layers" in str(e.value.__cause__ or e.value)


def test_wrong_enum_value_names_the_choices():
    with pytest.raises(ConfigCompositionException) as e:
        compose_dict(["precision.fp8_recipe=fancy"])
    msg = str(e.value.__cause__ or e.value)
    assert "fancy" in msg and "tensorwise" in msg


def test_unknown_group_option_lists_available():
    with pytest.raises(MissingConfigException) as e:
        compose_dict(["model=llama9"])
    assert "llama2_7b" in str(e.value)


def test_misspelt_experiment_fails_at_compose():
    # a Hydra `optional` default skips an option it cannot find: a misspelt preset would train the debug model
    with pytest.raises(MissingConfigException) as e:
        compose_dict(["experiment=llama2_7b_megatron_fp8_gbs265"])
    assert "llama2_7b_megatron_fp8_gbs256" in str(e.value)
