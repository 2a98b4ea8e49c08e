"""Two model settings Primus's Llama 4 configs need: MoE on every N-th layer (model.moe_layer_freq, Megatron-LM's
integer moe_layer_freq; Llama 4 Maverick: 2) and Llama-3.x RoPE frequency scaling (model.use_rope_scaling,
model.rope_scaling_factor; Llama 4 Scout: 16). Their mapping on both backends, what TorchTitan refuses, the counts,
and the import of Primus's layer patterns."""
import pytest

from conftest import compose_cfg, compose_dict
from primus.backends.megatron import args as margs
from primus.config.errors import ConfigError
from primus.context import RunContext

CPU = RunContext(device="cpu", world_size=1)


def _checked(overrides):
    from primus.run import checked

    return checked(compose_dict(overrides), overrides)


@pytest.mark.parametrize("first,freq,want", [(0, 1, [1, 1, 1, 1]), (0, 2, [1, 0, 1, 0]), (1, 2, [0, 1, 0, 1]),
                                             (1, 1, [0, 1, 1, 1]), (0, 3, [1, 0, 0, 1])])
def test_megatron_gets_the_layer_pattern(first, freq, want):
    cfg = compose_cfg(["model=debug_moe", f"model.moe_first_k_dense={first}", f"model.moe_layer_freq={freq}"])
    assert margs.build_args(cfg, CPU)["transformer_config"]["moe_layer_freq"] == want


def test_dense_layers_between_moe_ones_are_counted_as_dense():
    from primus.metrics.flops import expert_params, num_moe_layers, param_counts
    from primus.plan.memory import estimate_memory
    from primus.plan.gpus import resolve_gpu

    every, other = (compose_cfg(["model=debug_moe", f"model.moe_layer_freq={n}"]) for n in (1, 2))
    assert (num_moe_layers(every.model), num_moe_layers(other.model)) == (4, 2)
    m = every.model  # two layers' experts become two dense MLPs
    dense = 3 * m.hidden_size * m.ffn_hidden_size
    router = m.hidden_size * m.num_experts
    shared = 3 * m.hidden_size * (m.moe_shared_expert_intermediate_size or 0)
    per_moe = m.num_experts * expert_params(m) + shared + router
    assert param_counts(m).total - param_counts(other.model).total == 2 * (per_moe - dense)
    gpu = resolve_gpu("H200", None)
    assert estimate_memory(other, gpu, 1).params_numel == param_counts(other.model).total


def test_torchtitan_refuses_dense_layers_between_moe_ones():
    with pytest.raises(ConfigError, match="model.moe_layer_freq = 2: torchtitan 0.2.2's MoE models make every layer"):
        _checked(["backend=torchtitan", "model=debug_moe", "moe.moe_router_load_balancing_type=none",
                  "model.moe_layer_freq=2"])


def test_a_layer_frequency_below_one_is_refused():
    with pytest.raises(ConfigError, match=r"model.moe_layer_freq = 0: must be >= 1 \(a count\)"):
        _checked(["model=debug_moe", "model.moe_layer_freq=0"])


def test_rope_scaling_reaches_megatron_s_gpt_model_and_torchtitan_s_llama3():
    from primus.backends.torchtitan.flavors import LLAMA3, build_flavor

    on = ["model=debug", "model.use_rope_scaling=true", "model.rope_scaling_factor=16"]
    gm = margs.build_args(compose_cfg(["backend=megatron", *on]), CPU)["gpt_model"]
    assert (gm["rope_scaling"], gm["rope_scaling_factor"]) == (True, 16.0)
    assert "rope_scaling" not in margs.build_args(compose_cfg(["backend=megatron", "model=debug"]), CPU)["gpt_model"]
    flavor = build_flavor(compose_cfg(["backend=torchtitan", *on]))
    assert flavor.spec == LLAMA3 and flavor.args["rope_scaling_args"] == {
        "scaling_factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}  # megatron-core's fixed factors and original context
    plain = build_flavor(compose_cfg(["backend=torchtitan", "model=debug"])).args["rope_scaling_args"]
    assert plain["scaling_factor"] == 1.0  # the identity: plain RoPE


def test_rope_scaling_where_it_cannot_act():
    with pytest.raises(ConfigError, match="torchtitan 0.2.2 scales RoPE in its llama3 family only"):
        _checked(["backend=torchtitan", "model=debug", "model.qk_layernorm=true", "model.use_rope_scaling=true"])
    _, ctx = _checked(["model=debug", "model.rope_scaling_factor=16"])
    warned = {k: i.rule for i in ctx.warnings for k in i.keys}
    assert "acts only with Llama-3.x RoPE scaling" in warned["model.rope_scaling_factor"]


@pytest.mark.e2e
def test_megatron_trains_every_other_layer_moe_with_rope_scaling(tmp_path):
    """Llama 4 Maverick's layout at the debug size: MoE on layers 0 and 2, dense MLPs on 1 and 3, with RoPE scaling;
    the model megatron builds has the planner's parameter count."""
    from parity import COMMON
    from rank_script import run_train

    from primus.metrics.flops import param_counts

    ov = ["model=debug_moe", "model.moe_layer_freq=2", "model.use_rope_scaling=true", "model.rope_scaling_factor=16"]
    res, _ = run_train(tmp_path / "run", [*COMMON, *ov])
    assert len(res["losses"]) == 4 and all(x == x for x in res["losses"])
    assert res["params"] == param_counts(compose_cfg(ov).model).total


@pytest.mark.parametrize("freq,sets", [
    (2, {"model.moe_first_k_dense": 0, "model.moe_layer_freq": 2}),
    ("([0]*1+[1]*3)", {"model.moe_first_k_dense": 1, "model.moe_layer_freq": 1, "model.num_layers": 4}),
    ("([0,1]*2)", {"model.moe_first_k_dense": 1, "model.moe_layer_freq": 2, "model.num_layers": 4}),
])
def test_primus_s_layer_patterns_import(freq, sets):
    from primus.importer.keys import _layer_freq

    assert _layer_freq(freq, {}) == sets


def test_a_layer_pattern_with_no_period_is_not_importable():
    from primus.importer.keys import _layer_freq

    with pytest.raises(ValueError, match="MoE layers here are every N-th after the leading dense ones"):
        _layer_freq("[1,1,0,1]", {})
