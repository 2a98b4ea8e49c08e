"""One test per validation rule: the error names the key(s), the value, the rule and the fix."""
import pytest

from conftest import compose_cfg
from primus.config.errors import ConfigError
from primus.config.validate import RULES, validate
from primus.context import RunContext


def check(overrides, world=1, device="cpu"):
    cfg = compose_cfg(overrides)
    validate(cfg, RunContext(device=device, world_size=world), rules=RULES)
    return cfg


def error_of(overrides, world=1):
    with pytest.raises(ConfigError) as e:
        check(overrides, world)
    return str(e.value)


def test_default_config_is_valid():
    check([])


def test_grouped_mlp_removed_points_to_grouped_gemm():
    msg = error_of(["turbo.enable_primus_turbo=true", "turbo.use_turbo_grouped_mlp=true"])
    assert "turbo.use_turbo_grouped_mlp" in msg and "use_turbo_grouped_gemm" in msg and "removed" in msg


def test_parallel_linear_is_a_live_flag():
    check(["turbo.enable_primus_turbo=true", "turbo.use_turbo_parallel_linear=true"])


@pytest.mark.parametrize("flag", ["use_turbo_attention", "use_turbo_deepep", "moe_use_fused_router_with_aux_score",
                                  "use_turbo_rms_norm", "use_turbo_float8_linear"])
def test_turbo_flag_without_master_switch(flag):
    msg = error_of(["model=debug_moe", f"turbo.{flag}=true"])
    assert f"turbo.{flag}" in msg and "turbo.enable_primus_turbo" in msg and "enable_primus_turbo=true" in msg


def test_sync_free_stage_without_master_switch():
    msg = error_of(["model=debug_moe", "turbo.turbo_sync_free_moe_stage=1"])
    assert "turbo.turbo_sync_free_moe_stage" in msg and "enable_primus_turbo" in msg


def test_sync_free_stage_range():
    msg = error_of(["model=debug_moe", "turbo.enable_primus_turbo=true", "turbo.turbo_sync_free_moe_stage=4"])
    assert "0, 1, 2 or 3" in msg and "= 4" in msg


def test_sync_free_stage2_needs_grouped_gemm():
    msg = error_of(["model=debug_moe", "turbo=sync_free_stage2", "turbo.use_turbo_grouped_gemm=false"])
    assert "turbo.use_turbo_grouped_gemm" in msg and "stage 2" in msg


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_sync_free_presets_are_valid(stage):
    check(["model=debug_moe", f"turbo=sync_free_stage{stage}"])


def test_deepep_needs_flex_dispatcher_and_moe():
    msg = error_of(["turbo.enable_primus_turbo=true", "turbo.use_turbo_deepep=true"])
    assert "moe.moe_token_dispatcher_type" in msg and "flex" in msg and "model.num_experts" in msg


def test_recompute_layer_ids_needs_full_and_null_method():
    msg = error_of(["recompute=selective", "recompute.recompute_layer_ids=[1]"])
    assert "recompute_granularity=full" in msg and "recompute_method=null" in msg


def test_recompute_layer_ids_out_of_range():
    msg = error_of(["recompute=layer_ids", "recompute.recompute_layer_ids=[0,4]"])
    assert "[4]" in msg and "0..3" in msg


def test_recompute_layer_ids_mtp_ids_are_global():
    cfg = check(["recompute=layer_ids", "recompute.recompute_layer_ids=[4,0]", "model.mtp_num_layers=1"])
    assert cfg.recompute.recompute_layer_ids == [0, 4]
    assert "MTP depth" in error_of(["recompute=layer_ids", "recompute.recompute_layer_ids=[5]", "model.mtp_num_layers=1"])


def test_recompute_layer_ids_empty_list():
    assert "empty list" in error_of(["recompute=layer_ids", "recompute.recompute_layer_ids=[]"])


def test_recompute_layer_ids_dedup_and_sort():
    cfg = check(["recompute=layer_ids", "recompute.recompute_layer_ids=[3,1,3,0]"])
    assert cfg.recompute.recompute_layer_ids == [0, 1, 3]


def test_recompute_method_without_full():
    assert "recompute_granularity=full" in error_of(["recompute=selective", "recompute.recompute_method=uniform",
                                                     "recompute.recompute_num_layers=1"])


def test_bf16_and_fp16_together():
    msg = error_of(["precision=fp16", "precision.bf16=true"])
    assert "precision.bf16, precision.fp16" in msg and "exclusive" in msg


def test_fp8_and_fp4_together():
    assert "fp8 and fp4 are exclusive" in error_of(["precision=fp8", "precision.fp4=e2m1"])


def test_recipe_backend_cannot_run():
    msg = error_of(["backend=torchtitan", "precision=fp8_delayed"])
    assert "precision.fp8_recipe" in msg and "'delayed'" in msg and "rowwise" in msg
    assert "backend megatron runs fp8 recipes" in error_of(["precision=fp8_rowwise"])
    assert "no fp4 training path" in error_of(["backend=torchtitan", "precision=fp4"])


def test_first_last_layers_bf16_without_fp8():
    assert "needs precision.fp8 or precision.fp4" in error_of(["precision.first_last_layers_bf16=true"])


def test_first_last_layers_counts_beyond_layers():
    msg = error_of(["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_start_in_bf16=3",
                    "precision.num_layers_at_end_in_bf16=2"])
    assert "num_layers_at_start_in_bf16" in msg and "must be in 0..3" in msg and "nothing would run in fp8" in msg


def test_parallel_product_must_equal_world():
    msg = error_of(["parallel.tensor_model_parallel_size=2"], world=1)
    assert "tp x pp x cp x dp must equal the world size" in msg and "'world_size': 1" in msg
    check(["parallel.tensor_model_parallel_size=2", "training.global_batch_size=8"], world=2)


def test_explicit_dp_must_match_world():
    assert "must equal the world size" in error_of(["parallel.data_parallel_size=2"], world=4)


def test_layers_divisible_by_pipeline_stages():
    msg = error_of(["parallel.pipeline_model_parallel_size=3", "training.global_batch_size=12"], world=3)
    assert "model.num_layers" in msg and "3 pipeline stages" in msg


def test_virtual_pipeline_stages_divide_layers():
    msg = error_of(["parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=4"], world=2)
    assert "8 pipeline stages" in msg
    assert "pipeline_model_parallel_size >= 2" in error_of(["parallel.virtual_pipeline_model_parallel_size=2"])


def test_heads_divisible_by_tp():
    msg = error_of(["parallel.tensor_model_parallel_size=4", "training.global_batch_size=8"], world=4)
    assert "attention and KV heads must be divisible by tp" in msg and "'kv_heads': 2" in msg


def test_experts_divisible_by_ep():
    msg = error_of(["model=debug_moe", "parallel.expert_model_parallel_size=3", "training.global_batch_size=12"], world=3)
    assert "experts must be divisible by ep" in msg


def test_ep_on_dense_model():
    assert "expert parallelism needs a MoE model" in error_of(["parallel.expert_model_parallel_size=2"], world=2)


def test_micro_batch_times_dp_divides_global():
    msg = error_of(["training.micro_batch_size=3", "training.global_batch_size=8"])
    assert "training.global_batch_size" in msg and "multiple of 3" in msg


def test_offload_fraction_range():
    msg = error_of(["memory.optimizer_offload_fraction=1.5"])
    assert "memory.optimizer_offload_fraction = 1.5" in msg and "[0, 1]" in msg


def test_offload_overlap_without_offload_is_refused():
    msg = error_of(["memory.overlap_cpu_optimizer_d2h_h2d=true"])
    assert "memory.overlap_cpu_optimizer_d2h_h2d" in msg and "memory=offload" in msg


def test_moe_settings_on_dense_model_are_a_warning():
    """Harmless where they do not apply (Primus): the run goes on, the settings are listed as ignored."""
    ctx = RunContext(device="cpu", world_size=1)
    validate(compose_cfg(["moe=optimized"]), ctx, rules=RULES)
    [w] = ctx.warnings
    assert w.severity == "warning" and "moe.moe_permute_fusion" in w.keys and "dense model" in w.rule
    assert w.as_ignored()["key"].startswith("moe.")


def test_moe_settings_on_moe_model_ok():
    check(["model=debug_moe", "moe=optimized"])


def test_deterministic_forbids_compile(monkeypatch):
    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    assert "turns torch.compile off" in error_of(["training.deterministic=true", "training.compile=true"])
    monkeypatch.setenv("PRIMUS_DETERMINISTIC", "1")
    assert "turns torch.compile off" in error_of(["training.compile=true"])


def test_deterministic_forbids_tuning(monkeypatch):
    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    msg = error_of(["training.deterministic=true", "tuning.enabled=true", "tuning_stage=1"])
    assert "turns GEMM tuning off" in msg


def test_stage3_needs_results_file(tmp_path, monkeypatch):
    monkeypatch.delenv("HIPBLASLT_TUNING_OVERRIDE_FILE", raising=False)
    msg = error_of(["tuning_stage=3", "tuning.enabled=true", f"tuning.root={tmp_path}"])
    assert "tune_hipblas_gemm_results.txt" in msg and "stage 3" in msg
    f = tmp_path / "r.txt"
    f.write_text("Git Version: x\n")
    check(["tuning_stage=3", "tuning.enabled=true", f"tuning.override_file={f}"])


def test_stage3_ignored_when_tuning_off(tmp_path, monkeypatch):
    monkeypatch.delenv("PRIMUS_HIPBLASLT_TUNING", raising=False)
    check(["tuning_stage=3", f"tuning.root={tmp_path}"])


def test_missing_data_path(tmp_path):
    msg = error_of(["data=indexed", f"data.path={tmp_path}/nothing"])
    assert "data.path" in msg and "indexed dataset files not found" in msg
    assert "the prefix of a .bin/.idx pair on this machine" in msg and "data=synthetic" in msg
    (tmp_path / "c4.bin").write_bytes(b"")
    (tmp_path / "c4.idx").write_bytes(b"")
    msg = error_of(["data=indexed", f"data.path={tmp_path}/c4.bin"])  # the file, not its prefix
    assert f"give the prefix without .bin: data.path={tmp_path}/c4" in msg
    assert "does not exist" in error_of(["data=jsonl", f"data.path={tmp_path}/none.jsonl", f"data.tokenizer={tmp_path}"])


def test_all_problems_reported_together():
    msg = error_of(["precision=fp16", "precision.bf16=true", "memory=offload", "memory.optimizer_offload_fraction=2"])
    assert "2 problems" in msg


def test_profile_start_beyond_run():
    msg = error_of(["profile.enabled=true", "profile.start_step=99", "training.train_iters=10"])
    assert "profile.start_step = 99" in msg and "1..10" in msg


def test_profile_negative_steps():
    assert "profile.steps = -1" in error_of(["profile.enabled=true", "profile.steps=-1"])


def test_memory_snapshot_needs_gpu():
    assert "needs a GPU" in error_of(["profile.memory_snapshot=true"])


def test_warmup_must_end_before_run_ends():
    msg = error_of(["training.train_iters=4", "training.lr_warmup_iters=4"])
    assert "training.lr_warmup_iters" in msg and "0..3" in msg
    check(["training.train_iters=1", "training.lr_warmup_iters=0"])


def test_warmup_past_the_run_is_what_each_backend_can_do():
    """Primus's benchmark examples run a few steps with a production warm-up. megatron asserts only that the
    warm-up ends before the decay does; TorchTitan 0.2.2 shortens the warm-up to the run (said as a warning)."""
    check(["training.train_iters=4", "training.lr_warmup_iters=10", "training.lr_decay_iters=100"])
    ctx = RunContext(device="cpu", world_size=1)
    validate(compose_cfg(["backend=torchtitan", "training.train_iters=4", "training.lr_warmup_iters=10"]), ctx,
             rules=RULES)
    [w] = [w for w in ctx.warnings if "training.lr_warmup_iters" in w.keys]
    assert "shortens it to the run" in w.rule and "below 4" in w.fix


def test_multi_node_needs_slurm(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    msg = error_of(["launcher.nnodes=2", "training.global_batch_size=8"], world=2)
    assert "launcher.nnodes = 2" in msg and "hydra/launcher=slurm" in msg
    check(["launcher.nnodes=2", "training.global_batch_size=8", "dry_run=true"], world=2)


def test_fp8_weight_cache_needs_fp8_and_the_megatron_backend():
    msg = error_of(["precision.fp8_weight_cache=true"])
    assert "precision.fp8_weight_cache" in msg and "needs precision.fp8" in msg and "precision=fp8" in msg
    assert "needs precision.fp8" in error_of(["precision.fp8_weight_cache=false"])  # off: still no fp8 to cache
    msg = error_of(["backend=torchtitan", "precision=fp8", "precision.fp8_weight_cache=true"])
    assert "megatron backend's" in msg and "backend=megatron" in msg
    check(["backend=torchtitan", "precision=fp8", "precision.fp8_weight_cache=false"])  # what it does anyway
    check(["precision=fp8", "precision.fp8_weight_cache=true"])


def test_fp8_fused_mlp_needs_fp8_and_the_megatron_backend():
    msg = error_of(["precision.fp8_fused_mlp=true"])
    assert "precision.fp8_fused_mlp" in msg and "needs precision.fp8" in msg and "precision=fp8" in msg
    check(["precision.fp8_fused_mlp=false"])  # off: nothing to fuse, nothing to refuse
    msg = error_of(["backend=torchtitan", "precision=fp8", "precision.fp8_fused_mlp=true"])
    assert "replaces megatron's MLP module" in msg and "backend=megatron" in msg
    check(["backend=torchtitan", "precision=fp8", "precision.fp8_fused_mlp=false"])
    check(["precision=fp8", "precision.fp8_fused_mlp=true"])


@pytest.mark.parametrize("key,value,least", [
    ("training.micro_batch_size", 0, 1), ("training.global_batch_size", 0, 1), ("training.seq_length", -4, 1),
    ("training.train_iters", 0, 1), ("training.lr_warmup_iters", -1, 0), ("model.num_attention_heads", 0, 1),
    ("model.hidden_size", 0, 1), ("model.num_layers", 0, 1), ("model.vocab_size", 0, 1), ("model.kv_channels", 0, 1),
    ("parallel.tensor_model_parallel_size", 0, 1), ("launcher.nproc_per_node", 0, 1), ("model.mtp_num_layers", -1, 0),
    ("checkpoint.interval", -3, 0), ("checkpoint.keep_last", -1, 0),
])
def test_counts_must_be_positive_and_are_reported_alone(key, value, least):
    """A count below its floor is named with its value; the rules that divide by it do not add noise."""
    with pytest.raises(ConfigError) as e:
        check([f"{key}={value}"])
    assert [i.keys for i in e.value.issues] == [[key]]
    msg = str(e.value)
    assert f"{key} = {value}" in msg and f"must be >= {least}" in msg and f"set {key} to {least} or more" in msg


def test_an_unset_optional_size_is_not_judged_and_its_null_is_named():
    check(["model.kv_channels=null"])
    msg = error_of(["model=debug_moe", "model.num_experts=0"])
    assert "model.num_experts = 0" in msg and "null: a dense model" in msg


def test_query_heads_must_be_a_multiple_of_kv_heads():
    msg = error_of(["model.num_attention_heads=4", "model.num_query_groups=3"])
    assert "model.num_query_groups" in msg and "'kv_heads': 3" in msg and "dividing 4" in msg
    check(["model.num_attention_heads=4", "model.num_query_groups=4"])  # MHA


def test_head_dim_must_be_whole_unless_kv_channels_is_set():
    msg = error_of(["model.hidden_size=66"])
    assert "model.hidden_size" in msg and "'hidden_size': 66" in msg and "model.kv_channels" in msg
    check(["model.hidden_size=66", "model.kv_channels=16"])


def test_loss_scaling_settings_need_fp16_and_sane_values():
    msg = error_of(["precision.loss_scale=1024"])  # bf16 (the default): a loss scale would be ignored
    assert "precision.loss_scale = 1024.0" in msg and "acts only with fp16 training" in msg and "precision=fp16" in msg
    check(["precision=fp16", "precision.loss_scale=1024"])
    check(["precision=fp16", "precision.initial_loss_scale=65536", "precision.hysteresis=1"])
    msg = error_of(["precision=fp16", "precision.loss_scale=0"])
    assert "precision.loss_scale = 0" in msg and "> 0" in msg
    msg = error_of(["precision=fp16", "precision.min_loss_scale=100", "precision.initial_loss_scale=10"])
    assert "precision.min_loss_scale" in msg and "min_loss_scale <= initial_loss_scale" in msg
    msg = error_of(["precision=fp16", "precision.loss_scale_window=0"])
    assert "precision.loss_scale_window = 0" in msg


def test_plan_settings_are_checked_before_anything_plans():
    msg = error_of(["plan.gpu=H300"])
    assert "plan.gpu = 'H300'" in msg and "H200" in msg and "plan.gpu_memory_gb" in msg
    check(["plan.gpu=h100"])  # names match case-insensitively
    check(["plan.gpu=H300", "plan.gpu_memory_gb=96"])  # an explicit size names any GPU
    assert "plan.gpu_memory_gb = 0.0" in error_of(["plan.gpu_memory_gb=0"])
    assert "plan.assumed_mfu = 1.5" in error_of(["plan.assumed_mfu=1.5"])


@pytest.mark.parametrize("overrides,key,words", [
    (["training.seed=-1"], "training.seed", "0..2^32-1"),  # numpy refused it minutes in, as a traceback
    (["training.adam_beta1=1.5"], "training.adam_beta1", "[0, 1)"),
    (["training.adam_eps=-1e-8"], "training.adam_eps", ">= 0"),
    (["training.weight_decay=-0.1"], "training.weight_decay", ">= 0"),
    (["training.clip_grad=-1"], "training.clip_grad", "0 = off"),
    (["training.init_method_std=0"], "training.init_method_std", "> 0"),
    (["model.rotary_base=0"], "model.rotary_base", "> 0"),
    (["model.norm_epsilon=-1e-5"], "model.norm_epsilon", ">= 0"),
    (["model=debug_moe", "moe.moe_aux_loss_coeff=-1"], "moe.moe_aux_loss_coeff", ">= 0"),
    (["launcher.master_port=99999"], "launcher.master_port", "1..65535"),
    (["data.num_workers=-1"], "data.num_workers", ">= 0"),
])
def test_out_of_range_values_are_named(overrides, key, words):
    msg = error_of(overrides)
    assert key in msg and words in msg, msg



# (overrides: one field set where nothing reads it, the message's parts, a valid config that sets it)
IDLE = [
    (["recompute.recompute_num_layers=2"], ["recompute.recompute_num_layers = 2", "recompute_method"],
     ["recompute=full", "recompute.recompute_method=block", "recompute.recompute_num_layers=2"]),
    (["recompute=full", "recompute.recompute_num_layers=2"], ["recompute.recompute_num_layers = 2", "uniform or block"],
     ["recompute=full", "recompute.recompute_method=uniform", "recompute.recompute_num_layers=2"]),
    (["recompute=full", "recompute.recompute_modules=[mlp]"], ["recompute.recompute_modules", "selective"],
     ["recompute=selective", "recompute.recompute_modules=[mlp]"]),
    (["precision.fp8_recipe=delayed"], ["precision.fp8_recipe = 'delayed'", "fp8 on"], ["precision=fp8_delayed"]),
    (["precision=fp8", "precision.fp8_margin=1"], ["precision.fp8_margin = 1", "delayed fp8 recipe"],
     ["precision=fp8_delayed", "precision.fp8_margin=1"]),
    (["precision.fp4_recipe=mxfp4"], ["precision.fp4_recipe = 'mxfp4'", "fp4 on"], None),
    (["memory.optimizer_offload_fraction=0.5"], ["memory.optimizer_offload_fraction = 0.5", "optimizer offload"],
     ["memory=offload", "memory.optimizer_offload_fraction=0.5"]),
    (["memory.overlap_cpu_optimizer_d2h_h2d=true"], ["memory.overlap_cpu_optimizer_d2h_h2d = True", "memory=offload"],
     ["memory=offload", "memory.overlap_cpu_optimizer_d2h_h2d=true"]),
    (["precision=fp8", "precision.num_layers_at_end_in_bf16=2"],
     ["precision.num_layers_at_end_in_bf16 = 2", "first_last_layers_bf16=true"],
     ["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_end_in_bf16=2"]),
]


@pytest.mark.parametrize("overrides,parts,valid", IDLE)
def test_a_setting_nothing_would_read_is_refused(overrides, parts, valid):
    msg = error_of(overrides)
    assert "nothing would read it" in msg and all(p in msg for p in parts), msg
    if valid:
        check(valid)


def test_architecture_fields_a_switch_leaves_behind_are_warned_not_refused():
    from primus.features import idle_settings

    cfg = check(["model=deepseek_v2_lite", "model.rope_type=rope"])  # the preset's YaRN factors stay behind
    (w,) = idle_settings(cfg)
    assert w.severity == "warning" and "model.rotary_scaling_factor" in w.keys and "rope_type=yarn" in w.rule
    (w,) = idle_settings(check(["model.kv_lora_rank=64"]))
    assert w.keys == ["model.kv_lora_rank"] and "multi_latent_attention=true" in w.rule
    # the loss A/B of docs/benchmarks.md: the fusion off on a preset that names its kernel
    (w,) = idle_settings(check(["experiment=llama3_2_1b_megatron_bf16", "model.cross_entropy_loss_fusion=false"]))
    assert w.keys == ["model.cross_entropy_fusion_impl"] and w.severity == "warning"


@pytest.mark.parametrize("overrides,keys,under", [
    (["training.eval_iters=20"], ["training.eval_iters"], "eval_interval > 0"),
    (["training.optimizer=sgd", "training.adam_beta2=0.99"], ["training.adam_beta2"], "an Adam optimizer"),
    (["training.lr_decay_style=constant", "training.min_lr=0.0"], ["training.min_lr"], "a decaying learning rate"),
    (["profile.with_stack=true", "profile.steps=3"], ["profile.steps", "profile.with_stack"], "profile.enabled=true"),
    (["profile.start_step=5"], ["profile.start_step"], "profile.memory_snapshot=true"),
    (["profile.enabled=true", "profile.memory_snapshot_steps=4"], ["profile.memory_snapshot_steps"],
     "profile.memory_snapshot=true"),
    (["logging.wandb_project=mine"], ["logging.wandb_project"], "logging.wandb=true"),
    (["tuning_stage=1", "tuning.enabled=false"], ["tuning.stage"], "PRIMUS_HIPBLASLT_TUNING=1"),
    (["turbo.enable_primus_turbo=true"], ["turbo.enable_primus_turbo"], "a Turbo feature flag"),
])
def test_leftovers_their_switch_leaves_idle_are_warned(overrides, keys, under):
    """Training, profiler, sink, tuning and Turbo settings whose switch is off: harmless, so warned and listed as
    ignored."""
    from primus.features import idle_settings

    (w,) = idle_settings(check(overrides))
    assert w.severity == "warning" and w.keys == keys and under in w.rule and "nothing would read it" in w.rule
    assert idle_settings(check(["training.eval_interval=5", "training.eval_iters=20"])) == []
    assert idle_settings(check(["profile.enabled=true", "profile.start_step=5", "profile.with_stack=true"])) == []
    assert idle_settings(check(["tuning_stage=1", "tuning.enabled=true"])) == []
    assert idle_settings(check(["turbo=megatron"])) == []


def test_the_other_backend_s_fields_are_named_once():
    from conftest import compose_dict
    from primus.run import checked

    overrides = ["backend=torchtitan", "recompute.recompute_num_layers=2"]
    with pytest.raises(ConfigError) as e:
        checked(compose_dict(overrides), overrides)
    msg = str(e.value)
    assert "(1 problem)" in msg and "megatron-core only" in msg
