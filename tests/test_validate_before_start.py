"""What a dry run must catch without a GPU and before any heavy import: an explicit checkpoint.resume path that is
not a checkpoint, and selective-recompute modules megatron-core does not have."""
import pytest

from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext


def _issues(cfg_of, overrides):
    with pytest.raises(ConfigError) as e:
        validate(cfg_of(overrides), RunContext(device="cuda", world_size=1, planned=True))
    return e.value.issues


def test_resume_path_that_is_not_a_checkpoint(cfg_of, tmp_path):
    (issue,) = _issues(cfg_of, [f"checkpoint.resume={tmp_path / 'nonexistent'}"])
    assert issue.keys == ["checkpoint.resume"] and "not a directory" in issue.rule and "auto" in issue.fix
    validate(cfg_of(["checkpoint.resume=auto"]), RunContext(device="cuda", world_size=1, planned=True))


def test_unknown_and_misplaced_recompute_modules(cfg_of):
    issues = _issues(cfg_of, ["recompute=selective", "recompute.recompute_modules=[core_attn,bogus,mla_up_proj]"])
    assert {tuple(i.keys) for i in issues} == {("recompute.recompute_modules",),
                                               ("recompute.recompute_modules", "model.multi_latent_attention")}
    bad = next(i for i in issues if i.keys == ["recompute.recompute_modules"])
    assert bad.value == ["bogus"] and "core_attn" in bad.fix


@pytest.mark.parametrize("key", ["model.rotary_base", "model.norm_epsilon", "training.lr", "training.min_lr",
                                 "training.clip_grad", "training.adam_eps", "training.weight_decay",
                                 "training.init_method_std", "moe.moe_aux_loss_coeff", "moe.moe_z_loss_coeff",
                                 "plan.gpu_memory_gb"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nan_and_inf_are_refused_by_name(cfg_of, key, value):
    # the range rules compare with < and <=, which NaN passes: training.clip_grad=nan turned clipping off
    issues = _issues(cfg_of, [f"{key}={value}"])
    assert [i.keys for i in issues] == [[key]] and "finite" in issues[0].rule


def test_a_fractional_rope_theta_is_not_truncated(cfg_of):
    from primus.backends.megatron.args import build_args

    cfg = cfg_of(["model.rotary_base=10000.5"])
    validate(cfg, RunContext(device="cuda", world_size=1, planned=True))
    assert build_args(cfg, RunContext(device="cuda", world_size=1, planned=True))["gpt_model"]["rotary_base"] == 10000.5


@pytest.mark.parametrize("backend, override, owner", [
    ("megatron", "memory.enable_cpu_offload=true", "TorchTitan"),
    ("megatron", "precision.mixed_precision_param=float32", "TorchTitan"),
    ("megatron", "overlap.enable_async_tensor_parallel=true", "TorchTitan"),
    ("megatron", "recompute.activation_checkpoint_mode=full", "TorchTitan"),
    ("megatron", "parallel.data_parallel_shard_degree=2", "TorchTitan"),
    ("megatron", "turbo=torchtitan_fp8", "TorchTitan"),
    ("torchtitan", "turbo=megatron", "megatron-core"),
    ("torchtitan", "memory.use_distributed_optimizer=true", "megatron-core"),
])
def test_a_setting_only_the_other_backend_reads_is_refused(cfg_of, backend, override, owner):
    # one rule for both backends (primus.features.other_backend_issues); megatron used to accept these unread
    with pytest.raises(ConfigError) as e:
        validate(cfg_of([f"backend={backend}", override]), RunContext(device="cuda", world_size=1, planned=True))
    assert any(i.rule.startswith(f"{owner} only:") and "has no such setting" in i.rule for i in e.value.issues), \
        e.value.issues


@pytest.mark.parametrize("overrides, key", [
    (["turbo.provider=bogus"], "turbo.provider"),  # was checked only by the device probe, skipped in a dry run
    (["model=debug_moe", "model.moe_first_k_dense=4", "turbo=sync_free_stage2"], "model.moe_first_k_dense"),
    (["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_start_in_bf16=2",
      "precision.num_layers_at_end_in_bf16=2"], "precision.num_layers_at_start_in_bf16"),
])
def test_dry_run_catches_without_a_gpu(cfg_of, overrides, key):
    assert any(key in i.keys for i in _issues(cfg_of, overrides))
