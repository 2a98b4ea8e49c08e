"""The precision feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from primus.config.errors import ConfigIssue
from primus.features import rule


class FP8Format(str, Enum):
    e4m3 = "e4m3"
    hybrid = "hybrid"  # e4m3 forward, e5m2 gradients


class FP8Recipe(str, Enum):
    delayed = "delayed"  # per-tensor, scale from an amax history (TE, or the portable fp8 linear)
    tensorwise = "tensorwise"  # per-tensor, current scaling
    rowwise = "rowwise"  # per-row scales (TorchTitan / torchao)
    blockwise = "blockwise"  # 1x128 / 128x128 blocks (Megatron)
    mxfp8 = "mxfp8"  # microscaling, 32-element blocks with e8m0 scales


class FP4Format(str, Enum):
    e2m1 = "e2m1"


class FP4Recipe(str, Enum):
    nvfp4 = "nvfp4"
    mxfp4 = "mxfp4"


class Dtype(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class PrecisionConfig:
    bf16: bool = True  # BFloat16 training
    fp16: bool = False  # FP16 training (loss scaling)
    # fp16 loss scaling (megatron's names and defaults); with fp16 off these must stay at their defaults
    loss_scale: Optional[float] = None  # static loss scale (a power of 2 helps); null = dynamic
    initial_loss_scale: float = 4294967296.0  # dynamic: the first scale (2^32); halved on overflows
    min_loss_scale: float = 1.0  # dynamic: the scale never goes below this
    loss_scale_window: int = 1000  # dynamic: overflow-free steps before the scale doubles
    hysteresis: int = 2  # dynamic: overflows tolerated before the scale starts halving
    fp8: Optional[FP8Format] = None  # FP8 format; null = off
    fp8_recipe: FP8Recipe = FP8Recipe.tensorwise  # FP8 scaling recipe
    fp8_margin: int = 0  # delayed scaling: scale margin (power of 2)
    fp8_interval: int = 1  # delayed scaling: amax update interval (steps)
    fp8_amax_history_len: int = 1024  # delayed scaling: amax history length
    fp8_amax_compute_algo: str = "max"  # delayed scaling: "max" or "most_recent"
    fp4: Optional[FP4Format] = None  # FP4 format; null = off (experimental)
    fp4_recipe: FP4Recipe = FP4Recipe.nvfp4  # FP4 scaling recipe
    first_last_layers_bf16: bool = False  # keep first/last layers in BF16 under fp8/fp4
    num_layers_at_start_in_bf16: int = 1  # leading layers kept in BF16
    num_layers_at_end_in_bf16: int = 1  # trailing layers kept in BF16
    # megatron, portable fp8 (no TE): reuse each weight's fp8 cast within a step (TE's fp8 weight cache); null =
    # when a step runs a linear's forward more than once (micro batches > 1, recompute replaying linears)
    fp8_weight_cache: Optional[bool] = None
    # megatron, portable fp8, tensorwise: each dense MLP's fc1 -> SwiGLU -> fc2 as one fp8 op whose SwiGLU kernels
    # give the casts of their outputs the amax (one read fewer each, same bits); null = wherever it applies
    fp8_fused_mlp: Optional[bool] = None
    # TorchTitan (training.* and quantize.linear.float8.*)
    mixed_precision_param: Dtype = Dtype.bfloat16  # FSDP parameter dtype
    mixed_precision_reduce: Dtype = Dtype.float32  # FSDP gradient reduce dtype
    float8_enable_fsdp_float8_all_gather: bool = False  # all-gather FSDP weights in float8 (tensorwise only)
    float8_precompute_float8_dynamic_scale_for_fsdp: bool = False  # one amax all-reduce for all weights
    float8_filter_fqns: List[str] = field(default_factory=lambda: ["output"])  # modules kept out of float8


# ------------------------------------------------------------------------------------------- facts, as data
# Which fp8 / fp4 recipe runs on which backend, through which provider, on which GPUs: the one table every rule
# and mapping reads (recipes(), recipe_gpus()).
#   provider   te:        Transformer Engine's linears (megatron's TE layer spec)
#              portable:  primus.turbo.fp8_linear (megatron's local spec; TorchTitan with turbo.use_turbo_float8_linear)
#              torchao:   torchao through TorchTitan's converters (quantize.linear.float8; mxfp8: quantize.linear.mx)
#   gpus       a key of GPUS: the GPUs whose GEMMs run the recipe
# Rows are grouped by recipe, so recipes() lists them in this order.
RECIPES = (
    # (format, recipe, backend, provider, gpus)
    ("fp8", "tensorwise", "megatron", "te", "fp8"),
    ("fp8", "tensorwise", "megatron", "portable", "fp8"),
    ("fp8", "tensorwise", "torchtitan", "torchao", "fp8"),
    ("fp8", "tensorwise", "torchtitan", "portable", "fp8"),
    ("fp8", "delayed", "megatron", "te", "fp8"),
    ("fp8", "delayed", "megatron", "portable", "fp8"),
    ("fp8", "delayed", "torchtitan", "portable", "fp8"),
    # megatron-core 0.16.1's TransformerConfig has no rowwise recipe, though the portable linear runs it
    ("fp8", "rowwise", "torchtitan", "torchao", "fp8"),
    ("fp8", "rowwise", "torchtitan", "portable", "fp8"),
    ("fp8", "blockwise", "megatron", "te", "fp8"),
    ("fp8", "blockwise", "megatron", "portable", "fp8"),
    ("fp8", "blockwise", "torchtitan", "portable", "fp8"),
    # MX GEMMs: TE's MXFP8 recipe and torchtitan 0.2.2's MXLinearConverter (torchao) need CUDA sm100+ or ROCm
    # gfx950+; neither emulates them, and the portable fp8 linear has no MX path
    ("fp8", "mxfp8", "megatron", "te", "mx"),
    ("fp8", "mxfp8", "torchtitan", "torchao", "mx"),
    ("fp4", "nvfp4", "megatron", "te", "nvfp4"),
    # Primus Turbo's GEMM (turbo.use_turbo_parallel_linear / use_turbo_gemm): its fp8 scalings
    ("fp8", "tensorwise", "megatron", "primus_turbo", "fp8"),
    ("fp8", "blockwise", "megatron", "primus_turbo", "fp8"),
    ("fp8", "mxfp8", "megatron", "primus_turbo", "mx"),
)

# GPU classes: NVIDIA compute capability at least this, or an AMD gcnArchName with one of these prefixes.
GPUS = {
    "fp8": {"cuda": (8, 9), "rocm": ("gfx94", "gfx95", "gfx12"),
            "words": "fp8 tensor cores: NVIDIA compute capability >= 8.9 (L40/H100/H200/B200) or AMD gfx94x/gfx95x/"
                     "gfx12x (MI300/MI325/MI355)"},
    "mx": {"cuda": (10, 0), "rocm": ("gfx95",),
           "words": "microscaling (MX) GEMMs: NVIDIA compute capability >= 10.0 (B200) or AMD gfx95x (MI355)"},
    "nvfp4": {"cuda": (10, 0), "rocm": (), "words": "nvfp4 GEMMs: NVIDIA compute capability >= 10.0 (B200)"},
}


def recipes(fmt: str = "fp8", backend: Optional[str] = None, provider: Optional[str] = None) -> tuple:
    """The recipes of RECIPES for this format, on this backend, through this provider (None: any)."""
    out: List[str] = []
    for f, r, b, pr, _ in RECIPES:
        if f == fmt and backend in (None, b) and provider in (None, pr) and r not in out:
            out.append(r)
    return tuple(out)


def recipe_gpus(fmt: str, recipe: str, backend: str, provider: str) -> Optional[str]:
    """The GPU class (a key of GPUS) a recipe needs on this backend and provider; None when RECIPES has no row."""
    for f, r, b, pr, gpus in RECIPES:
        if (f, r, b, pr) == (fmt, recipe, backend, provider):
            return gpus
    return None


PORTABLE_FP8_RECIPES = recipes(provider="portable")  # what primus/turbo/fp8_linear.py implements
TURBO_GEMM_FP8_RECIPES = recipes(provider="primus_turbo")  # what fp8 through the turbo GEMM path may scale by
PORTABLE_AMAX_ALGOS = ("max", "most_recent")  # the delayed recipe's precision.fp8_amax_compute_algo values


def preset(recipe: str) -> str:
    """The conf/precision preset of an fp8 recipe."""
    return recipe if recipe.startswith("mx") else f"fp8_{recipe}"


def gpu_has(gpus: str, kind: str, capability: Tuple[int, int] = (0, 0), gcn_arch: str = "") -> bool:
    """Whether a GPU (kind "cuda" or "rocm", its compute capability / gcnArchName) belongs to the class GPUS[gpus]."""
    if kind == "cuda":
        return tuple(capability) >= GPUS[gpus]["cuda"]
    if kind == "rocm":
        return bool(GPUS[gpus]["rocm"]) and gcn_arch.startswith(GPUS[gpus]["rocm"])
    return False


def gpu_has_fp8(kind: str, capability: Tuple[int, int] = (0, 0), gcn_arch: str = "") -> bool:
    """Does this GPU have fp8 tensor cores: the one answer (GPUS["fp8"]) every fp8 path asks."""
    return gpu_has("fp8", kind, capability, gcn_arch)


def this_gpu(index=0) -> Optional[Tuple[str, Tuple[int, int], str, str]]:
    """(kind, compute capability, gcnArchName, name) of this machine's GPU, or None when there is none (or torch
    cannot tell). Imports torch: only on the path of a run that has a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(index)
        if torch.version.hip is not None:
            return "rocm", (0, 0), getattr(props, "gcnArchName", "").split(":")[0], props.name
        return "cuda", tuple(torch.cuda.get_device_capability(index)), "", props.name
    except Exception:  # noqa: BLE001 - no answer is "unknown", not an error
        return None


def te_available() -> bool:
    """Whether Transformer Engine imports here: the one test every TE path asks (provider "te" of RECIPES)."""
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def dtype_name(cfg) -> str:
    """The model's compute dtype (megatron's params_dtype / pipeline_dtype)."""
    p = cfg.precision
    return "bfloat16" if p.bf16 else ("float16" if p.fp16 else "float32")


def te_needed(cfg) -> Optional[str]:
    """"Transformer Engine" when an issue is only that TE is missing here: backend.layer_spec=auto would take TE's
    spec on a target that has it (a dry run judged for the target lists it as needed there); None when the user
    chose the local spec."""
    return "Transformer Engine" if cfg.backend.layer_spec.value in ("auto", "te") and not te_available() else None


def fp8_backend(cfg) -> Optional[str]:
    """megatron: who runs the low-precision linears: Transformer Engine, the portable fp8 linear, or nobody (None)."""
    p = cfg.precision
    if p.fp8 is None and p.fp4 is None:
        return None
    from primus.backends.megatron import args as margs

    return "te" if margs.resolved_layer_spec(cfg) == "te" else "portable"


def provider(cfg) -> Optional[str]:
    """Who runs this run's fp8 / fp4 linears (a provider of RECIPES), or None without fp8 / fp4."""
    p = cfg.precision
    if cfg.backend.name.value == "megatron" or (p.fp8 is None and p.fp4 is None):
        return fp8_backend(cfg)
    from primus.features.turbo import turbo_fp8

    return "portable" if turbo_fp8(cfg) else "torchao"


# ------------------------------------------------------------------------------------------- rules


@rule
def precision_exclusive(cfg, ctx):
    p, out = cfg.precision, []
    if p.bf16 and p.fp16:
        out.append(ConfigIssue(["precision.bf16", "precision.fp16"], True, "bf16 and fp16 are exclusive",
                               "use precision=bf16 or precision=fp16"))
    if p.fp8 is not None and p.fp4 is not None:
        out.append(ConfigIssue(["precision.fp8", "precision.fp4"], [p.fp8.value, p.fp4.value],
                               "fp8 and fp4 are exclusive", "pick one: precision=fp8 or precision=fp4"))
    if not (p.bf16 or p.fp16) and (p.fp8 is not None or p.fp4 is not None):
        out.append(ConfigIssue(["precision.bf16", "precision.fp16"], False,
                               "fp8/fp4 linears run inside a bf16 or fp16 model", "set precision.bf16=true"))
    return out


LOSS_SCALING = {k: getattr(PrecisionConfig(), k) for k in  # fp16's scaler settings and their schema defaults
                ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")}


# Fields that act only under another setting (primus.features.idle_settings): set while it is off, they are refused
ACTS_ONLY_WITH = (
    (tuple(LOSS_SCALING), "fp16 training (bf16 and fp32 need no loss scaling)", lambda c: c.precision.fp16,
     "use precision=fp16, or drop these settings"),
    (("fp8_recipe",), "fp8 on (precision.fp8)", lambda c: c.precision.fp8 is not None,
     "use an fp8 preset (precision=fp8, fp8_delayed, fp8_rowwise, fp8_blockwise), or drop it"),
    (("fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo"),
     "the delayed fp8 recipe (the others scale from each tensor's current amax)",
     lambda c: c.precision.fp8 is not None and c.precision.fp8_recipe == FP8Recipe.delayed,
     "use precision=fp8_delayed, or drop these settings"),
    (("fp4_recipe",), "fp4 on (precision.fp4)", lambda c: c.precision.fp4 is not None, "use precision=fp4, or drop it"),
    (("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"), "precision.first_last_layers_bf16=true",
     lambda c: c.precision.first_last_layers_bf16, "set precision.first_last_layers_bf16=true, or drop them"),
)


@rule
def fp16_loss_scaling(cfg, ctx):
    p, out = cfg.precision, []
    if not p.fp16:
        return out  # the settings' own row above refuses them
    if p.loss_scale is not None and p.loss_scale <= 0:
        out.append(ConfigIssue(["precision.loss_scale"], p.loss_scale, "a static loss scale must be > 0",
                               "use a power of 2 such as 1024, or null for dynamic scaling"))
    if not 0 < p.min_loss_scale <= p.initial_loss_scale:
        out.append(ConfigIssue(["precision.min_loss_scale", "precision.initial_loss_scale"],
                               [p.min_loss_scale, p.initial_loss_scale], "need 0 < min_loss_scale <= initial_loss_scale",
                               "e.g. precision.initial_loss_scale=65536 precision.min_loss_scale=1"))
    return out  # loss_scale_window and hysteresis are counts: validate.POSITIVE


@rule
def first_last_layers_bf16(cfg, ctx):
    p, out = cfg.precision, []
    if not p.first_last_layers_bf16:
        return []
    if p.fp8 is None and p.fp4 is None:
        out.append(ConfigIssue(["precision.first_last_layers_bf16"], True,
                               "keeps layers in BF16 out of fp8/fp4: needs precision.fp8 or precision.fp4",
                               "set precision=fp8 (or fp4), or first_last_layers_bf16=false"))
    n, layers = p.num_layers_at_start_in_bf16 + p.num_layers_at_end_in_bf16, cfg.model.num_layers
    if p.num_layers_at_start_in_bf16 < 0 or p.num_layers_at_end_in_bf16 < 0 or n >= layers:
        out.append(ConfigIssue(["precision.num_layers_at_start_in_bf16", "precision.num_layers_at_end_in_bf16"],
                               [p.num_layers_at_start_in_bf16, p.num_layers_at_end_in_bf16],
                               f"start + end must be in 0..{layers - 1}: with all {layers} layers in BF16 nothing "
                               "would run in fp8", "lower the counts, or drop fp8"))
    return out


def _megatron_fp8_option(cfg, key: str, off: tuple, needs: str, torchtitan_why: str) -> List[ConfigIssue]:
    """A switch of megatron's portable fp8 path: it needs precision.fp8, and TorchTitan has no such path."""
    v = getattr(cfg.precision, key)
    if v in off:
        return []
    if cfg.precision.fp8 is None:
        return [ConfigIssue([f"precision.{key}", "precision.fp8"], v, needs, "set precision=fp8, or drop it")]
    if v and cfg.backend.name.value != "megatron":
        return [ConfigIssue([f"precision.{key}", "backend.name"], True, torchtitan_why,
                            f"drop precision.{key}, or use backend=megatron")]
    return []


@rule
def fp8_weight_cache_setting(cfg, ctx):
    # FSDP's unsharded weights reuse buffers, so a cast keyed by storage could serve another layer's weight
    return _megatron_fp8_option(cfg, "fp8_weight_cache", (None,), "caches the fp8 casts of weights: needs precision.fp8",
                                "the fp8 weight cache is the megatron backend's (TorchTitan's FSDP all-gathers "
                                "weights into reused buffers)")


@rule
def fp8_fused_mlp_setting(cfg, ctx):
    # null: wherever it applies (fp8_fused_mlp below); false: off
    return _megatron_fp8_option(cfg, "fp8_fused_mlp", (None, False), "fuses the fp8 MLP's casts: needs precision.fp8",
                                "the fused fp8 MLP replaces megatron's MLP module (TorchTitan's fp8 is torchao's or "
                                "turbo.use_turbo_float8_linear)")


@rule
def low_precision_recipe_for_backend(cfg, ctx):
    """Which recipes each backend can run at all (RECIPES; the installed-library checks are megatron_issues /
    torchtitan_issues below)."""
    p, out = cfg.precision, []
    b = cfg.backend.name.value
    fix = "pick one of those (precision=fp8 is tensorwise, which both backends run)"
    if b == "torchtitan":
        prov = provider(cfg) or "torchao"
        allowed = set(recipes(backend=b, provider=prov))
        if prov != "portable":
            fix += f"; turbo=torchtitan_fp8 (the turbo fp8 linear) runs {sorted(PORTABLE_FP8_RECIPES)}"
    else:
        allowed = set(recipes(backend=b))
    if p.fp8 is not None and p.fp8_recipe.value not in allowed:
        out.append(ConfigIssue(["precision.fp8_recipe", "backend.name"], p.fp8_recipe.value,
                               f"backend {b} runs fp8 recipes {sorted(allowed)}", fix))
    if p.fp4 is not None and not recipes("fp4", backend=b):
        out.append(ConfigIssue(["precision.fp4", "backend.name"], p.fp4.value,
                               f"backend {b} has no fp4 training path",
                               "use backend=megatron with Transformer Engine, or drop fp4"))
    return out


def delayed_recipe_issues(p) -> List[ConfigIssue]:
    """The portable delayed recipe's settings (precision.*; fp8_linear.DelayedScaling), for either backend."""
    out: List[ConfigIssue] = []
    if p.fp8_interval != 1:
        out.append(ConfigIssue(["precision.fp8_interval"], p.fp8_interval,
                               "the portable delayed recipe updates the amax history and the scale at every cast "
                               "(Transformer Engine has deprecated fp8_interval)", "set precision.fp8_interval=1"))
    if p.fp8_amax_compute_algo not in PORTABLE_AMAX_ALGOS:
        out.append(ConfigIssue(["precision.fp8_amax_compute_algo"], p.fp8_amax_compute_algo,
                               f"the amax of the history is one of {list(PORTABLE_AMAX_ALGOS)}", "use one of those"))
    if p.fp8_amax_history_len < 1:
        out.append(ConfigIssue(["precision.fp8_amax_history_len"], p.fp8_amax_history_len,
                               "the amax history holds at least one entry", "set it to 1 or more (TE: 1024)"))
    return out


def gpu_issues(cfg, ctx) -> List[ConfigIssue]:
    """The recipe needs a GPU class (RECIPES, GPUS) this run's GPU is not of. Judged on the GPU a run has, never for
    a planned one (a dry run for a GPU this machine lacks) nor on CPU (the backends' CPU rules say it)."""
    p = cfg.precision
    prov = provider(cfg)
    if prov is None or ctx.device == "cpu" or ctx.planned:
        return []
    fmt, recipe = ("fp8", p.fp8_recipe.value) if p.fp8 is not None else ("fp4", p.fp4_recipe.value)
    gpus = recipe_gpus(fmt, recipe, cfg.backend.name.value, prov)
    gpu = this_gpu()
    if gpus is None or gpu is None or gpu_has(gpus, gpu[0], gpu[1], gpu[2]):
        return []
    return [ConfigIssue([f"precision.{fmt}", f"precision.{fmt}_recipe", "device"], getattr(p, fmt).value,
                        f"this GPU ({ctx.gpu_name or gpu[3]}) has no {GPUS[gpus]['words']}, which the {recipe} "
                        f"recipe needs", "use precision=bf16" + (", or precision=fp8 (tensorwise)" if gpus != "fp8"
                                                                 else ""))]


# ------------------------------------------------------------------------------------------- megatron
# In-model application: primus/backends/megatron/fp8.py swaps the local spec's linears for the portable fp8 linear
# (fp8_backend "portable") and fuses the dense MLPs (fp8_fused_mlp); trainer.py turns the fp8 weight cache on.


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def portable_fp8_available(recipe: Optional[str] = None, planned: bool = False) -> bool:
    """The project's own fp8 linear (primus/turbo/fp8_linear.py), when it exists and says it can run.
    planned: judged for a GPU this machine does not have (dry run / plan): the recipe alone decides."""
    if not _importable("primus.turbo.fp8_linear"):
        return False
    if planned:
        return recipe in PORTABLE_FP8_RECIPES
    from primus.turbo import fp8_linear  # small module, no megatron

    return bool(fp8_linear.fp8_linear_available(recipe))


def fp8_weight_cache(cfg, microbatches: int) -> bool:
    """Whether the portable fp8 linears reuse each weight's fp8 cast within a step (fp8_linear.WEIGHT_CASTS, which
    trainer.py enables and clears around every optimizer step): precision.fp8_weight_cache, or, when null, whenever
    a step runs a linear's forward more than once (several micro batches, or recompute replaying it). The cache
    costs the fp8 weight copies' memory (as TE's does) and saves one weight cast per extra forward."""
    p = cfg.precision
    if p.fp8 is None or fp8_backend(cfg) != "portable":
        return False
    if p.fp8_weight_cache is not None:
        return bool(p.fp8_weight_cache)
    from primus.backends.megatron.args import replays_linears

    return microbatches > 1 or replays_linears(cfg)


def fused_mlp_blockers(cfg, ctx) -> List[ConfigIssue]:
    """Why the fused fp8 MLP (fp8.py's FusedFP8MLP, precision.fp8_fused_mlp) cannot serve this run's MLPs (empty:
    it can). Needs precision.fp8 on megatron (fp8_fused_mlp_setting says so first)."""
    from primus.features.model import activation_fusion

    p, keys = cfg.precision, "precision.fp8_fused_mlp"
    out = []
    if fp8_backend(cfg) != "portable":  # (the other rules are about the portable path)
        return [ConfigIssue([keys, "backend.layer_spec"], p.fp8_fused_mlp,
                            "Transformer Engine's linears run fp8 in this run; the fused MLP is the portable fp8 "
                            "linear's", "drop precision.fp8_fused_mlp, or use backend.layer_spec=local")]
    if p.fp8_recipe.value != "tensorwise":
        out.append(ConfigIssue([keys, "precision.fp8_recipe"], p.fp8_recipe.value,
                               "the fused MLP hands the SwiGLU outputs' amax to tensorwise casts; this recipe has no "
                               "amax pass to skip (delayed: scales from the history; rowwise / blockwise: per row / "
                               "block inside the cast)", "use precision.fp8_recipe=tensorwise, or drop the key"))
    if cfg.turbo.use_turbo_parallel_linear:
        out.append(ConfigIssue([keys, "turbo.use_turbo_parallel_linear"], True,
                               "the turbo parallel linears serve fc1 / fc2 instead", "drop one of the two"))
    act = activation_fusion(cfg, ctx)
    if act != "triton":
        out.append(ConfigIssue([keys, "model.bias_activation_fusion"], act,
                               "the fused MLP runs primus' Triton SwiGLU, and the activation here resolves to "
                               f"{act or 'unfused'} (primus' Triton kernel is the choice on a GPU)",
                               "set model.bias_activation_fusion=true on a GPU, or drop precision.fp8_fused_mlp"))
    return out


def fp8_fused_mlp(cfg, ctx) -> bool:
    """Whether fp8.apply fuses the dense MLPs (precision.fp8_fused_mlp: true = must, checked by megatron_issues;
    null = wherever fused_mlp_blockers finds nothing in the way; false = off)."""
    p = cfg.precision
    if p.fp8 is None or p.fp8_fused_mlp is False:
        return False
    return not fused_mlp_blockers(cfg, ctx)


def megatron(cfg, ctx) -> Dict[str, Any]:
    from primus.backends.megatron.args import num_microbatches

    p = cfg.precision
    dtype = dtype_name(cfg)
    tc: Dict[str, Any] = {"bf16": p.bf16, "fp16": p.fp16, "params_dtype": dtype, "pipeline_dtype": dtype}
    if p.fp8 is not None:
        tc.update({"fp8": p.fp8.value, "fp8_recipe": p.fp8_recipe.value, "fp8_margin": p.fp8_margin,
                   "fp8_interval": p.fp8_interval, "fp8_amax_history_len": p.fp8_amax_history_len,
                   "fp8_amax_compute_algo": p.fp8_amax_compute_algo})
    if p.fp4 is not None:
        tc.update({"fp4": p.fp4.value, "fp4_recipe": p.fp4_recipe.value})
    if p.fp8 is not None or p.fp4 is not None:
        tc.update({"first_last_layers_bf16": p.first_last_layers_bf16,
                   "num_layers_at_start_in_bf16": p.num_layers_at_start_in_bf16,
                   "num_layers_at_end_in_bf16": p.num_layers_at_end_in_bf16})
    opt: Dict[str, Any] = {"bf16": p.bf16, "fp16": p.fp16, "params_dtype": dtype}
    if p.fp16:
        opt.update({k: getattr(p, k) for k in LOSS_SCALING})
    if p.fp8 is not None:
        opt["fp8_recipe"] = p.fp8_recipe.value  # megatron's optimizer reads it for precision-aware state
    return {
        "fp8_backend": fp8_backend(cfg),
        "fp8_weight_cache": fp8_weight_cache(cfg, num_microbatches(cfg, ctx)),
        "fp8_fused_mlp": fp8_fused_mlp(cfg, ctx),
        "transformer_config": tc,
        "optimizer_config": opt,
    }


def megatron_issues(cfg, ctx) -> List[ConfigIssue]:
    """What megatron-core 0.16.1 and this machine cannot honour of the precision settings."""
    from primus.backends.megatron import args as margs

    p, out = cfg.precision, []
    ver, cpu, spec = margs.mcore_version(), ctx.device == "cpu", margs.resolved_layer_spec(cfg)
    if cpu and (p.fp8 is not None or p.fp4 is not None):
        out.append(ConfigIssue(["precision.fp8", "precision.fp4", "device"],
                               (p.fp8 or p.fp4).value, "fp8/fp4 training needs a GPU with fp8 tensor cores",
                               "use precision=bf16 on CPU"))
    if spec == "local" and p.fp4 is not None:
        out.append(ConfigIssue(["precision.fp4"], p.fp4.value, f"megatron-core {ver} runs fp4 through TE only",
                               "install Transformer Engine or drop fp4", needs=te_needed(cfg)))
    if p.fp8 is not None:
        r = p.fp8_recipe.value
        if r not in recipes(backend="megatron"):
            out.append(ConfigIssue(["precision.fp8_recipe"], r,
                                   f"megatron-core {ver} has fp8 recipes {list(recipes(backend='megatron'))}",
                                   "pick one of those"))
        elif not cpu and spec == "local" and not portable_fp8_available(r, planned=ctx.planned):
            if _importable("primus.turbo.fp8_linear"):
                why = f"neither Transformer Engine nor the portable fp8 linear can run recipe {r!r} here"
            else:
                why = "Transformer Engine is not installed and the portable fp8 linear is not available yet"
            out.append(ConfigIssue(["precision.fp8", "precision.fp8_recipe"], {"fp8": p.fp8.value, "recipe": r},
                                   why, "use precision=bf16, or install Transformer Engine"))
        if p.fp8_weight_cache is False and fp8_backend(cfg) == "te":
            out.append(ConfigIssue(["precision.fp8_weight_cache", "backend.layer_spec"], False,
                                   "Transformer Engine's linears keep their own fp8 weight cache (megatron refreshes "
                                   "it at each step's first micro batch); this switch is the portable fp8 linear's",
                                   "drop precision.fp8_weight_cache, or use backend.layer_spec=local"))
        if p.fp8_fused_mlp:
            out += fused_mlp_blockers(cfg, ctx)
        if r == "delayed" and spec == "local":  # the portable DelayedScaling (primus.turbo.fp8_linear)
            out += delayed_recipe_issues(p)
    if p.fp4 is not None and p.fp4_recipe.value not in recipes("fp4", backend="megatron"):
        out.append(ConfigIssue(["precision.fp4_recipe"], p.fp4_recipe.value,
                               f"megatron-core {ver} has fp4 recipes {list(recipes('fp4', backend='megatron'))}",
                               "use nvfp4"))
    return out + gpu_issues(cfg, ctx)


# ------------------------------------------------------------------------------------------- torchtitan
# The delayed recipe's settings: megatron's, and the turbo fp8 linear's under turbo.use_turbo_float8_linear.
DELAYED_KEYS = ("fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo")
_FSDP_FLOAT8 = ("float8_enable_fsdp_float8_all_gather", "float8_precompute_float8_dynamic_scale_for_fsdp")


def megatron_only(cfg) -> tuple:
    """precision.* fields only megatron-core reads (backends/torchtitan/args.py: a non-default one is an issue)."""
    from primus.features.turbo import turbo_fp8

    delayed_read = turbo_fp8(cfg) and cfg.precision.fp8_recipe == FP8Recipe.delayed  # the turbo fp8 linear's
    return tuple(k for k in (*DELAYED_KEYS, "fp4", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                             "num_layers_at_end_in_bf16") if not (delayed_read and k in DELAYED_KEYS))


def torchtitan_only(cfg) -> tuple:
    """precision.* fields only TorchTitan reads (FSDP2's mixed precision, torchao's float8 options)."""
    return ("mixed_precision_param", "mixed_precision_reduce", *_FSDP_FLOAT8, "float8_filter_fqns")


def float8(cfg) -> Dict[str, Any]:
    """TorchTitan's model.converters and quantize.linear.* for precision.fp8 through torchao (provider "torchao");
    the turbo fp8 linear (turbo.torchtitan) serves it instead under turbo.use_turbo_float8_linear."""
    p = cfg.precision
    if p.fp8 is None:
        return {"converters": [], "quantize": {}}
    recipe = p.fp8_recipe
    if recipe == FP8Recipe.mxfp8:
        return {"converters": ["quantize.linear.mx"],
                "quantize": {"linear": {"mx": {"recipe_name": "mxfp8_cublas",
                                               "filter_fqns": list(p.float8_filter_fqns)}}}}
    f8: Dict[str, Any] = {"filter_fqns": list(p.float8_filter_fqns)}
    if recipe == FP8Recipe.rowwise:
        f8["recipe_name"] = "rowwise"
    else:
        # tensorwise is torchao's default config (recipe_name unset), the only path with float8 all-gather
        f8["enable_fsdp_float8_all_gather"] = p.float8_enable_fsdp_float8_all_gather
        f8["precompute_float8_dynamic_scale_for_fsdp"] = p.float8_precompute_float8_dynamic_scale_for_fsdp
    return {"converters": ["quantize.linear.float8"], "quantize": {"linear": {"float8": f8}}}


def torchtitan(cfg, ctx) -> Dict[str, Any]:
    from primus.features.turbo import turbo_fp8

    p = cfg.precision
    out: Dict[str, Any] = {"training": {"mixed_precision_param": p.mixed_precision_param.value,
                                        "mixed_precision_reduce": p.mixed_precision_reduce.value}}
    quantize = {} if turbo_fp8(cfg) else float8(cfg)["quantize"]
    if quantize:
        out["quantize"] = quantize
    return out


def _torchao_float8_issues(cfg) -> List[ConfigIssue]:
    p, issues = cfg.precision, []
    if p.fp8 is None:
        moved = {k: getattr(p, k) for k in _FSDP_FLOAT8 if getattr(p, k) != getattr(PrecisionConfig, k)}
        if moved:
            issues.append(ConfigIssue([f"precision.{k}" for k in moved], moved,
                                      "float8 options have no effect without precision.fp8",
                                      "set precision.fp8 (e.g. precision=fp8_tensorwise) or drop them"))
        return issues
    recipe = p.fp8_recipe
    if recipe == FP8Recipe.mxfp8:
        return issues
    torchao = recipes(backend="torchtitan", provider="torchao")
    only_turbo = " and ".join(sorted(set(PORTABLE_FP8_RECIPES) - set(torchao)))
    if recipe.value not in torchao:
        issues.append(ConfigIssue(["precision.fp8_recipe"], recipe.value,
                                  f"torchtitan 0.2.2 (torchao float8) has {', '.join(torchao[:-1])} and "
                                  f"{torchao[-1]} recipes only",
                                  f"use precision={' or '.join(preset(r) for r in torchao)}; or turbo=torchtitan_fp8 "
                                  f"(the turbo fp8 linear runs {only_turbo} too); or backend=megatron"))
    # torchao's formats are fixed per recipe: tensorwise casts grads to e5m2 (hybrid), rowwise/mxfp8 use e4m3
    want = FP8Format.hybrid if recipe == FP8Recipe.tensorwise else FP8Format.e4m3
    if recipe in (FP8Recipe.tensorwise, FP8Recipe.rowwise) and p.fp8 != want:
        issues.append(ConfigIssue(["precision.fp8", "precision.fp8_recipe"], {"fp8": p.fp8.value,
                                                                                "recipe": recipe.value},
                                  f"torchao's {recipe.value} recipe runs fp8 format {want.value}",
                                  f"set precision.fp8={want.value}"))
    if recipe == FP8Recipe.rowwise:
        # torchtitan asserts the float8 all-gather options are off with a named recipe
        for k in _FSDP_FLOAT8:
            if getattr(p, k):
                issues.append(ConfigIssue([f"precision.{k}", "precision.fp8_recipe"], True,
                                          "float8 all-gather works with the tensorwise recipe only",
                                          "set it false or use precision=fp8_tensorwise"))
    elif p.float8_precompute_float8_dynamic_scale_for_fsdp and not p.float8_enable_fsdp_float8_all_gather:
        issues.append(ConfigIssue(["precision.float8_precompute_float8_dynamic_scale_for_fsdp"], True,
                                  "it only acts together with float8_enable_fsdp_float8_all_gather",
                                  "enable precision.float8_enable_fsdp_float8_all_gather too"))
    return issues


def torchtitan_issues(cfg, ctx) -> List[ConfigIssue]:
    """What torchtitan 0.2.2 and this machine cannot honour of the precision settings."""
    from primus.features.turbo import turbo_fp8

    p, issues = cfg.precision, []
    par = cfg.parallel
    if not turbo_fp8(cfg):
        issues += _torchao_float8_issues(cfg)
    if p.fp16:
        issues.append(ConfigIssue(["precision.fp16"], True, "torchtitan 0.2.2 has no fp16 (loss-scaled) training",
                                  "use precision=bf16"))
    if not p.bf16 and p.mixed_precision_param == Dtype.bfloat16:
        issues.append(ConfigIssue(["precision.bf16", "precision.mixed_precision_param"], "bfloat16",
                                  "bf16=false asks for fp32 training but torchtitan would still compute in bf16",
                                  "also set precision.mixed_precision_param=float32"))
    if p.mixed_precision_param not in (Dtype.bfloat16, Dtype.float32):
        issues.append(ConfigIssue(["precision.mixed_precision_param"], p.mixed_precision_param.value,
                                  "torchtitan 0.2.2 accepts bfloat16 or float32", "use one of those"))
    if p.mixed_precision_reduce != Dtype.float32:
        issues.append(ConfigIssue(["precision.mixed_precision_reduce"], p.mixed_precision_reduce.value,
                                  "torchtitan 0.2.2 reduces gradients in float32 only", "use float32"))
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size
    # TorchTitan applies bf16 through fully_shard (FSDP/HSDP/CP) or autocast (DDP / one device); with TP or PP and no
    # FSDP it logs a warning and trains in fp32, so a bf16 setting would silently have no effect.
    shard = par.data_parallel_shard_degree
    if shard == -1:
        shard = max(1, ctx.world_size // max(1, par.data_parallel_replicate_degree * cp * tp * pp))
    if (tp > 1 or pp > 1) and shard == 1 and cp == 1 and p.mixed_precision_param == Dtype.bfloat16:
        issues.append(ConfigIssue(["precision.mixed_precision_param", "parallel.data_parallel_shard_degree"],
                                  "bfloat16", "torchtitan 0.2.2 drops mixed precision under TP/PP without FSDP "
                                  "(it would train in fp32)",
                                  "shard over dp too (data_parallel_shard_degree > 1), or set "
                                  "precision.bf16=false precision.mixed_precision_param=float32"))
    if p.fp8 is not None and tp > 1 and not turbo_fp8(cfg):
        # 0.2.2's llama3 parallelize looks for a converter named "float8", but the converter is registered as
        # "quantize.linear.float8": its float8 TP plan would never be applied to the float8 linears
        issues.append(ConfigIssue(["precision.fp8", "parallel.tensor_model_parallel_size"], tp,
                                  "torchtitan 0.2.2 does not apply its float8 tensor-parallel plan",
                                  "use float8 with FSDP only (tp=1), turbo=torchtitan_fp8 (the turbo fp8 linear "
                                  "runs under TP), or drop fp8"))
    if ctx.device == "cpu" and p.fp8 is not None and not turbo_fp8(cfg):
        issues.append(ConfigIssue(["precision.fp8", "device"], p.fp8.value,
                                  "torchao float8 needs a GPU with SM89+ (TorchTitan refuses CPU)",
                                  "drop precision.fp8 on CPU"))
    return issues + gpu_issues(cfg, ctx)
