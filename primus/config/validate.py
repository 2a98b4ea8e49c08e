"""`validate(cfg)`: every cross-field rule of the guide, each in one place, run before anything launches.

Each rule is a small function returning ConfigIssues (key, value, rule, fix); `validate` runs them all and raises
one ConfigError listing every problem. The features' rules live in their modules (primus/features/*.py, `@rule`).
Rules that depend on the installed backend or the device are the backend's `capability_issues`
(`primus/backends/<name>/args.py`), which adds each feature's `megatron_issues` / `torchtitan_issues`; they are
run from here too, once the other rules pass. Normalisations the guide asks for (recompute_layer_ids deduplicated
and sorted) happen here, in place, so every consumer sees one form.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional

from primus.config.errors import ConfigError, ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext, data_parallel_size

from primus.features import RULES, Rule, modules, rule  # noqa: F401 - the registry every feature module's rules join


# ---------------------------------------------------------------- counts and the model's shape
# Every other rule divides or compares by these, so `validate` reports these alone when any is off.

# (key, must be >= this); a None value (an optional size left unset) is not judged
POSITIVE = (
    ("model.num_layers", 1), ("model.hidden_size", 1), ("model.ffn_hidden_size", 1),
    ("model.num_attention_heads", 1), ("model.num_query_groups", 1), ("model.kv_channels", 1),
    ("model.vocab_size", 1), ("model.max_position_embeddings", 1), ("model.num_experts", 1),
    ("model.moe_ffn_hidden_size", 1), ("model.moe_shared_expert_intermediate_size", 1),
    ("model.moe_first_k_dense", 0), ("model.mtp_num_layers", 0), ("model.q_lora_rank", 1),
    ("model.kv_lora_rank", 1), ("model.qk_head_dim", 1), ("model.qk_pos_emb_head_dim", 1), ("model.v_head_dim", 1),
    ("training.train_iters", 1), ("training.seq_length", 1), ("training.micro_batch_size", 1),
    ("training.global_batch_size", 1), ("training.lr_warmup_iters", 0), ("training.timing_warmup_steps", 0),
    ("training.log_interval", 1),
    ("parallel.tensor_model_parallel_size", 1), ("parallel.pipeline_model_parallel_size", 1),
    ("parallel.context_parallel_size", 1), ("parallel.expert_model_parallel_size", 1),
    ("launcher.nproc_per_node", 1), ("launcher.nnodes", 1), ("checkpoint.interval", 0), ("checkpoint.keep_last", 0),
    ("data.num_workers", 0), ("precision.loss_scale_window", 1), ("precision.hysteresis", 1),
)


def _get(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def counts_are_positive(cfg, ctx) -> List[ConfigIssue]:
    out = []
    for key, least in POSITIVE:
        v = _get(cfg, key)
        if v is not None and v < least:
            what = "a count" if least == 1 else "a count that may be 0"
            null = f" (or null: {_NULL_MEANS[key]})" if key in _NULL_MEANS else ""
            out.append(ConfigIssue([key], v, f"must be >= {least} ({what})", f"set {key} to {least} or more{null}"))
    return out


_NULL_MEANS = {"model.kv_channels": "hidden_size / heads", "model.num_experts": "a dense model",
               "model.moe_ffn_hidden_size": "ffn_hidden_size", "model.moe_shared_expert_intermediate_size":
               "no shared experts", "model.q_lora_rank": "full-rank queries"}


# ---------------------------------------------------------------- recompute


@rule
def recompute_layer_ids(cfg, ctx):
    r = cfg.recompute
    ids = r.recompute_layer_ids
    if ids is None:
        return []
    out = []
    if len(ids) == 0:
        return [ConfigIssue(["recompute.recompute_layer_ids"], [], "an empty list recomputes nothing",
                            "list at least one layer id, or set it to null")]
    if r.recompute_granularity is None or r.recompute_granularity.value != "full" or r.recompute_method is not None:
        out.append(ConfigIssue(
            ["recompute.recompute_layer_ids", "recompute.recompute_granularity", "recompute.recompute_method"],
            {"granularity": r.recompute_granularity and r.recompute_granularity.value,
             "method": r.recompute_method and r.recompute_method.value},
            "recompute_layer_ids needs recompute_granularity=full and recompute_method=null",
            "use recompute=layer_ids, or set recompute.recompute_granularity=full recompute.recompute_method=null"))
    top = cfg.model.num_layers + cfg.model.mtp_num_layers
    bad = sorted({i for i in ids if i < 0 or i >= top})
    if bad:
        out.append(ConfigIssue(["recompute.recompute_layer_ids"], bad,
                               f"ids are global: decoder layers 0..{cfg.model.num_layers - 1}"
                               + (f", MTP depth d is {cfg.model.num_layers}+d (up to {top - 1})" if cfg.model.mtp_num_layers else ""),
                               f"use ids in 0..{top - 1}"))
    if not out:
        r.recompute_layer_ids = sorted(set(ids))  # the guide: duplicates removed, sorted
    return out


@rule
def recompute_method_needs_full(cfg, ctx):
    r = cfg.recompute
    out = []
    if r.recompute_method is not None and (r.recompute_granularity is None or r.recompute_granularity.value != "full"):
        out.append(ConfigIssue(["recompute.recompute_method", "recompute.recompute_granularity"],
                               r.recompute_method.value, "recompute_method applies to recompute_granularity=full",
                               "set recompute.recompute_granularity=full or recompute.recompute_method=null"))
    if r.recompute_method is not None and r.recompute_num_layers is None:
        out.append(ConfigIssue(["recompute.recompute_num_layers"], None,
                               f"recompute_method={r.recompute_method.value} needs the number of layers",
                               "set recompute.recompute_num_layers (e.g. 1 for uniform)"))
    if r.recompute_num_layers is not None and r.recompute_num_layers <= 0:
        out.append(ConfigIssue(["recompute.recompute_num_layers"], r.recompute_num_layers, "must be >= 1", "use a positive count"))
    return out


# ---------------------------------------------------------------- parallel layout


@rule
def parallel_layout(cfg, ctx):
    p, m, t, out = cfg.parallel, cfg.model, cfg.training, []
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    world = ctx.world_size
    dp = data_parallel_size(cfg, world)
    if tp * pp * cp * dp != world:
        out.append(ConfigIssue(["parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size",
                                "parallel.context_parallel_size", "parallel.data_parallel_size", "launcher.nproc_per_node"],
                               {"tp": tp, "pp": pp, "cp": cp, "dp": p.data_parallel_size, "world_size": world},
                               "tp x pp x cp x dp must equal the world size",
                               "launch tp*pp*cp*dp ranks (launcher.nproc_per_node x launcher.nnodes), or change the sizes"))
        dp = max(dp, 1)
    vp = p.virtual_pipeline_model_parallel_size
    stages = pp * (vp or 1)
    if vp is not None and (vp < 1 or pp < 2):
        out.append(ConfigIssue(["parallel.virtual_pipeline_model_parallel_size"], vp,
                               "virtual pipeline stages need pipeline_model_parallel_size >= 2 and vp >= 1",
                               "set parallel.pipeline_model_parallel_size >= 2 or vp=null"))
    elif m.num_layers % stages:
        out.append(ConfigIssue(["model.num_layers", "parallel.pipeline_model_parallel_size",
                                "parallel.virtual_pipeline_model_parallel_size"], m.num_layers,
                               f"layers must divide evenly across {stages} pipeline stages (pp={pp}, vp={vp})",
                               "choose pp (x vp) dividing num_layers"))
    if m.num_attention_heads % tp or m.num_query_groups % tp:
        out.append(ConfigIssue(["model.num_attention_heads", "model.num_query_groups", "parallel.tensor_model_parallel_size"],
                               {"heads": m.num_attention_heads, "kv_heads": m.num_query_groups, "tp": tp},
                               "attention and KV heads must be divisible by tp", "choose tp dividing both head counts"))
    ep = p.expert_model_parallel_size
    if ep > 1 and not m.num_experts:
        out.append(ConfigIssue(["parallel.expert_model_parallel_size", "model.num_experts"], ep,
                               "expert parallelism needs a MoE model", "set ep=1 or choose a MoE model"))
    elif m.num_experts and m.num_experts % ep:
        out.append(ConfigIssue(["model.num_experts", "parallel.expert_model_parallel_size"],
                               {"experts": m.num_experts, "ep": ep}, "experts must be divisible by ep", "choose ep dividing num_experts"))
    if t.global_batch_size % (t.micro_batch_size * dp):
        out.append(ConfigIssue(["training.global_batch_size", "training.micro_batch_size", "parallel.data_parallel_size"],
                               {"global": t.global_batch_size, "micro": t.micro_batch_size, "dp": dp},
                               "micro_batch_size x dp must divide global_batch_size (gradient accumulation steps are whole)",
                               f"use a global batch that is a multiple of {t.micro_batch_size * dp}"))
    if p.sequence_parallel and tp == 1:
        out.append(ConfigIssue(["parallel.sequence_parallel", "parallel.tensor_model_parallel_size"], True,
                               "sequence parallel shards over tp ranks: needs tp > 1", "set tp > 1 or sequence_parallel=false"))
    if t.seq_length % cp:
        out.append(ConfigIssue(["training.seq_length", "parallel.context_parallel_size"], t.seq_length,
                               "seq_length must be divisible by cp", "choose cp dividing seq_length"))
    if t.seq_length > m.max_position_embeddings:
        out.append(ConfigIssue(["training.seq_length", "model.max_position_embeddings"], t.seq_length,
                               f"longer than the model's positions ({m.max_position_embeddings})",
                               "lower training.seq_length or raise model.max_position_embeddings"))
    return out


@rule
def training_values(cfg, ctx):
    t, out = cfg.training, []
    if t.lr <= 0 or t.min_lr < 0 or t.min_lr > t.lr:
        out.append(ConfigIssue(["training.lr", "training.min_lr"], [t.lr, t.min_lr], "need 0 <= min_lr <= lr, lr > 0", "fix the rates"))
    if not 0 <= t.seed < 2 ** 32:  # numpy's seed range (megatron and torchtitan seed numpy too)
        out.append(ConfigIssue(["training.seed"], t.seed, "must be in 0..2^32-1", "use a non-negative seed, e.g. 1234"))
    if not (0 <= t.adam_beta1 < 1 and 0 <= t.adam_beta2 < 1):
        out.append(ConfigIssue(["training.adam_beta1", "training.adam_beta2"], [t.adam_beta1, t.adam_beta2],
                               "Adam's betas are decay rates in [0, 1)", "e.g. 0.9 and 0.95"))
    for k, v in (("adam_eps", t.adam_eps), ("weight_decay", t.weight_decay), ("clip_grad", t.clip_grad)):
        if v < 0:
            out.append(ConfigIssue([f"training.{k}"], v, "must be >= 0" + (" (0 = off)" if k == "clip_grad" else ""),
                                   f"set training.{k} to 0 or more"))
    if t.init_method_std <= 0:
        out.append(ConfigIssue(["training.init_method_std"], t.init_method_std, "a standard deviation must be > 0",
                               "e.g. 0.02"))
    if t.lr_warmup_iters and t.lr_warmup_iters >= t.train_iters:
        # the schedulers need warm-up to end before the decay does (megatron asserts warmup < decay steps)
        out.append(ConfigIssue(["training.lr_warmup_iters", "training.train_iters"], t.lr_warmup_iters,
                               f"warm-up must be 0 or shorter than the run (train_iters={t.train_iters})",
                               f"set training.lr_warmup_iters to 0..{max(t.train_iters - 1, 0)}"))
    return out


# ---------------------------------------------------------------- memory


@rule
def memory_values(cfg, ctx):
    mem, out = cfg.memory, []
    if not 0.0 <= mem.optimizer_offload_fraction <= 1.0:
        out.append(ConfigIssue(["memory.optimizer_offload_fraction"], mem.optimizer_offload_fraction,
                               "a fraction: must be in [0, 1]", "use e.g. 1.0 (all) or 0.5"))
    if mem.empty_unused_memory_level not in (0, 1, 2):
        out.append(ConfigIssue(["memory.empty_unused_memory_level"], mem.empty_unused_memory_level,
                               "must be 0, 1 or 2", "use 0 (default)"))
    return out


# ---------------------------------------------------------------- determinism, tuning


def deterministic_on(cfg) -> bool:
    return cfg.training.deterministic or os.environ.get("PRIMUS_DETERMINISTIC") == "1"


def tuning_enabled(cfg) -> bool:
    if cfg.tuning.enabled is not None:
        return cfg.tuning.enabled
    return os.environ.get("PRIMUS_HIPBLASLT_TUNING") == "1"


@rule
def deterministic_mode(cfg, ctx):
    if not deterministic_on(cfg):
        return []
    out = []
    if cfg.training.compile:
        out.append(ConfigIssue(["training.deterministic", "training.compile"], True,
                               "deterministic mode (PRIMUS_DETERMINISTIC) turns torch.compile off",
                               "set training.compile=false, or turn deterministic mode off"))
    if cfg.tuning.enabled or (cfg.tuning.enabled is None and tuning_enabled(cfg) and cfg.tuning.stage > 0):
        out.append(ConfigIssue(["training.deterministic", "tuning.enabled", "tuning.stage"],
                               {"enabled": tuning_enabled(cfg), "stage": cfg.tuning.stage},
                               "deterministic mode turns GEMM tuning off",
                               "drop tuning.enabled / PRIMUS_HIPBLASLT_TUNING, or turn deterministic mode off"))
    return out


@rule
def tuning_stage(cfg, ctx):
    tcfg = cfg.tuning
    if tcfg.stage not in (0, 1, 2, 3):
        return [ConfigIssue(["tuning.stage"], tcfg.stage, "must be 0, 1, 2 or 3", "use tuning_stage=0..3")]
    if tcfg.stage == 3 and tuning_enabled(cfg) and not deterministic_on(cfg):
        from primus.tuning_env import results_file

        path = results_file(cfg)
        if not os.path.isfile(path):
            return [ConfigIssue(["tuning.override_file", "tuning.stage"], path,
                                "stage 3 trains with tuned GEMMs: the results file does not exist",
                                "run stage 1 (tuning_stage=1) and stage 2 (tuning_stage=2) first, or point "
                                "tuning.override_file / HIPBLASLT_TUNING_OVERRIDE_FILE at a results file")]
    return []


# ---------------------------------------------------------------- data


@rule
def data_paths(cfg, ctx):
    d, out = cfg.data, []
    kind = d.kind.value
    if kind == "synthetic":
        return []
    if not d.path:
        return [ConfigIssue(["data.path"], d.path, f"data.kind={kind} reads a local path", "set data.path")]
    if kind == "indexed":
        missing = [p for p in (d.path + ".bin", d.path + ".idx") if not os.path.isfile(p)]
        if missing:
            out.append(ConfigIssue(["data.path"], d.path, f"indexed dataset files not found: {missing}",
                                   "give the prefix without .bin/.idx (build one with python -m primus.data.megatron_preprocess)"))
    elif not os.path.exists(d.path):
        out.append(ConfigIssue(["data.path"], d.path, "does not exist", "point data.path at a local jsonl file or folder"))
    if kind in ("jsonl", "indexed") and d.tokenizer and not os.path.isfile(os.path.join(d.tokenizer, "tokenizer.json")):
        out.append(ConfigIssue(["data.tokenizer"], d.tokenizer, "no tokenizer.json in that folder",
                               "point data.tokenizer at a local tokenizer folder"))
    if kind == "jsonl" and not d.tokenizer:
        out.append(ConfigIssue(["data.tokenizer"], None, "jsonl text needs a local tokenizer", "set data.tokenizer"))
    return out


@rule
def launcher_values(cfg, ctx):
    lc, out = cfg.launcher, []
    if not 0 <= lc.master_port <= 65535:
        out.append(ConfigIssue(["launcher.master_port"], lc.master_port, "a TCP port is 1..65535 (0 = pick a free one)",
                               "use 0, or a free port such as 29500"))
    launching = not (cfg.dry_run or cfg.mode.value == "plan")
    if lc.nnodes > 1 and launching and "WORLD_SIZE" not in os.environ and "SLURM_JOB_ID" not in os.environ:
        out.append(ConfigIssue(["launcher.nnodes"], lc.nnodes,
                               "the local launcher starts processes on this node only; several nodes run through Slurm",
                               "submit with -m hydra/launcher=slurm (see docs/launching.md), or set launcher.nnodes=1"))
    if ctx.device == "cuda" and not ctx.planned and lc.nproc_per_node > 1:  # a dry run plans for its GPUs
        import torch

        n = torch.cuda.device_count()
        if lc.nproc_per_node > n:
            out.append(ConfigIssue(["launcher.nproc_per_node"], lc.nproc_per_node,
                                   f"one process per GPU: this node has {n}", f"use launcher.nproc_per_node<={n}"))
    return out


@rule
def plan_values(cfg, ctx):
    from primus.plan.gpus import KNOWN, lookup

    p, out = cfg.plan, []
    if p.gpu_memory_gb is not None and p.gpu_memory_gb <= 0:
        out.append(ConfigIssue(["plan.gpu_memory_gb"], p.gpu_memory_gb, "a GPU's memory must be > 0 GiB",
                               "set the capacity in GiB (e.g. 141), or null to take plan.gpu's"))
    elif p.gpu_memory_gb is None and p.gpu and p.gpu.lower() != "auto" and lookup(p.gpu) is None:
        out.append(ConfigIssue(["plan.gpu"], p.gpu, f"not a GPU the planner knows ({', '.join(KNOWN)})",
                               "use one of those or auto, or give the size: plan.gpu_memory_gb=<GiB>"))
    if not 0 < p.assumed_mfu <= 1:
        out.append(ConfigIssue(["plan.assumed_mfu"], p.assumed_mfu, "an MFU is a fraction in (0, 1]",
                               "e.g. plan.assumed_mfu=0.45"))
    return out


@rule
def profile_window(cfg, ctx):
    p, out = cfg.profile, []
    if not (p.enabled or p.memory_snapshot):
        return []
    n = cfg.training.train_iters
    if p.start_step < 1 or p.start_step > n:
        out.append(ConfigIssue(["profile.start_step"], p.start_step, f"must be a step of the run (1..{n})",
                               f"use profile.start_step between 1 and training.train_iters ({n})"))
    if p.steps < 1:
        out.append(ConfigIssue(["profile.steps"], p.steps, "must be >= 1", "profile at least one step"))
    elif p.enabled and p.start_step + p.steps - 1 > n:
        out.append(ConfigIssue(["profile.start_step", "profile.steps"], [p.start_step, p.steps],
                               f"the window ends after the run's last step ({n})", "start earlier or profile fewer steps"))
    if p.memory_snapshot:
        if ctx.device != "cuda":
            out.append(ConfigIssue(["profile.memory_snapshot"], True, "records the CUDA allocator: needs a GPU",
                                   "set profile.memory_snapshot=false on CPU"))
        if p.memory_snapshot_steps < 1:
            out.append(ConfigIssue(["profile.memory_snapshot_steps"], p.memory_snapshot_steps, "must be >= 1", "use 1 or more"))
    bad = [r for r in p.ranks if r < 0 or r >= ctx.world_size]
    if bad:
        out.append(ConfigIssue(["profile.ranks"], bad, f"ranks must be in 0..{ctx.world_size - 1}", "list existing ranks"))
    return out


@rule
def wandb_installed(cfg, ctx):
    if not cfg.logging.wandb:
        return []
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return [ConfigIssue(["logging.wandb"], True, "the Weights & Biases sink needs the wandb package",
                            "pip install wandb==0.31.0 (pinned in requirements.lock), or set logging.wandb=false")]
    return []


modules()  # every feature module, imported: their rules join RULES


def validate(cfg: PrimusConfig, ctx: RunContext, rules: Optional[List[Rule]] = None) -> PrimusConfig:
    """Run every rule (generic, then the backend's capability rules) and raise one ConfigError listing all issues."""
    issues: List[ConfigIssue] = counts_are_positive(cfg, ctx)
    if issues:  # the other rules divide by these counts: their verdicts would be noise
        raise ConfigError(issues)
    for r in rules or RULES:
        issues += r(cfg, ctx)
    if not issues and rules is None:
        from primus.backends import capability_issues

        issues += capability_issues(cfg, ctx)
    if issues:
        raise ConfigError(issues)
    return cfg
