"""Primus key -> key here: the one table the importer reads (adding a key is one line).

Megatron modules use Megatron-LM's flat argument names; TorchTitan modules use TorchTitan's `section.key` names.
An entry is
- a dotted key here (`"training.lr"`): the value is copied;
- `Map(fn, idle)`: fn(value, module) -> {key here: value} ({} = nothing to set, listed with `idle`; `module` is the whole Primus module config,
  for keys whose meaning depends on another: `save_interval` without `save` saves nothing);
- `No(reason)`: no key here; the importer lists it with its value and this reason.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Union

NO_EQUIV = "no equivalent here"
LOG_ONLY = "logging-only, nothing to do"


@dataclass(frozen=True)
class Map:
    fn: Callable[[Any, Dict[str, Any]], Dict[str, Any]]
    idle: str = "null / off in Primus: nothing to set, this project's default applies"  # why fn gave {}


@dataclass(frozen=True)
class No:
    reason: str


Entry = Union[str, Map, No]


def _not(key: str) -> Map:
    return Map(lambda v, m: {key: not v} if v is not None else {})


def _if_set(key: str) -> Map:
    """A null in Primus means Megatron's own default: leave ours."""
    return Map(lambda v, m: {key: v} if v is not None else {})


def _lower(key: str) -> Map:
    return Map(lambda v, m: {key: str(v).lower()} if v is not None else {})


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _data(v, m):
    if m.get("mock_data", v if isinstance(v, bool) else False):
        return {"data.kind": "synthetic"}
    path = m.get("train_data_path") or m.get("data_path")
    if isinstance(path, str) and len(path.split()) > 1:  # Megatron-LM splits its --data-path string on spaces
        path = path.split()
    if isinstance(path, list):  # Megatron's weighted blend: [weight, prefix, ...] or [prefix, ...]
        prefixes = [p for p in path if isinstance(p, str) and not _number(p)]
        if len(prefixes) != 1:
            raise ValueError(f"a blend of {len(prefixes)} datasets; one indexed prefix is read here "
                             "(data.path): merge them into one, or set data.path to one of them")
        path = prefixes[0]
    return {"data.kind": "indexed", "data.path": path} if path else {}


def _save_dir(v, m):
    return {"checkpoint.dir": v} if v else {"checkpoint.interval": 0}


def _save_interval(v, m):
    return {"checkpoint.interval": v} if m.get("save") and v else {}


def _save_at_end(v, m):
    return {"checkpoint.save_at_end": not v} if m.get("save") else {}


def _resume(v, m):
    if m.get("auto_continue_train"):
        return {"checkpoint.resume": "auto"}
    return {"checkpoint.resume": v} if v else {}


def _layer_freq(v, m):
    # an integer N (every N-th layer MoE, from layer 0), "([0]*k+[1]*n)" (k leading dense layers) or any list
    pattern = eval(v, {"__builtins__": {}}) if isinstance(v, str) else v  # Megatron evaluates the same expression
    if isinstance(pattern, int):
        if pattern < 1:
            raise ValueError(f"MoE every {pattern} layers: Megatron needs N >= 1")
        return {"model.moe_first_k_dense": 0, "model.moe_layer_freq": pattern}
    pattern = [int(bool(x)) for x in pattern]
    k = next((i for i, x in enumerate(pattern) if x), len(pattern))
    rest = [i for i, x in enumerate(pattern) if x]
    n = rest[1] - rest[0] if len(rest) > 1 else 1
    if pattern != [int(i >= k and (i - k) % n == 0) for i in range(len(pattern))]:
        raise ValueError(f"pattern {pattern}: MoE layers here are every N-th after the leading dense ones "
                         "(model.moe_first_k_dense, model.moe_layer_freq)")
    return {"model.moe_first_k_dense": k, "model.moe_layer_freq": n, "model.num_layers": len(pattern)}


def _no_full(m):
    return m.get("recompute_granularity") == "full" and m.get("recompute_num_layers") == 0 \
        and not m.get("recompute_layer_ids")


def _full(m):
    return m.get("recompute_granularity") == "full" and not _no_full(m)


def _interleaved(m):
    return (m.get("pipeline_model_parallel_size") or 1) > 1 and bool(
        m.get("virtual_pipeline_model_parallel_size") or m.get("num_virtual_stages_per_pipeline_rank"))


def _raise(why: str):
    raise ValueError(why)


# A setting that acts only under another: the schema's ACTS_ONLY_WITH rows decide that for every key mapped here
# (core._drop_idle leaves such a setting out, and lists it, where its row does not hold). _when is for the
# conditions that exist only in Primus's key space, such as TorchTitan's float8 converter list.
def _when(key: str, on: Callable[[Dict[str, Any]], bool], idle: str) -> Map:
    return Map(lambda v, m: {key: v} if v is not None and on(m) else {}, idle)


def _float8_on(m) -> bool:
    return "quantize.linear.float8" in (m.get("model.converters") or [])


def _float8(key: str) -> Map:
    return _when(key, _float8_on, "no effect: the model config has no quantize.linear.float8 converter (bf16 linears)")


def _turbo_float8(m) -> bool:
    return bool(m.get("primus_turbo.enable_primus_turbo") and m.get("primus_turbo.use_turbo_float8_linear"))


def _fsdp_float8(key: str) -> Map:
    # torchao's float8 all-gather; Primus's turbo float8 linear, which replaces torchao's, casts after FSDP's bf16 one
    return _when(key, lambda m: _float8_on(m) and not _turbo_float8(m),
                 "no effect: no torchao float8 linears (the model config has no quantize.linear.float8 converter, or "
                 "primus_turbo.use_turbo_float8_linear replaces them and casts after FSDP's bf16 all-gather)")


def _kv_groups(v, m):
    return {"model.num_query_groups": v} if v and m.get("group_query_attention", True) else {}


def _no_dropout(v, m):
    if v:
        raise ValueError(f"dropout {v}: models here have none (every dropout is 0.0)")
    return {}


def _profile_steps(v, m):
    start, end = m.get("profile_step_start"), m.get("profile_step_end")
    if start is None or not end:
        return {}
    return {"profile.start_step": start, "profile.steps": max(1, end - start)}


def _evaluating(key: str) -> Map:
    # Megatron-LM evaluates every eval_interval steps for eval_iters batches: either 0 (or null) turns it off
    return _when(key, lambda m: bool(m.get("eval_interval")) and bool(m.get("eval_iters")),
                 "no effect: evaluation is off (eval_interval or eval_iters is 0)")


def _tt_ac(v, m):
    return {"recompute.activation_checkpoint_mode": v} if v else {}


def _tt_ckpt(v, m):
    return {"checkpoint.interval": m.get("checkpoint", {}).get("interval", 0)} if v else {"checkpoint.interval": 0}


# ------------------------------------------------------------------------------------------------ megatron
MEGATRON: Dict[str, Entry] = {
    # training recipe
    "train_iters": "training.train_iters",
    "micro_batch_size": "training.micro_batch_size",
    "global_batch_size": "training.global_batch_size",
    "seq_length": "training.seq_length",
    "lr": "training.lr",
    "min_lr": "training.min_lr",
    "lr_warmup_iters": "training.lr_warmup_iters",
    "lr_decay_iters": "training.lr_decay_iters",
    "lr_decay_style": "training.lr_decay_style",
    "weight_decay": "training.weight_decay",
    "adam_beta1": "training.adam_beta1",
    "adam_beta2": "training.adam_beta2",
    "adam_eps": "training.adam_eps",
    "clip_grad": "training.clip_grad",
    "init_method_std": "training.init_method_std",
    "seed": "training.seed",
    "optimizer": "training.optimizer",
    "log_interval": "training.log_interval",
    "eval_iters": "training.eval_iters",
    "eval_interval": _evaluating("training.eval_interval"),
    "gradient_accumulation_fusion": "training.gradient_accumulation_fusion",
    "PRIMUS_DETERMINISTIC": Map(lambda v, m: {"training.deterministic": bool(v)}),
    # data
    "mock_data": Map(_data),
    "train_data_path": Map(lambda v, m: {} if m.get("mock_data") else _data(v, m),
                           "no effect: mock_data is true (synthetic data) or the path is null"),
    "data_path": Map(lambda v, m: {} if m.get("mock_data") or m.get("train_data_path") else _data(v, m),
                     "no effect: mock_data is true or train_data_path is given"),
    "valid_data_path": No("no separate validation set here: evaluation reads held-out batches of data.path"),
    "test_data_path": No(NO_EQUIV + ": no test pass after training"),
    "num_workers": "data.num_workers",
    "eod_mask_loss": "data.eod_mask_loss",
    "tokenizer_type": No("the model preset gives vocab_size; data.tokenizer names a local tokenizer for jsonl data"),
    "tokenizer_model": No("the model preset gives vocab_size; data.tokenizer names a local tokenizer for jsonl data"),
    "dataloader_type": No(NO_EQUIV + ": batches are read in order, cyclically"),
    "split": No(NO_EQUIV + ": no train/valid/test split of one prefix"),
    "data_cache_path": No(NO_EQUIV + ": index files are built in memory"),
    "mmap_bin_files": No(NO_EQUIV + ": .bin files are always memory-mapped"),
    "create_attention_mask_in_dataloader": No(NO_EQUIV + ": causal attention needs no mask tensor"),
    # parallelism
    "tensor_model_parallel_size": "parallel.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "parallel.pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size": "parallel.virtual_pipeline_model_parallel_size",
    "num_virtual_stages_per_pipeline_rank": _if_set("parallel.virtual_pipeline_model_parallel_size"),
    "context_parallel_size": "parallel.context_parallel_size",
    "expert_model_parallel_size": "parallel.expert_model_parallel_size",
    "expert_tensor_parallel_size": No(NO_EQUIV + ": experts use the dense tp"),
    # as Megatron-LM: sequence parallelism is switched off when tp is 1
    "sequence_parallel": Map(lambda v, m: {"parallel.sequence_parallel": bool(v) and
                                           (m.get("tensor_model_parallel_size") or 1) > 1}),
    "pipeline_model_parallel_layout": No(NO_EQUIV + ": a per-(virtual-)stage layout string; the first and last "
                                            "stages' layer counts are parallel.decoder_first/last_pipeline_num_layers"),
    "decoder_first_pipeline_num_layers": _if_set("parallel.decoder_first_pipeline_num_layers"),
    "decoder_last_pipeline_num_layers": _if_set("parallel.decoder_last_pipeline_num_layers"),
    "use_torch_fsdp2": No(NO_EQUIV + " on megatron (FSDP2 is backend=torchtitan's data parallelism)"),
    "use_megatron_fsdp": No(NO_EQUIV + ": megatron data parallelism here is DDP + the distributed optimizer"),
    "data_parallel_sharding_strategy": No(NO_EQUIV + ": megatron FSDP is not used"),
    "data_parallel_replicate_degree": Map(lambda v, m: {} if (v or 1) == 1 else _raise(
        f"Megatron-FSDP's {v} replicas: megatron data parallelism here is DDP + the distributed optimizer (one "
        "replica per dp rank)"), "1: one Megatron-FSDP replica, which is megatron data parallelism here"),
    # communication overlap
    "overlap_grad_reduce": "overlap.overlap_grad_reduce",
    "overlap_param_gather": "overlap.overlap_param_gather",
    # Megatron-LM turns the p2p overlap off unless the schedule is interleaved (virtual pipeline stages)
    "overlap_p2p_comm": Map(lambda v, m: {"overlap.overlap_p2p_comm": bool(v)} if _interleaved(m) else {},
                            "no effect: Megatron overlaps pipeline send/recv in the interleaved schedule only "
                            "(pipeline_model_parallel_size > 1 with virtual stages)"),
    "align_grad_reduce": "overlap.align_grad_reduce",
    "async_tensor_model_parallel_allreduce": Map(
        lambda v, m: {"overlap.async_tensor_model_parallel_allreduce": bool(v)}
        if (m.get("tensor_model_parallel_size") or 1) > 1 else {},
        "no effect: with tensor_model_parallel_size 1 there is no TP all-reduce"),
    "ddp_bucket_size": _if_set("overlap.bucket_size"),
    # Megatron aligns the param gathers only when it overlaps them
    "align_param_gather": Map(lambda v, m: {"overlap.align_param_gather": bool(v and m.get("overlap_param_gather"))}),
    "ddp_average_in_collective": No(NO_EQUIV + ": gradients are averaged as megatron-core's DDP default does"),
    "ddp_num_buckets": No(NO_EQUIV + ": overlap.bucket_size sets the bucket size instead"),
    "accumulate_allreduce_grads_in_fp32": No(NO_EQUIV + ": gradients are reduced in fp32 (megatron-core's default)"),
    "grad_reduce_in_bf16": No(NO_EQUIV + ": gradients are reduced in fp32"),
    # memory
    "use_distributed_optimizer": "memory.use_distributed_optimizer",
    "use_precision_aware_optimizer": "memory.use_precision_aware_optimizer",
    "empty_unused_memory_level": "memory.empty_unused_memory_level",
    "optimizer_cpu_offload": "memory.optimizer_cpu_offload",
    "optimizer_offload_fraction": "memory.optimizer_offload_fraction",
    "overlap_cpu_optimizer_d2h_h2d": Map(lambda v, m: {"memory.overlap_cpu_optimizer_d2h_h2d": bool(v)}),
    "main_grads_dtype": No(NO_EQUIV + ": main grads are fp32"),
    "exp_avg_dtype": No(NO_EQUIV + ": Adam states are fp32 (memory.use_precision_aware_optimizer keeps them low)"),
    "exp_avg_sq_dtype": No(NO_EQUIV + ": Adam states are fp32 (memory.use_precision_aware_optimizer keeps them low)"),
    "manual_gc": No(NO_EQUIV + ": Python's GC runs as usual"),
    "manual_gc_interval": No(NO_EQUIV + ": Python's GC runs as usual"),
    "empty_cache_interval": No(NO_EQUIV + ": memory.empty_unused_memory_level frees cached memory instead"),
    # recompute
    # Megatron: full recompute of 0 layers recomputes nothing; method and count mean something for full only
    "recompute_granularity": Map(lambda v, m: {"recompute.recompute_granularity": None if _no_full(m) else v}),
    "recompute_method": Map(lambda v, m: {"recompute.recompute_method": v} if _full(m) else {},
                            "no effect: no full recompute (recompute_granularity null/selective, or 0 layers)"),
    "recompute_num_layers": "recompute.recompute_num_layers",
    "recompute_layer_ids": Map(lambda v, m: {"recompute.recompute_layer_ids": [int(x) for x in str(v).split(",")]
                                             if isinstance(v, (str, int)) else v}),
    "recompute_modules": Map(lambda v, m: {"recompute.recompute_modules": list(v)} if v else {}),
    "moe_layer_recompute": No(NO_EQUIV + ": recompute.recompute_modules=[moe] recomputes the MoE layers"),
    # precision
    "bf16": "precision.bf16",
    "fp16": "precision.fp16",
    # fp16's loss scaling, fp8's and fp4's recipes and delayed scaling's settings act only with their format on
    # (Primus's module defaults carry them for every run): the import leaves them out where they would not act
    **{k: f"precision.{k}" for k in ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window",
                                     "hysteresis", "fp8_margin", "fp8_interval", "fp8_amax_history_len",
                                     "fp8_amax_compute_algo")},
    "fp8": "precision.fp8",
    "fp8_recipe": "precision.fp8_recipe",
    "fp4": "precision.fp4",
    "fp4_recipe": "precision.fp4_recipe",
    "first_last_layers_bf16": Map(lambda v, m: {"precision.first_last_layers_bf16": bool(v)}
                                  if m.get("fp8") or m.get("fp4") else {}, "no effect: fp8 and fp4 are off"),
    "num_layers_at_start_in_bf16": "precision.num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16": "precision.num_layers_at_end_in_bf16",
    "fp8_param_gather": No(NO_EQUIV + ": parameters are gathered in bf16"),
    "no_fp8_weight_transpose_cache": No(NO_EQUIV + ": precision.fp8_weight_cache decides the fp8 weight cache"),
    "disable_delayed_scaling_patches": No(NO_EQUIV + ": Primus-internal patch switch"),
    "moe_router_padding_for_fp8": No(NO_EQUIV + ": tokens per expert are padded where the fp8 GEMM needs it"),
    "moe_router_padding_for_quantization": No(NO_EQUIV + ": tokens per expert are padded where the fp8 GEMM needs it"),
    # model settings an experiment may override (the model preset gives the rest)
    "num_layers": "model.num_layers",
    "hidden_size": "model.hidden_size",
    "ffn_hidden_size": "model.ffn_hidden_size",
    "num_attention_heads": "model.num_attention_heads",
    "num_query_groups": Map(_kv_groups),
    "group_query_attention": Map(lambda v, m: {} if v else {"model.num_query_groups": m.get("num_attention_heads")}
                                 if m.get("num_attention_heads") else {}),
    "kv_channels": "model.kv_channels",
    "vocab_size": _if_set("model.vocab_size"),
    "max_position_embeddings": "model.max_position_embeddings",
    "rotary_base": "model.rotary_base",
    "use_rope_scaling": "model.use_rope_scaling",
    "rope_scaling_factor": "model.rope_scaling_factor",
    "norm_epsilon": "model.norm_epsilon",
    "layernorm_epsilon": "model.norm_epsilon",
    "qk_layernorm": "model.qk_layernorm",
    "untie_embeddings_and_output_weights": _not("model.tie_word_embeddings"),
    "num_experts": "model.num_experts",
    "moe_router_topk": "model.moe_router_topk",
    "moe_ffn_hidden_size": "model.moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size": "model.moe_shared_expert_intermediate_size",
    "moe_layer_freq": Map(_layer_freq),
    "mtp_num_layers": _if_set("model.mtp_num_layers"),
    "multi_latent_attention": "model.multi_latent_attention",
    "q_lora_rank": "model.q_lora_rank",
    "kv_lora_rank": "model.kv_lora_rank",
    "qk_head_dim": "model.qk_head_dim",
    "qk_pos_emb_head_dim": "model.qk_pos_emb_head_dim",
    "v_head_dim": "model.v_head_dim",
    "rotary_scaling_factor": "model.rotary_scaling_factor",
    "original_max_position_embeddings": "model.original_max_position_embeddings",
    "mscale": "model.mscale",
    "mscale_all_dim": "model.mscale_all_dim",
    "rope_type": _if_set("model.rope_type"),
    "hidden_dropout": Map(_no_dropout),
    "attention_dropout": Map(_no_dropout),
    "attention_softmax_in_fp32": No(NO_EQUIV + ": attention kernels accumulate softmax in fp32"),
    "position_embedding_type": No(NO_EQUIV + ": models here use RoPE (MLA: its own)"),
    "add_qkv_bias": "model.add_qkv_bias",
    "activation_func": No(NO_EQUIV + ": models here use SwiGLU"),
    "spec": No(NO_EQUIV + ": backend.layer_spec picks the TE or the local layer spec"),
    # loss and fusions
    "cross_entropy_loss_fusion": "model.cross_entropy_loss_fusion",
    "cross_entropy_fusion_impl": "model.cross_entropy_fusion_impl",
    # Primus's true is Transformer Engine's fused RoPE, which runs under q/k layernorm too; here true requires the
    # fusion where it cannot always run (primus' split + RoPE kernel, not under q/k layernorm), null takes it wherever
    # it runs
    "apply_rope_fusion": Map(lambda v, m: {"model.apply_rope_fusion": False} if v is False else {},
                             "null or true in Primus (true: Transformer Engine's fused RoPE): model.apply_rope_fusion "
                             "stays null here, the fused RoPE wherever it runs (TE's, or primus' Triton kernel where "
                             "no q/k layernorm sits between the split and RoPE)"),
    "bias_swiglu_fusion": "model.bias_activation_fusion",
    "masked_softmax_fusion": No(NO_EQUIV + ": causal attention runs in flash/SDPA kernels, not a masked softmax"),
    "no_persist_layer_norm": No(NO_EQUIV + ": the persistent LayerNorm kernel is not used"),
    # MoE
    "moe_router_load_balancing_type": "moe.moe_router_load_balancing_type",
    "moe_aux_loss_coeff": "moe.moe_aux_loss_coeff",
    "moe_z_loss_coeff": "moe.moe_z_loss_coeff",
    "moe_router_score_function": "moe.moe_router_score_function",
    "moe_router_pre_softmax": "moe.moe_router_pre_softmax",
    "moe_router_dtype": "moe.moe_router_dtype",
    "moe_router_force_load_balancing": "moe.moe_router_force_load_balancing",
    "moe_shared_expert_overlap": "moe.moe_shared_expert_overlap",
    "moe_grouped_gemm": "moe.moe_grouped_gemm",
    "moe_permute_fusion": "moe.moe_permute_fusion",
    "moe_token_dispatcher_type": "moe.moe_token_dispatcher_type",
    "overlap_moe_expert_parallel_comm": "moe.overlap_moe_expert_parallel_comm",
    "moe_use_legacy_grouped_gemm": No(NO_EQUIV + ": the layer spec picks the grouped MLP (GroupedMLP without TE)"),
    "moe_router_topk_scaling_factor": No(NO_EQUIV + ": routing weights are not rescaled"),
    "moe_router_num_groups": No(NO_EQUIV + ": no group-limited routing"),
    "moe_router_group_topk": No(NO_EQUIV + ": no group-limited routing"),
    "moe_router_enable_expert_bias": No(NO_EQUIV + ": no aux-loss-free expert bias"),
    "moe_router_bias_update_rate": No(NO_EQUIV + ": no aux-loss-free expert bias"),
    "moe_expert_capacity_factor": No(NO_EQUIV + ": experts take every routed token (no capacity, no dropping)"),
    "moe_pad_expert_input_to_capacity": No(NO_EQUIV + ": experts take every routed token (no capacity)"),
    "moe_token_drop_policy": No(NO_EQUIV + ": no token dropping"),
    "moe_input_jitter_eps": No(NO_EQUIV + ": no router input jitter"),
    "moe_router_fusion": No(NO_EQUIV + ": turbo.moe_use_fused_router_with_aux_score fuses the router"),
    "moe_enable_deepep": No("DeepEP is turbo.use_turbo_deepep here"),
    "moe_flex_dispatcher_backend": No(NO_EQUIV + ": the flex dispatcher is DeepEP (turbo.use_turbo_deepep)"),
    "moe_deepep_num_sms": No("turbo.turbo_deepep_num_cu sets DeepEP's compute units here"),
    "moe_per_layer_logging": No(LOG_ONLY),
    # Primus Turbo
    "enable_primus_turbo": "turbo.enable_primus_turbo",
    "use_turbo_attention": "turbo.use_turbo_attention",
    "use_turbo_gemm": "turbo.use_turbo_gemm",
    "use_turbo_parallel_linear": "turbo.use_turbo_parallel_linear",
    "use_turbo_grouped_gemm": "turbo.use_turbo_grouped_gemm",
    "use_turbo_grouped_mlp": "turbo.use_turbo_grouped_mlp",
    "use_turbo_rms_norm": "turbo.use_turbo_rms_norm",
    "use_turbo_deepep": "turbo.use_turbo_deepep",
    "turbo_deepep_num_cu": "turbo.turbo_deepep_num_cu",
    "turbo_deepep_use_comm_stream": "turbo.turbo_deepep_use_comm_stream",
    "turbo_sync_free_moe_stage": "turbo.turbo_sync_free_moe_stage",
    "moe_use_fused_router_with_aux_score": "turbo.moe_use_fused_router_with_aux_score",
    "use_turbo_fused_act_with_probs": "turbo.use_turbo_fused_act_with_probs",
    "enable_turbo_attention_float8": No(NO_EQUIV + ": attention runs in bf16"),
    "use_turbo_permute_padding": No(NO_EQUIV + ": tokens per expert are padded where the GEMM needs it"),
    # checkpointing
    "save": Map(_save_dir),
    "save_interval": Map(_save_interval, "no effect: save is null, so Primus saves no checkpoint"),
    "disable_last_saving": Map(_save_at_end, "no effect: save is null, so Primus saves no checkpoint"),
    "load": Map(_resume, "null: a fresh start"),
    "auto_continue_train": Map(_resume),
    "ckpt_format": Map(lambda v, m: {"checkpoint.ckpt_format": v} if v in (None, "torch_dist") else {},
                       idle="checkpoints here are always torch_dist (dist-checkpointing, which resumes at another "
                            "layout); Primus's per-rank 'torch' and 'zarr' formats have no equivalent"),
    "no_save_optim": _if_set("checkpoint.no_save_optim"),
    "no_load_optim": _if_set("checkpoint.no_load_optim"),
    "no_save_rng": _if_set("checkpoint.no_save_rng"),
    "no_load_rng": _if_set("checkpoint.no_load_rng"),
    "finetune": No(NO_EQUIV + ": checkpoint.resume continues a run (a weights-only load is checkpoint.no_load_optim)"),
    "pretrained_checkpoint": No(NO_EQUIV + ": checkpoint.resume names the checkpoint to start from"),
    "auto_detect_ckpt_format": No(NO_EQUIV + ": checkpoint.ckpt_format names the format"),
    "dist_ckpt_strictness": No(NO_EQUIV + ": a checkpoint must match the model exactly"),
    "exit_on_missing_checkpoint": No(NO_EQUIV + ": a resume path that does not exist is an error before start"),
    # logging and profiling
    "wandb_project": "logging.wandb_project",
    "disable_wandb": _not("logging.wandb"),
    "disable_tensorboard": _not("logging.tensorboard"),
    "tensorboard_dir": No("TensorBoard writes to <run dir>/tensorboard"),
    "log_avg_skip_iterations": No("timing warm-up is training.timing_warmup_steps (" + LOG_ONLY + ")"),
    "log_avg_reset_interval": No(LOG_ONLY),
    "tensorboard_log_interval": No(LOG_ONLY),
    "tensorboard_queue_size": No(LOG_ONLY),
    "log_batch_size_to_tensorboard": No(LOG_ONLY),
    "log_learning_rate_to_tensorboard": No(LOG_ONLY),
    "log_loss_scale_to_tensorboard": No(LOG_ONLY),
    "log_memory_to_tensorboard": No(LOG_ONLY),
    "log_timers_to_tensorboard": No(LOG_ONLY),
    "log_validation_ppl_to_tensorboard": No(LOG_ONLY),
    "log_world_size_to_tensorboard": No(LOG_ONLY),
    "barrier_with_L1_time": No(LOG_ONLY),
    "nvtx_ranges": No(LOG_ONLY),
    "profile": "profile.enabled",
    "use_pytorch_profiler": No("profile.enabled uses torch.profiler"),
    "profile_step_start": Map(_profile_steps, "no profiling window: profile_step_start or profile_step_end is null"),
    "profile_step_end": Map(_profile_steps, "no profiling window: profile_step_start or profile_step_end is null"),
    "profile_ranks": "profile.ranks",
    "record_shapes": "profile.record_shapes",
    "torch_profiler_record_shapes": "profile.record_shapes",
    "torch_profiler_with_stack": "profile.with_stack",
    "pytorch_profiler_collect_shapes": "profile.record_shapes",
    "pytorch_profiler_collect_callstack": "profile.with_stack",
    "pytorch_profiler_collect_chakra": No(NO_EQUIV + ": no Chakra execution traces"),
    "torch_profiler_use_gzip": No(NO_EQUIV + ": traces are written uncompressed"),
    "disable_profiler_activity_cpu": No(NO_EQUIV + ": traces record CPU and GPU activity"),
    "use_nsys_profiler": No(NO_EQUIV + ": run under nsys/rocprof from the outside"),
    "record_memory_history": "profile.memory_snapshot",
    # run health
    "check_for_nan_in_loss_and_grad": No("a NaN/inf loss or grad norm always stops the run here "
                                         "(training.on_nonfinite)"),
    "check_for_nan_in_loss": No("a NaN/inf loss always stops the run here (training.on_nonfinite)"),
    "check_for_spiky_loss": No(NO_EQUIV + ": no spiky-loss detector"),
    "check_for_large_grads": No(NO_EQUIV + ": no large-gradient detector (training.clip_grad bounds them)"),
}

ARCH_ONLY = No(NO_EQUIV + ": a layer type of an architecture refused here (see the models it belongs to)")
MEGATRON.update({k: ARCH_ONLY for k in (
    "attn_sink", "conv_bias", "conv_L_cache", "fla_mla_attn", "hc_use_sinkhorn", "hybrid_attention_enabled",
    "kda_backend", "lfm_layer_types", "moe_latent_size", "mtp_use_separate_hc_head",
    "swiglu_limit", "use_fla_data", "use_fla_fused_gated_norm",
    "use_fla_fused_norm_gated", "use_fla_fused_rmsnorm", "use_fla_fused_swiglu", "use_fla_kda_in_kernel_gate",
    "use_fla_short_conv", "use_fla_triton_kda", "use_kimi_k3_attention_backend",
    "use_v4_attention_backend", "use_v4_compiled_sinkhorn", "use_v4_csa_attention_backend", "use_v4_fp8_indexer",
    "window_attn_skip_freq", "window_size")})
MEGATRON.update({
    # gpt-oss's attention sinks (Primus runs them inside its turbo attention; here in every attention core)
    "use_sink_attention": "model.use_sink_attention",
    "sink_sliding_window": "model.sink_sliding_window",
    "sink_window_even_layers_only": "model.sink_window_even_layers_only",
    "enable_experimental": No(NO_EQUIV + ": megatron-core's experimental features stay off"),
    "fused_ce_chunks": No(NO_EQUIV + ": no chunked fused linear + cross entropy (model.cross_entropy_loss_fusion "
                                     "fuses the loss)"),
    "fused_ce_mode": No(NO_EQUIV + ": no chunked fused linear + cross entropy (model.cross_entropy_loss_fusion "
                                   "fuses the loss)"),
    "enable_fused_linear_ce": No(NO_EQUIV + ": no fused output linear + cross entropy (model.cross_entropy_loss_fusion "
                                            "fuses the loss)"),
    "pp_warmup": No(NO_EQUIV + ": the pipeline schedule is megatron-core's (1F1B / interleaved)"),
    "moe_apply_probs_on_input": No(NO_EQUIV + ": router probabilities scale the expert outputs"),
    "moe_extended_tp": No(NO_EQUIV + ": experts use expert parallelism, not extended tp"),
    "moe_hybridep_num_sms": No(NO_EQUIV + ": no HybridEP dispatcher"),
    "moe_router_topk_limited_devices": No(NO_EQUIV + ": no device-limited routing"),
    "moe_shared_expert_gate": No(NO_EQUIV + ": shared experts are ungated"),
    "moe_token_dropping": No(NO_EQUIV + ": no token dropping"),
    "enable_packed_sequences": No(NO_EQUIV + ": sequences are not packed with per-document masks"),
    "use_packed_attention": No(NO_EQUIV + ": sequences are not packed with per-document masks"),
    "enable_odc": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "enable_odc_lb_mini": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "odc_p2p_backend": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "odc_phase": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "odc_rocshmem_gda": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "lb_mini_cost_model": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "lb_mini_max_token_len": No(NO_EQUIV + ": no on-demand communication (ODC) data parallelism"),
    "stage": No(NO_EQUIV + ": a Primus trainer variant (e.g. mlperf_pretrain); train.py runs one trainer"),
    "hf_path": No(NO_EQUIV + ": no Hugging Face checkpoint conversion"),
    "sft_sanitize_nan_grads": No(NO_EQUIV + ": a NaN/inf grad norm stops or skips the step (training.on_nonfinite)"),
})

# ------------------------------------------------------------------------------------------------ torchtitan
TORCHTITAN: Dict[str, Entry] = {
    "training.steps": "training.train_iters",
    "training.local_batch_size": "training.micro_batch_size",
    "training.global_batch_size": Map(lambda v, m: {"training.global_batch_size": v} if v and v > 0 else {}),
    "training.seq_len": "training.seq_length",
    "training.max_norm": "training.clip_grad",
    "training.mock_data": Map(lambda v, m: {"data.kind": "synthetic"} if v else {}),
    "training.dataset": No("data.kind / data.path choose the data here (a named dataset is not downloaded)"),
    "training.dataset_path": _if_set("data.path"),
    "training.gc_freq": No(NO_EQUIV + ": Python's GC runs as usual"),
    "training.mixed_precision_param": "precision.mixed_precision_param",
    "training.mixed_precision_reduce": "precision.mixed_precision_reduce",
    "training.enable_cpu_offload": "memory.enable_cpu_offload",
    "optimizer.lr": "training.lr",
    "optimizer.eps": "training.adam_eps",
    "optimizer.beta1": "training.adam_beta1",
    "optimizer.beta2": "training.adam_beta2",
    "optimizer.weight_decay": "training.weight_decay",
    "optimizer.name": _lower("training.optimizer"),
    "lr_scheduler.warmup_steps": "training.lr_warmup_iters",
    "lr_scheduler.decay_type": "training.lr_decay_style",
    "lr_scheduler.min_lr_factor": Map(lambda v, m: {"training.min_lr": v * m.get("optimizer", {}).get("lr", 8e-4)}),
    "lr_scheduler.decay_ratio": No(NO_EQUIV + ": the decay runs over every step after the warm-up"),
    "parallelism.tensor_parallel_degree": "parallel.tensor_model_parallel_size",
    "parallelism.pipeline_parallel_degree": "parallel.pipeline_model_parallel_size",
    "parallelism.context_parallel_degree": "parallel.context_parallel_size",
    "parallelism.expert_parallel_degree": "parallel.expert_model_parallel_size",
    "parallelism.expert_tensor_parallel_degree": No(NO_EQUIV + ": experts use the dense tp"),
    "parallelism.data_parallel_shard_degree": "parallel.data_parallel_shard_degree",
    "parallelism.data_parallel_replicate_degree": "parallel.data_parallel_replicate_degree",
    "parallelism.enable_async_tensor_parallel": "overlap.enable_async_tensor_parallel",
    "parallelism.fsdp_reshard_after_forward": No(NO_EQUIV + ": FSDP2 reshards after forward (TorchTitan's default)"),
    "parallelism.pipeline_parallel_schedule": No(NO_EQUIV + ": the pipeline schedule is 1F1B"),
    "activation_checkpoint.mode": Map(_tt_ac),
    "activation_checkpoint.selective_ac_option": "recompute.selective_ac_option",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": No(NO_EQUIV + ": per-op SAC saves as "
                                                                             "TorchTitan's default policy does"),
    "compile.enable": "training.compile",
    "compile.components": No(NO_EQUIV + ": training.compile compiles each transformer block"),
    "checkpoint.enable": Map(_tt_ckpt),
    "checkpoint.interval": No("checkpoint.interval here (taken when checkpoint.enable is true)"),
    "checkpoint.folder": _if_set("checkpoint.dir"),
    "checkpoint.async_mode": No(NO_EQUIV + ": checkpoints are written synchronously"),
    "checkpoint.export_dtype": No(NO_EQUIV + ": checkpoints keep the training dtypes"),
    "checkpoint.last_save_model_only": No(NO_EQUIV + ": the last checkpoint is a full one"),
    "metrics.log_freq": "training.log_interval",
    "metrics.enable_tensorboard": "logging.tensorboard",
    "metrics.enable_wandb": "logging.wandb",
    "metrics.save_tb_folder": No("TensorBoard writes to <run dir>/tensorboard"),
    "metrics.disable_color_printing": No(LOG_ONLY),
    "profiling.enable_profiling": "profile.enabled",
    "profiling.profile_freq": No(NO_EQUIV + ": profile.start_step / profile.steps choose one window"),
    "profiling.save_traces_folder": No("traces go to <run dir>/profile"),
    "profiling.enable_memory_snapshot": "profile.memory_snapshot",
    "profiling.save_memory_snapshot_folder": No("the snapshot goes to <run dir>"),
    "debug.moe_force_load_balance": "moe.moe_router_force_load_balancing",
    "debug.seed": _if_set("training.seed"),
    "debug.deterministic": "training.deterministic",
    "primus_turbo.enable_primus_turbo": "turbo.enable_primus_turbo",
    "primus_turbo.use_turbo_attention": "turbo.use_turbo_attention",
    # the turbo float8 linear acts only where the model's float8 converter makes linears fp8
    "primus_turbo.use_turbo_float8_linear": Map(
        lambda v, m: {"turbo.use_turbo_float8_linear": v} if "quantize.linear.float8" in (m.get("model.converters")
                                                                                         or []) else {},
        "no effect: the model config has no quantize.linear.float8 converter (bf16 linears)"),
    "primus_turbo.use_turbo_grouped_mm": "turbo.use_turbo_grouped_gemm",
    "primus_turbo.use_turbo_mx_linear": No(NO_EQUIV + ": MX linears are precision=mxfp8"),
    "primus_turbo.enable_attention_float8": No(NO_EQUIV + ": attention runs in bf16"),
    "primus_turbo.use_classic_attention": No(NO_EQUIV + ": attention is SDPA / turbo.use_turbo_attention"),
    "primus_turbo.use_moe_fp8": No(NO_EQUIV + ": experts run in bf16 on torchtitan"),
    # the float8 converter's settings act only where the model config lists the converter
    "quantize.linear.float8.enable_fsdp_float8_all_gather": _fsdp_float8(
        "precision.float8_enable_fsdp_float8_all_gather"),
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": _fsdp_float8(
        "precision.float8_precompute_float8_dynamic_scale_for_fsdp"),
    "quantize.linear.float8.filter_fqns": _float8("precision.float8_filter_fqns"),
    "quantize.linear.float8.recipe_name": _float8("precision.fp8_recipe"),
    "job.dump_folder": No("outputs go to the run dir (hydra.run.dir)"),
    "job.description": No(LOG_ONLY),
}

def _sink_level(key: str) -> Map:
    # as Primus's logger setup reads them: a non-null sink_level overrides both sinks' own levels
    return Map(lambda v, m: {key: str(m.get("sink_level") or v).upper()} if (m.get("sink_level") or v) else {})


# both frameworks: Primus's own logging switches
COMMON: Dict[str, Entry] = {
    "sink_level": Map(lambda v, m: {"logging.console_level": str(v).upper(), "logging.file_level": str(v).upper()}
                      if v else {}, "null: stderr_sink_level and file_sink_level decide"),
    "stderr_sink_level": _sink_level("logging.console_level"),
    "file_sink_level": _sink_level("logging.file_level"),
}

TABLES = {"megatron": {**COMMON, **MEGATRON}, "torchtitan": {**COMMON, **TORCHTITAN}}

# experiment-level keys Primus reads besides `modules`
EXPERIMENT_KEYS: Dict[str, Entry] = {
    "work_group": No(LOG_ONLY + " (Primus's output path)"),
    "user_name": No(LOG_ONLY + " (Primus's output path)"),
    "exp_name": No("the preset's name is the experiment name here"),
    "workspace": No("outputs go to the run dir (hydra.run.dir)"),
    "platform": No("the launcher (launcher=..., cluster=...) says where the job runs"),
}

# keys that are environment variables written into `overrides` (Primus passes them to the process environment)
ENV_LIKE = No("an environment variable, not a config key: export it before launching")

def _world(m):
    # Primus's launch scripts: GPUS_PER_NODE (default 8) processes on each of NNODES (default 1) nodes
    return {"launcher.nproc_per_node": int(os.environ.get("GPUS_PER_NODE", 8)),
            "launcher.nnodes": int(os.environ.get("NNODES", 1))}


def _tt_global_batch(m):
    # TorchTitan's global_batch_size -1 (its default) = local batch x data-parallel ranks: no accumulation
    gbs = m.get("training.global_batch_size", -1)
    if gbs is not None and gbs > 0:
        return {}
    world = _world(m)
    ranks = world["launcher.nproc_per_node"] * world["launcher.nnodes"]
    split = 1
    for k in ("parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
              "parallelism.context_parallel_degree"):
        split *= max(1, m.get(k) or 1)
    return {"training.global_batch_size": m.get("training.local_batch_size", 8) * max(1, ranks // split)}


# Settings Primus derives from others at run time (its patches and Megatron's own argument checks), applied after the
# table: (applies(module), {key here: value}, why). Each one applied is noted in the output.
DERIVED = [
    (lambda m: True, _world,
     "the job size: Primus launches GPUS_PER_NODE (default 8) ranks on each of NNODES (default 1) nodes"),
    (lambda m: bool(m.get("use_turbo_deepep") and m.get("enable_primus_turbo")),
     {"moe.moe_token_dispatcher_type": "flex"},
     "use_turbo_deepep: Primus's DeepEP patch switches Megatron to the flex token dispatcher"),
    (lambda m: "training.local_batch_size" in m and (m.get("training.global_batch_size") or -1) <= 0, _tt_global_batch,
     "TorchTitan's global_batch_size -1: the local batch times the data-parallel ranks (no accumulation)"),
    (lambda m: m.get("multi_latent_attention") is False,
     {"model.rope_type": "rope"},
     "multi_latent_attention: false: Megatron's standard attention applies plain RoPE (YaRN is MLA's)"),
]
