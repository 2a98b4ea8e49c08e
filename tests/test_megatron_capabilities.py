"""Settings megatron-core 0.16.1 / this device cannot honour are ConfigErrors before launch, naming the keys."""
import pytest

from conftest import compose_cfg as compose
from primus.backends.megatron import args as margs
from primus.context import RunContext
from primus.features import precision

CPU = RunContext(device="cpu", world_size=2)
GPU = RunContext(device="cuda", world_size=2, gpu_name="NVIDIA H200")


def issues(*overrides, ctx=CPU):
    return margs.capability_issues(compose(overrides), ctx)


def keys_of(found):
    return {k for i in found for k in i.keys}


def test_defaults_have_no_issues_on_cpu_and_gpu():
    assert issues() == []
    assert issues("model=llama3_2_1b", ctx=GPU) == []


@pytest.mark.parametrize("overrides,key,words", [
    (["memory=offload"], "memory.optimizer_cpu_offload", "no GPU"),
    (["precision=fp8"], "precision.fp8", "GPU"),
    (["precision=fp4"], "precision.fp4", "GPU"),
    (["backend.layer_spec=te"], "backend.layer_spec", "Transformer Engine"),
    (["model.cross_entropy_loss_fusion=true"], "model.cross_entropy_loss_fusion", "GPU kernel"),
])
def test_cpu_rejects_what_megatron_cannot_run_without_cuda(overrides, key, words):
    found = issues(*overrides)
    assert key in keys_of(found), found
    assert any(words in str(i) for i in found), found


@pytest.mark.skipif(margs.te_available(), reason="Transformer Engine installed")
@pytest.mark.parametrize("overrides,key,words", [
    (["precision=fp8"], "precision.fp8", "fp8"),
    (["precision=fp4"], "precision.fp4", "TE"),
    (["precision=fp8", "precision.fp8_recipe=rowwise"], "precision.fp8_recipe", "0.16.1"),
    (["parallel.context_parallel_size=2"], "parallel.context_parallel_size", "TE"),
    (["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=te"],
     "model.cross_entropy_fusion_impl", "TE"),
    (["model=debug_moe", "moe.moe_grouped_gemm=true", "precision=fp16"], "moe.moe_grouped_gemm", "bf16"),
    (["model=debug_moe", "moe.moe_token_dispatcher_type=flex"], "moe.moe_token_dispatcher_type", "DeepEP"),
    (["memory=distributed_optimizer", "memory.use_precision_aware_optimizer=true"],
     "memory.use_precision_aware_optimizer", "Transformer Engine"),
    (["backend.layer_spec=te"], "backend.layer_spec", "not importable"),
])
def test_gpu_without_te_rejects_te_only_features(overrides, key, words, monkeypatch):
    monkeypatch.setattr(precision, "portable_fp8_available", lambda recipe=None, planned=False: False)  # as on a GPU without fp8
    found = issues(*overrides, ctx=GPU)
    assert key in keys_of(found), found
    assert any(words in str(i) for i in found), found


def test_fp8_without_te_names_the_missing_portable_linear(monkeypatch):
    monkeypatch.setattr(margs, "te_available", lambda: False)
    monkeypatch.setattr(precision, "_importable", lambda name: False)  # no primus.turbo.fp8_linear yet
    found = issues("precision=fp8", ctx=GPU)
    assert any("portable fp8 linear is not available yet" in str(i) for i in found), found
    # once the portable linear exists and says yes, fp8 on a GPU without TE is accepted
    monkeypatch.setattr(precision, "portable_fp8_available", lambda recipe=None, planned=False: True)
    assert not [i for i in issues("precision=fp8", ctx=GPU) if "precision.fp8" in i.keys]
    assert margs.build_args(compose(["precision=fp8"]), GPU)["fp8_backend"] == "portable"


def test_gpu_without_fp8_tensor_cores_is_an_error(monkeypatch):
    monkeypatch.setattr(precision, "this_gpu", lambda index=0: ("cuda", (8, 0), "", "NVIDIA A100"))
    monkeypatch.setattr(precision, "portable_fp8_available", lambda recipe=None, planned=False: True)
    found = issues("precision=fp8", ctx=RunContext(device="cuda", world_size=1, gpu_name="NVIDIA A100"))
    assert any("no fp8 tensor cores" in str(i) and "A100" in str(i) for i in found), found


@pytest.mark.parametrize("overrides,key", [
    (["overlap.overlap_param_gather=true"], "overlap.overlap_param_gather"),
    (["overlap.align_param_gather=true"], "overlap.align_param_gather"),
    (["overlap.overlap_p2p_comm=true", "parallel.pipeline_model_parallel_size=2"], "overlap.overlap_p2p_comm"),
    (["memory.optimizer_cpu_offload=true"], "memory.optimizer_cpu_offload"),
    (["memory.use_precision_aware_optimizer=true"], "memory.use_precision_aware_optimizer"),
    (["model=debug_moe", "moe.overlap_moe_expert_parallel_comm=true", "moe.moe_token_dispatcher_type=allgather"],
     "moe.moe_token_dispatcher_type"),
    (["model=debug_moe", "moe.overlap_moe_expert_parallel_comm=true", "recompute=full",
      "recompute.recompute_method=uniform", "recompute.recompute_num_layers=1"], "recompute.recompute_granularity"),
])
def test_settings_megatron_cannot_honour_on_any_device(overrides, key):
    found = issues(*overrides, ctx=GPU)
    assert key in keys_of(found), found


def test_wrong_megatron_core_version_is_named(monkeypatch):
    monkeypatch.setattr(margs, "mcore_version", lambda: "0.15.0")
    found = issues()
    assert any("0.16.1" in str(i) and "0.15.0" in str(i) for i in found), found


def test_sequence_parallel_is_accepted_with_the_fused_local_spec():
    """spec.RMSNorm carries megatron's sequence_parallel mark, so SP runs without TE (CPU parity: test_megatron_e2e)."""
    assert issues("parallel.sequence_parallel=true", "parallel.tensor_model_parallel_size=2") == []
    assert issues("parallel.sequence_parallel=true", "parallel.tensor_model_parallel_size=2", ctx=GPU) == []


def test_validate_runs_these_rules(monkeypatch):
    """The generic validate() raises the backend's issues together with its own."""
    from primus.config.errors import ConfigError
    from primus.config.validate import validate

    cfg = compose(["memory=offload", "device=cpu"])
    with pytest.raises(ConfigError, match="memory.optimizer_cpu_offload"):
        validate(cfg, RunContext(device="cpu", world_size=1))


@pytest.mark.skipif(margs._importable("deep_ep"), reason="DeepEP installed")
def test_deepep_missing_gives_one_fix_not_two_that_contradict():
    """turbo=sync_free_stage2 asks for DeepEP (flex dispatcher): without deep_ep the provider rule says to install it
    or turn both off; the megatron rule must not add "use alltoall" alone, which the DeepEP rule then refuses."""
    from primus.config.validate import validate
    from primus.config.errors import ConfigError

    found = issues("model=debug_moe", "turbo=sync_free_stage2", ctx=GPU)
    assert "moe.moe_token_dispatcher_type" not in [k for i in found for k in i.keys], found
    with pytest.raises(ConfigError) as e:  # the whole validation, provider rules included
        validate(compose(["model=debug_moe", "turbo=sync_free_stage2"]), GPU)
    deepep = [i for i in e.value.issues if i.keys == ["turbo.use_turbo_deepep"]]
    assert deepep and "install DeepEP" in deepep[0].fix and "moe_token_dispatcher_type=alltoall" in deepep[0].fix
    assert not [i for i in e.value.issues if i.keys == ["moe.moe_token_dispatcher_type"]], e.value.issues
    # flex without the DeepEP flag still gets megatron's own rule; a dry run planned for a GPU lists DeepEP as
    # needed on the target instead of refusing
    assert "moe.moe_token_dispatcher_type" in keys_of(issues("model=debug_moe", "moe.moe_token_dispatcher_type=flex",
                                                               ctx=GPU))
    planned = RunContext(device="cuda", world_size=1, planned=True)
    cfg = validate(compose(["model=debug_moe", "moe.moe_token_dispatcher_type=flex"]), planned)
    assert cfg.moe.moe_token_dispatcher_type.value == "flex"
    assert [(i.keys, i.needs) for i in planned.needed_on_target] == [(["moe.moe_token_dispatcher_type"], "DeepEP")]

