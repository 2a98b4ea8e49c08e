"""Mapping of our config to TorchTitan's job config, the key check against the installed TorchTitan, and the
errors for settings TorchTitan 0.2.2 cannot honour. No training here (fast)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, compose_cfg
from primus.backends.torchtitan import args as A, flavors
from primus.backends.torchtitan.jobconfig_keys import (
    FLAVOR_KEY, UnknownTorchTitanKey, installed_version, runtime_problems, static_problems,
)
from primus.context import RunContext
from primus.features.data import JSONL_DATASET, SYNTHETIC_DATASET
from primus.features.training import NO_CLIP

TT = ["backend=torchtitan"]
GPU1 = RunContext(device="cuda", world_size=1, run_dir="/tmp/r")
CPU1 = RunContext(device="cpu", world_size=1, run_dir="/tmp/r")
needs_torchtitan = pytest.mark.skipif(installed_version() is None, reason="torchtitan not installed")


def build(overrides=(), ctx=GPU1):
    cfg = compose_cfg(TT + list(overrides))
    return A.build_args(cfg, ctx), A.capability_issues(cfg, ctx)


def keys_of(issues):
    return {k for i in issues for k in i.keys}


# ------------------------------------------------------------------------------------------- every guide key maps


@pytest.mark.parametrize("override, section, key, value", [
    ("precision.mixed_precision_param=float32", "training", "mixed_precision_param", "float32"),
    ("precision.mixed_precision_param=bfloat16", "training", "mixed_precision_param", "bfloat16"),
    ("precision.mixed_precision_reduce=float32", "training", "mixed_precision_reduce", "float32"),
    ("memory.enable_cpu_offload=true", "training", "enable_cpu_offload", True),
    ("overlap.enable_async_tensor_parallel=true", "parallelism", "enable_async_tensor_parallel", True),
    ("parallel.data_parallel_shard_degree=4", "parallelism", "data_parallel_shard_degree", 4),
    ("parallel.data_parallel_replicate_degree=2", "parallelism", "data_parallel_replicate_degree", 2),
    ("parallel.tensor_model_parallel_size=2", "parallelism", "tensor_parallel_degree", 2),
    ("parallel.pipeline_model_parallel_size=2", "parallelism", "pipeline_parallel_degree", 2),
    ("parallel.context_parallel_size=2", "parallelism", "context_parallel_degree", 2),
    ("parallel.expert_model_parallel_size=2", "parallelism", "expert_parallel_degree", 2),
    ("recompute.activation_checkpoint_mode=full", "activation_checkpoint", "mode", "full"),
    ("recompute.activation_checkpoint_mode=selective", "activation_checkpoint", "mode", "selective"),
    ("recompute.selective_ac_option=2", "activation_checkpoint", "selective_ac_option", "2"),
    ("recompute.recompute_granularity=selective", "activation_checkpoint", "mode", "selective"),
    ("recompute.recompute_granularity=full", "activation_checkpoint", "mode", "full"),
    ("training.compile=true", "compile", "enable", True),
    ("training.seq_length=256", "training", "seq_len", 256),
    ("training.train_iters=7", "training", "steps", 7),
    ("training.micro_batch_size=2", "training", "local_batch_size", 2),
    ("training.global_batch_size=16", "training", "global_batch_size", 16),
    ("training.clip_grad=0.5", "training", "max_norm", 0.5),
    ("training.clip_grad=0", "training", "max_norm", NO_CLIP),
    ("training.lr=1e-4", "optimizer", "lr", 1e-4),
    ("training.weight_decay=0.01", "optimizer", "weight_decay", 0.01),
    ("training.adam_beta2=0.99", "optimizer", "beta2", 0.99),
    ("training.adam_eps=1e-6", "optimizer", "eps", 1e-6),
    ("training.lr_warmup_iters=3", "lr_scheduler", "warmup_steps", 3),
    ("training.lr_decay_style=linear", "lr_scheduler", "decay_type", "linear"),
    ("training.lr_decay_style=constant", "lr_scheduler", "min_lr_factor", 1.0),
    ("training.seed=7", "debug", "seed", 7),
    ("training.deterministic=true", "debug", "deterministic", True),
    ("data.num_workers=2", "training", "dataloader", {"num_workers": 2}),
])
def test_field_maps(override, section, key, value):
    args, _ = build([override])
    assert args[section][key] == value


def test_ac_is_off_unless_asked():
    args, _ = build()
    assert args["activation_checkpoint"]["mode"] == "none"  # TorchTitan's own default would be selective


def test_lr_schedule_min_lr_factor():
    args, _ = build(["training.lr=1e-3", "training.min_lr=1e-4", "training.lr_decay_style=cosine"])
    assert args["lr_scheduler"] == {"warmup_steps": args["lr_scheduler"]["warmup_steps"], "decay_type": "cosine",
                                    "min_lr_factor": pytest.approx(0.1)}


def test_adam_and_adamw_both_decoupled():
    for opt in ("adam", "adamw"):
        assert build([f"training.optimizer={opt}"])[0]["optimizer"]["name"] == "AdamW"


def test_fused_adamw_on_gpu_foreach_on_cpu():
    assert build(ctx=GPU1)[0]["optimizer"]["implementation"] == "fused"
    assert build(ctx=CPU1)[0]["optimizer"]["implementation"] == "foreach"


def test_pipeline_batches():
    ctx = RunContext(device="cuda", world_size=4, run_dir="/tmp/r")
    args, _ = build(["parallel=pp2", "training.micro_batch_size=2", "training.global_batch_size=16"], ctx)
    t, p = args["training"], args["parallelism"]
    # dp = 4 / pp 2 = 2: each dp rank pushes 8 sequences through the pipeline as microbatches of 2
    assert (t["local_batch_size"], t["global_batch_size"], p["pipeline_parallel_microbatch_size"]) == (8, 16, 2)
    args, _ = build(["parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"], ctx)
    assert args["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert args["parallelism"]["pipeline_parallel_layers_per_stage"] == 1  # debug: 4 layers / (2 x 2)


def test_float8_tensorwise():
    args, issues = build(["precision=fp8_tensorwise", "precision.float8_enable_fsdp_float8_all_gather=true",
                          "precision.float8_precompute_float8_dynamic_scale_for_fsdp=true",
                          "precision.float8_filter_fqns=[output,layers.0.attention.wq]"])
    assert args["model"]["converters"] == ["quantize.linear.float8"]
    f8 = args["quantize"]["linear"]["float8"]
    assert "recipe_name" not in f8  # torchao's default config is tensorwise and the only one with fp8 all-gather
    assert f8 == {"filter_fqns": ["output", "layers.0.attention.wq"], "enable_fsdp_float8_all_gather": True,
                  "precompute_float8_dynamic_scale_for_fsdp": True}
    assert not issues


def test_float8_rowwise():
    args, issues = build(["precision=fp8_rowwise"])
    assert args["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"], "recipe_name": "rowwise"}
    assert not issues
    _, issues = build(["precision=fp8_rowwise", "precision.float8_enable_fsdp_float8_all_gather=true"])
    assert "precision.float8_enable_fsdp_float8_all_gather" in keys_of(issues)


def test_no_float8_without_fp8():
    args, issues = build()
    assert args["model"]["converters"] == [] and "quantize" not in args and not issues
    _, issues = build(["precision.float8_enable_fsdp_float8_all_gather=true"])
    assert "precision.float8_enable_fsdp_float8_all_gather" in keys_of(issues)


def test_jsonl_data_and_local_tokenizer(tmp_path):
    args, issues = build(["data=jsonl", f"data.path={tmp_path}/d", f"data.tokenizer={tmp_path}/tok"])
    assert args["training"]["dataset"] == JSONL_DATASET
    assert args["training"]["dataset_path"] == f"{tmp_path}/d"
    assert args["model"]["hf_assets_path"] == f"{tmp_path}/tok"
    assert build()[0]["training"]["dataset"] == SYNTHETIC_DATASET


# ------------------------------------------------------------------------------------------- models and flavors


DENSE = ["debug", "llama3_2_1b", "llama3_8b", "llama3_70b", "llama2_7b"]


@pytest.mark.parametrize("preset", DENSE)
def test_dense_presets_are_llama3_flavors_with_exact_ffn(preset):
    cfg = compose_cfg(TT + [f"model={preset}"])
    args = A.build_args(cfg, GPU1)
    fa = args[FLAVOR_KEY]
    m = cfg.model
    assert args["model"]["name"] == flavors.LLAMA3 and args["model"]["flavor"].startswith(preset + "-")
    assert (fa["dim"], fa["n_layers"], fa["n_heads"], fa["n_kv_heads"], fa["vocab_size"]) == (
        m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups, m.vocab_size)
    assert (fa["rope_theta"], fa["norm_eps"]) == (m.rotary_base, m.norm_epsilon)
    assert fa["rope_scaling_args"]["scaling_factor"] == 1.0  # plain RoPE
    assert flavors.llama3_ffn_hidden(fa["dim"], fa["multiple_of"], fa["ffn_dim_multiplier"]) == m.ffn_hidden_size
    assert fa["tie_word_embeddings"] == (preset == "llama3_2_1b")


@pytest.mark.parametrize("dim, ffn", [(128, 384), (2048, 8192), (4096, 14336), (8192, 28672), (4096, 11008),
                                      (4096, 4096), (1000, 700), (768, 2048), (5120, 13824)])
def test_llama3_ffn_exact_for_any_width(dim, ffn):
    a = flavors.llama3_ffn_args(dim, ffn)
    assert flavors.llama3_ffn_hidden(dim, a["multiple_of"], a["ffn_dim_multiplier"]) == ffn


def test_flavor_name_changes_with_shape():
    a = A.build_args(compose_cfg(TT), GPU1)["model"]["flavor"]
    b = A.build_args(compose_cfg(TT + ["model.num_layers=2"]), GPU1)["model"]["flavor"]
    assert a != b


def test_qwen3_moe_preset():
    cfg = compose_cfg(TT + ["model=qwen3_30b_a3b", "moe.moe_router_load_balancing_type=none"])
    args, issues = A.build_args(cfg, GPU1), A.capability_issues(cfg, GPU1)
    fa = args[FLAVOR_KEY]
    assert args["model"]["name"] == flavors.QWEN3 and not issues
    assert (fa["head_dim"], fa["qk_norm"], fa["moe_enabled"], fa["moe_inter_dim"]) == (128, True, True, 768)
    assert fa["moe_args"]["num_experts"] == 128 and fa["moe_args"]["top_k"] == 8
    assert fa["moe_args"]["num_shared_experts"] == 0 and fa["moe_args"]["route_norm"] is True


def test_mixtral_is_qwen3_moe_without_qk_norm():
    cfg = compose_cfg(TT + ["model=mixtral_8x7b", "moe.moe_router_load_balancing_type=none"])
    args = A.build_args(cfg, GPU1)
    assert args["model"]["name"] == flavors.QWEN3
    assert args[FLAVOR_KEY]["qk_norm"] is False and args[FLAVOR_KEY]["hidden_dim"] == 14336


def test_deepseek_is_deepseek_v3():
    cfg = compose_cfg(TT + ["model=deepseek_v2_lite", "moe.moe_router_load_balancing_type=none"])
    args, issues = A.build_args(cfg, GPU1), A.capability_issues(cfg, GPU1)
    fa = args[FLAVOR_KEY]
    assert args["model"]["name"] == flavors.DEEPSEEK_V3 and not issues
    assert (fa["n_dense_layers"], fa["inter_dim"], fa["moe_inter_dim"], fa["kv_lora_rank"]) == (1, 10944, 1408, 512)
    assert fa["moe_args"]["num_shared_experts"] == 2 and fa["moe_args"]["top_k"] == 6
    assert fa["original_seq_len"] >= cfg.training.seq_length  # no YaRN: plain RoPE as configured


def test_moe_loss_based_balancing_is_an_error_not_dropped():
    for lb in ("aux_loss", "seq_aux_loss", "sinkhorn"):
        issues = A.capability_issues(compose_cfg(TT + ["model=deepseek_v2_lite",
                                                       f"moe.moe_router_load_balancing_type={lb}"]), GPU1)
        assert "moe.moe_router_load_balancing_type" in keys_of(issues)


def test_moe_shapes_torchtitan_cannot_build():
    issues = A.capability_issues(compose_cfg(TT + ["model=qwen3_30b_a3b", "moe.moe_router_load_balancing_type=none",
                                                   "model.moe_first_k_dense=1"]), GPU1)
    assert "model.moe_first_k_dense" in keys_of(issues)
    issues = A.capability_issues(compose_cfg(TT + ["model=debug_moe", "moe.moe_router_load_balancing_type=none",
                                                   "model.moe_shared_expert_intermediate_size=192"]), GPU1)
    assert "model.moe_shared_expert_intermediate_size" in keys_of(issues)


# ------------------------------------------------------------------------------------------- what cannot be honoured


@pytest.mark.parametrize("override, key", [
    ("recompute.recompute_method=uniform", "recompute.recompute_method"),
    ("recompute.recompute_num_layers=2", "recompute.recompute_num_layers"),
    ("recompute.recompute_layer_ids=[0]", "recompute.recompute_layer_ids"),
    ("recompute.recompute_modules=[mlp]", "recompute.recompute_modules"),
    ("overlap.overlap_p2p_comm=true", "overlap.overlap_p2p_comm"),
    ("overlap.overlap_grad_reduce=true", "overlap.overlap_grad_reduce"),
    ("overlap.overlap_param_gather=true", "overlap.overlap_param_gather"),
    ("overlap.async_tensor_model_parallel_allreduce=true", "overlap.async_tensor_model_parallel_allreduce"),
    ("overlap.bucket_size=1000", "overlap.bucket_size"),
    ("memory.use_distributed_optimizer=true", "memory.use_distributed_optimizer"),
    ("memory.optimizer_cpu_offload=true", "memory.optimizer_cpu_offload"),
    ("memory.empty_unused_memory_level=1", "memory.empty_unused_memory_level"),
    ("precision.first_last_layers_bf16=true", "precision.first_last_layers_bf16"),
    ("precision.fp16=true", "precision.fp16"),
    ("precision.mixed_precision_reduce=bfloat16", "precision.mixed_precision_reduce"),
    ("precision.mixed_precision_param=float16", "precision.mixed_precision_param"),
    ("precision.bf16=false", "precision.bf16"),
    ("precision=fp8_blockwise", "precision.fp8_recipe"),
    ("precision=fp8_delayed", "precision.fp8_recipe"),
    ("precision=fp8_tensorwise precision.fp8=e4m3", "precision.fp8"),
    ("precision=fp8_rowwise precision.fp8=hybrid", "precision.fp8"),
    ("training.optimizer=sgd", "training.optimizer"),
    ("training.init_method_std=0.01", "training.init_method_std"),
    ("model.cross_entropy_loss_fusion=true", "model.cross_entropy_loss_fusion"),
    ("model.mtp_num_layers=1", "model.mtp_num_layers"),
    ("parallel=tp2 parallel.sequence_parallel=false", "parallel.sequence_parallel"),
    ("overlap.enable_async_tensor_parallel=true", "overlap.enable_async_tensor_parallel"),
    ("parallel=tp2 parallel.sequence_parallel=true overlap.enable_async_tensor_parallel=true",
     "overlap.enable_async_tensor_parallel"),
    ("parallel.context_parallel_size=2 training.seq_length=130", "training.seq_length"),
    ("precision=fp8 parallel=tp2 parallel.sequence_parallel=true", "precision.fp8"),
    ("parallel=ep2", "parallel.expert_model_parallel_size"),
    ("recompute.activation_checkpoint_mode=selective recompute.selective_ac_option=every",
     "recompute.selective_ac_option"),
])
def test_unhonoured_setting_is_an_issue(override, key):
    _, issues = build(override.split())
    assert key in keys_of(issues), [str(i) for i in issues]


def test_defaults_and_presets_have_no_issues():
    four = RunContext(device="cuda", world_size=4, run_dir="/tmp/r")
    for over in ([], ["recompute=selective"], ["model=llama3_8b"], ["precision=fp8"],
                 ["parallel=tp2", "parallel.sequence_parallel=true"],
                 ["parallel=tp2", "parallel.sequence_parallel=true", "overlap.enable_async_tensor_parallel=true",
                  "training.compile=true"]):
        _, issues = build(over, four)
        assert not issues, (over, [str(i) for i in issues])


def test_cpu_only_limits():
    _, issues = build(["precision=fp8", "device=cpu"], CPU1)
    assert "precision.fp8" in keys_of(issues)
    _, issues = build(["memory.enable_cpu_offload=true", "device=cpu"], CPU1)
    assert "memory.enable_cpu_offload" in keys_of(issues)


def test_bf16_with_tp_or_pp_needs_fsdp():
    sp = ["parallel.sequence_parallel=true"]
    two, four = (RunContext(device="cuda", world_size=n, run_dir="/tmp/r") for n in (2, 4))
    for over, ctx, bad in ((["parallel=tp2"] + sp, two, True), (["parallel=pp2"], two, True),
                           (["parallel=tp2"] + sp, four, False),  # dp_shard -1 -> 2: FSDP applies bf16
                           (["parallel=tp2"] + sp + FP32_PARAMS, two, False)):
        _, issues = build(over, ctx)
        assert ("precision.mixed_precision_param" in keys_of(issues)) == bad, over


FP32_PARAMS = ["precision.bf16=false", "precision.mixed_precision_param=float32"]


def test_tied_llama_with_tp_is_an_issue():
    _, issues = build(["model=llama3_2_1b", "parallel=tp2", "parallel.sequence_parallel=true"])
    assert "model.tie_word_embeddings" in keys_of(issues)


def test_registry_routes_to_this_backend():
    from primus.backends import backend_args, capability_issues

    cfg = compose_cfg(TT + ["precision.fp16=true"])
    assert backend_args(cfg, GPU1)["model"]["name"] == flavors.LLAMA3
    assert "precision.fp16" in keys_of(capability_issues(cfg, GPU1))


# ------------------------------------------------------------------------------------------- keys vs installed TorchTitan


ALL_PRESETS = [["model=" + p] for p in DENSE] + [
    ["model=qwen3_30b_a3b", "moe.moe_router_load_balancing_type=none"],
    ["model=deepseek_v2_lite", "moe.moe_router_load_balancing_type=none"],
    ["precision=fp8_tensorwise", "precision.float8_enable_fsdp_float8_all_gather=true"],
    ["precision=fp8_rowwise"], ["precision=mxfp8"], ["parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"],
]


@needs_torchtitan
@pytest.mark.parametrize("over", ALL_PRESETS)
def test_every_key_we_set_exists_in_installed_torchtitan(over):
    args = A.build_args(compose_cfg(TT + over), GPU1)
    assert static_problems(args) == []
    assert runtime_problems(args) == []


@needs_torchtitan
def test_unknown_or_renamed_key_is_reported_with_version():
    args = A.build_args(compose_cfg(TT), GPU1)
    args["training"]["mixed_precision_params"] = "bfloat16"  # a typo / rename
    args["activation_checkpoint"]["mode"] = "offload"  # not one of its Literal choices
    args["float8"] = {"recipe_name": "rowwise"}  # a section that moved under quantize.linear
    for problems in (static_problems(args), runtime_problems(args)):
        text = "\n".join(problems)
        assert "training.mixed_precision_params" in text
        assert "activation_checkpoint.mode: 'offload'" in text
        assert "float8: not a field" in text
    err = UnknownTorchTitanKey(static_problems(args))
    assert "torchtitan 0.2.2" in str(err) and "training.mixed_precision_params" in str(err)


@needs_torchtitan
def test_static_check_matches_the_dataclasses():
    """The text-level reading of job_config.py sees the same fields as the imported dataclasses."""
    import dataclasses

    from primus.backends.torchtitan.jobconfig_keys import _static_classes
    from torchtitan.config import job_config as jc

    classes = _static_classes()
    for name, fields in classes.items():
        cls = getattr(jc, name, None)
        if dataclasses.is_dataclass(cls):
            assert set(fields) == {f.name for f in dataclasses.fields(cls)}, name


@needs_torchtitan
def test_toml_round_trip_through_torchtitan_config_manager(tmp_path):
    from primus.backends.torchtitan.trainer import to_toml
    from torchtitan.config import ConfigManager

    args = A.build_args(compose_cfg(TT + ["precision=fp8_tensorwise", "training.clip_grad=0",
                                          "recompute.selective_ac_option=2"]), GPU1)
    job = {k: v for k, v in args.items() if k != FLAVOR_KEY}
    path = tmp_path / "job.toml"
    path.write_text(to_toml(job))
    jc = ConfigManager().parse_args(["--job.config_file", str(path)])
    for section, values in job.items():
        obj = getattr(jc, section)
        _assert_same(obj, values, section)


def _assert_same(obj, values, where):
    for k, v in values.items():
        got = getattr(obj, k)
        if isinstance(v, dict):
            _assert_same(got, v, f"{where}.{k}")
        else:
            assert got == v, f"{where}.{k}: {got!r} != {v!r}"


@pytest.mark.e2e
def test_build_args_is_fast_and_imports_no_torch():
    code = ("import sys, time; t = time.time(); sys.path.insert(0, 'tests'); from conftest import compose_cfg; "
            "from primus.backends.torchtitan.args import build_args, capability_issues; "
            "from primus.context import RunContext; c = compose_cfg(['backend=torchtitan']); "
            "ctx = RunContext(device='cpu', world_size=1); build_args(c, ctx); capability_issues(c, ctx); "
            "import json; print(json.dumps({'torch': 'torch' in sys.modules, 's': time.time() - t}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["torch"] is False and res["s"] < 3.0, res


def test_build_args_is_json(tmp_path):
    for over in ALL_PRESETS:
        json.dumps(A.build_args(compose_cfg(TT + over), GPU1), allow_nan=False)
