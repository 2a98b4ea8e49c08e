"""The turbo feature: its config, rules and backend mapping (see primus/features/__init__.py).

Where each flag is applied in the model (the kernels live in primus/turbo/, primus/turbo/providers.py picks who
serves each flag on this machine); megatron: primus/backends/megatron/turbo.py, torchtitan:
primus/backends/torchtitan/turbo.py:

  use_turbo_attention                  megatron swap_spec (TurboSDPAttention); torchtitan AttentionConverter
  use_turbo_rms_norm                   megatron swap_spec (TurboRMSNorm)
  use_turbo_parallel_linear            megatron apply (Column/RowParallelLinear forwards)
  use_turbo_grouped_gemm               megatron install (GroupedMLP's gmm); torchtitan GroupedGemmConverter
  grouped_gemm_fp8                     megatron install (fp8_grouped_gemm)
  moe_use_fused_router_with_aux_score  megatron install (_fused_topk, _fused_aux_scores)
  use_turbo_fused_act_with_probs       megatron apply (activation_func_with_probs)
  use_turbo_deepep                     megatron's flex token dispatcher (DeepEP)
  turbo_sync_free_moe_stage            megatron install (_turbo_permute: sync_free)
  (no flag) sync-free MoE dispatch     megatron apply (the alltoall dispatcher where SYNC_FREE_DISPATCH holds)
  use_turbo_float8_linear              torchtitan Float8LinearConverter (swap_float8_linears)
  use_turbo_async_tp                   torchtitan's own async TP (parallelism.enable_async_tensor_parallel)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from primus.config.errors import WARNING, ConfigIssue, note, warning
from primus.features import resolver, rule, unmet


@dataclass
class TurboConfig:
    enable_primus_turbo: bool = False  # master switch for every flag below
    provider: str = "auto"  # auto: primus_turbo when it imports, else this project's Triton/torch kernels
    use_turbo_attention: bool = False  # fused attention kernels
    use_turbo_parallel_linear: bool = False  # turbo GEMM in column/row-parallel linears
    # Primus's name for use_turbo_parallel_linear: one field (turbo_gemm_alias makes both read the same)
    use_turbo_gemm: Optional[bool] = None
    # The sync-free stage components are null = unset: turbo_sync_free_moe_stage sets them on, an explicit false
    # under a stage that needs the flag is an error; null elsewhere is off
    use_turbo_grouped_gemm: Optional[bool] = None  # grouped GEMM over MoE experts
    # ... and under precision.fp8 (portable path) in fp8 too: torch._scaled_grouped_mm (sm90, precision.fp8=e4m3;
    # H200: 1.11x bf16 at Mixtral's experts, 0.53-0.74x at many small ones, docs/turbo.md) else
    # primus' Triton fp8 grouped GEMM (primus/turbo/grouped_gemm_fp8.py decides).
    # Off by default: the Triton one measured 0.2x torch's bf16 grouped GEMM on the H200 (docs/benchmarks.md)
    grouped_gemm_fp8: bool = False
    use_turbo_grouped_mlp: Optional[bool] = None  # REMOVED: use use_turbo_grouped_gemm (true is an error)
    use_turbo_rms_norm: bool = False  # fused RMSNorm
    moe_use_fused_router_with_aux_score: Optional[bool] = None  # fused router + aux-loss score
    use_turbo_deepep: Optional[bool] = None  # DeepEP token dispatcher
    # compute units for DeepEP (megatron's moe_deepep_num_sms): 64/80 for EP8, at most 32 for EP16-64
    turbo_deepep_num_cu: int = 32
    # DeepEP buffers on a separate comm stream (Primus Turbo's DeepEP); megatron-core 0.16.1's flex dispatcher
    # fixes this itself, so only false is accepted here
    turbo_deepep_use_comm_stream: bool = False
    turbo_sync_free_moe_stage: int = 0  # 0 off; 1 router+permute fusion; 2 +DeepEP +grouped GEMM; 3 +fused act
    use_turbo_fused_act_with_probs: Optional[bool] = None  # SwiGLU fused with router probabilities
    # TorchTitan
    use_turbo_async_tp: bool = False  # async TP through turbo kernels
    use_turbo_float8_linear: bool = False  # float8 linear through turbo kernels


# ------------------------------------------------------------------------------------------- facts, as data
# Every turbo.* feature flag: the backends that apply it, whether it acts on MoE layers only (off on a dense model),
# and whether megatron applies it by swapping a module of the local layer spec (Transformer Engine's layers fuse
# those already). The order is the order issues and logs list them in.
TURBO_FLAGS = {
    # flag: (backends, moe_only, local_spec_swap)
    "use_turbo_attention": (("megatron", "torchtitan"), False, True),
    "use_turbo_parallel_linear": (("megatron",), False, True),
    "use_turbo_grouped_gemm": (("megatron", "torchtitan"), True, True),
    "use_turbo_rms_norm": (("megatron",), False, True),
    "moe_use_fused_router_with_aux_score": (("megatron",), True, True),
    "use_turbo_deepep": (("megatron",), True, False),
    "use_turbo_fused_act_with_probs": (("megatron",), True, True),
    "use_turbo_async_tp": (("torchtitan",), False, False),
    "use_turbo_float8_linear": (("torchtitan",), False, False),
}


def flags(backend: Optional[str] = None, moe_only: Optional[bool] = None, local_spec_swap: Optional[bool] = None
          ) -> Tuple[str, ...]:
    """The TURBO_FLAGS applied by this backend, MoE-only or not, swapping a local-spec module or not (None: any)."""
    return tuple(f for f, (b, moe, swap) in TURBO_FLAGS.items()
                 if (backend is None or backend in b) and moe_only in (None, moe) and local_spec_swap in (None, swap))


# The sync-free MoE stages are cumulative: stage s needs the component keys of every stage up to s, each with the
# words the provider log uses. conf/turbo/sync_free_stage<s>.yaml sets them.
SYNC_FREE_STAGES = {
    1: (("turbo.moe_use_fused_router_with_aux_score", "fused router"), ("moe.moe_permute_fusion", "permute fusion")),
    2: (("turbo.use_turbo_grouped_gemm", "grouped GEMM"), ("turbo.use_turbo_deepep", "DeepEP dispatcher")),
    3: (("turbo.use_turbo_fused_act_with_probs", "fused act with probs"),),
}


def sync_free_components(stage: int) -> Tuple[Tuple[str, str], ...]:
    """(config key, words) of every component sync-free stage `stage` needs (SYNC_FREE_STAGES, cumulative)."""
    return tuple(c for s in sorted(SYNC_FREE_STAGES) if s <= stage for c in SYNC_FREE_STAGES[s])


def _get(cfg, key: str):
    group, name = key.split(".", 1)
    return getattr(getattr(cfg, group), name)


# megatron's alltoall token dispatcher runs sync-free (megatron/turbo.py `_sync_free_dispatcher`) where every one
# of these holds: the token counts per expert stay on the device (no copy to the host, no stream sync, no identity
# sort of the expert chunks), the math is megatron's. Automatic: it changes no number, and each condition is a
# setting the user chose for itself. Each: (config keys, what it needs, holds(cfg)), in the order a miss is named.
# Dropless routing is needed too and is not a row: no key here sets a capacity factor, padding to capacity or the
# router's padding for quantization (the importer refuses them); the swap checks megatron's config for them.
SYNC_FREE_DISPATCH = (
    (("moe.moe_token_dispatcher_type",), "moe.moe_token_dispatcher_type=alltoall",
     lambda c: c.moe.moe_token_dispatcher_type.value == "alltoall"),
    (("parallel.expert_model_parallel_size",), "parallel.expert_model_parallel_size=1 (no token all-to-all)",
     lambda c: c.parallel.expert_model_parallel_size == 1),
    (("parallel.tensor_model_parallel_size",), "parallel.tensor_model_parallel_size=1 (the experts' tp: no token "
     "all-gather)", lambda c: c.parallel.tensor_model_parallel_size == 1),
    (("moe.moe_permute_fusion", "backend.layer_spec"), "moe.moe_permute_fusion=true on the local spec (the Triton "
     "permute, given the static token count)", lambda c: turbo_permute_fusion(c)),
    (("turbo.use_turbo_grouped_gemm",), "turbo.use_turbo_grouped_gemm=true (GroupedMLP on the turbo grouped GEMM, "
     "which reads the counts on the device; SequentialMLP splits on host counts)",
     lambda c: turbo_on(c, "use_turbo_grouped_gemm")),
)


def sync_free_dispatch(cfg) -> Optional[List[Tuple[Tuple[str, ...], str]]]:
    """The SYNC_FREE_DISPATCH rows this megatron MoE run misses, as (keys, what is needed): [] = the MoE dispatch
    runs sync-free; None = no MoE layer (a dense model)."""
    if not cfg.model.num_experts:
        return None
    return unmet(SYNC_FREE_DISPATCH, cfg)


def moe_dispatch_info(cfg) -> Optional[str]:
    """backend_info.moe_dispatch (megatron): whether the MoE dispatch runs sync-free and, if not, what it needs."""
    missing = sync_free_dispatch(cfg)
    if missing is None:
        return None
    if not missing:
        return ("sync-free: token counts stay on the device (alltoall dispatcher, ep = tp = 1, Triton permute, "
                "turbo grouped GEMM; no host copy, no stream sync, no chunk sort)")
    return (f"megatron's {cfg.moe.moe_token_dispatcher_type.value} dispatcher: token counts read on the host in "
            "every MoE layer; sync-free needs " + "; ".join(need for _, need in missing))


def turbo_on(cfg, flag: str) -> bool:
    return bool(cfg.turbo.enable_primus_turbo and getattr(cfg.turbo, flag))


def turbo_linears(cfg) -> bool:
    """megatron runs the decoder's Column/RowParallelLinear as primus.turbo.parallel_linear's (a local-spec swap)."""
    from primus.backends.megatron.args import resolved_layer_spec

    return turbo_on(cfg, "use_turbo_parallel_linear") and resolved_layer_spec(cfg) == "local"


def turbo_fp8(cfg) -> bool:
    """precision.fp8 served by the turbo fp8 linear (TorchTitan's turbo.use_turbo_float8_linear)."""
    return turbo_on(cfg, "use_turbo_float8_linear") and cfg.precision.fp8 is not None


# ------------------------------------------------------------------------------------------- rules


@rule
def turbo_provider_known(cfg, ctx):
    from primus.turbo.providers import PROVIDERS

    p = cfg.turbo.provider
    if p in PROVIDERS:
        return []
    return [ConfigIssue(["turbo.provider"], p, "must be " + ", ".join(PROVIDERS[:-1]),
                        "set turbo.provider=auto (primus_turbo when it imports, else this project's kernels)")]


@resolver
def turbo_gemm_alias(cfg, ctx):
    """turbo.use_turbo_gemm is Primus's name for turbo.use_turbo_parallel_linear: one field. Its value is folded
    into use_turbo_parallel_linear (and the alias left unset), so every rule, mapping and dry run reads that one."""
    t = cfg.turbo
    g, t.use_turbo_gemm = t.use_turbo_gemm, None
    if g is None:
        return []
    if g is False and t.use_turbo_parallel_linear:
        return [ConfigIssue(["turbo.use_turbo_gemm", "turbo.use_turbo_parallel_linear"],
                            {"use_turbo_gemm": False, "use_turbo_parallel_linear": True},
                            "use_turbo_gemm is Primus's name for use_turbo_parallel_linear: the two disagree",
                            "set only one of them")]
    t.use_turbo_parallel_linear = g
    return [note(["turbo.use_turbo_parallel_linear", "turbo.use_turbo_gemm"], g,
                 "set by turbo.use_turbo_gemm (Primus's name for the same field)")]


@resolver
def turbo_sync_free_stage_sets_components(cfg, ctx):
    """A sync-free stage sets its component flags (SYNC_FREE_STAGES), as Primus's stage does; an explicit false
    for one of them contradicts the stage. DeepEP, whether a stage or the user turned it on, is the flex token
    dispatcher with fp32 router probabilities: those are set too when left at their defaults (an explicit
    alltoall on the command line stays, and turbo_deepep refuses it)."""
    t, out = cfg.turbo, []
    s = t.turbo_sync_free_moe_stage
    if s in SYNC_FREE_STAGES and t.enable_primus_turbo and cfg.model.num_experts:
        contra = []
        for key, words in sync_free_components(s):
            group, name = key.split(".", 1)
            v = getattr(getattr(cfg, group), name)
            if v is None:
                setattr(getattr(cfg, group), name, True)
                out.append(note([key, "turbo.turbo_sync_free_moe_stage"], True,
                                f"set by sync-free MoE stage {s} ({words})"))
            elif v is False:
                contra.append(key)
        if contra:
            out.append(ConfigIssue(["turbo.turbo_sync_free_moe_stage"] + contra, s,
                                   f"sync-free MoE stage {s} turns on " + ", ".join(contra) + ", set false here",
                                   f"drop those keys (stage {s} sets them), or pick a lower stage"))
    if t.enable_primus_turbo and t.use_turbo_deepep and cfg.model.num_experts:
        from primus.features.moe import TokenDispatcher

        m = cfg.moe
        if m.moe_token_dispatcher_type == TokenDispatcher.alltoall and "moe.moe_token_dispatcher_type" not in ctx.explicit:
            m.moe_token_dispatcher_type = TokenDispatcher.flex
            out.append(note(["moe.moe_token_dispatcher_type", "turbo.use_turbo_deepep"], "flex",
                            "set by DeepEP (it is the flex token dispatcher)"))
        if m.moe_router_dtype is None:
            from primus.features.moe import RouterDtype

            m.moe_router_dtype = RouterDtype.fp32
            out.append(note(["moe.moe_router_dtype", "turbo.use_turbo_deepep"], "fp32",
                            "set by DeepEP (it dispatches fp32 router probabilities)"))
    return out


@rule
def turbo_grouped_mlp_removed(cfg, ctx):
    # Primus's MI355X examples set it false: only true is the removed usage
    if cfg.turbo.use_turbo_grouped_mlp:
        return [ConfigIssue(["turbo.use_turbo_grouped_mlp"], cfg.turbo.use_turbo_grouped_mlp,
                            "use_turbo_grouped_mlp was removed",
                            "delete it and set turbo.use_turbo_grouped_gemm=true instead")]
    return []


@rule
def turbo_gemm_fp8_recipe(cfg, ctx):
    """fp8 through the turbo GEMM path scales tensorwise, blockwise or mxfp8 (precision.RECIPES, provider
    primus_turbo), whoever serves the GEMM on this machine."""
    from primus.features.precision import TURBO_GEMM_FP8_RECIPES, preset

    t, p = cfg.turbo, cfg.precision
    if not (t.enable_primus_turbo and t.use_turbo_parallel_linear and p.fp8 is not None):
        return []
    r = p.fp8_recipe.value
    if r in TURBO_GEMM_FP8_RECIPES:
        return []
    return [ConfigIssue(["turbo.use_turbo_parallel_linear", "turbo.use_turbo_gemm", "precision.fp8_recipe"], r,
                        f"fp8 through the turbo GEMM path must be one of {list(TURBO_GEMM_FP8_RECIPES)}",
                        "use precision=" + " / ".join(preset(x) for x in TURBO_GEMM_FP8_RECIPES)
                        + ", or turbo.use_turbo_parallel_linear=false")]


# Fields that act only under another setting (primus.features.idle_settings). The master switch alone turns no
# kernel on (Primus's semantics: each path has its flag): warned, as Primus's own configs often carry it so
ACTS_ONLY_WITH = (
    (("enable_primus_turbo",), "a Turbo feature flag (turbo.use_turbo_*, turbo.turbo_sync_free_moe_stage)",
     lambda c: c.turbo.turbo_sync_free_moe_stage > 0 or any(getattr(c.turbo, f) for f in TURBO_FLAGS),
     "turn on the paths you want (a turbo= preset such as turbo=megatron sets them), or drop it", WARNING),
)


@rule
def turbo_flags_need_master_switch(cfg, ctx):
    t = cfg.turbo
    if t.enable_primus_turbo:
        return []
    on = [f"turbo.{f}" for f in TURBO_FLAGS if getattr(t, f)]
    if t.turbo_sync_free_moe_stage > 0:
        on.append("turbo.turbo_sync_free_moe_stage")
    if not on:
        return []
    return [ConfigIssue(on + ["turbo.enable_primus_turbo"], False,
                        "Turbo feature flags take effect only with the master switch on (they are never ignored)",
                        "set turbo.enable_primus_turbo=true, or turn the listed flags off")]


@rule
def turbo_sync_free_stage(cfg, ctx):
    t, out = cfg.turbo, []
    s = t.turbo_sync_free_moe_stage
    if s != 0 and s not in SYNC_FREE_STAGES:
        return [ConfigIssue(["turbo.turbo_sync_free_moe_stage"], s, "must be 0, 1, 2 or 3 (0 disables)",
                            "use turbo=sync_free_stage2 (recommended) or set the stage to 0..3")]
    # The stages are cumulative (guide): turbo_sync_free_stage_sets_components turned their flags on
    if s > 0 and not cfg.model.num_experts:
        out.append(ConfigIssue(["turbo.turbo_sync_free_moe_stage", "model.num_experts"], s,
                               "sync-free MoE stages apply to MoE models only", "choose a MoE model or set the stage to 0"))
    return out


@rule
def turbo_deepep(cfg, ctx):
    t, out = cfg.turbo, []
    if t.use_turbo_deepep:
        if t.turbo_deepep_num_cu <= 0:
            out.append(ConfigIssue(["turbo.turbo_deepep_num_cu"], t.turbo_deepep_num_cu, "must be > 0",
                                   "use 64 or 80 for EP8, 32 for EP16-64"))
        if cfg.moe.moe_token_dispatcher_type.value != "flex":
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "moe.moe_token_dispatcher_type"],
                                   cfg.moe.moe_token_dispatcher_type.value,
                                   "DeepEP is the flex token dispatcher", "set moe.moe_token_dispatcher_type=flex"))
        if not cfg.model.num_experts:
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "model.num_experts"], None,
                                   "DeepEP dispatches MoE tokens: the model has no experts", "turn it off or pick a MoE model"))
            return out
        # Primus's rules: DeepEP dispatches fp32 router probabilities, and megatron's shared-expert overlap is the
        # alltoall dispatcher's; past EP16 DeepEP's kernels want at most 32 CUs
        rd = cfg.moe.moe_router_dtype
        if rd is not None and rd.value != "fp32":
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "moe.moe_router_dtype"], rd.value,
                                   "DeepEP needs fp32 router probabilities", "set moe.moe_router_dtype=fp32 (or leave "
                                   "it unset: DeepEP sets it)"))
        if cfg.moe.moe_shared_expert_overlap:
            out.append(ConfigIssue(["turbo.use_turbo_deepep", "moe.moe_shared_expert_overlap"], True,
                                   "DeepEP cannot overlap the shared experts with its dispatch",
                                   "set moe.moe_shared_expert_overlap=false"))
        ep = cfg.parallel.expert_model_parallel_size
        if ep >= 16 and t.turbo_deepep_num_cu > 32:
            out.append(ConfigIssue(["turbo.turbo_deepep_num_cu", "parallel.expert_model_parallel_size"],
                                   {"turbo_deepep_num_cu": t.turbo_deepep_num_cu, "ep": ep},
                                   "with ep >= 16 DeepEP runs on at most 32 CUs", "set turbo.turbo_deepep_num_cu=32"))
    elif t.turbo_deepep_num_cu != TurboConfig.turbo_deepep_num_cu or t.turbo_deepep_use_comm_stream:
        keys = [f"turbo.{k}" for k in ("turbo_deepep_num_cu", "turbo_deepep_use_comm_stream")
                if getattr(t, k) != getattr(TurboConfig, k)]
        out.append(warning(keys, {k: _get(cfg, k) for k in keys}, "DeepEP is off (turbo.use_turbo_deepep): "
                           "its settings do not apply", "drop them, or turn DeepEP on"))
    if t.turbo_deepep_use_comm_stream and t.use_turbo_deepep:
        out.append(ConfigIssue(["turbo.turbo_deepep_use_comm_stream"], True,
                               "megatron-core 0.16.1's flex dispatcher chooses DeepEP's streams itself "
                               "(fused_a2a: allocate_on_comm_stream); there is no switch for it here",
                               "set turbo.turbo_deepep_use_comm_stream=false"))
    return out


# ------------------------------------------------------------------------------------------- megatron


def turbo_permute_fusion(cfg) -> bool:
    """moe.moe_permute_fusion without TE: served by primus.turbo.moe_ops.permute / unpermute (megatron/turbo.py)."""
    from primus.backends.megatron.args import resolved_layer_spec

    return bool(cfg.moe.moe_permute_fusion and cfg.model.num_experts and resolved_layer_spec(cfg) == "local")


def turbo_args(cfg) -> Dict[str, Any]:
    """args["turbo"]: what primus/backends/megatron/turbo.py swaps in ({} when nothing)."""
    t = cfg.turbo
    out: Dict[str, Any] = {}
    if t.enable_primus_turbo:
        for f in flags("megatron"):
            if getattr(t, f) and (not TURBO_FLAGS[f][1] or cfg.model.num_experts):
                out[f] = True
        if t.turbo_sync_free_moe_stage and cfg.model.num_experts:
            out["turbo_sync_free_moe_stage"] = int(t.turbo_sync_free_moe_stage)
            out["sync_free"] = True  # permute with num_out_tokens = tokens x topk (dropless): no host sync
        if t.use_turbo_parallel_linear:
            out["chunks"] = 2  # pieces of the overlapped TP collectives
    if out.get("use_turbo_grouped_gemm") and t.grouped_gemm_fp8:  # checked: portable fp8 (megatron_issues)
        out["grouped_gemm_fp8"] = cfg.precision.fp8.value  # experts' GEMMs in fp8 too (tensorwise, fp8 format)
    if turbo_permute_fusion(cfg):
        out["moe_permute_fusion"] = True
    if sync_free_dispatch(cfg) == []:
        out["sync_free_dispatch"] = True
    if out and cfg.model.num_experts:
        out["topk"] = cfg.model.moe_router_topk
    return out


def megatron(cfg, ctx) -> Dict[str, Any]:
    t = cfg.turbo
    out: Dict[str, Any] = {"turbo": turbo_args(cfg)}
    if t.enable_primus_turbo and t.use_turbo_deepep and cfg.model.num_experts:
        # the flex dispatcher sizes DeepEP's kernels by it (megatron's set_deepep_num_sms)
        out["transformer_config"] = {"moe_deepep_num_sms": t.turbo_deepep_num_cu}
    return out


def megatron_issues(cfg, ctx) -> List[ConfigIssue]:
    """Turbo flags with backend=megatron: what they need, and (unless planned) a provider for each on this device
    (primus.turbo.providers names what to install)."""
    from primus.backends.megatron.args import resolved_layer_spec
    from primus.features.precision import PORTABLE_FP8_RECIPES, TURBO_GEMM_FP8_RECIPES, fp8_backend

    t, p, m = cfg.turbo, cfg.precision, cfg.model
    out: List[ConfigIssue] = []
    if t.grouped_gemm_fp8:
        need = []
        if not (t.enable_primus_turbo and t.use_turbo_grouped_gemm and m.num_experts):
            need.append("turbo.enable_primus_turbo=true and turbo.use_turbo_grouped_gemm=true on an MoE model")
        if p.fp8 is None or fp8_backend(cfg) != "portable":
            need.append("precision=fp8 on the portable fp8 path (no Transformer Engine)")
        if need:
            out.append(ConfigIssue(["turbo.grouped_gemm_fp8"], True, "fp8 experts need " + " and ".join(need),
                                   "set those, or turbo.grouped_gemm_fp8=false"))
        elif p.fp8_recipe.value != "tensorwise":
            out.append(ConfigIssue(["turbo.grouped_gemm_fp8", "precision.fp8_recipe"], p.fp8_recipe.value,
                                   "the fp8 grouped GEMM over experts (primus.turbo.grouped_gemm) scales tensorwise",
                                   "use precision.fp8_recipe=tensorwise, or turbo.grouped_gemm_fp8=false (experts "
                                   "then run a bf16 grouped GEMM)"))
        elif p.first_last_layers_bf16:
            out.append(ConfigIssue(["turbo.grouped_gemm_fp8", "precision.first_last_layers_bf16"], True,
                                   "the fp8 grouped GEMM applies to every MoE layer's experts; keeping the first/last "
                                   "layers in bf16 is not wired for experts yet",
                                   "set precision.first_last_layers_bf16=false, or turbo.grouped_gemm_fp8=false"))
    if not t.enable_primus_turbo and not turbo_permute_fusion(cfg):
        return out
    spec = resolved_layer_spec(cfg)
    if t.enable_primus_turbo and spec == "te":
        on = [f"turbo.{f}" for f in flags("megatron", local_spec_swap=True) if getattr(t, f)]
        if on:
            out.append(ConfigIssue(on + ["backend.layer_spec"], "te",
                                   "the megatron turbo swaps replace modules of the local spec; Transformer Engine's "
                                   "layers already fuse these", "set backend.layer_spec=local, or turbo=off"))
    if turbo_on(cfg, "use_turbo_attention") and m.use_sink_attention and spec == "local":
        # Primus runs sinks inside its turbo attention; the kernel here has no sink (or window) argument
        out.append(ConfigIssue(["turbo.use_turbo_attention", "model.use_sink_attention"], True,
                               "the turbo attention kernel has no attention sinks: every layer runs torch's SDPA "
                               "with the sink as one more key instead (primus.backends.attention_sinks)",
                               "drop turbo.use_turbo_attention (nothing else changes)", severity=WARNING))
    if turbo_linears(cfg) and p.fp8 is not None:
        r = p.fp8_recipe.value
        if r in TURBO_GEMM_FP8_RECIPES and r not in PORTABLE_FP8_RECIPES:  # turbo_gemm_fp8_recipe judges the rest
            out.append(ConfigIssue(["turbo.use_turbo_parallel_linear", "precision.fp8_recipe"], r,
                                   f"without primus_turbo the turbo parallel linear runs fp8 recipes "
                                   f"{[x for x in TURBO_GEMM_FP8_RECIPES if x in PORTABLE_FP8_RECIPES]}",
                                   "install primus_turbo (AMD), or use precision=fp8 (tensorwise)", needs="primus_turbo"))
    if ctx.planned:
        return out
    from primus.turbo import providers

    for i in providers.capability_issues(cfg, ctx.device, info=providers.device_info_for(ctx.device)):
        if i.keys and i.keys[0].startswith("precision.fp8"):
            continue  # the precision rules judge fp8 (TE or the portable linear)
        out.append(i)
    return out


# args["turbo"] keys that other groups' settings turn on -> the user's key (the rest are turbo.<key>)
SWAP_KEYS = {"moe_permute_fusion": "moe.moe_permute_fusion",
             "experts_grad_accum_fusion": "training.gradient_accumulation_fusion"}


def megatron_swaps() -> Tuple[str, ...]:
    """args["turbo"] keys whose module swaps megatron/turbo.py counts (a flag that swapped nothing is an error)."""
    return flags("megatron", local_spec_swap=True) + tuple(SWAP_KEYS)


def swap_key(key: str) -> str:
    """The config key behind an args["turbo"] swap key."""
    return SWAP_KEYS.get(key, f"turbo.{key}")


# ------------------------------------------------------------------------------------------- torchtitan
# turbo.* flags -> the TorchTitan model converters of backends/torchtitan/turbo.py, settings in args[TURBO_KEY].

TURBO_ATTENTION = "primus_turbo.attention"  # names registered by backends/torchtitan/turbo.py (a test checks)
TURBO_FLOAT8 = "primus_turbo.float8_linear"
TURBO_GROUPED_GEMM = "primus_turbo.grouped_gemm"


def megatron_only(cfg) -> tuple:
    """turbo.* fields only megatron reads: the flags TURBO_FLAGS gives megatron alone, and the fp8 grouped GEMM
    (TorchTitan's MoE experts have none here)."""
    return tuple(f for f in flags("megatron") if f not in flags("torchtitan")) + ("grouped_gemm_fp8",)


def torchtitan_only(cfg) -> tuple:
    """turbo.* fields only TorchTitan reads: the flags TURBO_FLAGS gives TorchTitan alone."""
    return tuple(f for f in flags("torchtitan") if f not in flags("megatron"))


def torchtitan_async_tp(cfg) -> bool:
    """TorchTitan's async TP asked for through turbo.use_turbo_async_tp (parallelism.enable_async_tensor_parallel)."""
    return turbo_on(cfg, "use_turbo_async_tp")


def torchtitan(cfg, ctx) -> Dict[str, Any]:
    from primus.backends.torchtitan.jobconfig_keys import TURBO_KEY
    from primus.features.precision import FP8Recipe, float8

    t, p = cfg.turbo, cfg.precision
    converters: List[str] = []
    out: Dict[str, Any] = {}
    if t.enable_primus_turbo:
        settings: Dict[str, Any] = {"compile": cfg.training.compile}
        if t.use_turbo_attention:
            converters.append(TURBO_ATTENTION)
            settings["attention"] = True
        if t.use_turbo_grouped_gemm and cfg.model.num_experts:  # dense models: moe's MoE-on-dense rule
            converters.append(TURBO_GROUPED_GEMM)
            settings["grouped_gemm"] = True
        if t.use_turbo_float8_linear and p.fp8 is not None:
            settings["float8_linear"] = {"recipe": p.fp8_recipe.value, "fmt": p.fp8.value,
                                         "filter_fqns": list(p.float8_filter_fqns)}
            if p.fp8_recipe == FP8Recipe.delayed:  # fp8_linear.DelayedScaling's settings
                settings["float8_linear"]["delayed"] = {"history_len": p.fp8_amax_history_len,
                                                        "margin": p.fp8_margin, "algo": p.fp8_amax_compute_algo}
        if t.use_turbo_async_tp:
            # TorchTitan's async TP: torch symmetric-memory fused all-gather/reduce-scatter matmuls, which compile
            # inserts into the TP regions. primus.turbo.parallel_linear is not wired into TorchTitan's DTensor plan.
            settings["async_tp"] = True
        out[TURBO_KEY] = settings
    # the float8 converter last: after the turbo swaps (the turbo fp8 linear, or torchao's)
    converters += [TURBO_FLOAT8] if turbo_fp8(cfg) else float8(cfg)["converters"]
    out["model"] = {"converters": converters}
    return out


def _turbo_float8_tp_issues(cfg) -> List[ConfigIssue]:
    """The turbo fp8 linear under TorchTitan's TP plan runs on each rank's shards (turbo._tp_forward): their dims
    must still be fp8 GEMM operands (multiples of 16), and TorchTitan's async TP cannot fuse its collectives into
    the fp8 GEMMs (custom ops, not aten matmuls: the fusion would silently skip them)."""
    from primus.metrics.flops import head_dim as head_dim_of

    m, par, out = cfg.model, cfg.parallel, []
    tp = par.tensor_model_parallel_size
    head_dim = head_dim_of(m)
    local = {"q (heads x head dim)": m.num_attention_heads * head_dim, "k / v (kv heads x head dim)":
             m.num_query_groups * head_dim, "ffn_hidden_size": m.ffn_hidden_size}
    bad = {k: v for k, v in local.items() if v % tp or (v // tp) % 16}
    if bad:
        out.append(ConfigIssue(["turbo.use_turbo_float8_linear", "parallel.tensor_model_parallel_size"],
                               {"tp": tp, **bad}, "each rank's shard of these linear dims must be a multiple of 16 "
                               "(an fp8 GEMM operand)", "pick a tensor_model_parallel_size that keeps them so"))
    if cfg.turbo.use_turbo_async_tp or cfg.overlap.enable_async_tensor_parallel:
        out.append(ConfigIssue(["turbo.use_turbo_float8_linear", "turbo.use_turbo_async_tp",
                                "overlap.enable_async_tensor_parallel"], True,
                               "TorchTitan's async TP fuses the TP collectives into aten matmuls; the turbo fp8 "
                               "linear's GEMMs are custom ops it cannot fuse",
                               "turn async TP off, or turbo.use_turbo_float8_linear=false"))
    return out


def torchtitan_issues(cfg, ctx) -> List[ConfigIssue]:
    """Turbo flags with backend=torchtitan: what they need, and (unless planned) a provider for each here."""
    from primus.features.precision import PORTABLE_FP8_RECIPES, FP8Recipe, delayed_recipe_issues, preset

    t, p, par = cfg.turbo, cfg.precision, cfg.parallel
    issues: List[ConfigIssue] = []
    if not t.enable_primus_turbo:
        return issues
    if t.use_turbo_attention and cfg.model.use_sink_attention:
        # the converter swaps TorchTitan's SDPA wrapper; every attention core here is the sink one
        issues.append(ConfigIssue(["turbo.use_turbo_attention", "model.use_sink_attention"], True,
                                  "the turbo attention kernel has no attention sinks, and every layer's attention "
                                  "core is the sink one: it would swap nothing",
                                  "set turbo.use_turbo_attention=false"))
    if turbo_fp8(cfg):  # precision.fp8 served by primus.turbo.fp8_linear instead of torchao's converter
        if p.fp8_recipe.value not in PORTABLE_FP8_RECIPES:
            issues.append(ConfigIssue(["turbo.use_turbo_float8_linear", "precision.fp8_recipe"], p.fp8_recipe.value,
                                      f"the turbo fp8 linear runs recipes {list(PORTABLE_FP8_RECIPES)}",
                                      f"pick one of those (precision={', '.join(map(preset, PORTABLE_FP8_RECIPES))}), "
                                      "or turbo.use_turbo_float8_linear=false"))
        if p.fp8_recipe == FP8Recipe.delayed:
            issues.extend(delayed_recipe_issues(p))
        for k in ("float8_enable_fsdp_float8_all_gather", "float8_precompute_float8_dynamic_scale_for_fsdp"):
            if getattr(p, k):
                issues.append(ConfigIssue([f"precision.{k}", "turbo.use_turbo_float8_linear"], True,
                                          "the turbo fp8 linear casts after the FSDP all-gather (bf16 all-gather); "
                                          "float8 all-gather is torchao's",
                                          f"set precision.{k}=false, or turbo.use_turbo_float8_linear=false"))
        if par.tensor_model_parallel_size > 1:
            issues.extend(_turbo_float8_tp_issues(cfg))
    elif t.use_turbo_float8_linear:
        issues.append(ConfigIssue(["turbo.use_turbo_float8_linear", "precision.fp8"], None,
                                  "the turbo float8 linear serves precision.fp8; with fp8 off there is nothing "
                                  "to serve",
                                  "set precision=fp8 (tensorwise), or turbo.use_turbo_float8_linear=false"))
    if t.use_turbo_async_tp:
        tp = par.tensor_model_parallel_size
        if tp == 1 or not cfg.training.compile:
            issues.append(ConfigIssue(["turbo.use_turbo_async_tp", "parallel.tensor_model_parallel_size",
                                       "training.compile"], {"tp": tp, "compile": cfg.training.compile},
                                      "async TP overlaps the TP collectives with the GEMMs: it needs tp > 1 and "
                                      "torch.compile (TorchTitan's micro-pipelined TP)",
                                      "set tp > 1 and training.compile=true, or turbo.use_turbo_async_tp=false"))
    if ctx.planned:  # a dry run for a GPU this machine lacks skips the hardware probe
        return issues
    from primus.turbo import providers

    return issues + providers.capability_issues(cfg, ctx.device, info=providers.device_info_for(ctx.device))
