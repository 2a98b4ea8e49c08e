"""The training feature: batch, steps, optimizer, schedule, seed, compile and deterministic mode (see
primus/features/__init__.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import List, Optional, Tuple

from primus.config.errors import WARNING, ConfigIssue, note, warning
from primus.features import rule, unmet


class Optimizer(str, Enum):
    adam = "adam"  # decoupled weight decay (AdamW), as megatron-core's "adam"
    adamw = "adamw"
    sgd = "sgd"


class LRDecay(str, Enum):  # after the linear warm-up, from lr down to min_lr
    constant = "constant"  # (stays at lr)
    linear = "linear"
    cosine = "cosine"


class NonFiniteAction(str, Enum):
    skip = "skip"  # drop the update, keep training
    stop = "stop"  # end the run with status failed


@dataclass
class TrainingConfig:
    micro_batch_size: int = 4  # sequences per forward per rank
    # sequences per optimizer step (all dp ranks, all micro batches). -1 (TorchTitan's convention): sized from the
    # world, micro_batch_size x dp x gradient_accumulation_steps; validation writes the resolved value back
    global_batch_size: int = -1
    # micro batches each dp rank runs per optimizer step (megatron's num_microbatches, TorchTitan's gradient
    # accumulation steps). null: global / (micro x dp) for an explicit global batch; with -1, 1 (pp under megatron's
    # interleaved pipeline, which needs whole groups of pp). Set together with an explicit global batch, the two
    # must agree
    gradient_accumulation_steps: Optional[int] = None
    seq_length: int = 128  # tokens per sequence
    train_iters: int = 30  # optimizer steps
    optimizer: Optimizer = Optimizer.adamw
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # final learning rate of the decay
    lr_warmup_iters: Optional[int] = None  # linear warm-up steps (0 or < train_iters); None: warmup_iters()
    lr_decay_style: LRDecay = LRDecay.cosine
    lr_decay_iters: Optional[int] = None  # steps from the start to the end of the decay (then min_lr); null = train_iters
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # max global grad norm; 0 = off
    init_method_std: float = 0.02  # weight init std
    seed: int = 1234
    compile: bool = False  # torch.compile (per transformer block)
    deterministic: bool = False  # PRIMUS_DETERMINISTIC: bitwise reruns; no compile, no tuning
    log_interval: int = 1  # steps between log lines
    timing_warmup_steps: int = 3  # steps left out of step-time statistics
    on_nonfinite: NonFiniteAction = NonFiniteAction.stop  # loss or grad norm NaN/inf
    # evaluation on held-out data: every eval_interval steps and after the last one, the mean loss of eval_iters
    # global batches of the validation split (val_loss in the step log, TensorBoard and result.json); 0 = none
    eval_interval: int = 0
    eval_iters: int = 10
    # megatron: fuse the weight-gradient GEMM with the fp32 main-grad accumulation (TE's linears; on the local spec
    # apex's fused_weight_gradient_mlp_cuda, or without apex the workaround megatron.local.grad_accum_fusion)
    gradient_accumulation_fusion: bool = False


# Fields that act only under another setting (primus.features.idle_settings): warned (a training group's leftover,
# e.g. `training.lr_decay_style=constant` on a preset that sets min_lr, is harmless) and listed in result.json's
# ignored_settings
ACTS_ONLY_WITH = (
    (("eval_iters",), "evaluation (training.eval_interval > 0)", lambda c: c.training.eval_interval > 0,
     "set training.eval_interval > 0 to evaluate, or drop it", WARNING),
    (("adam_beta1", "adam_beta2", "adam_eps"), "an Adam optimizer (training.optimizer=adam or adamw)",
     lambda c: c.training.optimizer != Optimizer.sgd, "drop them, or use training.optimizer=adamw", WARNING),
    (("min_lr", "lr_decay_iters"), "a decaying learning rate (training.lr_decay_style=linear or cosine)",
     lambda c: c.training.lr_decay_style != LRDecay.constant, "drop them, or set training.lr_decay_style=cosine",
     WARNING),
)

WARMUP_FRACTION = 0.05  # of train_iters, as Megatron-LM's --lr-warmup-fraction
WARMUP_CAP = 2000  # the warm-up common in Megatron-LM pretraining configs (--lr-warmup-iters 2000)


def warmup_iters(cfg) -> int:
    """training.lr_warmup_iters, or by default 5% of train_iters (rounded down: runs under 20 steps get none, so a
    2-step smoke run trains from its first step) and at most 2000."""
    t = cfg.training
    if t.lr_warmup_iters is not None:
        return t.lr_warmup_iters
    return min(WARMUP_CAP, int(t.train_iters * WARMUP_FRACTION))


def deterministic_on(cfg) -> bool:
    return cfg.training.deterministic or os.environ.get("PRIMUS_DETERMINISTIC") == "1"


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
    if t.lr_decay_iters is not None and not warmup_iters(cfg) < t.lr_decay_iters:
        # megatron's OptimizerParamScheduler asserts the warm-up ends before the decay does
        w = warmup_iters(cfg)
        out.append(ConfigIssue(["training.lr_decay_iters", "training.lr_warmup_iters"], t.lr_decay_iters,
                               f"the decay must end after the warm-up (lr_warmup_iters: {w})",
                               f"set training.lr_decay_iters > {w}, or null (= train_iters)"))
    if t.eval_interval < 0 or t.eval_iters < 0:
        out.append(ConfigIssue(["training.eval_interval", "training.eval_iters"], [t.eval_interval, t.eval_iters],
                               "must be >= 0 (eval_interval 0 = no evaluation)", "set them to 0 or more"))
    elif t.eval_interval and not t.eval_iters:
        # Megatron-LM's eval_iters=0 turns evaluation off: harmless, but said
        out.append(warning(["training.eval_interval", "training.eval_iters"], [t.eval_interval, 0],
                           "eval_iters=0 evaluates nothing: no validation loss", "set training.eval_iters > 0"))
    if t.lr_warmup_iters and t.lr_warmup_iters >= t.train_iters:
        if cfg.backend.name.value == "torchtitan":
            # TorchTitan 0.2.2's scheduler clamps the warm-up to the run (a benchmark of a few steps with a production
            # warm-up, as Primus's examples do): it runs, and is said
            out.append(warning(["training.lr_warmup_iters", "training.train_iters"], t.lr_warmup_iters,
                               f"the warm-up is as long as the run or longer (train_iters={t.train_iters}): "
                               "TorchTitan shortens it to the run, so the LR reaches its peak at the last step",
                               f"set training.lr_warmup_iters below {t.train_iters} for a warm-up that ends in the run"))
        elif t.lr_decay_iters is None:
            # megatron's OptimizerParamScheduler asserts the warm-up ends before the decay (train_iters by default)
            out.append(ConfigIssue(["training.lr_warmup_iters", "training.train_iters"], t.lr_warmup_iters,
                                   f"warm-up must be 0 or shorter than the decay, which ends at train_iters="
                                   f"{t.train_iters} when training.lr_decay_iters is unset",
                                   f"set training.lr_warmup_iters to 0..{max(t.train_iters - 1, 0)}, leave it unset "
                                   "(5% of train_iters), or set training.lr_decay_iters beyond the warm-up"))
    return out


AUTO_BATCH = -1  # training.global_batch_size: micro x dp x gradient_accumulation_steps


def global_batch(cfg, world: int) -> int:
    """training.global_batch_size as the run uses it: -1 sized from the world (micro x dp x accumulation steps).
    Validation writes it back; mappings and estimates read it through here, so they agree on unvalidated configs."""
    from primus.context import data_parallel_size

    t = cfg.training
    if t.global_batch_size != AUTO_BATCH:
        return t.global_batch_size
    gas = t.gradient_accumulation_steps or default_accumulation_steps(cfg)
    return t.micro_batch_size * max(1, data_parallel_size(cfg, world)) * gas


def default_accumulation_steps(cfg) -> int:
    """Micro batches per step when neither they nor the global batch are set: 1, or pp under megatron's interleaved
    schedule (pp x vpp), which runs micro batches in groups of pp."""
    p = cfg.parallel
    if cfg.backend.name.value == "megatron" and p.virtual_pipeline_model_parallel_size:
        return max(1, p.pipeline_model_parallel_size)
    return 1


def _multiples(unit: int, near: int) -> str:
    lo = max(unit, near // unit * unit)
    return ", ".join(str(v) for v in dict.fromkeys((lo, lo + unit)))


@rule
def batch_sizes(cfg, ctx):
    """The global batch from the world (-1), or an explicit one checked against micro x dp: whole accumulation steps.
    Resolves training.global_batch_size and gradient_accumulation_steps in place, so both backends, the dry run and
    result.json see the numbers the run uses."""
    from primus.context import data_parallel_size

    t = cfg.training
    dp = data_parallel_size(cfg, ctx.world_size)
    if dp < 1:
        return []  # the layout rule reports the world that does not split into tp x pp x cp x dp
    unit, gas = t.micro_batch_size * dp, t.gradient_accumulation_steps
    sizes = {"global": t.global_batch_size, "micro": t.micro_batch_size, "dp": dp,
             "gradient_accumulation_steps": gas}
    if t.global_batch_size == AUTO_BATCH:
        gas = gas or default_accumulation_steps(cfg)
        t.global_batch_size, t.gradient_accumulation_steps = unit * gas, gas
        return interleaved_microbatches(cfg)
    if t.global_batch_size % unit:
        return [ConfigIssue(["training.global_batch_size", "training.micro_batch_size", "parallel.data_parallel_size"],
                            sizes, f"the global batch must be a whole number of micro batches on every dp rank: a "
                            f"multiple of micro x dp = {t.micro_batch_size} x {dp} = {unit}",
                            f"set training.global_batch_size to a multiple of {unit} (e.g. "
                            f"{_multiples(unit, t.global_batch_size)}), or -1 for micro x dp x "
                            "gradient_accumulation_steps")]
    if gas is not None and t.global_batch_size != unit * gas:
        return [ConfigIssue(["training.global_batch_size", "training.gradient_accumulation_steps"], sizes,
                            f"global = micro x dp x gradient_accumulation_steps = {unit} x {gas} = {unit * gas}",
                            f"set training.global_batch_size={unit * gas} (or -1), or "
                            f"training.gradient_accumulation_steps={t.global_batch_size // unit}, or drop one of "
                            "the two")]
    t.gradient_accumulation_steps = t.global_batch_size // unit
    return interleaved_microbatches(cfg)


def interleaved_microbatches(cfg) -> list:
    """megatron-core's interleaved 1F1B (pp x vpp) runs micro batches in groups of pp per virtual stage: it raises
    unless their count is >= pp and a multiple of pp (schedules.py at 0.16.1)."""
    p, gas = cfg.parallel, cfg.training.gradient_accumulation_steps
    pp = p.pipeline_model_parallel_size
    if cfg.backend.name.value != "megatron" or not p.virtual_pipeline_model_parallel_size or pp < 2 or gas % pp == 0:
        return []
    return [ConfigIssue(["training.gradient_accumulation_steps", "parallel.virtual_pipeline_model_parallel_size"],
                        {"micro_batches": gas, "pp": pp, "vpp": p.virtual_pipeline_model_parallel_size},
                        "the interleaved pipeline schedule needs micro batches per step in whole groups of pp",
                        f"set training.gradient_accumulation_steps to a multiple of {pp} (and global batch -1), or "
                        f"a global batch of micro x dp x {pp * max(1, -(-gas // pp))}")]


@rule
def deterministic_mode(cfg, ctx):
    from primus.features.tuning import tuning_enabled

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


# ------------------------------------------------------------------------------------------- megatron-core


def megatron(cfg, ctx) -> dict:
    t, mem = cfg.training, cfg.memory
    # megatron-core's "adam" is AdamW (decoupled weight decay) unless told otherwise: both our names map to it.
    name = "sgd" if t.optimizer.value == "sgd" else "adam"
    opt = {"optimizer": name, "lr": t.lr, "min_lr": t.min_lr, "weight_decay": t.weight_decay,
           "clip_grad": t.clip_grad}
    if name == "adam":
        opt.update({"adam_beta1": t.adam_beta1, "adam_beta2": t.adam_beta2, "adam_eps": t.adam_eps,
                    "decoupled_weight_decay": True})
    out = {
        "transformer_config": {"init_method_std": t.init_method_std, "deterministic_mode": t.deterministic,
                               "gradient_accumulation_fusion": t.gradient_accumulation_fusion},
        # the portable fp8 linears add their weight gradients into main_grad in the GEMM (fp8.py; LINEARS_...)
        "fp8_grad_accum_fusion": fp8_linears_grad_accum_fusion(cfg) == [],
        "ddp_config": {"check_for_nan_in_grad": False},  # the shared loop checks loss and grad norm itself
        "optimizer_config": opt,
        # megatron.core.optimizer_param_scheduler.OptimizerParamScheduler, counted in optimizer steps
        "scheduler": {
            "init_lr": 0.0,
            "max_lr": t.lr,
            "min_lr": t.min_lr,
            "lr_warmup_steps": warmup_iters(cfg),
            "lr_decay_steps": decay_iters(cfg),
            "lr_decay_style": t.lr_decay_style.value,
            "start_wd": t.weight_decay,
            "end_wd": t.weight_decay,
            "wd_incr_steps": t.train_iters,
            "wd_incr_style": "constant",
        },
        "schedule": {"micro_batch_size": t.micro_batch_size, "global_batch_size": global_batch(cfg, ctx.world_size),
                     "seq_length": t.seq_length},
        # perf.py: torch.compile per TransformerLayer; torch AdamW switched to its fused kernel (no TE/apex)
        "compile": bool(t.compile),
        "fused_adamw": t.optimizer.value != "sgd" and not mem.use_precision_aware_optimizer,
        "seed": t.seed,
        "eval": {"interval": t.eval_interval, "iters": t.eval_iters},
    }
    if experts_grad_accum_fusion(cfg) == []:
        out["turbo"] = {"experts_grad_accum_fusion": True}  # megatron/turbo.py swaps GroupedMLP's forward
    return out


def decay_iters(cfg) -> int:
    return cfg.training.train_iters if cfg.training.lr_decay_iters is None else cfg.training.lr_decay_iters


def evaluates(cfg, step: int) -> bool:
    """Whether the loop evaluates after `step`: every eval_interval steps and after the last step."""
    t = cfg.training
    return bool(t.eval_interval and t.eval_iters) and (step % t.eval_interval == 0 or step == t.train_iters)


def megatron_issues(cfg, ctx) -> list:
    """gradient_accumulation_fusion runs anywhere on megatron (TE's linears; on the local spec apex's kernel or,
    without apex, the workaround megatron.local.grad_accum_fusion). Under training.compile the local linears that keep
    megatron's fused linear (overlap_grad_reduce on, or tensor parallel) set attributes on the weight in their
    backward, inside megatron's activation-offloading context: dynamo cannot resume there and leaves most of each
    layer eager (debug model: 0 -> 20 graph breaks). The workaround's own linear (tp = 1, no overlap) stays traced."""
    from primus.backends.megatron.args import resolved_layer_spec

    t, p = cfg.training, cfg.parallel
    megatrons = cfg.overlap.overlap_grad_reduce or p.tensor_model_parallel_size > 1
    if t.gradient_accumulation_fusion and t.compile and megatrons and resolved_layer_spec(cfg) == "local":
        keys = ["training.gradient_accumulation_fusion", "training.compile", "overlap.overlap_grad_reduce",
                "parallel.tensor_model_parallel_size"]
        return [warning(keys, [True, True, cfg.overlap.overlap_grad_reduce, p.tensor_model_parallel_size],
                        "with overlap_grad_reduce or tensor parallel, megatron's fused weight-gradient linears break "
                        "each compiled layer's graph (most of the layer then runs eagerly): the two settings undo "
                        "each other",
                        "keep one: training.compile=true, or training.gradient_accumulation_fusion=true with "
                        "training.compile=false")]
    out = []
    unfused = linears_unfused(cfg)
    if unfused:
        key, what = unfused
        missing = fp8_linears_grad_accum_fusion(cfg)
        why = ("that needs " + "; ".join(need for _, need in missing)) if missing else \
            "they have no accumulating form (their GEMMs write a fresh output)"
        out.append(note(["training.gradient_accumulation_fusion", key] + [k for ks, _ in missing or [] for k in ks],
                        True, f"the decoder's {what} return their weight gradients, which megatron then adds into "
                              f"main_grad: {why}; megatron's own linears accumulate in their GEMMs"))
    missing = experts_grad_accum_fusion(cfg)
    if missing:
        keys = ["training.gradient_accumulation_fusion"] + [k for ks, _ in missing for k in ks]
        out.append(note(keys, True, "the MoE experts' weight gradients stay unfused (megatron's linears' are fused): "
                                    "that needs " + "; ".join(need for _, need in missing)))
    return out


def linears_unfused(cfg) -> Optional[Tuple[str, str]]:
    """(the key, what they are) when the fusion is on and the decoder's linears are ones whose backward returns the
    weight gradient (megatron's hook adds it): turbo's (features.turbo.turbo_linears), or the portable fp8 linears
    (precision.fp8 without Transformer Engine, primus/backends/megatron/fp8.py); else None."""
    from primus.features.precision import fp8_backend
    from primus.features.turbo import turbo_linears

    if not (cfg.training.gradient_accumulation_fusion and cfg.backend.name.value == "megatron"):
        return None
    if turbo_linears(cfg):
        return "turbo.use_turbo_parallel_linear", "turbo linears (primus.turbo.parallel_linear)"
    if fp8_linears_grad_accum_fusion(cfg):
        return "precision.fp8", "fp8 linears (primus.turbo.fp8_linear, without Transformer Engine)"
    return None


# gradient_accumulation_fusion reaches the portable fp8 linears (precision.fp8 without Transformer Engine) where
# every row holds: their weight-gradient GEMM is then cuBLASLt's fp8 GEMM with the fp32 main_grad as its C and D
# (primus.turbo.cublaslt; torch._scaled_mm has no accumulating form), so no bf16 gradient is written and megatron's
# hook adds none. On a device where cuBLASLt cannot (ROCm, or its start-up check fails) the same op computes the
# gradient and adds it, as unfused, and says so in the log. Each: (keys, what it needs, holds(cfg)).
FP8_LINEARS_GRAD_ACCUM_FUSION = (
    (("precision.fp8_recipe",), "precision.fp8_recipe=tensorwise (the in-GEMM add takes one scale per operand)",
     lambda c: c.precision.fp8_recipe.value == "tensorwise"),
    (("parallel.tensor_model_parallel_size",), "parallel.tensor_model_parallel_size=1 (the linears traced as custom "
     "ops; tensor parallel runs them eagerly around megatron's collectives)",
     lambda c: c.parallel.tensor_model_parallel_size == 1),
    (("overlap.overlap_grad_reduce",), "overlap.overlap_grad_reduce=false (megatron's bucketed reduce starts from "
     "each weight's gradient hook, which a weight accumulated in its GEMM does not run)",
     lambda c: not c.overlap.overlap_grad_reduce),
)


def fp8_linears_grad_accum_fusion(cfg) -> Optional[List[Tuple[Tuple[str, ...], str]]]:
    """The FP8_LINEARS_GRAD_ACCUM_FUSION rows this run misses ([]: the portable fp8 linears accumulate in their
    GEMM); None where the question does not arise (the fusion off, not megatron, no portable fp8 linears)."""
    from primus.features.precision import fp8_backend
    from primus.features.turbo import turbo_linears

    if not (cfg.training.gradient_accumulation_fusion and cfg.backend.name.value == "megatron"
            and cfg.precision.fp8 is not None and fp8_backend(cfg) == "portable") or turbo_linears(cfg):
        return None
    return unmet(FP8_LINEARS_GRAD_ACCUM_FUSION, cfg)


def megatron_only(cfg) -> tuple:
    return ("gradient_accumulation_fusion",)


# gradient_accumulation_fusion reaches the MoE experts (megatron-core 0.16.1's GroupedMLP has no fused path of its
# own) where every row holds: megatron/turbo.py then runs each GroupedMLP's two grouped GEMMs through
# primus.turbo.grouped_gemm.grouped_gemm_accumulate, whose weight-gradient GEMM adds into main_grad. Elsewhere the
# experts keep megatron's unfused accumulation, and a note names the rows missing. Each: (keys, what it needs,
# holds(cfg)).
def _moe_act_recomputed(c) -> bool:
    r = c.recompute
    return r.recompute_granularity is not None and r.recompute_granularity.value == "selective" \
        and "moe_act" in r.recompute_modules


EXPERTS_GRAD_ACCUM_FUSION = (
    (("turbo.use_turbo_grouped_gemm",), "turbo.use_turbo_grouped_gemm=true (GroupedMLP on the turbo grouped GEMM)",
     lambda c: bool(c.turbo.enable_primus_turbo and c.turbo.use_turbo_grouped_gemm)),
    (("turbo.grouped_gemm_fp8",), "turbo.grouped_gemm_fp8=false (bf16 experts: the fp8 grouped GEMMs return their "
     "weight gradients)", lambda c: not c.turbo.grouped_gemm_fp8),
    (("overlap.overlap_grad_reduce",), "overlap.overlap_grad_reduce=false (megatron's bucketed reduce starts from "
     "each weight's gradient hook, which a weight accumulated in its GEMM does not run)",
     lambda c: not c.overlap.overlap_grad_reduce),
    (("recompute.recompute_modules",), "recompute.recompute_modules without moe_act under selective recompute "
     "(GroupedMLP then checkpoints its activation itself)", lambda c: not _moe_act_recomputed(c)),
)


def experts_grad_accum_fusion(cfg) -> Optional[List[Tuple[Tuple[str, ...], str]]]:
    """The EXPERTS_GRAD_ACCUM_FUSION rows this run misses ([]: the experts' weight gradients accumulate in their
    GEMM); None where the question does not arise (the fusion off, a dense model). megatron's mapping asks it."""
    if not (cfg.training.gradient_accumulation_fusion and cfg.model.num_experts):
        return None
    return unmet(EXPERTS_GRAD_ACCUM_FUSION, cfg)


def experts_grad_accum_info(cfg) -> Optional[str]:
    """backend_info.experts_grad_accum (megatron, the fusion on, an MoE model): fused or not, and what it needs."""
    missing = experts_grad_accum_fusion(cfg)
    if missing is None:
        return None
    if not missing:
        return ("fused: each GroupedMLP's weight-gradient GEMM adds into main_grad (primus.turbo.grouped_gemm; on "
                "an H100 at DeepSeek-V2-Lite and Qwen3-30B-A3B widths the experts' GEMMs 1.15-1.22x the unfused ones "
                "plus add, the steps 1.045x and 1.073x: docs/benchmarks.md)")
    return ("unfused (megatron's GroupedMLP returns bf16 weight gradients, then adds them into main_grad): needs "
            + "; ".join(need for _, need in missing))


# ------------------------------------------------------------------------------------------- TorchTitan

NO_CLIP = 1.0e30  # TorchTitan always clips; max_norm 0 would zero every gradient, so "off" is a huge norm


def torchtitan(cfg, ctx) -> dict:
    from primus.features.parallel import torchtitan_batches

    t = cfg.training
    local_batch, _ = torchtitan_batches(cfg, ctx)
    lr_min_factor = 1.0 if t.lr_decay_style == LRDecay.constant else (t.min_lr / t.lr if t.lr else 0.0)
    out = {
        "training": {"local_batch_size": local_batch, "global_batch_size": global_batch(cfg, ctx.world_size),
                     "seq_len": t.seq_length, "max_norm": t.clip_grad if t.clip_grad > 0 else NO_CLIP,
                     "steps": t.train_iters},
        "optimizer": {
            "name": "AdamW",  # ours: adam = decoupled weight decay, as megatron-core's "adam"
            "lr": t.lr, "beta1": t.adam_beta1, "beta2": t.adam_beta2, "eps": t.adam_eps,
            "weight_decay": t.weight_decay,
            # fused AdamW runs on CPU tensors too in torch >= 2.4; foreach on CPU is the safer common path
            "implementation": "fused" if ctx.device == "cuda" else "foreach",
        },
        "lr_scheduler": {
            "warmup_steps": warmup_iters(cfg),
            "decay_type": "cosine" if t.lr_decay_style == LRDecay.cosine else "linear",
            "min_lr_factor": lr_min_factor,
        },
        "compile": {"enable": t.compile, "components": ["model", "loss"]},
        "debug": {"seed": t.seed, "deterministic": t.deterministic},
    }
    if t.eval_interval and t.eval_iters:
        # TorchTitan's Validator (the data feature names its held-out dataset); the shared loop calls it at
        # evaluates() steps, so freq is only its own bookkeeping. Its step is one local batch per dp rank: eval_iters
        # global batches, as megatron counts them, are eval_iters x the batches a training step accumulates
        from primus.features.parallel import _dp

        accum = max(1, t.global_batch_size // (local_batch * (_dp(cfg, ctx.world_size) or 1)))
        out["validation"] = {"enable": True, "freq": t.eval_interval, "steps": t.eval_iters * accum,
                             "local_batch_size": local_batch, "seq_len": t.seq_length}
    return out


def torchtitan_issues(cfg, ctx) -> list:
    t, out = cfg.training, []
    if t.optimizer == Optimizer.sgd:
        out.append(ConfigIssue(["training.optimizer"], "sgd", "torchtitan 0.2.2 builds Adam and AdamW only",
                               "use adamw"))
    if t.lr_decay_iters is not None and t.lr_decay_iters != t.train_iters:
        out.append(ConfigIssue(["training.lr_decay_iters", "training.train_iters"], t.lr_decay_iters,
                               "torchtitan 0.2.2 decays the rate until the last step (its decay_ratio places the "
                               "decay at the end of the run); it cannot reach min_lr earlier and hold it",
                               f"set training.lr_decay_iters=null (or {t.train_iters}), or use backend=megatron"))
    if t.init_method_std != TrainingConfig.init_method_std:
        out.append(ConfigIssue(["training.init_method_std"], t.init_method_std,
                               "torchtitan's models fix their init (0.02, depth-scaled)", "leave it at 0.02"))
    return out
