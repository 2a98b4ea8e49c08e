"""The Primus importer (primus/importer): Primus's YAML semantics, the key table, model presets, errors and exit
codes, on small Primus-shaped configs and a tiny Primus checkout (tests/data/primus/root)."""
import dataclasses
import os
import subprocess
import sys

import pytest
import yaml

from conftest import PY, ROOT, compose_cfg
from primus.config.schema import PrimusConfig
from primus.importer import keys as K
from primus.importer.__main__ import main
from primus.importer.core import CannotImport, NotPrimusExperiment, _schema_field, import_experiment
from primus.importer.primus_yaml import PrimusYamlError, parse
from primus.importer import write

DATA = os.path.join(os.path.dirname(__file__), "data", "primus")
PRIMUS_ROOT = os.path.join(DATA, "root")
ZOO = os.path.join(PRIMUS_ROOT, "primus", "configs", "models", "megatron")


def _f(name):
    return os.path.join(DATA, name)


def _accounted(imp, overrides):
    """Every override key is either imported (the origin of a setting) or listed with a reason."""
    listed = {item.key for item in imp.listed}
    origins = set(imp.origin.values())
    return [k for k in overrides if k not in origins and k not in listed]


# ------------------------------------------------------------------------------------------------ Primus YAML


def test_env_interpolation_is_primus_s(monkeypatch):
    monkeypatch.delenv("PRIMUS_TP", raising=False)
    over = parse(_f("dense.yaml"))["modules"]["pre_trainer"]["overrides"]
    assert over["tensor_model_parallel_size"] == 1  # ${PRIMUS_TP:1}: the default, read as an int
    assert over["train_data_path"] is None  # ${...:null}
    monkeypatch.setenv("PRIMUS_TP", "2")
    monkeypatch.setenv("PRIMUS_SEQ_LENGTH", "32")
    over = parse(_f("dense.yaml"))["modules"]["pre_trainer"]["overrides"]
    assert over["tensor_model_parallel_size"] == 2 and over["seq_length"] == 32


def test_required_env_variable_without_default_is_named(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("work_group: ${NO_SUCH_PRIMUS_VAR}\n")
    with pytest.raises(PrimusYamlError, match="NO_SUCH_PRIMUS_VAR"):
        parse(str(p), env={})


def test_extends_chain_merges_bases_first_and_the_file_last():
    chain = []
    m = parse(os.path.join(ZOO, "tinymoe_4L.yaml"), chain=chain)
    assert [os.path.basename(c) for c in chain] == ["tiny_lm.yaml", "tiny_family.yaml", "tinyllama_2L.yaml",
                                                    "tinymoe_4L.yaml"]
    assert m["num_layers"] == 4  # the file over its base (2)
    assert m["rotary_base"] == 500000  # tiny_family over tiny_lm (10000)
    assert m["normalization"] == "RMSNorm" and "extends" not in m


# ------------------------------------------------------------------------------------------------ importing


def test_zoo_only_model_becomes_a_preset_with_its_sizes_and_every_key_is_accounted():
    imp = import_experiment(_f("dense.yaml"), PRIMUS_ROOT)
    assert imp.framework == "megatron" and imp.model_preset == "tinyllama_2l"
    assert imp.new_model == {"name": "tinyllama_2l", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 192,
                             "num_attention_heads": 4, "num_query_groups": 2, "vocab_size": 2048,
                             "max_position_embeddings": 256, "rotary_base": 500000, "norm_epsilon": 1e-05,
                             "tie_word_embeddings": False}
    s = imp.sets
    assert s["training.train_iters"] == 3 and s["training.lr"] == 1e-4 and s["training.seq_length"] == 64
    assert s["model.max_position_embeddings"] == 128  # an override of the model's 256
    assert s["data.kind"] == "synthetic" and s["checkpoint.interval"] == 0  # save: null saves nothing
    assert s["training.weight_decay"] == 0.01  # Primus's pre_trainer.yaml over its trainer_base.yaml
    assert s["training.lr_warmup_iters"] == 1  # a module default
    assert "precision.fp8_recipe" not in s  # the module's default recipe (delayed): fp8 is off, nothing reads it
    # no disable_wandb here (Primus's module config says true): the sink stays off, so the project is listed
    assert "logging.wandb_project" not in s and "logging.wandb" not in s
    over = yaml.safe_load(open(_f("dense.yaml")))["modules"]["pre_trainer"]["overrides"]
    assert _accounted(imp, over) == []
    reasons = {i.key: i.reason for i in imp.listed}
    assert reasons["log_avg_reset_interval"] == K.LOG_ONLY
    assert reasons["wandb_project"] == "no effect: acts only with the Weights & Biases sink (logging.wandb=true)"
    assert reasons["manual_gc"].startswith(K.NO_EQUIV)
    assert set(reasons) >= {"work_group", "user_name", "exp_name", "workspace", "finetune", "valid_data_path"}
    # untouched Primus defaults with no equivalent are listed by name, with where they came from
    defaults = [i for i in imp.listed if i.source.startswith("module")]
    assert any("use_flash_attn" in i.key and "tensorboard_queue_size" in i.key for i in defaults)
    assert any("transformer_impl" in i.key for i in imp.listed if i.source.startswith("model"))


def test_job_size_is_primus_s_launch_default_or_its_env(monkeypatch):
    monkeypatch.delenv("GPUS_PER_NODE", raising=False)
    monkeypatch.delenv("NNODES", raising=False)
    imp = import_experiment(_f("llama2_7b.yaml"))
    assert imp.sets["launcher.nproc_per_node"] == 8 and imp.sets["launcher.nnodes"] == 1
    assert any("GPUS_PER_NODE" in n for n in imp.notes)
    monkeypatch.setenv("GPUS_PER_NODE", "4")
    monkeypatch.setenv("NNODES", "2")
    imp = import_experiment(_f("llama2_7b.yaml"))
    assert imp.sets["launcher.nproc_per_node"] == 4 and imp.sets["launcher.nnodes"] == 2


def test_deepep_switches_to_the_flex_dispatcher_as_primus_s_patch_does(tmp_path):
    src = yaml.safe_load(open(_f("moe.yaml")))
    src["modules"]["pre_trainer"]["overrides"].update({"enable_primus_turbo": True, "use_turbo_deepep": True})
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p), PRIMUS_ROOT)
    assert imp.sets["moe.moe_token_dispatcher_type"] == "flex"
    assert any("flex" in n for n in imp.notes)


def _import_with(tmp_path, base, framework_overrides, root=None):
    src = yaml.safe_load(open(_f(base)))
    src["modules"]["pre_trainer"]["overrides"].update(framework_overrides)
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    return import_experiment(str(p), root)


def test_guide_keys_that_have_a_key_here_are_imported_not_called_missing(tmp_path):
    # these have the guide's (Megatron-LM's) names here too; the table once called them "no equivalent"
    imp = _import_with(tmp_path, "llama2_7b.yaml", {
        "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.75, "overlap_cpu_optimizer_d2h_h2d": True,
        "ddp_bucket_size": 40000000, "align_grad_reduce": False, "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 0, "tensor_model_parallel_size": 2,
        "async_tensor_model_parallel_allreduce": True, "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2, "overlap_p2p_comm": True, "rope_type": "rope"})
    assert {k: v for k, v in imp.sets.items() if k.startswith(("memory.", "overlap.", "precision.first",
                                                                 "precision.num_layers", "model.rope"))} == {
        "memory.optimizer_cpu_offload": True, "memory.optimizer_offload_fraction": 0.75,
        "memory.overlap_cpu_optimizer_d2h_h2d": True, "memory.use_distributed_optimizer": True,
        "overlap.bucket_size": 40000000, "overlap.align_grad_reduce": False,
        "overlap.async_tensor_model_parallel_allreduce": True, "overlap.overlap_p2p_comm": True,
        "precision.first_last_layers_bf16": True, "precision.num_layers_at_start_in_bf16": 2,
        "precision.num_layers_at_end_in_bf16": 0, "model.rope_type": "rope"}
    assert not [i for i in imp.listed if i.reason.startswith(K.NO_EQUIV)]


def test_settings_that_would_act_on_nothing_are_listed_with_what_they_need(tmp_path):
    # what Megatron-LM would ignore (or switch off) for this run is listed, so the imported config asks for nothing
    # that validation then refuses as idle (primus.features.idle_settings)
    imp = _import_with(tmp_path, "llama2_7b.yaml", {
        "fp8": None, "fp8_recipe": "delayed", "fp8_margin": 1, "loss_scale": 1024.0, "hysteresis": 3,
        "optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True, "overlap_p2p_comm": True,
        "async_tensor_model_parallel_allreduce": True, "recompute_modules": ["mlp"], "fp4_recipe": "mxfp4",
        "num_layers_at_start_in_bf16": 2, "data_parallel_replicate_degree": 2, "cross_entropy_loss_fusion": False,
        "cross_entropy_fusion_impl": "te"})
    assert not [k for k in imp.sets if k.startswith(("precision.fp8_", "precision.loss", "precision.hyst",
                                                     "precision.fp4_", "precision.num_layers", "recompute.",
                                                     "memory.optimizer", "memory.overlap", "overlap.overlap_p2p",
                                                     "overlap.async"))]
    reasons = {i.key: i.reason for i in imp.listed}
    # each with what it acts under, as the schema's ACTS_ONLY_WITH rows say it
    assert reasons["fp8_recipe"] == "no effect: acts only with fp8 on (precision.fp8)"
    assert "delayed" in reasons["fp8_margin"]
    assert "fp16" in reasons["loss_scale"] and "fp16" in reasons["hysteresis"]
    assert reasons["optimizer_offload_fraction"] == reasons["overlap_cpu_optimizer_d2h_h2d"] == (
        "no effect: acts only with optimizer offload (memory.optimizer_cpu_offload=true)")
    assert "interleaved" in reasons["overlap_p2p_comm"] and "tensor_model_parallel_size 1" in reasons[
        "async_tensor_model_parallel_allreduce"]
    assert "selective" in reasons["recompute_modules"] and "fp4 on" in reasons["fp4_recipe"]
    assert "first_last_layers_bf16" in reasons["num_layers_at_start_in_bf16"]
    assert "model.cross_entropy_fusion_impl" not in imp.sets and "cross_entropy_loss_fusion=true" in reasons[
        "cross_entropy_fusion_impl"]
    assert reasons["data_parallel_replicate_degree"].startswith("not importable: Megatron-FSDP's 2 replicas")
    with_fp8 = _import_with(tmp_path, "llama2_7b.yaml", {"fp8_recipe": "delayed", "fp8_margin": 1})
    assert with_fp8.sets["precision.fp8_recipe"] == "delayed" and with_fp8.sets["precision.fp8_margin"] == 1


def test_profiler_sink_evaluation_and_schedule_leftovers_are_listed_where_their_switch_is_off(tmp_path):
    # Primus's module defaults set a profiler window and stack traces with the profiler off, and eval_iters 0 with
    # an eval_interval: nothing Megatron-LM would read, so not imported (validation would warn them as idle)
    off = {"profile": False, "profile_step_start": 5, "profile_step_end": 7, "torch_profiler_with_stack": True,
           "profile_ranks": [0, 1], "disable_wandb": True, "wandb_project": "p", "eval_interval": 1000,
           "eval_iters": 0, "optimizer": "sgd", "adam_beta2": 0.99, "lr_decay_style": "constant", "min_lr": 0.0}
    imp = _import_with(tmp_path, "llama2_7b.yaml", off)
    leftovers = ("profile.", "logging.wandb_project", "training.eval", "training.adam", "training.min_lr")
    assert [k for k in imp.sets if k.startswith(leftovers)] == ["profile.enabled"], imp.sets
    reasons = {i.key: i.reason for i in imp.listed}
    assert reasons["torch_profiler_with_stack"] == "no effect: acts only with the profiler (profile.enabled=true)"
    assert "the profiler" in reasons["profile_step_start"] and "the profiler" in reasons["profile_step_end"]
    assert "Weights & Biases" in reasons["wandb_project"] and "evaluation is off" in reasons["eval_interval"]
    assert "an Adam optimizer" in reasons["adam_beta2"] and "a decaying learning rate" in reasons["min_lr"]
    on = {**off, "profile": True, "disable_wandb": False, "eval_iters": 8, "optimizer": "adam",
          "lr_decay_style": "cosine"}
    imp = _import_with(tmp_path, "llama2_7b.yaml", on)
    assert {k: imp.sets[k] for k in ("profile.start_step", "profile.steps", "profile.with_stack", "profile.ranks",
                                     "logging.wandb_project", "training.eval_interval", "training.eval_iters",
                                     "training.adam_beta2", "training.min_lr")} == {
        "profile.start_step": 5, "profile.steps": 2, "profile.with_stack": True, "profile.ranks": [0, 1],
        "logging.wandb_project": "p", "training.eval_interval": 1000, "training.eval_iters": 8,
        "training.adam_beta2": 0.99, "training.min_lr": 0.0}


def test_primus_s_fused_rope_true_is_imported_as_where_it_runs(tmp_path):
    # Primus's true is Transformer Engine's fused RoPE, which runs under q/k layernorm (Qwen3); true here would
    # require primus' split + RoPE kernel, which cannot, and refuse the import's dry run
    imp = _import_with(tmp_path, "llama2_7b.yaml", {"apply_rope_fusion": True, "qk_layernorm": True})
    assert "model.apply_rope_fusion" not in imp.sets and imp.sets["model.qk_layernorm"] is True
    assert "Transformer Engine" in {i.key: i.reason for i in imp.listed}["apply_rope_fusion"]
    imp = _import_with(tmp_path, "llama2_7b.yaml", {"apply_rope_fusion": False})
    assert imp.sets["model.apply_rope_fusion"] is False


def test_a_key_the_table_lacks_but_a_setting_here_shares_is_pointed_at(tmp_path):
    imp = _import_with(tmp_path, "llama2_7b.yaml", {"timing_warmup_steps": 3})
    reason = {i.key: i.reason for i in imp.listed}["timing_warmup_steps"]
    assert "training.timing_warmup_steps" in reason and not reason.startswith(K.NO_EQUIV)


def test_no_table_entry_calls_a_key_with_a_namesake_here_missing():
    from primus.config.keys import schema_leaves

    leaves = {k.rsplit(".", 1)[-1] for k in schema_leaves()}
    other_meaning = {"stage": "Primus's trainer variant, not the GEMM tuning stage",
                     "checkpoint.interval": "TorchTitan's, taken with checkpoint.enable"}
    said_missing = [f"{name}: {key}" for name, table in K.TABLES.items() for key, e in table.items()
                    if isinstance(e, K.No) and key.rsplit(".", 1)[-1] in leaves and key not in other_meaning]
    assert said_missing == []


def test_torchtitan_float8_settings_follow_the_converter(tmp_path):
    on = {"quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": True,
                                             "precompute_float8_dynamic_scale_for_fsdp": True,
                                             "filter_fqns": ["output", "router.gate"]}}}}
    imp = _import_with(tmp_path, "torchtitan.yaml", on, PRIMUS_ROOT)
    assert imp.sets["precision.float8_enable_fsdp_float8_all_gather"] is True
    assert imp.sets["precision.float8_filter_fqns"] == ["output", "router.gate"]
    on["primus_turbo"] = {"enable_primus_turbo": True, "use_turbo_float8_linear": True}
    imp = _import_with(tmp_path, "torchtitan.yaml", on, PRIMUS_ROOT)
    assert "precision.float8_enable_fsdp_float8_all_gather" not in imp.sets  # the turbo linear gathers bf16
    assert "replaces them" in {i.key: i.reason for i in imp.listed}[
        "quantize.linear.float8.enable_fsdp_float8_all_gather"]


def test_moe_settings_on_a_dense_model_are_listed_not_set(tmp_path):
    src = yaml.safe_load(open(_f("llama2_7b.yaml")))
    src["modules"]["pre_trainer"]["overrides"].update({"use_turbo_grouped_gemm": True, "moe_permute_fusion": True})
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p))
    assert "turbo.use_turbo_grouped_gemm" not in imp.sets and "moe.moe_permute_fusion" not in imp.sets
    reasons = {i.key: i.reason for i in imp.listed}
    assert "is dense" in reasons["use_turbo_grouped_gemm"] and "is dense" in reasons["moe_permute_fusion"]


def test_moe_model_keeps_its_router_and_its_dense_layers():
    imp = import_experiment(_f("moe.yaml"), PRIMUS_ROOT)
    m = imp.new_model
    assert m["num_layers"] == 4 and m["num_experts"] == 4 and m["moe_first_k_dense"] == 1
    assert m["moe_router_pre_softmax"] is True and m["moe_router_load_balancing_type"] == "seq_aux_loss"
    assert m["moe_aux_loss_coeff"] == 0.001
    assert imp.sets["moe.moe_grouped_gemm"] is True  # the model config's runtime setting
    assert imp.sets["moe.moe_permute_fusion"] is False  # the experiment's


def test_model_with_a_preset_here_needs_no_primus_checkout():
    imp = import_experiment(_f("llama2_7b.yaml"))
    assert imp.model_preset == "llama2_7b" and imp.new_model is None
    assert imp.sets["precision.fp8"] == "hybrid" and imp.sets["precision.fp8_recipe"] == "tensorwise"
    assert imp.sets["memory.use_distributed_optimizer"] is True and imp.sets["turbo.use_turbo_attention"] is True
    assert any("--primus-root" in n for n in imp.notes)
    reasons = {i.key: i.reason for i in imp.listed}
    assert "export it" in reasons["CLEAN_DOCKER_CONTAINER"]
    over = yaml.safe_load(open(_f("llama2_7b.yaml")))["modules"]["pre_trainer"]["overrides"]
    assert _accounted(imp, over) == []


def test_preset_that_differs_from_primus_s_model_is_noted():
    imp = import_experiment(_f("llama2_7b.yaml"), PRIMUS_ROOT)  # the test zoo's llama2_7B has rotary 10000 ...
    assert imp.model_preset == "llama2_7b"
    # ... and no tokenizer-free differences in sizes: nothing to note; a changed size is named
    assert not any("differs" in n for n in imp.notes), imp.notes


def test_torchtitan_experiment_maps_sections_and_the_fp8_converter():
    imp = import_experiment(_f("torchtitan.yaml"), PRIMUS_ROOT)
    s = imp.sets
    assert imp.framework == "torchtitan" and imp.model_preset == "llama3_1_8b"
    assert s["training.micro_batch_size"] == 2 and s["training.seq_length"] == 8192 and s["training.train_iters"] == 50
    assert s["training.lr_warmup_iters"] == 10 and s["training.log_interval"] == 1
    assert s["training.lr"] == 0.0008  # Primus's torchtitan pre_trainer.yaml
    assert s["precision.fp8"] == "hybrid"
    # TorchTitan's llama3 scales RoPE as Llama 3.1 in every flavor: Primus's TorchTitan run does, so this one does
    assert (s["model.use_rope_scaling"], s["model.rope_scaling_factor"]) == (True, 8.0)
    reasons = {i.key: i.reason for i in imp.listed}
    # the master switch with every Turbo path off turns nothing on: listed, not set
    assert "turbo.enable_primus_turbo" not in s
    assert reasons["primus_turbo.enable_primus_turbo"].startswith("no effect: acts only with a Turbo feature flag")
    assert reasons["training.gc_freq"].startswith(K.NO_EQUIV)
    assert reasons["sink_level"] == "null: stderr_sink_level and file_sink_level decide"


def test_write_experiment_and_model_presets(tmp_path):
    out = tmp_path / "conf" / "experiment" / "tiny_import.yaml"
    assert main([_f("dense.yaml"), "--primus-root", PRIMUS_ROOT, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# @package _global_\n")
    assert "log_avg_reset_interval: 50 (overrides) -- " + K.LOG_ONLY in text.replace("\n#     ", " ")
    body = yaml.safe_load(text)
    assert body["defaults"] == [{"override /backend": "megatron"}, {"override /model": "tinyllama_2l"}]
    assert body["training"]["train_iters"] == 3
    model = yaml.safe_load((tmp_path / "conf" / "model" / "tinyllama_2l.yaml").read_text())
    assert model["defaults"] == ["/schema/model@_here_", "_self_"] and model["hidden_size"] == 64


def test_print_mode_gives_train_py_overrides(capsys):
    assert main([_f("llama2_7b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "python train.py backend=megatron model=llama2_7b" in out and "precision.fp8=hybrid" in out
    assert "CLEAN_DOCKER_CONTAINER: 1 (overrides)" in out


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("content", ["- a\n- b\n", "defaults: []\ntraining: {lr: 1}\n",
                                     "modules: {pre_trainer: {framework: megatron}}\n"])
def test_not_a_primus_experiment_exits_2(tmp_path, capsys, content):
    p = tmp_path / "x.yaml"
    p.write_text(content)
    assert main([str(p)]) == 2
    err = capsys.readouterr().err
    assert "is not a Primus experiment" in err and "modules" in err


def test_this_project_s_own_preset_is_not_a_primus_experiment(capsys):
    assert main([_f("not_primus.yaml")]) == 2
    assert "no `modules:` mapping" in capsys.readouterr().err


@pytest.mark.parametrize("name,missing", [("bias.yaml", "biases in the linear layers (add_bias_linear: True)"),
                                          ("mamba.yaml", "Mamba"),
                                          ("softcap.yaml", "logit soft-capping (final_logit_softcapping: 50.0); "
                                                           "router logit soft-capping"),
                                          ("sft.yaml", "post-training")])
def test_what_cannot_be_built_is_named(capsys, name, missing):
    assert main([_f(name), "--primus-root", PRIMUS_ROOT]) == 1
    assert missing in capsys.readouterr().err


def test_qwen2_5_maps_to_its_preset_and_the_missing_biases_in_primus_s_config_are_noted():
    imp = import_experiment(_f("qwen2_5.yaml"), PRIMUS_ROOT)
    assert imp.model_preset == "qwen2_5_7b" and imp.new_model is None
    assert compose_cfg([f"model={imp.model_preset}"]).model.add_qkv_bias is True
    (note,) = [n for n in imp.notes if "differs from Primus's qwen2_5_7b" in n]
    assert "add_qkv_bias: Primus False, here True" in note
    assert imp.sets["training.seq_length"] == 2048 and imp.sets["model.max_position_embeddings"] == 131072
    # the preset is this project's: no Primus checkout needed to import it
    assert import_experiment(_f("qwen2_5.yaml")).model_preset == "qwen2_5_7b"


def test_a_zoo_model_with_qkv_biases_becomes_a_preset_with_them(monkeypatch):
    monkeypatch.setenv("PRIMUS_MODEL", "tinyqwen_2L")
    imp = import_experiment(_f("dense.yaml"), PRIMUS_ROOT)
    assert imp.model_preset == "tinyqwen_2l"
    assert imp.new_model["add_qkv_bias"] is True and imp.new_model["rotary_base"] == 1000000


def test_zoo_model_without_a_primus_checkout_asks_for_one():
    with pytest.raises(CannotImport, match="--primus-root"):
        import_experiment(_f("dense.yaml"))


def test_unknown_override_key_is_listed_not_dropped(tmp_path):
    src = yaml.safe_load(open(_f("llama2_7b.yaml")))
    src["modules"]["pre_trainer"]["overrides"]["some_future_primus_flag"] = 7
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p))
    item = next(i for i in imp.listed if i.key == "some_future_primus_flag")
    assert item.value == 7 and item.reason == K.NO_EQUIV


def test_a_value_this_schema_refuses_is_listed_with_what_is_allowed(tmp_path):
    src = yaml.safe_load(open(_f("llama2_7b.yaml")))
    src["modules"]["pre_trainer"]["overrides"]["lr_decay_style"] = "WSD"
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p))
    item = next(i for i in imp.listed if i.key == "lr_decay_style")
    assert "not importable as training.lr_decay_style" in item.reason and "cosine" in item.reason
    assert "training.lr_decay_style" not in imp.sets


# ------------------------------------------------------------------------------------------------ the table


def _table_targets():
    out = {t for table in K.TABLES.values() for t in table.values() if isinstance(t, str)}
    return out | {"data.kind", "data.path", "checkpoint.dir", "checkpoint.interval", "checkpoint.save_at_end",
                  "checkpoint.resume", "model.moe_first_k_dense", "model.num_query_groups",
                  "model.tie_word_embeddings", "profile.start_step", "profile.steps",
                  "recompute.activation_checkpoint_mode", "logging.wandb", "logging.tensorboard",
                  "parallel.sequence_parallel", "training.deterministic"}


def test_every_key_the_table_maps_to_exists_in_the_schema():
    missing = sorted(t for t in _table_targets() if _schema_field(t) is None)
    assert missing == [], f"keys the importer writes but the schema lacks: {missing}"


def test_model_presets_written_have_only_model_fields():
    fields = {f.name for f in dataclasses.fields(PrimusConfig.__dataclass_fields__["model"].default_factory())}
    imp = import_experiment(_f("moe.yaml"), PRIMUS_ROOT)
    assert set(imp.new_model) <= fields, set(imp.new_model) - fields


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.e2e
def test_imported_preset_dry_runs_through_train_py(tmp_path):
    conf = tmp_path / "conf"
    out = conf / "experiment" / "tiny_primus.yaml"
    # one rank, as Primus's launch scripts read it (GPUS_PER_NODE, NNODES); a Qwen2-style zoo model (q/k/v biases)
    env = {**os.environ, "GPUS_PER_NODE": "1", "NNODES": "1", "PRIMUS_MODEL": "tinyqwen_2L"}
    r = subprocess.run([PY, "-m", "primus.importer", _f("dense.yaml"), "--primus-root", PRIMUS_ROOT, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([PY, "train.py", f"hydra.searchpath=[file://{conf}]", "experiment=tiny_primus", "dry_run=true",
                        "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '"num_layers": 2' in r.stdout and '"hidden_size": 64' in r.stdout and '"add_qkv_bias": true' in r.stdout


def test_a_sync_free_stage_overrides_primus_s_module_defaults_not_the_experiment(tmp_path):
    """Primus's stage sets its flags over its module config's defaults (false there): the import leaves them to the
    stage here too, and lists them; a false the experiment itself sets stays, and validation names the clash."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(PRIMUS_ROOT, root)
    with open(root / "primus" / "configs" / "modules" / "megatron" / "trainer_base.yaml", "a") as f:
        f.write("\nmoe_use_fused_router_with_aux_score: false\n")
    src = yaml.safe_load(open(_f("moe.yaml")))
    src["modules"]["pre_trainer"]["overrides"].update({"enable_primus_turbo": True, "turbo_sync_free_moe_stage": 1})
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p), str(root))
    assert "turbo.moe_use_fused_router_with_aux_score" not in imp.sets
    reasons = {i.key: i.reason for i in imp.listed}
    assert "turbo_sync_free_moe_stage=1" in reasons["moe_use_fused_router_with_aux_score"]
    assert imp.sets["moe.moe_permute_fusion"] is False  # the experiment's own: the stage rule refuses it, named


def test_a_torchtitan_moe_experiment_balances_as_torchtitan_does(tmp_path):
    src = yaml.safe_load(open(_f("torchtitan.yaml")))
    src["modules"]["pre_trainer"]["model"] = "deepseek_v2_lite.yaml"  # a preset here: no checkout needed
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p))
    assert imp.model_preset == "deepseek_v2_lite"
    assert imp.sets["moe.moe_router_load_balancing_type"] == "none"  # the preset's seq_aux_loss is megatron's


def test_kimi_k2_without_a_context_length_in_primus_s_config_takes_the_published_one(monkeypatch):
    monkeypatch.setenv("PRIMUS_MODEL", "kimi_k2")
    imp = import_experiment(_f("dense.yaml"), PRIMUS_ROOT)
    assert imp.model_preset == "kimi_k2" and imp.new_model["multi_latent_attention"] is True
    assert imp.new_model["max_position_embeddings"] == 131072
    assert any("gives no max_position_embeddings" in n and "131072" in n for n in imp.notes), imp.notes
    # without a published one, the experiment's (128 here); with neither, the import is refused, naming the key
    monkeypatch.setattr("primus.importer.models.PUBLISHED_CONTEXT", {})
    assert import_experiment(_f("dense.yaml"), PRIMUS_ROOT).new_model["max_position_embeddings"] == 128


def test_a_model_with_no_context_length_anywhere_is_refused_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_MODEL", "glm_tiny")
    src = yaml.safe_load(open(_f("dense.yaml")))
    del src["modules"]["pre_trainer"]["overrides"]["max_position_embeddings"]
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    with pytest.raises(CannotImport, match="gives no max_position_embeddings"):
        import_experiment(str(p), PRIMUS_ROOT)


def test_a_torchtitan_deepseek_experiment_drops_the_mtp_layers_torchtitan_cannot_build(tmp_path):
    src = yaml.safe_load(open(_f("torchtitan.yaml")))
    src["modules"]["pre_trainer"]["model"] = "deepseek_v3_671b.yaml"  # TorchTitan's name for DeepSeek-V3's shape
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(src))
    imp = import_experiment(str(p))
    assert imp.model_preset == "deepseek_v3" and compose_cfg(["model=deepseek_v3"]).model.mtp_num_layers == 1
    assert imp.sets["model.mtp_num_layers"] == 0
    assert any(n.startswith("set model.mtp_num_layers=0") and "TorchTitan" in n for n in imp.notes)
    # the TorchTitan refusal of the preset's MTP layer is what the setting removes
    from primus.config.errors import ConfigError
    from primus.config.validate import validate
    from primus.context import RunContext

    def mtp_issues(extra):
        cfg = compose_cfg(["backend=torchtitan", "model=deepseek_v3", "moe.moe_router_load_balancing_type=none"]
                          + extra)
        try:
            validate(cfg, RunContext(device="cuda", world_size=8, dist_backend="nccl", planned=True))
        except ConfigError as e:
            return [i for i in e.issues if "model.mtp_num_layers" in i.keys]
        return []

    assert mtp_issues([]) and mtp_issues(["model.mtp_num_layers=0"]) == []


@pytest.mark.parametrize("path", ["10 /data/c4-train.en_6_text_document", ["10", "/data/c4-train.en_6_text_document"],
                                  [10, "/data/c4-train.en_6_text_document"], "/data/c4-train.en_6_text_document"])
def test_a_weighted_data_path_imports_its_one_prefix(tmp_path, path):
    """Megatron-LM's --data-path is a blend, `weight prefix ...`, as one string (split on spaces) or a list: one
    prefix with its weight is that prefix (Primus's MLPerf examples read "10 /data/c4-train...")."""
    imp = _import_with(tmp_path, "dense.yaml", {"mock_data": False, "train_data_path": path}, PRIMUS_ROOT)
    assert imp.sets["data.kind"] == "indexed" and imp.sets["data.path"] == "/data/c4-train.en_6_text_document"


def test_a_blend_of_several_datasets_is_listed_as_not_importable_naming_the_count(tmp_path):
    imp = _import_with(tmp_path, "dense.yaml", {"mock_data": False, "train_data_path": "0.7 /data/a 0.3 /data/b"},
                       PRIMUS_ROOT)
    reasons = {x.key: x.reason for x in imp.listed}
    assert reasons["train_data_path"].startswith("not importable: a blend of 2 datasets; one indexed prefix")
    assert "data.path" not in imp.sets


def test_a_model_with_no_known_context_length_takes_the_experiment_s(monkeypatch):
    """Primus's GLM-5 config names no max_position_embeddings and its published one is not in models.py: the
    preset takes the experiment's (dense.yaml: 128), with a note, rather than refusing the import."""
    monkeypatch.setenv("PRIMUS_MODEL", "glm_tiny")
    imp = import_experiment(_f("dense.yaml"), PRIMUS_ROOT)
    assert imp.model_preset == "glm_tiny" and imp.new_model["max_position_embeddings"] == 128
    assert any("the preset takes the experiment's, 128" in n for n in imp.notes), imp.notes


def test_an_import_that_does_not_compose_says_its_idle_settings_were_kept(tmp_path, monkeypatch):
    """Where the imported config cannot be composed here, the settings that act only under another cannot be
    judged: they stay in the import (validation names them) and a note says so, rather than a silent skip."""
    from primus.importer import core

    def broken(framework):
        raise ValueError("conf/ unreadable")

    monkeypatch.setattr(core, "_base_config", broken)
    imp = _import_with(tmp_path, "llama2_7b.yaml", {"fp8": None, "fp8_recipe": "delayed"})
    assert imp.sets["precision.fp8_recipe"] == "delayed"  # not judged, so kept
    assert any("were not left out" in n and "conf/ unreadable" in n for n in imp.notes), imp.notes
