"""The settings Primus's examples use and Primus's rules: each one mapped to the backend that honours it, refused
with a clear error where it cannot be, and judged in one round (warnings, implied values, what the target needs)."""
import pytest

from conftest import compose_cfg
from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext

CPU = RunContext(device="cpu", world_size=1, run_dir="/tmp/r")


def planned():  # a dry run on this machine, judged for the GPU target (run.py)
    return RunContext(device="cuda", world_size=1, run_dir="/tmp/r", planned=True)


def cpu():
    return RunContext(device="cpu", world_size=1, run_dir="/tmp/r")


def ok(overrides, ctx=None):
    ctx = ctx or cpu()
    cfg = validate(compose_cfg(overrides), ctx)
    return cfg, ctx


def errors(overrides, ctx=None):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(overrides), ctx or cpu())
    return e.value.issues


def keys(issues):
    return {k for i in issues for k in i.keys}


def megatron_args(overrides, ctx=None):
    from primus.backends.megatron.args import build_args

    cfg, ctx = ok(overrides, ctx)
    return build_args(cfg, ctx)


def torchtitan_args(overrides, ctx=None):
    from primus.backends.torchtitan.args import build_args

    cfg, ctx = ok(["backend=torchtitan", *overrides], ctx)
    return build_args(cfg, ctx)


# ------------------------------------------------------------------------------------------- turbo GEMM alias

TURBO_PL = ["turbo.enable_primus_turbo=true", "backend.layer_spec=local"]


def test_use_turbo_gemm_is_use_turbo_parallel_linear():
    cfg, ctx = ok([*TURBO_PL, "turbo.use_turbo_gemm=true"], planned())
    assert cfg.turbo.use_turbo_parallel_linear is True and cfg.turbo.use_turbo_gemm is None
    assert any("turbo.use_turbo_gemm" in n.keys for n in ctx.notes)
    a = megatron_args([*TURBO_PL, "turbo.use_turbo_gemm=true"], planned())
    assert a["turbo"]["use_turbo_parallel_linear"] is True


def test_use_turbo_gemm_and_use_turbo_parallel_linear_disagreeing_is_an_error():
    found = errors([*TURBO_PL, "turbo.use_turbo_gemm=false", "turbo.use_turbo_parallel_linear=true"], planned())
    assert {"turbo.use_turbo_gemm", "turbo.use_turbo_parallel_linear"} <= keys(found)


@pytest.mark.parametrize("alias", ["use_turbo_gemm", "use_turbo_parallel_linear"])
def test_fp8_delayed_through_the_turbo_gemm_is_refused(alias):
    found = errors([*TURBO_PL, "precision=fp8_delayed", f"turbo.{alias}=true"], planned())
    [i] = [i for i in found if "precision.fp8_recipe" in i.keys]
    assert "tensorwise" in i.rule and "blockwise" in i.rule and "mxfp8" in i.rule


def test_fp8_blockwise_through_the_turbo_gemm_passes():
    ok([*TURBO_PL, "precision=fp8_blockwise", "turbo.use_turbo_gemm=true"], planned())


# ------------------------------------------------------------------------------------------- removed flag


def test_use_turbo_grouped_mlp_false_is_accepted_true_is_refused():
    ok(["turbo.use_turbo_grouped_mlp=false"])
    found = errors(["turbo.use_turbo_grouped_mlp=true"])
    assert keys(found) == {"turbo.use_turbo_grouped_mlp"}


# ------------------------------------------------------------------------------------------- sync-free stages

MOE_TURBO = ["model=debug_moe", "turbo.enable_primus_turbo=true"]


def test_a_sync_free_stage_sets_its_component_flags():
    from primus.features import turbo

    cfg, ctx = ok([*MOE_TURBO, "turbo.turbo_sync_free_moe_stage=2"], planned())
    for key, _ in turbo.sync_free_components(2):
        group, name = key.split(".")
        assert getattr(getattr(cfg, group), name) is True, key
    assert cfg.moe.moe_token_dispatcher_type.value == "flex" and cfg.moe.moe_router_dtype.value == "fp32"
    assert {k for n in ctx.notes for k in n.keys} >= {k for k, _ in turbo.sync_free_components(2)}


def test_an_explicit_flag_contradicting_the_stage_is_an_error():
    found = errors([*MOE_TURBO, "turbo.turbo_sync_free_moe_stage=1", "moe.moe_permute_fusion=false"], planned())
    [i] = [i for i in found if "turbo.turbo_sync_free_moe_stage" in i.keys]
    assert "moe.moe_permute_fusion" in i.keys and "stage 1" in i.rule


# ------------------------------------------------------------------------------------------- DeepEP

DEEPEP = [*MOE_TURBO, "turbo.use_turbo_deepep=true"]


def test_deepep_maps_its_compute_units_to_megatrons_num_sms():
    a = megatron_args([*DEEPEP, "turbo.turbo_deepep_num_cu=64"], planned())
    assert a["transformer_config"]["moe_deepep_num_sms"] == 64
    assert a["transformer_config"]["moe_router_dtype"] == "fp32"
    assert a["transformer_config"]["moe_token_dispatcher_type"] == "flex"


def test_deepep_needs_fp32_router_dtype():
    found = errors([*DEEPEP, "moe.moe_router_dtype=fp64"], planned())
    assert {"turbo.use_turbo_deepep", "moe.moe_router_dtype"} <= keys(found)


def test_deepep_refuses_the_shared_expert_overlap():
    found = errors([*DEEPEP, "moe.moe_shared_expert_overlap=true"], planned())
    assert {"turbo.use_turbo_deepep", "moe.moe_shared_expert_overlap"} <= keys(found)


def test_deepep_at_ep16_runs_on_at_most_32_cus():
    from primus.features.turbo import turbo_deepep

    cfg = compose_cfg([*DEEPEP, "turbo.turbo_deepep_num_cu=64", "parallel.expert_model_parallel_size=16",
                       "moe.moe_token_dispatcher_type=flex"])
    found = turbo_deepep(cfg, planned())
    assert {"turbo.turbo_deepep_num_cu", "parallel.expert_model_parallel_size"} <= keys(found)
    cfg.parallel.expert_model_parallel_size = 8
    assert turbo_deepep(cfg, planned()) == []


def test_deepep_comm_stream_is_refused_and_deepep_settings_without_deepep_are_a_warning():
    found = errors([*DEEPEP, "turbo.turbo_deepep_use_comm_stream=true"], planned())
    assert "turbo.turbo_deepep_use_comm_stream" in keys(found)
    _, ctx = ok(["turbo.turbo_deepep_num_cu=64"])
    assert [w.keys for w in ctx.warnings] == [["turbo.turbo_deepep_num_cu"]]


# ------------------------------------------------------------------------------------------- MoE settings


def test_moe_router_settings_reach_megatron():
    tc = megatron_args(["model=debug_moe", "moe.moe_router_dtype=fp32", "moe.moe_router_force_load_balancing=true",
                        "model.moe_shared_expert_intermediate_size=128",
                        "moe.moe_shared_expert_overlap=true"])["transformer_config"]
    assert (tc["moe_router_dtype"], tc["moe_router_force_load_balancing"], tc["moe_shared_expert_overlap"]) == \
        ("fp32", True, True)


def test_moe_shared_expert_overlap_needs_shared_experts():
    found = errors(["model=debug_moe", "moe.moe_shared_expert_overlap=true",
                    "model.moe_shared_expert_intermediate_size=null"])
    assert "model.moe_shared_expert_intermediate_size" in keys(found)


@pytest.mark.parametrize("setting", ["moe.moe_router_dtype=fp32", "moe.moe_shared_expert_overlap=true",
                                     "moe.moe_token_dispatcher_type=allgather",
                                     "model.apply_rope_fusion=true", "model.bias_activation_fusion=false",
                                     "model.cross_entropy_fusion_impl=turbo", "backend.layer_spec=local"])
def test_megatron_only_settings_are_refused_on_torchtitan(setting):
    # TorchTitan 0.2.2 has its own dispatch, permute, RoPE, SwiGLU, loss and model classes: these would be dropped
    found = errors(["backend=torchtitan", "model=debug_moe", "moe.moe_router_load_balancing_type=none", setting])
    assert setting.split("=")[0] in keys(found) and "megatron-core only" in " ".join(map(str, found))


def test_forced_load_balancing_reaches_torchtitans_debug_switch():
    none = "moe.moe_router_load_balancing_type=none"  # TorchTitan balances with its aux-loss-free bias
    assert torchtitan_args(["model=debug_moe", none, "moe.moe_router_force_load_balancing=true"])["debug"][
        "moe_force_load_balance"] is True
    assert "moe_force_load_balance" not in torchtitan_args(["model=debug_moe", none])["debug"]


def test_permute_fusion_on_torchtitan_is_said_not_refused():
    # moe=optimized on TorchTitan: its grouped GEMM maps (use_grouped_mm); TorchTitan permutes its own way anyway
    _, ctx = ok(["backend=torchtitan", "model=debug_moe", "moe.moe_router_load_balancing_type=none", "moe=optimized"])
    assert [w.keys for w in ctx.warnings] == [["moe.moe_permute_fusion"]]
    assert torchtitan_args(["model=debug_moe", "moe.moe_router_load_balancing_type=none", "moe=optimized"])[
        "flavor_args"]["moe_args"]["use_grouped_mm"] is True


def test_every_moe_setting_and_expert_shape_on_a_dense_model_is_listed_as_ignored():
    _, ctx = ok(["moe.moe_token_dispatcher_type=allgather", "moe.moe_z_loss_coeff=0.001", "model.moe_router_topk=4"])
    ignored = {k for w in ctx.warnings for k in w.keys}
    assert {"moe.moe_token_dispatcher_type", "moe.moe_z_loss_coeff", "model.moe_router_topk"} <= ignored


def test_moe_settings_on_a_dense_model_are_listed_as_ignored():
    _, ctx = ok(["moe.moe_router_force_load_balancing=true"])
    [w] = ctx.warnings
    assert w.as_ignored() == {"key": "moe.moe_router_force_load_balancing", "value": True,
                              "why": w.rule} and "dense model" in w.rule


# ------------------------------------------------------------------------------------------- overlap


def test_async_tensor_model_parallel_allreduce_is_passed_with_a_warning():
    a = megatron_args(["overlap.async_tensor_model_parallel_allreduce=true"])
    assert a["transformer_config"]["async_tensor_model_parallel_allreduce"] is True
    _, ctx = ok(["overlap.async_tensor_model_parallel_allreduce=true"])
    assert "deprecated" in ctx.warnings[0].rule


# ------------------------------------------------------------------------------------------- training


def test_gradient_accumulation_fusion_maps_and_runs_on_the_local_spec_anywhere():
    """megatron takes it on any device and spec (the local spec without apex through the workaround
    megatron.local.grad_accum_fusion); TorchTitan has no such setting."""
    tc = megatron_args(["training.gradient_accumulation_fusion=true"], planned())["transformer_config"]
    assert tc["gradient_accumulation_fusion"] is True
    _, ctx = ok(["training.gradient_accumulation_fusion=true"], planned())
    assert not ctx.needed_on_target
    _, ctx = ok(["training.gradient_accumulation_fusion=true", "device=cpu"])
    assert not ctx.warnings
    _, ctx = ok(["training.gradient_accumulation_fusion=true", "device=cpu", "training.compile=true"])
    assert not ctx.warnings  # tp = 1 without overlap_grad_reduce: primus' fused linear, traced
    _, ctx = ok(["training.gradient_accumulation_fusion=true", "device=cpu", "training.compile=true",
                 "overlap.overlap_grad_reduce=true", "launcher.nproc_per_node=2"])
    (w,) = [w for w in ctx.warnings if "training.gradient_accumulation_fusion" in w.keys]
    assert w.keys[:3] == ["training.gradient_accumulation_fusion", "training.compile", "overlap.overlap_grad_reduce"]
    assert "graph" in w.rule
    found = errors(["backend=torchtitan", "training.gradient_accumulation_fusion=true"])
    assert "training.gradient_accumulation_fusion" in keys(found)


def test_gradient_accumulation_fusion_reaches_the_moe_experts_where_its_rule_holds():
    """On an MoE model with the turbo grouped GEMM the experts' weight gradients accumulate in their GEMM (args
    turbo.experts_grad_accum_fusion); each EXPERTS_GRAD_ACCUM_FUSION row that fails leaves them unfused with a note
    naming its key; a dense model or the fusion off asks nothing."""
    from primus.features.training import EXPERTS_GRAD_ACCUM_FUSION, experts_grad_accum_info

    moe = ["model=debug_moe", "turbo=megatron_moe", "training.gradient_accumulation_fusion=true"]
    cfg, ctx = ok(moe)
    assert megatron_args(moe)["turbo"]["experts_grad_accum_fusion"] is True
    experts = lambda ctx: [n for n in ctx.notes if "training.gradient_accumulation_fusion" in n.keys  # noqa: E731
                           and "turbo.use_turbo_parallel_linear" not in n.keys]  # that one: turbo's linears
    assert not experts(ctx)
    assert experts_grad_accum_info(cfg).startswith("fused")
    misses = {"turbo.use_turbo_grouped_gemm": ["turbo.use_turbo_grouped_gemm=false"],
              "overlap.overlap_grad_reduce": ["overlap.overlap_grad_reduce=true", "launcher.nproc_per_node=2"],
              "recompute.recompute_modules": ["recompute.recompute_granularity=selective",
                                              "recompute.recompute_modules=[moe_act]"]}
    assert set(misses) | {"turbo.grouped_gemm_fp8"} == {keys[0] for keys, _, _ in EXPERTS_GRAD_ACCUM_FUSION}
    for key, extra in misses.items():
        cfg, ctx = ok(moe + extra)
        (n,) = experts(ctx)
        assert key in n.keys and "experts" in n.rule, (key, n)
        assert "experts_grad_accum_fusion" not in megatron_args(moe + extra).get("turbo", {})
        assert experts_grad_accum_info(cfg).startswith("unfused") and key.split(".")[1] in experts_grad_accum_info(cfg)
    assert experts_grad_accum_info(ok(["model=debug", "training.gradient_accumulation_fusion=true"])[0]) is None
    assert experts_grad_accum_info(ok(["model=debug_moe", "turbo=megatron_moe"])[0]) is None


def test_gradient_accumulation_fusion_reaches_the_portable_fp8_linears_where_its_rule_holds():
    """precision=fp8 without Transformer Engine, tensorwise, tp=1: the fp8 linears add their weight gradients into
    main_grad in their GEMM (args fp8_grad_accum_fusion) and no note says otherwise; each FP8_LINEARS_GRAD_ACCUM_FUSION
    row that fails leaves them unfused with a note naming its key; without the fusion the question does not arise."""
    from primus.features.training import FP8_LINEARS_GRAD_ACCUM_FUSION

    fp8 = ["backend.layer_spec=local", "turbo=off", "precision=fp8", "training.gradient_accumulation_fusion=true"]
    linears = lambda ctx: [n for n in ctx.notes if "training.gradient_accumulation_fusion" in n.keys  # noqa: E731
                           and "precision.fp8" in n.keys]
    _, ctx = ok(fp8, planned())
    assert not linears(ctx) and megatron_args(fp8, planned())["fp8_grad_accum_fusion"] is True
    misses = {"precision.fp8_recipe": ["precision.fp8_recipe=blockwise"],
              "parallel.tensor_model_parallel_size": ["parallel.tensor_model_parallel_size=2",
                                                      "launcher.nproc_per_node=2"],
              "overlap.overlap_grad_reduce": ["overlap.overlap_grad_reduce=true", "launcher.nproc_per_node=2"]}
    assert set(misses) == {keys[0] for keys, _, _ in FP8_LINEARS_GRAD_ACCUM_FUSION}
    for key, extra in misses.items():
        ctx = RunContext(device="cuda", world_size=2 if "launcher.nproc_per_node=2" in extra else 1,
                         run_dir="/tmp/r", planned=True)
        _, ctx = ok(fp8 + extra, ctx)
        (n,) = linears(ctx)
        assert key in n.keys and "fp8 linears" in n.rule, (key, n)
        assert megatron_args(fp8 + extra, ctx)["fp8_grad_accum_fusion"] is False
    assert megatron_args(fp8[:-1], planned())["fp8_grad_accum_fusion"] is False


def test_lr_decay_iters_reaches_megatrons_scheduler():
    s = megatron_args(["training.train_iters=30", "training.lr_decay_iters=20"])["scheduler"]
    assert s["lr_decay_steps"] == 20
    assert megatron_args(["training.train_iters=30"])["scheduler"]["lr_decay_steps"] == 30


def test_lr_decay_iters_rules():
    found = errors(["training.lr_decay_iters=2", "training.lr_warmup_iters=2"])
    assert "training.lr_decay_iters" in keys(found)
    found = errors(["backend=torchtitan", "training.train_iters=30", "training.lr_decay_iters=20"])
    assert "training.lr_decay_iters" in keys(found)
    ok(["backend=torchtitan", "training.train_iters=30", "training.lr_decay_iters=30"])


def test_evaluation_maps_to_both_backends():
    a = megatron_args(["training.eval_interval=5", "training.eval_iters=3", "training.global_batch_size=8"])
    assert a["eval"] == {"interval": 5, "iters": 3}
    assert a["data"]["split"] == "98,2,0" and a["data"]["valid_samples"] == 3 * 8
    assert megatron_args([])["data"]["valid_samples"] == 0
    t = torchtitan_args(["training.eval_interval=5", "training.eval_iters=3", "training.global_batch_size=8"])
    # a TorchTitan validation step is one micro batch per dp rank: 3 global batches of 8 = 3 x 2 batches of 4
    assert t["validation"]["enable"] is True and t["validation"]["steps"] == 3 * 2
    assert t["validation"]["dataset"] == "primus_synthetic"
    assert "validation" not in torchtitan_args([])


def test_eval_iters_zero_evaluates_nothing_and_says_so():
    _, ctx = ok(["training.eval_interval=5", "training.eval_iters=0"])
    assert "eval_iters=0" in ctx.warnings[0].rule


def test_evaluation_steps():
    from primus.features.training import evaluates

    cfg = compose_cfg(["training.train_iters=7", "training.eval_interval=3"])
    assert [s for s in range(1, 8) if evaluates(cfg, s)] == [3, 6, 7]
    assert not any(evaluates(compose_cfg([]), s) for s in range(1, 31))


# ------------------------------------------------------------------------------------------- data


def test_eod_mask_loss_reaches_megatrons_dataset():
    assert megatron_args(["data.eod_mask_loss=true"])["data"]["eod_mask_loss"] is True


def test_torchtitan_eod_mask_leaves_the_eod_labels_out():
    torch = pytest.importorskip("torch")
    from torchtitan.components.loss import IGNORE_INDEX

    from primus.backends.torchtitan import data as tt_data

    labels = torch.tensor([[1, 7, 2, 7]])
    try:
        tt_data.configure(7)
        assert tt_data.mask_eod(labels).tolist() == [[1, IGNORE_INDEX, 2, IGNORE_INDEX]]
        tt_data.configure(None)
        assert tt_data.mask_eod(labels).tolist() == [[1, 7, 2, 7]]
    finally:
        tt_data.configure(None)


def test_synthetic_held_out_samples_are_not_training_samples():
    pytest.importorskip("torch")
    from primus.backends.torchtitan.data import HELDOUT_FIRST_INDEX, SyntheticTokens

    train = SyntheticTokens(100, 64, seed=3)
    held = SyntheticTokens(100, 64, seed=3, first_index=HELDOUT_FIRST_INDEX, restart=True)
    first = [next(iter(held))[1].tolist() for _ in range(2)]
    assert first[0] == first[1]  # each evaluation reads the same batches
    it = iter(train)
    assert all(next(it)[1].tolist() != first[0] for _ in range(20))
    assert (train.bank == held.bank).all()  # the same distribution


# ------------------------------------------------------------------------------------------- checkpoint


def test_checkpoint_switches_reach_megatron():
    c = megatron_args(["checkpoint.no_save_optim=true", "checkpoint.no_load_optim=true",
                       "checkpoint.ckpt_format=torch_dist"])["checkpoint"]
    assert c == {"no_save_optim": True, "no_load_optim": True, "ckpt_format": "torch_dist"}


def test_ckpt_format_other_than_torch_dist_is_refused():
    found = errors(["checkpoint.ckpt_format=torch"])
    assert keys(found) == {"checkpoint.ckpt_format"}
    assert "checkpoint.ckpt_format" in keys(errors(["backend=torchtitan", "checkpoint.ckpt_format=torch_dist"]))


# ------------------------------------------------------------------------------------------- one round


def test_generic_and_backend_problems_are_reported_together():
    found = errors(["training.lr=-1", "model.cross_entropy_fusion_impl=te", "model.cross_entropy_loss_fusion=true",
                    "backend.layer_spec=local"])
    assert {"training.lr", "model.cross_entropy_fusion_impl"} <= keys(found)


def test_a_dry_run_notes_what_the_target_needs_and_device_cpu_judges_this_machine():
    from primus.features.precision import te_available

    if te_available():
        pytest.skip("Transformer Engine is installed here")
    over = ["model.cross_entropy_fusion_impl=te", "model.cross_entropy_loss_fusion=true"]
    _, ctx = ok(over, planned())
    [n] = ctx.needed_on_target
    assert n.as_needed()["needs"] == "Transformer Engine" and n.keys == ["model.cross_entropy_fusion_impl"]
    assert "model.cross_entropy_fusion_impl" in keys(errors(over, cpu()))
    # the local spec chosen explicitly: TE would not be used on the target either
    assert "model.cross_entropy_fusion_impl" in keys(errors([*over, "backend.layer_spec=local"], planned()))
