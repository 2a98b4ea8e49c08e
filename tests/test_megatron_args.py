"""Mapping tests: every config field reaches the megatron-core object it should, with the right value."""
import json
import subprocess
import sys
import types

import pytest

from conftest import compose_cfg as compose
from primus.backends.megatron import args as margs
from primus.context import RunContext

CPU = RunContext(device="cpu", world_size=1)
GPU8 = RunContext(device="cuda", world_size=8)


def build(*overrides, ctx=CPU):
    return margs.build_args(compose(overrides), ctx)


@pytest.mark.e2e
def test_args_module_is_light_and_json():
    """Dry runs must stay fast: the mapping imports neither megatron nor torch."""
    code = ("import sys, json; from primus.backends.megatron.testing import compose; "
            "from primus.backends.megatron.args import build_args; from primus.context import RunContext; "
            "a = build_args(compose(['model=llama3_8b', 'precision=fp8']), RunContext(device='cuda', world_size=8)); "
            "json.dumps(a); "
            "assert not any(m == 'torch' or m.startswith('megatron') for m in sys.modules), "
            "[m for m in sys.modules if m.startswith(('torch', 'megatron'))][:5]")
    subprocess.run([sys.executable, "-c", code], check=True)


# (overrides, section, megatron keyword, expected value)
CASES = [
    (["model=llama3_2_1b"], "transformer_config", "num_layers", 16),
    (["model=llama3_2_1b"], "transformer_config", "hidden_size", 2048),
    (["model=llama3_2_1b"], "transformer_config", "ffn_hidden_size", 8192),
    (["model=llama3_2_1b"], "transformer_config", "num_attention_heads", 32),
    (["model=llama3_2_1b"], "transformer_config", "num_query_groups", 8),
    (["model=qwen3_30b_a3b"], "transformer_config", "kv_channels", 128),
    (["model=qwen3_30b_a3b"], "transformer_config", "qk_layernorm", True),
    (["model.norm_epsilon=1e-6"], "transformer_config", "layernorm_epsilon", 1e-6),
    (["training.init_method_std=0.01"], "transformer_config", "init_method_std", 0.01),
    (["model.cross_entropy_loss_fusion=true"], "transformer_config", "cross_entropy_loss_fusion", True),
    (["model.cross_entropy_fusion_impl=te"], "transformer_config", "cross_entropy_fusion_impl", "te"),
    # impl=turbo: megatron computes its plain loss, which perf.turbo_loss replaces (megatron knows native / te only)
    (["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=turbo"], "transformer_config",
     "cross_entropy_loss_fusion", False),
    (["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=turbo"], "transformer_config",
     "cross_entropy_fusion_impl", "native"),
    (["precision=bf16"], "transformer_config", "params_dtype", "bfloat16"),
    (["precision=fp16"], "transformer_config", "fp16", True),
    (["precision=fp16"], "transformer_config", "bf16", False),
    (["precision.bf16=false"], "transformer_config", "params_dtype", "float32"),
    (["precision=fp8"], "transformer_config", "fp8", "hybrid"),
    (["precision=fp8"], "transformer_config", "fp8_recipe", "tensorwise"),
    (["precision=fp8_delayed", "precision.fp8_margin=1"], "transformer_config", "fp8_margin", 1),
    (["precision=fp8_delayed", "precision.fp8_interval=2"], "transformer_config", "fp8_interval", 2),
    (["precision=fp8_delayed", "precision.fp8_amax_history_len=16"], "transformer_config", "fp8_amax_history_len", 16),
    (["precision=fp8_delayed", "precision.fp8_amax_compute_algo=most_recent"], "transformer_config",
     "fp8_amax_compute_algo", "most_recent"),
    (["precision=fp8", "precision.first_last_layers_bf16=true"], "transformer_config", "first_last_layers_bf16", True),
    (["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_start_in_bf16=2"],
     "transformer_config", "num_layers_at_start_in_bf16", 2),
    (["precision=fp8", "precision.num_layers_at_end_in_bf16=3"], "transformer_config", "num_layers_at_end_in_bf16", 3),
    (["precision=fp4"], "transformer_config", "fp4", "e2m1"),
    (["precision=fp4"], "transformer_config", "fp4_recipe", "nvfp4"),
    (["recompute=selective"], "transformer_config", "recompute_granularity", "selective"),
    (["recompute=selective", "recompute.recompute_modules=[core_attn,mlp]"], "transformer_config",
     "recompute_modules", ["core_attn", "mlp"]),
    (["recompute=full", "recompute.recompute_method=block", "recompute.recompute_num_layers=2"],
     "transformer_config", "recompute_method", "block"),
    (["recompute=full", "recompute.recompute_method=block", "recompute.recompute_num_layers=2"],
     "transformer_config", "recompute_num_layers", 2),
    (["parallel.tensor_model_parallel_size=2"], "transformer_config", "tensor_model_parallel_size", 2),
    (["parallel.pipeline_model_parallel_size=2"], "transformer_config", "pipeline_model_parallel_size", 2),
    (["parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2"],
     "transformer_config", "virtual_pipeline_model_parallel_size", 2),
    (["parallel.context_parallel_size=2"], "transformer_config", "context_parallel_size", 2),
    (["parallel.sequence_parallel=true", "parallel.tensor_model_parallel_size=2"], "transformer_config",
     "sequence_parallel", True),
    (["overlap.overlap_p2p_comm=true"], "transformer_config", "overlap_p2p_comm", True),
    (["overlap.overlap_p2p_comm=true"], "transformer_config", "batch_p2p_comm", False),
    (["training.deterministic=true"], "transformer_config", "deterministic_mode", True),
    # MoE
    (["model=debug_moe"], "transformer_config", "num_moe_experts", 8),
    (["model=debug_moe", "model.moe_router_topk=3"], "transformer_config", "moe_router_topk", 3),
    (["model=debug_moe"], "transformer_config", "moe_ffn_hidden_size", 128),
    (["model=debug_moe"], "transformer_config", "moe_shared_expert_intermediate_size", 128),
    (["model=debug_moe", "model.moe_first_k_dense=1"], "transformer_config", "moe_layer_freq", [0, 1, 1, 1]),
    (["model=debug_moe", "moe.moe_aux_loss_coeff=0.05"], "transformer_config", "moe_aux_loss_coeff", 0.05),
    (["model=debug_moe", "moe.moe_z_loss_coeff=0.001"], "transformer_config", "moe_z_loss_coeff", 0.001),
    (["model=debug_moe", "moe.moe_router_score_function=sigmoid"], "transformer_config",
     "moe_router_score_function", "sigmoid"),
    (["model=debug_moe", "moe.moe_router_pre_softmax=true"], "transformer_config", "moe_router_pre_softmax", True),
    (["model=debug_moe", "moe.moe_router_load_balancing_type=seq_aux_loss"], "transformer_config",
     "moe_router_load_balancing_type", "seq_aux_loss"),
    (["model=debug_moe", "moe=optimized"], "transformer_config", "moe_grouped_gemm", True),
    # megatron's own permute fusion is TE's; without TE turbo.py's Triton permute serves the flag
    (["model=debug_moe", "moe=optimized"], "transformer_config", "moe_permute_fusion", margs.te_available()),
    (["model=debug_moe", "moe=optimized"], "turbo", "moe_permute_fusion", True),
    (["model=debug_moe", "moe.moe_token_dispatcher_type=allgather"], "transformer_config",
     "moe_token_dispatcher_type", "allgather"),
    (["model=debug_moe", "moe.overlap_moe_expert_parallel_comm=true"], "transformer_config",
     "overlap_moe_expert_parallel_comm", True),
    (["model=deepseek_v2_lite"], "transformer_config", "multi_latent_attention", True),
    (["model=deepseek_v2_lite"], "transformer_config", "kv_lora_rank", 512),
    (["model=deepseek_v2_lite"], "transformer_config", "qk_pos_emb_head_dim", 64),
    (["model=deepseek_v2_lite"], "transformer_config", "moe_layer_freq", [0] + [1] * 26),
    # GPTModel
    (["model=llama3_2_1b"], "gpt_model", "share_embeddings_and_output_weights", True),
    (["model=llama3_2_1b"], "gpt_model", "rotary_base", 500000),
    (["model.vocab_size=2000"], "gpt_model", "vocab_size", 2048),
    (["model.vocab_size=2000", "parallel.tensor_model_parallel_size=2"], "gpt_model", "vocab_size", 2048),
    (["model.vocab_size=2049"], "gpt_model", "vocab_size", 2176),
    (["training.seq_length=256"], "gpt_model", "max_sequence_length", 256),
    # DDP
    (["overlap.overlap_grad_reduce=true"], "ddp_config", "overlap_grad_reduce", True),
    (["overlap.overlap_param_gather=true", "memory=distributed_optimizer"], "ddp_config", "overlap_param_gather", True),
    (["overlap.align_param_gather=true"], "ddp_config", "align_param_gather", True),
    (["overlap.bucket_size=1000000"], "ddp_config", "bucket_size", 1000000),
    (["memory=distributed_optimizer"], "ddp_config", "use_distributed_optimizer", True),
    # optimizer
    (["memory=distributed_optimizer"], "optimizer_config", "use_distributed_optimizer", True),
    (["memory=offload"], "optimizer_config", "optimizer_cpu_offload", True),
    (["memory=offload", "memory.optimizer_offload_fraction=0.5"], "optimizer_config", "optimizer_offload_fraction", 0.5),
    (["memory=offload", "memory.overlap_cpu_optimizer_d2h_h2d=true"], "optimizer_config",
     "overlap_cpu_optimizer_d2h_h2d", True),
    (["memory=offload", "memory.use_precision_aware_optimizer=true"], "optimizer_config",
     "use_precision_aware_optimizer", True),
    (["overlap.overlap_param_gather=true", "memory=distributed_optimizer"], "optimizer_config",
     "overlap_param_gather", True),
    (["training.optimizer=adam"], "optimizer_config", "optimizer", "adam"),
    (["training.optimizer=adamw"], "optimizer_config", "decoupled_weight_decay", True),
    (["training.optimizer=sgd"], "optimizer_config", "optimizer", "sgd"),
    (["training.lr=0.01"], "optimizer_config", "lr", 0.01),
    (["training.min_lr=0.0001"], "optimizer_config", "min_lr", 0.0001),
    (["training.weight_decay=0.2"], "optimizer_config", "weight_decay", 0.2),
    (["training.adam_beta1=0.8"], "optimizer_config", "adam_beta1", 0.8),
    (["training.adam_beta2=0.99"], "optimizer_config", "adam_beta2", 0.99),
    (["training.adam_eps=1e-6"], "optimizer_config", "adam_eps", 1e-6),
    (["training.clip_grad=0.5"], "optimizer_config", "clip_grad", 0.5),
    (["precision=fp16"], "optimizer_config", "fp16", True),
    (["precision=fp16"], "optimizer_config", "initial_loss_scale", 2.0 ** 32),  # megatron's default, dynamic
    (["precision=fp16"], "optimizer_config", "loss_scale", None),
    (["precision=fp16", "precision.loss_scale=512"], "optimizer_config", "loss_scale", 512.0),
    (["precision=fp16", "precision.initial_loss_scale=65536"], "optimizer_config", "initial_loss_scale", 65536.0),
    (["precision=fp16", "precision.min_loss_scale=2"], "optimizer_config", "min_loss_scale", 2.0),
    (["precision=fp16", "precision.loss_scale_window=200"], "optimizer_config", "loss_scale_window", 200),
    (["precision=fp16", "precision.hysteresis=1"], "optimizer_config", "hysteresis", 1),
    # scheduler
    (["training.lr=0.01"], "scheduler", "max_lr", 0.01),
    (["training.min_lr=0.0001"], "scheduler", "min_lr", 0.0001),
    (["training.lr_warmup_iters=7"], "scheduler", "lr_warmup_steps", 7),
    (["training.train_iters=50"], "scheduler", "lr_decay_steps", 50),
    (["training.lr_decay_style=linear"], "scheduler", "lr_decay_style", "linear"),
    (["training.weight_decay=0.2"], "scheduler", "start_wd", 0.2),
    # parallel state, schedule, memory, data
    (["parallel.expert_model_parallel_size=2", "model=debug_moe"], "parallel_state", "expert_model_parallel_size", 2),
    (["parallel.pipeline_model_parallel_size=2"], "schedule", "forward_backward_func", "1f1b"),
    (["parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2"], "schedule",
     "forward_backward_func", "interleaved_1f1b"),
    (["training.global_batch_size=32", "training.micro_batch_size=2"], "schedule", "num_microbatches", 16),
    (["overlap.align_grad_reduce=false"], "schedule", "align_grad_reduce", False),
    (["memory.empty_unused_memory_level=2"], None, "empty_unused_memory_level", 2),
    (["recompute=layer_ids", "recompute.recompute_layer_ids=[1,3]"], None, "recompute_layer_ids", [1, 3]),
    (["training.seed=7"], "data", "seed", 7),
    (["training.train_iters=10", "training.global_batch_size=16"], "data", "num_samples", 160),
]


@pytest.mark.parametrize("overrides,section,key,expected", CASES, ids=lambda v: str(v) if not isinstance(v, list) else None)
def test_config_field_maps_to_megatron_keyword(overrides, section, key, expected):
    a = build(*overrides)
    got = (a[section] if section else a)[key]
    assert got == expected


def test_dp_and_microbatches_follow_world_size():
    a = build("training.global_batch_size=64", "training.micro_batch_size=2", "parallel.tensor_model_parallel_size=2",
              ctx=GPU8)
    assert a["data_parallel_size"] == 4
    assert a["schedule"]["num_microbatches"] == 8


@pytest.mark.parametrize("overrides,on", [
    (["precision=bf16", "training.global_batch_size=16", "training.micro_batch_size=2"], False),  # no fp8 linears
    (["precision=fp8", "training.global_batch_size=2", "training.micro_batch_size=2"], False),  # one forward a step
    (["precision=fp8", "training.global_batch_size=4", "training.micro_batch_size=2"], True),  # two micro batches
    (["precision=fp8", "training.global_batch_size=2", "training.micro_batch_size=2", "recompute=full"], True),
    (["precision=fp8", "training.global_batch_size=2", "training.micro_batch_size=2", "recompute=selective"], False),
    (["precision=fp8", "training.global_batch_size=2", "training.micro_batch_size=2", "recompute=selective",
      "recompute.recompute_modules=[core_attn,mlp]"], True),  # the mlp's linears are replayed
    (["precision=fp8", "training.global_batch_size=2", "training.micro_batch_size=2",
      "precision.fp8_weight_cache=true"], True),
    (["precision=fp8", "training.global_batch_size=4", "training.micro_batch_size=2",
      "precision.fp8_weight_cache=false"], False),
])
def test_fp8_weight_cache_resolution(monkeypatch, overrides, on):
    """null: on when a step runs a linear's forward more than once (micro batches, recompute replaying linears);
    an explicit value is the answer; never on without the portable fp8 linears."""
    monkeypatch.setattr(margs, "te_available", lambda: False)
    assert build("backend.layer_spec=auto", *overrides)["fp8_weight_cache"] is on


def test_fp8_weight_cache_off_under_te_is_an_issue(monkeypatch):
    monkeypatch.setattr(margs, "te_available", lambda: True)
    cfg = compose(["precision=fp8", "precision.fp8_weight_cache=false"])
    assert margs.build_args(cfg, GPU8)["fp8_weight_cache"] is False  # TE's linears: not this switch's
    issues = [i for i in margs.capability_issues(cfg, GPU8) if "precision.fp8_weight_cache" in i.keys]
    assert len(issues) == 1 and "Transformer Engine" in issues[0].rule and "layer_spec=local" in issues[0].fix
    on = compose(["precision=fp8", "precision.fp8_weight_cache=true"])
    assert not [i for i in margs.capability_issues(on, GPU8) if "precision.fp8_weight_cache" in i.keys]


@pytest.mark.parametrize("overrides,on", [
    (["precision=fp8"], True),  # portable tensorwise, primus' Triton SwiGLU on the GPU
    (["precision=bf16"], False),
    (["precision=fp8", "precision.fp8_fused_mlp=false"], False),
    (["precision=fp8", "precision.fp8_recipe=rowwise"], False),  # no amax pass to fuse
    (["precision=fp8_delayed"], False),
    (["precision=fp8", "model.bias_activation_fusion=false"], False),  # the user's unfused activation stays
    (["precision=fp8", "turbo=megatron", "turbo.use_turbo_parallel_linear=true"], False),
])
def test_fp8_fused_mlp_resolution(monkeypatch, overrides, on):
    """null: wherever fused_mlp_blockers finds nothing in the way; false: off."""
    monkeypatch.setattr(margs, "te_available", lambda: False)
    assert build("backend.layer_spec=auto", *overrides, ctx=GPU8)["fp8_fused_mlp"] is on


@pytest.mark.parametrize("overrides,key,words", [
    (["precision.fp8_recipe=blockwise"], "precision.fp8_recipe", "no amax pass"),
    (["model.bias_activation_fusion=false"], "model.bias_activation_fusion", "Triton SwiGLU"),
    (["turbo=megatron", "turbo.use_turbo_parallel_linear=true"], "turbo.use_turbo_parallel_linear",
     "turbo parallel linears"),
])
def test_fp8_fused_mlp_true_where_it_cannot_apply_is_an_issue(monkeypatch, overrides, key, words):
    monkeypatch.setattr(margs, "te_available", lambda: False)
    cfg = compose(["precision=fp8", "precision.fp8_fused_mlp=true", *overrides])
    found = [i for i in margs.capability_issues(cfg, GPU8) if "precision.fp8_fused_mlp" in i.keys]
    assert len(found) == 1 and key in found[0].keys and words in found[0].rule, found
    assert not [i for i in margs.capability_issues(compose(["precision=fp8", "precision.fp8_fused_mlp=true"]), GPU8)
                if "precision.fp8_fused_mlp" in i.keys]


def test_fp8_fused_mlp_under_te_is_an_issue(monkeypatch):
    monkeypatch.setattr(margs, "te_available", lambda: True)
    cfg = compose(["precision=fp8", "precision.fp8_fused_mlp=true"])
    assert margs.build_args(cfg, GPU8)["fp8_fused_mlp"] is False
    found = [i for i in margs.capability_issues(cfg, GPU8) if "precision.fp8_fused_mlp" in i.keys]
    assert len(found) == 1 and "Transformer Engine" in found[0].rule and "layer_spec=local" in found[0].fix


def test_single_connection_env_only_when_an_overlap_needs_it():
    assert build(ctx=GPU8)["env"] == {}
    assert build("overlap.overlap_grad_reduce=true", ctx=GPU8)["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert build("parallel.tensor_model_parallel_size=2", "overlap.async_tensor_model_parallel_allreduce=true",
                 ctx=GPU8)["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert build("overlap.overlap_grad_reduce=true")["env"] == {}  # CPU: no CUDA connections to limit


# ------------------------------------------------------------------------------------------------------------------
# args -> the real megatron-core objects (the trainer's own converters)

_POST_INIT_DERIVED = {"kv_channels", "moe_ffn_hidden_size"}  # None -> computed by megatron's __post_init__


def _check_all_keys_land(obj, kwargs, convert=lambda k, v: v):
    for k, v in kwargs.items():
        if v is None and k in _POST_INIT_DERIVED:
            continue
        assert hasattr(obj, k), f"{type(obj).__name__} has no field {k}"
        assert getattr(obj, k) == convert(k, v), (k, getattr(obj, k), v)


@pytest.mark.parametrize("overrides", [
    [],
    ["model=llama3_2_1b", "recompute=selective"],
    ["model=llama2_7b", "precision=fp8", "precision.first_last_layers_bf16=true", "recompute=full",
     "recompute.recompute_method=uniform", "recompute.recompute_num_layers=1"],
    ["model=debug_moe", "moe.moe_aux_loss_coeff=0.02", "moe.moe_z_loss_coeff=0.001", "model.moe_first_k_dense=1",
     "parallel.expert_model_parallel_size=2", "parallel.tensor_model_parallel_size=2"],
    ["model=deepseek_v2_lite"],
    ["recompute=layer_ids", "recompute.recompute_layer_ids=[0,2]"],
    ["parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2",
     "overlap.overlap_p2p_comm=true"],
])
def test_transformer_config_receives_every_keyword(overrides):
    import torch

    from primus.backends.megatron.trainer import transformer_config_from

    a = build(*overrides, ctx=GPU8)
    tc = transformer_config_from(a["transformer_config"])
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

    def convert(k, v):
        if k in ("params_dtype", "pipeline_dtype"):
            return dtypes[v]
        if k == "activation_func":
            return torch.nn.functional.silu
        return v

    _check_all_keys_land(tc, a["transformer_config"], convert)


@pytest.mark.parametrize("overrides", [
    [],
    ["overlap.overlap_grad_reduce=true", "overlap.bucket_size=123456", "overlap.align_param_gather=true",
     "overlap.overlap_param_gather=true", "memory=distributed_optimizer"],
])
def test_ddp_config_receives_every_keyword(overrides):
    from primus.backends.megatron.trainer import ddp_config_from

    a = build(*overrides, ctx=GPU8)
    _check_all_keys_land(ddp_config_from(a["ddp_config"]), a["ddp_config"])


@pytest.mark.parametrize("overrides", [
    ["training.lr=0.01", "training.min_lr=0.001", "training.adam_beta1=0.8", "training.clip_grad=0.3"],
    ["training.optimizer=sgd", "precision=fp16"],
    ["memory=offload", "memory.optimizer_offload_fraction=0.25"],
    ["memory=offload", "memory.overlap_cpu_optimizer_d2h_h2d=true"],
])
def test_optimizer_config_receives_every_keyword(overrides):
    import torch

    from primus.backends.megatron.trainer import optimizer_config_from

    a = build(*overrides, ctx=GPU8)
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    _check_all_keys_land(optimizer_config_from(a["optimizer_config"]), a["optimizer_config"],
                         lambda k, v: dtypes[v] if k == "params_dtype" else v)


def test_scheduler_receives_warmup_and_decay():
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    a = build("training.lr=0.01", "training.min_lr=0.001", "training.lr_warmup_iters=4", "training.train_iters=20",
              "training.lr_decay_style=linear")
    opt = types.SimpleNamespace(param_groups=[{"params": []}])
    sched = OptimizerParamScheduler(opt, **a["scheduler"])
    assert (sched.max_lr, sched.min_lr, sched.lr_warmup_steps, sched.lr_decay_steps, sched.lr_decay_style) == \
        (0.01, 0.001, 4, 20, "linear")
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step(1)
    assert lrs[0] == 0.0 and lrs[4] == pytest.approx(0.01)  # linear warm-up from 0 over 4 steps
    assert lrs[-1] < 0.002 and all(x >= y for x, y in zip(lrs[4:], lrs[5:]))  # then decays towards min_lr


def test_mcore_refusal_becomes_config_error():
    from primus.backends.megatron.trainer import transformer_config_from
    from primus.config.errors import ConfigError

    a = build("recompute=full", "recompute.recompute_method=uniform", "recompute.recompute_num_layers=1",
              "model=debug_moe", "moe.overlap_moe_expert_parallel_comm=true", "parallel.expert_model_parallel_size=2",
              ctx=GPU8)
    with pytest.raises(ConfigError, match="megatron-core 0.16.1"):
        transformer_config_from(a["transformer_config"])


def test_dry_run_json_roundtrips():
    a = build("model=mixtral_small", "moe=optimized", ctx=GPU8)
    assert json.loads(json.dumps(a)) == a


def test_rope_fusion_resolution(monkeypatch):
    """model.apply_rope_fusion: unset = primus' fused split+RoPE on a GPU, megatron's unfused RoPE on CPU; off when
    the model has q/k norms or MLA; false = off; the hook is megatron's own fused_single_qkv_rope flag."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu = RunContext(device="cuda", world_size=1)
    a = build("model=llama3_2_1b", ctx=gpu)
    assert a["rope_fusion"] == "triton"
    assert a["transformer_config"]["fused_single_qkv_rope"] is True
    assert a["transformer_config"]["apply_rope_fusion"] is False  # that one is TE's kernel
    assert build("model=llama3_2_1b")["rope_fusion"] is None  # CPU
    assert build("model=llama3_2_1b", "model.apply_rope_fusion=false", ctx=gpu)["rope_fusion"] is None
    for model in ("qwen3_30b_a3b", "deepseek_v2_lite"):  # q/k layernorm; MLA
        t = build(f"model={model}", ctx=gpu)
        assert t["rope_fusion"] is None and t["transformer_config"]["fused_single_qkv_rope"] is False


def test_rope_fusion_required_but_impossible_is_an_issue(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    issues = margs.capability_issues(compose(["model.apply_rope_fusion=true"]), CPU)
    assert [i.keys for i in issues] == [["model.apply_rope_fusion"]]
    assert "GPU kernel" in issues[0].rule
    gpu = RunContext(device="cuda", world_size=1)
    issues = margs.capability_issues(compose(["model=qwen3_30b_a3b", "model.apply_rope_fusion=true"]), gpu)
    assert any(i.keys == ["model.apply_rope_fusion"] and "q/k layernorm" in i.rule for i in issues)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel tests' CPU mode: allowed when asked for
    assert margs.capability_issues(compose(["model.apply_rope_fusion=true"]), CPU) == []
    assert build("model.apply_rope_fusion=true")["rope_fusion"] == "triton"


TURBO_CE = ["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=turbo"]


def test_turbo_cross_entropy_resolution():
    """impl=turbo: args["turbo_loss"], the compiled torch loss off (also under training.compile), megatron's own
    fusion off; impl=turbo without cross_entropy_loss_fusion=true asks for nothing."""
    gpu = RunContext(device="cuda", world_size=1)
    a = build("model=llama3_2_1b", "training.compile=true", *TURBO_CE, ctx=gpu)
    assert a["turbo_loss"] is True and a["compile_loss"] is False
    assert a["transformer_config"]["cross_entropy_loss_fusion"] is False
    plain = build("model=llama3_2_1b", "training.compile=true", "model.cross_entropy_fusion_impl=turbo", ctx=gpu)
    assert plain["turbo_loss"] is False and plain["compile_loss"] is True
    assert margs.capability_issues(compose(["model=llama3_2_1b", *TURBO_CE]), gpu) == []


def test_turbo_cross_entropy_with_tensor_parallel_is_an_issue():
    gpu = RunContext(device="cuda", world_size=2)
    issues = margs.capability_issues(compose([*TURBO_CE, "parallel.tensor_model_parallel_size=2"]), gpu)
    assert [i.keys for i in issues] == [["model.cross_entropy_fusion_impl", "parallel.tensor_model_parallel_size"]]
    i = issues[0]
    assert i.value == {"impl": "turbo", "tp": 2}
    assert "all-reduce" in i.rule and "tp = 1" in i.rule
    assert "model.cross_entropy_fusion_impl=native" in i.fix and "tensor_model_parallel_size=1" in i.fix
    native = margs.capability_issues(compose(["model.cross_entropy_loss_fusion=true",
                                              "parallel.tensor_model_parallel_size=2"]), gpu)
    assert native == []  # megatron's fused vocab-parallel one does the all-reduces


def test_turbo_cross_entropy_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    issues = margs.capability_issues(compose(TURBO_CE), CPU)
    assert [i.keys for i in issues] == [["model.cross_entropy_fusion_impl", "device"]]  # one rule, not two
    assert "GPU kernel" in issues[0].rule and "TRITON_INTERPRET=1" in issues[0].rule
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel tests' CPU mode
    assert margs.capability_issues(compose(TURBO_CE), CPU) == []
    planned = RunContext(device="cpu", world_size=1, planned=True)  # a dry run / plan for a GPU
    monkeypatch.delenv("TRITON_INTERPRET")
    assert margs.capability_issues(compose(TURBO_CE), planned) == []


def test_activation_fusion_resolution(monkeypatch):
    """model.bias_activation_fusion: unset = primus' Triton SwiGLU on a GPU, eager on CPU; true on CPU = megatron's
    torch.compile'd one; false = eager everywhere."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu = RunContext(device="cuda", world_size=1)
    a = build("model=llama3_2_1b", ctx=gpu)
    assert a["activation_fusion"] == "triton" and a["transformer_config"]["bias_activation_fusion"] is True
    assert build("model=llama3_2_1b")["activation_fusion"] is None
    assert build("model=llama3_2_1b")["transformer_config"]["bias_activation_fusion"] is False
    assert build("model.bias_activation_fusion=true")["activation_fusion"] == "jit"
    off = build("model.bias_activation_fusion=false", ctx=gpu)
    assert off["activation_fusion"] is None and off["transformer_config"]["bias_activation_fusion"] is False
