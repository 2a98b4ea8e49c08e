"""`validate(cfg)`: every cross-field rule of the guide, each in one place, run before anything launches.

Each rule is a small function returning ConfigIssues (key, value, rule, fix), registered with `@rule` in the
module of its feature (primus/features/<name>.py); `validate` checks the counts, runs them all and raises one
ConfigError listing every problem. Rules that depend on the installed backend or the device are the backend's
(`primus/backends/<name>/args.py: capability_issues`, which gathers each feature's `<backend>_issues`) and are run
in the same round, so one error message lists the generic and the backend problems together. Normalisations the guide asks for (recompute_layer_ids deduplicated and sorted) happen in the rules,
in place, so every consumer sees one form.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional

from primus.config.errors import ERROR, NOTE, WARNING, ConfigError, ConfigIssue
from primus.config.schema import PrimusConfig
from primus.context import RunContext

from primus.features import RESOLVERS, RULES, Rule, modules, rule  # noqa: F401 - the registry every feature module's rules join

modules()  # importing each feature module registers its rules


# ---------------------------------------------------------------- counts and the model's shape
# Every other rule divides or compares by these, so `validate` reports these alone when any is off.

# (key, must be >= this); a None value (an optional size left unset) is not judged
POSITIVE = (
    ("model.num_layers", 1), ("model.hidden_size", 1), ("model.ffn_hidden_size", 1),
    ("model.num_attention_heads", 1), ("model.num_query_groups", 1), ("model.kv_channels", 1),
    ("model.vocab_size", 1), ("model.max_position_embeddings", 1), ("model.num_experts", 1),
    ("model.moe_ffn_hidden_size", 1), ("model.moe_shared_expert_intermediate_size", 1),
    ("model.moe_first_k_dense", 0), ("model.moe_layer_freq", 1), ("model.sink_sliding_window", 0),
    ("model.mtp_num_layers", 0), ("model.q_lora_rank", 1),
    ("model.kv_lora_rank", 1), ("model.qk_head_dim", 1), ("model.qk_pos_emb_head_dim", 1), ("model.v_head_dim", 1),
    ("training.train_iters", 1), ("training.seq_length", 1), ("training.micro_batch_size", 1),
    ("training.global_batch_size", 1), ("training.gradient_accumulation_steps", 1), ("training.lr_warmup_iters", 0),
    ("training.timing_warmup_steps", 0), ("training.log_interval", 1),
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
        if v is not None and v < least and v != _SIZED_FROM_WORLD.get(key):
            what = "a count" if least == 1 else "a count that may be 0"
            null = f" (or null: {_NULL_MEANS[key]})" if key in _NULL_MEANS else ""
            if key in _SIZED_FROM_WORLD:
                null = f" (or {_SIZED_FROM_WORLD[key]}: micro batch x dp x gradient_accumulation_steps)"
            out.append(ConfigIssue([key], v, f"must be >= {least} ({what})", f"set {key} to {least} or more{null}"))
    return out


# a count whose sentinel means "sized from the world" (training.py: batch_sizes resolves it)
_SIZED_FROM_WORLD = {"training.global_batch_size": -1}

_NULL_MEANS = {"model.kv_channels": "hidden_size / heads", "model.num_experts": "a dense model",
               "model.moe_ffn_hidden_size": "ffn_hidden_size", "model.moe_shared_expert_intermediate_size":
               "no shared experts", "model.q_lora_rank": "full-rank queries",
               "training.lr_warmup_iters": "5% of train_iters, at most 2000"}


# Float fields that may be infinite (none yet): every other number must be finite. The range rules compare with
# < and <=, which NaN passes, so NaN and inf are caught here, before them.
INFINITE_OK: tuple = ()


def numbers_are_finite(cfg, ctx=None) -> List[ConfigIssue]:
    out = []

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            v, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(v):
                walk(v, key + ".")
            elif isinstance(v, float) and not math.isfinite(v) and key not in INFINITE_OK:
                out.append(ConfigIssue([key], v, "must be a finite number (NaN and inf are not values here)",
                                       f"set {key} to a finite number, or leave it at its default"))

    walk(cfg, "")
    return out


def validate(cfg: PrimusConfig, ctx: RunContext, rules: Optional[List[Rule]] = None) -> PrimusConfig:
    """Run the resolvers, every rule and the backend's capability rules, all in one round, and raise one
    ConfigError listing every error. Warnings and notes go to ctx.warnings / ctx.notes; in a dry run judged for the
    GPU target (ctx.planned) an error that only says a library is missing here goes to ctx.needed_on_target."""
    issues: List[ConfigIssue] = numbers_are_finite(cfg) + counts_are_positive(cfg, ctx)
    if issues:  # the other rules compare and divide by these: their verdicts would be noise
        raise ConfigError(issues)
    for r in RESOLVERS:  # what settings imply, before any rule judges them
        issues += r(cfg, ctx)
    for r in rules or RULES:
        issues += r(cfg, ctx)
    if rules is None:
        from primus.backends import capability_issues

        try:
            issues += capability_issues(cfg, ctx)
        except Exception:  # noqa: BLE001 - a capability rule tripped on a value the generic rules already refuse
            if not any(i.severity == ERROR for i in issues):
                raise
    errors = [i for i in issues if i.severity == ERROR]
    if ctx.planned:
        ctx.needed_on_target = [i for i in errors if i.needs]
        errors = [i for i in errors if not i.needs]
    if errors:
        raise ConfigError(errors)
    ctx.warnings = [i for i in issues if i.severity == WARNING]
    ctx.notes = [i for i in issues if i.severity == NOTE]
    return cfg
