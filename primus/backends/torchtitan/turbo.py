"""Turbo swaps for backend=torchtitan: TorchTitan model converters that put this project's kernels in the model.

TorchTitan builds the model on the meta device, runs the converters named in `model.converters`, then applies
TP / activation checkpointing / torch.compile (per block, fullgraph) / FSDP. Ours are registered under these names
(primus/features/turbo.py puts them in the job config; `configure` hands them the settings in `args[TURBO_KEY]`):

  primus_turbo.attention      every attention module's SDPA wrapper (`inner_attention`, TorchTitan's
                              ScaledDotProductAttentionWrapper) -> TurboSDPA: `primus.turbo.attention.turbo_attention`
                              (cuDNN > flash > efficient on CUDA, GQA in the kernel, never the math fallback)
  primus_turbo.float8_linear  nn.Linear -> TurboFP8Linear through `primus.turbo.fp8_linear.swap_linears_to_fp8`
                              (precision.fp8_recipe: tensorwise, delayed, rowwise or blockwise / fp8 format /
                              float8_filter_fqns), instead of torchao's `quantize.linear.float8` converter. The fp8
                              forward and backward are torch custom ops (opaque to dynamo, with fake kernels), so
                              TorchTitan's fullgraph per-block compile traces them. The delayed recipe's amax
                              histories are allocated once the model is materialised (`allocate_fp8_states`, called
                              by the trainer), before the first trace. Under TorchTitan's TP plan the fp8 linear
                              runs on each rank's shards (`_tp_forward`).
  primus_turbo.grouped_gemm   MoE GroupedExperts -> TurboGroupedExperts: the three expert GEMMs through
                              `primus.turbo.grouped_gemm.grouped_gemm` (torch._grouped_mm on sm90/sm100, else the
                              Triton grouped GEMM), TorchTitan's sync-free token padding kept.

A converter that finds nothing to swap raises (a turbo flag is never a silent no-op). Swapped counts are kept in
`LAST_SWAPS` for the trainer's start-up info.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger("primus.turbo")

ATTENTION = "primus_turbo.attention"
FLOAT8_LINEAR = "primus_turbo.float8_linear"
GROUPED_GEMM = "primus_turbo.grouped_gemm"
CONVERTERS = (ATTENTION, FLOAT8_LINEAR, GROUPED_GEMM)

_SETTINGS: Dict[str, Any] = {}
LAST_SWAPS: Dict[str, int] = {}


def configure(settings: Optional[Dict[str, Any]]) -> None:
    """Settings for the converters of the next TorchTitan build (args[TURBO_KEY]); registers them once."""
    _SETTINGS.clear()
    _SETTINGS.update(settings or {})
    LAST_SWAPS.clear()
    register_converters()


# ------------------------------------------------------------------------------------------------ attention


def _sdpa_wrapper_cls():
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    return ScaledDotProductAttentionWrapper


class TurboSDPA(nn.Module):
    """Drop-in for TorchTitan's ScaledDotProductAttentionWrapper (q, k, v in (bs, heads, seq, dim))."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None, enable_gqa: bool = False,
                is_causal: bool = True) -> Tensor:
        from primus.turbo.attention import turbo_attention

        # GQA is read from the head counts (enable_gqa in SDPA: K/V are never repeated in memory)
        return turbo_attention(q, k, v, causal=is_causal, layout="bhsd", scale=scale)


def _make_turbo_sdpa():
    """TurboSDPA that is also an instance of TorchTitan's wrapper class (its CP / AC code matches on the type)."""
    base = _sdpa_wrapper_cls()
    cls = _TURBO_SDPA_CLS.get(base)
    if cls is None:
        cls = type("TurboSDPA", (TurboSDPA, base), {"__module__": __name__})
        _TURBO_SDPA_CLS[base] = cls
    return cls()


_TURBO_SDPA_CLS: Dict[type, type] = {}


def swap_attention(model: nn.Module) -> int:
    """Replace every `inner_attention` that is TorchTitan's SDPA wrapper; returns how many were swapped."""
    base = _sdpa_wrapper_cls()
    n = 0
    for mod in model.modules():
        inner = getattr(mod, "inner_attention", None)
        if isinstance(inner, base) and not isinstance(inner, TurboSDPA):
            mod.inner_attention = _make_turbo_sdpa()
            n += 1
    return n


def count_turbo_attention(model: nn.Module) -> int:
    return sum(isinstance(m, TurboSDPA) for m in model.modules())


# ------------------------------------------------------------------------------------------------ fp8 linear
def _fp8_linear_cls():
    from primus.turbo.fp8_linear import FP8Linear
    from primus.turbo.fp8_ops import fp8_linear_traced

    global _TURBO_FP8_CLS
    if _TURBO_FP8_CLS is None:
        def forward(self, x):
            from torch.distributed.tensor import DTensor

            if isinstance(self.weight, DTensor):
                return _tp_forward(self, x)
            return fp8_linear_traced(_autocast_input(x), self.weight, self.bias, self.recipe, self.fmt,
                                     delayed=self.fp8_delayed)

        _TURBO_FP8_CLS = type("TurboFP8Linear", (FP8Linear,), {"forward": forward, "__module__": __name__})
    return _TURBO_FP8_CLS


_TURBO_FP8_CLS = None


def _autocast_input(x):
    """fp32 activations under autocast (TorchTitan on one GPU: fp32 params, bf16 autocast) cast in its dtype."""
    if x.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _tp_forward(mod, x):
    """A TurboFP8Linear under TorchTitan's TP plan (ColwiseParallel / RowwiseParallel: the weight a DTensor sharded
    on dim 0 / 1 of a 1-D mesh, x the DTensor the plan's input hook made: replicated / sharded on its last dim).
    The fp8 linear runs on the local shards, each with its own scales (current scaling per shard; a delayed
    history per shard), and the output is the DTensor the plan's output hook expects: sharded on its last dim
    (colwise) or partial sums (rowwise), which it all-gathers / reduce-scatters as for nn.Linear."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    from primus.turbo.fp8_ops import fp8_linear_traced

    w = mod.weight
    if w.device_mesh.ndim != 1 or not isinstance(w.placements[0], Shard) or w.placements[0].dim not in (0, 1):
        raise RuntimeError(f"TurboFP8Linear under TP takes a weight sharded on dim 0 or 1 of a 1-D mesh, got "
                           f"{w.placements} on a {w.device_mesh.ndim}-D mesh")
    colwise = w.placements[0].dim == 0
    if isinstance(x, DTensor):  # colwise: x replicated, each rank's dx a partial sum (reduced by the input hook)
        x = x.to_local(grad_placements=[Partial()] if colwise else None)
    xl = _autocast_input(x)
    bias = mod.bias
    local_bias = bias.to_local() if isinstance(bias, DTensor) and colwise else None
    yl = fp8_linear_traced(xl, w.to_local(), local_bias, mod.recipe, mod.fmt, delayed=mod.fp8_delayed)
    y = DTensor.from_local(yl, w.device_mesh, [Shard(yl.ndim - 1) if colwise else Partial()], run_check=False)
    if bias is not None and not colwise:  # added once, after the partial sums are reduced
        y = y + bias
    return y


def swap_float8_linears(model: nn.Module, recipe: str = "tensorwise", filter_fqns=("output",),
                        fmt: str = "e4m3", delayed: Optional[Dict[str, Any]] = None) -> List[str]:
    """primus.turbo.fp8_linear.swap_linears_to_fp8, then each FP8Linear gets the compile-safe (custom op) forward.
    delayed: DelayedScaling's settings (history_len, margin, algo) for recipe "delayed"; each linear's state is
    allocated by `allocate_fp8_states` once the model is on its device."""
    from primus.turbo.fp8_linear import DelayedScaling, swap_linears_to_fp8

    scaling = DelayedScaling(**(delayed or {})) if recipe == "delayed" else None
    names = swap_linears_to_fp8(model, recipe=recipe, filter_fqns=filter_fqns, fmt=fmt, delayed_scaling=scaling)
    cls = _fp8_linear_cls()
    for name in names:
        mod = model.get_submodule(name)
        mod.__class__ = cls
    return names


def allocate_fp8_states(model: nn.Module) -> int:
    """The delayed recipe's amax histories of every TurboFP8Linear, zeroed on its weight's device. TorchTitan builds
    the model on the meta device and materialises it after the converters ran; the compiled blocks are traced at
    the first step and must find the state tensors there. Returns how many linears got one."""
    n = 0
    for mod in model.modules():
        if isinstance(mod, _fp8_linear_cls()) and mod.fp8_delayed is not None:
            mod.fp8_delayed.allocate(mod.weight.device)
            n += 1
    return n


# ------------------------------------------------------------------------------------------------ grouped GEMM


def _run_experts_turbo(w1: Tensor, w2: Tensor, w3: Tensor, x: Tensor, num_tokens_per_expert: Tensor,
                       provider: Optional[str] = None) -> Tensor:
    """TorchTitan's _run_experts_grouped_mm with its three GEMMs through primus.turbo.grouped_gemm."""
    from primus.turbo.grouped_gemm import grouped_gemm

    xb = x.bfloat16()
    h = F.silu(grouped_gemm(xb, w1.bfloat16(), num_tokens_per_expert, trans_b=True, provider=provider))
    h = h * grouped_gemm(xb, w3.bfloat16(), num_tokens_per_expert, trans_b=True, provider=provider)
    return grouped_gemm(h, w2.bfloat16(), num_tokens_per_expert, trans_b=True, provider=provider).type_as(x)


_COMPILED_RUN = None


class TurboGroupedExperts(nn.Module):
    """Mixin over TorchTitan's GroupedExperts (same parameters): forward through the turbo grouped GEMM."""

    turbo_provider: Optional[str] = None  # None: primus.turbo.grouped_gemm.pick_provider per call
    turbo_compile: bool = False

    def forward(self, x: Tensor, num_tokens_per_expert: Tensor) -> Tensor:
        from torch.distributed.tensor import DTensor
        from torchtitan.models.moe.utils import indices_padding_wrapper

        w1, w2, w3 = self.w1, self.w2, self.w3
        ep = isinstance(w1, DTensor) and "ep" in (w1.device_mesh.mesh_dim_names or ())
        if isinstance(w1, DTensor):
            w1, w2, w3 = w1.to_local(), w2.to_local(), w3.to_local()
        provider = self.turbo_provider
        if provider is None:  # decided once, on the first batch (device, dtype, shapes)
            from primus.turbo.grouped_gemm import pick_provider

            provider = self.turbo_provider = pick_provider(x[:1].bfloat16(), w1[:1].bfloat16())
        run = _run_experts_turbo
        if self.turbo_compile and provider == "torch":
            # as TorchTitan compiles its own _run_experts_grouped_mm under compile (fuses silu * mul and casts)
            global _COMPILED_RUN
            if _COMPILED_RUN is None:
                _COMPILED_RUN = torch.compile(_run_experts_turbo, fullgraph=True)
            run = _COMPILED_RUN

        def fn(w1, w2, w3, x, n):
            return run(w1, w2, w3, x, n, provider)

        if not ep and provider == "torch" and x.device.type == "cuda":
            # torch._grouped_mm wants each expert's rows aligned: TorchTitan's sync-free padding (a Triton index
            # kernel). The Triton grouped GEMM takes any group sizes: no permutation copy there.
            fn = indices_padding_wrapper(fn)
        return fn(w1, w2, w3, x, num_tokens_per_expert)


_TURBO_EXPERTS_CLS: Dict[type, type] = {}


def swap_grouped_experts(model: nn.Module, compile: bool = False, provider: Optional[str] = None) -> int:
    from torchtitan.models.moe.moe import GroupedExperts

    n = 0
    for mod in model.modules():
        if isinstance(mod, GroupedExperts) and not isinstance(mod, TurboGroupedExperts):
            base = type(mod)
            cls = _TURBO_EXPERTS_CLS.get(base)
            if cls is None:
                cls = type("TurboGroupedExperts", (TurboGroupedExperts, base), {"__module__": __name__})
                _TURBO_EXPERTS_CLS[base] = cls
            mod.__class__ = cls
            mod.turbo_compile = compile
            mod.turbo_provider = provider
            n += 1
    return n


# ------------------------------------------------------------------------------------------------ converters


class _Converter:
    key = ""

    def __init__(self, job_config, parallel_dims):
        self.job_config = job_config

    def post_optimizer_hook(self, model):
        pass

    def _done(self, what: str, n: int) -> None:
        if n == 0:
            raise RuntimeError(f"{self.key}: found nothing to swap ({what}) in this model; turn the turbo flag off")
        LAST_SWAPS[self.key] = LAST_SWAPS.get(self.key, 0) + n
        log.info("turbo: %s swapped %d %s", self.key, n, what)


class AttentionConverter(_Converter):
    key = ATTENTION

    def convert(self, model):
        self._done("SDPA attention cores", swap_attention(model))


class Float8LinearConverter(_Converter):
    key = FLOAT8_LINEAR

    def convert(self, model):
        s = _SETTINGS.get("float8_linear") or {}
        names = swap_float8_linears(model, recipe=s.get("recipe", "tensorwise"),
                                    filter_fqns=s.get("filter_fqns", ["output"]), fmt=s.get("fmt", "e4m3"),
                                    delayed=s.get("delayed"))
        self._done("linears", len(names))


class GroupedGemmConverter(_Converter):
    key = GROUPED_GEMM

    def convert(self, model):
        self._done("MoE expert groups", swap_grouped_experts(model, compile=bool(_SETTINGS.get("compile"))))


def register_converters() -> None:
    from torchtitan.protocols import model_converter as mc

    for cls in (AttentionConverter, Float8LinearConverter, GroupedGemmConverter):
        if cls.key not in mc._registry_model_converter_cls:
            mc.register_model_converter(cls, cls.key)
