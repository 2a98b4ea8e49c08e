"""Turbo kernels in megatron-core's local spec (`turbo.*` flags, backend=megatron, no Transformer Engine).

primus/features/turbo.py decides what is on (`args["turbo"]`, JSON-able, shown by a dry run); the trainer resolves
and logs the providers (`primus.turbo.providers`), then uses this module at three points:

  spec (before the model is built)   spec.py calls `swap_spec`:
      use_turbo_attention   core attention -> TurboSDPAttention: `primus.turbo.attention.turbo_attention` on the
                            [s, b, h, d] tensors (cuDNN > flash > efficient on CUDA; never the math kernel on a GPU,
                            it raises instead), GQA in the kernel. Non-causal masks fall back to spec.SDPAttention.
      use_turbo_rms_norm    input / pre-MLP / q-k(-latent) / final norms -> TurboRMSNorm: the Triton fused
                            RMSNorm fwd+bwd, weight marked `sequence_parallel` as spec.RMSNorm does.
  megatron internals (`install`, before the model is built, idempotent, switches read per call):
      use_turbo_grouped_gemm               GroupedMLP's `gg.ops.gmm` -> primus.turbo.grouped_gemm (the config's
                                           moe_grouped_gemm is forced on by features/moe.py: GroupedMLP is built);
                                           with turbo.grouped_gemm_fp8 (precision.fp8 without TE):
                                           fp8_grouped_gemm: torch._scaled_grouped_mm (rowwise, e4m3, sm90)
                                           or the Triton kernels (tensorwise), per grouped_gemm_fp8's rule;
                                           SWAPS counts calls per provider (gmm_calls_fp8_<provider>)
      moe_use_fused_router_with_aux_score  TopKRouter's top-k + aux-loss scores -> moe_ops.fused_router (one pass
                                           computes probs, routing map and the aux scores; group-limited routing,
                                           padding masks and router replay keep megatron's code)
      moe.moe_permute_fusion (no TE)       the token dispatchers' permute / unpermute -> moe_ops.permute /
                                           unpermute (megatron's own fusion needs TE, so its config flag stays off)
  built model (`apply`, per model chunk):
      use_turbo_parallel_linear  decoder Column/RowParallelLinear (not experts) -> primus.turbo.parallel_linear's
                                 autograd functions: column = input comm + GEMM (+ async dgrad all-reduce /
                                 reduce-scatter overlapped with the wgrad GEMM; sequence parallel: chunked all-gather
                                 overlapped with GEMMs); row = GEMM with the output all-reduce chunked and overlapped
                                 (sequence parallel: reduce-scatter). bf16 GEMMs, or fp8 (portable recipe) under
                                 precision.fp8 for the linears fp8 would convert (first/last bf16 layers kept).
      use_turbo_fused_act_with_probs  GroupedMLP's activation_func_with_probs -> moe_ops.swiglu_with_probs
      experts_grad_accum_fusion  (training.gradient_accumulation_fusion, features/training.py
                                 EXPERTS_GRAD_ACCUM_FUSION) GroupedMLP's forward -> `_grouped_mlp_accum_forward`:
                                 its two grouped GEMMs add their weight gradients into main_grad
      sync_free_dispatch         each MoE layer's alltoall dispatcher -> `_sync_free_dispatcher`: token counts kept
                                 on the device (features/turbo.py SYNC_FREE_DISPATCH says where; no flag of its own)
A flag that finds nothing to swap in the model raises (never a silent no-op). `SWAPS` counts swaps per flag.

Under training.compile (perf.py compiles each TransformerLayer) the attention (SDPA under an sdpa_kernel
priority, which dynamo traces), the RMSNorm, the router, permute and unpermute (torch custom op pairs: the patched
entries below are plain Python dynamo reads) and tp=1 parallel linears (bf16: torch GEMMs; fp8: primus.turbo.fp8_ops'
custom ops, delayed included) stay inside the compiled graph, as does the grouped GEMM of bf16 experts on sm90 /
sm100 (`_gmm`: the torch._grouped_mm it runs there is traced). The other entry points here run eagerly
(`torch.compiler.disable`: one graph break each): dynamo must not trace into their Triton launchers or the TP
collectives. result.json's `compile` counts the run's graph breaks.
"""
from __future__ import annotations

import logging
import types
from typing import Any, Dict, List, Optional

import torch

from primus.backends.megatron.spec import RMSNorm, SDPAttention

log = logging.getLogger("primus.megatron")

SWAPS: Dict[str, int] = {}
_STATE: Dict[str, Any] = {"flags": {}}


def _eager(fn):
    """Keep dynamo out of a turbo kernel call (a graph break under training.compile; a no-op otherwise)."""
    return torch.compiler.disable(fn, recursive=True)


def _count(key: str, n: int = 1) -> None:
    """Only from code dynamo does not trace: there the count it reads becomes a guard, and every call would recompile
    the layer (the compiled MoE layer hit dynamo's recompile limit when its router and permute counted calls)."""
    SWAPS[key] = SWAPS.get(key, 0) + n


def reset(flags: Optional[Dict[str, Any]]) -> None:
    """The flags of this run (args["turbo"]); clears the swap counts."""
    SWAPS.clear()
    _STATE["flags"] = dict(flags or {})
    _STATE["gmm_traced"] = False  # apply() decides it for the run's device


def _on(name: str) -> bool:
    return bool(_STATE["flags"].get(name))


# ------------------------------------------------------------------------------------------------ spec modules


class TurboSDPAttention(SDPAttention):
    """SDPAttention through primus.turbo.attention.turbo_attention (explicit backend order, never math on GPU)."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kw):
        from megatron.core.transformer.enums import AttnMaskType

        from primus.turbo.attention import turbo_attention

        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        dropout = self.dropout_p if self.training else 0.0
        if packed_seq_params is not None or attention_bias is not None or mask_type != AttnMaskType.causal \
                or dropout > 0.0 or self.softmax_offset is not None or self.window is not None:
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params, **kw)
        out = turbo_attention(query, key, value, causal=True, layout="sbhd", scale=self.scale)
        s, b, h, dv = out.shape
        return out.reshape(s, b, h * dv)


class TurboRMSNorm(RMSNorm):
    """spec.RMSNorm (same parameter, same sequence-parallel mark) with the Triton fused kernel."""

    def forward(self, x):
        from primus.turbo.rmsnorm import rms_norm

        return rms_norm(x, self.weight, self.eps)


def swap_spec(layer_spec, flags: Dict[str, Any]) -> None:
    """Point one (already locally swapped) layer spec at the turbo modules that the flags ask for."""
    sub = layer_spec.submodules
    if flags.get("use_turbo_rms_norm"):
        for name in ("input_layernorm", "pre_mlp_layernorm"):
            if getattr(sub, name, None) is RMSNorm:
                setattr(sub, name, TurboRMSNorm)
    attn = getattr(getattr(sub, "self_attention", None), "submodules", None)
    if attn is None:
        return
    if flags.get("use_turbo_attention") and getattr(attn, "core_attention", None) is SDPAttention:
        attn.core_attention = TurboSDPAttention
    if flags.get("use_turbo_rms_norm"):
        for name in ("q_layernorm", "k_layernorm", "kv_layernorm"):
            if getattr(attn, name, None) is RMSNorm:
                setattr(attn, name, TurboRMSNorm)


# ------------------------------------------------------------------------------------------------ megatron internals


def _gmm(a, b, batch_sizes, trans_b=False):
    """GroupedMLP's grouped GEMM. Compiled (training.compile) with bf16 experts where torch._grouped_mm serves the
    GPU (`apply` says so in _STATE["gmm_traced"]: CUDA sm90/sm100), the call stays in the layer's graph: the same
    torch._grouped_mm that grouped_gemm's "torch" provider runs eagerly, the counts on the device. Otherwise the
    eager entry below (a graph break under compile)."""
    if torch.compiler.is_compiling() and _STATE.get("gmm_traced") and _on("use_turbo_grouped_gemm") \
            and not _STATE["flags"].get("grouped_gemm_fp8"):
        from primus.turbo.grouped_gemm import grouped_gemm, grouped_mm_aligned

        if grouped_mm_aligned(a, b):
            return grouped_gemm(a, b, batch_sizes, trans_b=trans_b, provider="torch")
    return _gmm_eager(a, b, batch_sizes, trans_b)


@_eager
def _gmm_eager(a, b, batch_sizes, trans_b=False):
    if not _on("use_turbo_grouped_gemm"):  # a later run in this process without the flag
        from primus.backends.megatron.patches.grouped_gemm import gmm

        return gmm(a, b, batch_sizes, trans_b)
    from primus.turbo.grouped_gemm import fp8_grouped_gemm, grouped_gemm

    fmt = _STATE["flags"].get("grouped_gemm_fp8")
    if fmt:  # turbo.grouped_gemm_fp8 (portable fp8 path): the experts' GEMMs in fp8 too
        from primus.turbo.grouped_gemm_fp8 import fp8_grouped_provider

        provider = fp8_grouped_provider(a, b, fmt, trans_b)  # logged once per shape; counted per provider
        _count("gmm_calls_fp8")
        _count(f"gmm_calls_fp8_{provider}")
        return fp8_grouped_gemm(a, b, batch_sizes, trans_b=trans_b, fmt=fmt, provider=provider)
    _count("gmm_calls")
    return grouped_gemm(a, b, batch_sizes, trans_b=trans_b)


def _gmm_accum(a, b, batch_sizes, main_grad):
    """`_gmm` for the experts_grad_accum_fusion forward: the weight gradient added into main_grad. Traced under
    compile where `_gmm` is (torch._grouped_mm and the accumulation op, one graph); otherwise a graph break."""
    from primus.turbo.grouped_gemm import grouped_gemm_accumulate, grouped_mm_aligned

    if torch.compiler.is_compiling():
        if _STATE.get("gmm_traced") and grouped_mm_aligned(a, b):
            return grouped_gemm_accumulate(a, b, batch_sizes, main_grad, provider="torch")
        return _gmm_accum_eager(a, b, batch_sizes, main_grad)
    return grouped_gemm_accumulate(a, b, batch_sizes, main_grad)


@_eager
def _gmm_accum_eager(a, b, batch_sizes, main_grad):
    from primus.turbo.grouped_gemm import grouped_gemm_accumulate

    return grouped_gemm_accumulate(a, b, batch_sizes, main_grad)


def _grouped_mlp_accum_forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
    """GroupedMLP.forward (megatron-core 0.16.1: fc1 grouped GEMM, activation with probs, fc2 grouped GEMM) with
    each weight's gradient added into its main_grad inside the GEMM. Where megatron's forward does more (no tokens
    under expert parallelism, probs applied to the input, its own activation checkpoint) or no main_grad exists
    (outside megatron's DDP), megatron's forward runs; the rule (features/training.py) keeps the configs that reach
    those cases off this path."""
    x = permuted_local_hidden_states
    main1, main2 = getattr(self.weight1, "main_grad", None), getattr(self.weight2, "main_grad", None)
    if main1 is None or main2 is None or x.nelement() == 0 or self.activation_recompute \
            or self.config.moe_apply_probs_on_input:
        return type(self).forward(self, x, tokens_per_expert, permuted_probs)
    e, h = self.num_local_experts, self.config.hidden_size
    fc1 = _gmm_accum(x, self.weight1.view(e, h, -1), tokens_per_expert, main1)
    act = self.activation_func_with_probs(fc1, permuted_probs.unsqueeze(-1))
    return _gmm_accum(act, self.weight2.view(e, -1, h), tokens_per_expert, main2), None


def fp8_experts_info(tconfig, device, fmt: str) -> str:
    """backend_info.fp8_experts under turbo.grouped_gemm_fp8: which fp8 grouped GEMM GroupedMLP's two GEMMs run on
    `device` and why (fc1 hidden -> ffn (x2 gated), fc2 ffn -> hidden; the experts local to this rank)."""
    from primus.turbo.grouped_gemm_fp8 import experts_summary

    h, f = tconfig.hidden_size, tconfig.moe_ffn_hidden_size or tconfig.ffn_hidden_size
    fc1 = f * (2 if tconfig.gated_linear_unit else 1)
    local = tconfig.num_moe_experts // max(1, tconfig.expert_model_parallel_size or 1)
    return experts_summary(device, fmt, [(h, fc1), (f, h)], local)


# Measured on the H200 (docs/benchmarks.md, 2026-12-02; fwd+bwd of the experts, fp8 weight cache on): fp8 grouped
# GEMMs vs bf16 1.11x at ffn 14336 (Mixtral-8x7B), 0.74x at 1408 (DeepSeek-V2-Lite), 0.53x at 768 (Qwen3-30B-A3B).
SMALL_EXPERT_FFN = 4096


def small_experts_warning(tconfig) -> Optional[str]:
    """Under turbo.grouped_gemm_fp8: a warning when the experts are as narrow as those measured slower in fp8 than
    in bf16 (the setting is honoured; the user hears what it costs)."""
    f = tconfig.moe_ffn_hidden_size or tconfig.ffn_hidden_size
    if f >= SMALL_EXPERT_FFN:
        return None
    return (f"turbo.grouped_gemm_fp8=true with experts of ffn {f}: on the H200 the fp8 grouped GEMMs ran 0.74x the "
            "bf16 ones at ffn 1408 and 0.53x at 768 (1.11x at 14336; docs/turbo.md, 2026-12-02). Unless "
            "measured otherwise here, set turbo.grouped_gemm_fp8=false for these experts")


def resolve(cfg, ctx) -> Dict[str, str]:
    """{config key: provider} for this run's turbo flags (logged by the trainer); ConfigError naming what to install
    when one is missing (fp8 itself is judged by args.capability_issues / the portable fp8 path)."""
    from primus.config.errors import ConfigError
    from primus.turbo import providers

    mapping, issues = providers._resolve(cfg.turbo, cfg.precision, providers.device_info_for(ctx.device), "megatron", cfg.moe)
    issues = [i for i in issues if not (i.keys and i.keys[0].startswith("precision.fp8"))]
    if issues:
        raise ConfigError(issues)
    return mapping


def _fused_topk(orig):
    def topk_routing_with_score_function(logits, topk, use_pre_softmax=False, num_groups=None, group_topk=None,
                                         scaling_factor=None, score_function="softmax", expert_bias=None,
                                         fused=False, router_replay=None, **kw):
        if not _on("moe_use_fused_router_with_aux_score") or num_groups or group_topk or router_replay is not None \
                or kw or logits.dim() != 2:
            return orig(logits, topk, use_pre_softmax=use_pre_softmax, num_groups=num_groups, group_topk=group_topk,
                        scaling_factor=scaling_factor, score_function=score_function, expert_bias=expert_bias,
                        fused=fused, router_replay=router_replay, **kw)
        from primus.turbo.moe_ops import fused_router

        probs, routing_map, aux = fused_router(logits, topk, score_function=score_function,
                                               pre_softmax=use_pre_softmax, scaling_factor=scaling_factor,
                                               expert_bias=expert_bias)
        # the aux-loss scores came from the same pass; compute_routing_scores_for_aux_loss picks them up
        _STATE["aux"] = (logits, routing_map if expert_bias is None else None, aux)
        return probs.to(logits.dtype), routing_map

    return topk_routing_with_score_function


def _fused_aux_scores(orig):
    def compute_routing_scores_for_aux_loss(logits, topk, score_function, fused=False, padding_mask=None):
        cached = _STATE.pop("aux", None)
        if cached is not None and cached[0] is logits and cached[1] is not None and padding_mask is None:
            return cached[1], cached[2]
        return orig(logits, topk, score_function, fused=fused, padding_mask=padding_mask)

    return compute_routing_scores_for_aux_loss


def _turbo_permute(orig):
    def permute(tokens, routing_map, probs=None, num_out_tokens=None, fused=False, drop_and_pad=False):
        if not _on("moe_permute_fusion") or drop_and_pad:
            return orig(tokens, routing_map, probs=probs, num_out_tokens=num_out_tokens, fused=fused,
                        drop_and_pad=drop_and_pad)
        from primus.turbo import moe_ops

        n = num_out_tokens
        if _on("sync_free") and n is None:
            n = routing_map.shape[0] * int(_STATE["flags"].get("topk", 1))
        out, pprobs, row_id_map = moe_ops.permute(tokens, routing_map, probs, num_out_tokens=n)
        return out, pprobs, _RowIdMap(row_id_map)

    return permute


class _RowIdMap:
    """Marks a permutation made by the turbo permute (unpermute must use the matching kernel)."""

    __slots__ = ("row_id_map",)

    def __init__(self, row_id_map):
        self.row_id_map = row_id_map


def _turbo_unpermute(orig):
    def unpermute(permuted_tokens, sorted_indices, restore_shape, probs=None, routing_map=None, fused=False,
                  drop_and_pad=False):
        if not isinstance(sorted_indices, _RowIdMap):
            return orig(permuted_tokens, sorted_indices, restore_shape, probs=probs, routing_map=routing_map,
                        fused=fused, drop_and_pad=drop_and_pad)
        from primus.turbo import moe_ops

        out = moe_ops.unpermute(permuted_tokens, sorted_indices.row_id_map, probs)
        return out.view(restore_shape) if tuple(out.shape) != tuple(restore_shape) else out

    return unpermute


def install() -> None:
    """Patch megatron's grouped GEMM, router and dispatcher entry points (once per process); each patched entry
    checks this run's flags on every call and otherwise runs megatron's own code."""
    from megatron.core.transformer.moe import grouped_gemm_util as gg
    from megatron.core.transformer.moe import moe_utils, router, token_dispatcher

    if _on("use_turbo_grouped_gemm"):
        ops = types.SimpleNamespace(gmm=_gmm)
        gg.grouped_gemm = types.SimpleNamespace(ops=ops, __name__="primus.turbo.grouped_gemm")
        gg.ops = ops
    if getattr(router, "__primus_turbo__", False):
        return
    router.topk_routing_with_score_function = _fused_topk(moe_utils.topk_routing_with_score_function)
    router.compute_routing_scores_for_aux_loss = _fused_aux_scores(moe_utils.compute_routing_scores_for_aux_loss)
    token_dispatcher.permute = _turbo_permute(moe_utils.permute)
    token_dispatcher.unpermute = _turbo_unpermute(moe_utils.unpermute)
    router.__primus_turbo__ = True


# ------------------------------------------------------------------------------------------------ built model


def _traced(recipe: Optional[str], tp_size: int):
    """A tp=1 turbo linear has no collective: bf16 is two torch GEMMs that dynamo traces, fp8 primus.turbo.fp8_ops'
    custom-op pair where fp8_ops.compiles says so; either stays inside a compiled layer. tp > 1 (collectives with
    async handles) runs eagerly."""
    if recipe is None:
        return tp_size == 1
    from primus.turbo.fp8_ops import compiles

    return compiles(recipe, tp_size)


def _fp8_op(recipe: Optional[str], tp_size: int):
    """primus.turbo.fp8_ops.fp8_linear_traced when this fp8 linear runs through the custom ops, else None (bf16
    turbo linears import no Triton)."""
    if not (recipe and _traced(recipe, tp_size)):
        return None
    from primus.turbo.fp8_ops import fp8_linear_traced

    return fp8_linear_traced


def _column_impl(recipe: Optional[str], fmt: str, chunks: int, delayed=None, tp_size: int = 1):
    from primus.turbo.parallel_linear import _ColumnFn

    fp8_op = _fp8_op(recipe, tp_size)

    def forward_impl(input, weight, bias, gradient_accumulation_fusion=False, allreduce_dgrad=False,
                     sequence_parallel=False, tp_group=None, **_unused):
        if fp8_op is not None:
            return fp8_op(input, weight, bias, recipe, fmt, delayed)
        group = tp_group if (sequence_parallel or allreduce_dgrad) else None
        lead = list(input.shape[:-1])
        y = _ColumnFn.apply(input.reshape(-1, input.shape[-1]), weight, bias, group, bool(sequence_parallel),
                            recipe, fmt, chunks, delayed)
        if sequence_parallel and group is not None and group.size() > 1:
            lead[0] *= group.size()
        return y.view(*lead, y.shape[-1])

    return forward_impl if _traced(recipe, tp_size) else _eager(forward_impl)


def _row_forward(recipe: Optional[str], fmt: str, chunks: int, delayed=None, tp_size: int = 1):
    from primus.turbo.parallel_linear import _RowFn

    fp8_op = _fp8_op(recipe, tp_size)

    def forward(self, input_):
        if not self.input_is_parallel:
            raise NotImplementedError("turbo row-parallel linear expects a parallel input (megatron's default)")
        bias = self.bias if not self.skip_bias_add else None
        if fp8_op is not None:
            return (fp8_op(input_, self.weight, bias, recipe, fmt, delayed),
                    self.bias if self.skip_bias_add else None)
        group = self.tp_group if self.tp_group.size() > 1 else None
        lead = list(input_.shape[:-1])
        y = _RowFn.apply(input_.reshape(-1, input_.shape[-1]), self.weight, bias, group, bool(self.sequence_parallel),
                         recipe, fmt, chunks, delayed)
        if self.sequence_parallel and group is not None:
            lead[0] //= group.size()
        y = y.view(*lead, y.shape[-1])
        return y, (self.bias if self.skip_bias_add else None)

    return forward if _traced(recipe, tp_size) else _eager(forward)


def _bf16_layers(settings: Dict[str, Any], num_layers: int):
    if not settings.get("first_last_layers_bf16"):
        return set()
    first, last = settings.get("num_layers_at_start_in_bf16", 1), settings.get("num_layers_at_end_in_bf16", 1)
    return set(range(first)) | set(range(num_layers - last, num_layers))


def apply(model, config, fp8_settings: Optional[Dict[str, Any]] = None) -> Dict[str, int]:
    """Swap the built modules of one GPTModel chunk; returns {what: count} for this chunk."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    flags = _STATE["flags"]
    done: Dict[str, int] = {}
    decoder = getattr(model, "decoder", None)
    layers = list(decoder.layers) if decoder is not None else []
    if flags.get("use_turbo_parallel_linear"):
        fp8 = fp8_settings or {}
        recipe = fp8.get("fp8_recipe") if fp8.get("fp8") else None
        fmt = fp8.get("fp8", "e4m3") or "e4m3"
        bf16_layers = _bf16_layers(fp8, config.num_layers) if recipe else set()
        chunks = int(flags.get("chunks", 2))
        n_fp8 = n = 0
        for layer in layers:
            in_bf16 = (layer.layer_number - 1) in bf16_layers
            for _name, mod in layer.named_modules():
                if not isinstance(mod, (ColumnParallelLinear, RowParallelLinear)) or getattr(mod, "is_expert", False):
                    continue
                r = recipe
                if r:
                    from primus.turbo.fp8_linear import fp8_shape_ok

                    out_f, in_f = mod.weight.shape
                    if in_bf16 or not fp8_shape_ok(in_f, out_f):
                        r = None
                delayed = None
                if r == "delayed":  # this linear's own amax histories (x, weight, dy)
                    from primus.backends.megatron.fp8 import delayed_scaling

                    delayed = mod.primus_fp8_delayed = delayed_scaling(fp8).linear_state().allocate(mod.weight.device)
                tp_group = getattr(mod, "tp_group", None)
                tp_size = tp_group.size() if tp_group is not None else 1
                if isinstance(mod, ColumnParallelLinear):
                    mod._forward_impl = _column_impl(r, fmt, chunks, delayed, tp_size)
                else:
                    mod.forward = types.MethodType(_row_forward(r, fmt, chunks, delayed, tp_size), mod)
                mod.primus_turbo_linear = r or "bf16"
                n += 1
                n_fp8 += bool(r)
        done["use_turbo_parallel_linear"] = n
        if recipe:
            done["use_turbo_parallel_linear_fp8"] = n_fp8
    if flags.get("use_turbo_grouped_gemm"):
        from primus.turbo.grouped_gemm import grouped_mm_gpu

        _STATE["gmm_traced"] = grouped_mm_gpu(next(model.parameters()).device)
    if flags.get("use_turbo_fused_act_with_probs"):
        from megatron.core.transformer.moe.experts import GroupedMLP

        from primus.turbo.moe_ops import swiglu_with_probs

        n = 0
        for mod in model.modules():
            if isinstance(mod, GroupedMLP):
                mod.activation_func_with_probs = swiglu_with_probs  # a custom op: compiled graphs keep it
                n += 1
        done["use_turbo_fused_act_with_probs"] = n
    if flags.get("experts_grad_accum_fusion"):
        from megatron.core.transformer.moe.experts import GroupedMLP

        n = 0
        for mod in model.modules():
            if isinstance(mod, GroupedMLP):
                mod.forward = types.MethodType(_grouped_mlp_accum_forward, mod)
                n += 1
        done["experts_grad_accum_fusion"] = n
    if flags.get("sync_free_dispatch"):
        from megatron.core.transformer.moe.moe_layer import MoELayer

        done["sync_free_dispatch"] = sum(_sync_free_dispatcher(m) for m in model.modules() if isinstance(m, MoELayer))
    for k, v in done.items():
        _count(k, v)
    return done


# ------------------------------------------------------------------------------------------------ sync-free dispatch
# megatron-core 0.16.1's MoEAlltoAllTokenDispatcher copies the token counts per expert to the host in every MoE layer
# (preprocess: a D2H copy at cuda_dtoh_point, a stream sync at "before_finish", or "before_permutation_2" while its
# own permute fusion, TE's, is off) for the token all-to-all / all-gather split sizes, for sort_chunks_by_idxs and
# for experts that split on host counts. At ep = tp = 1 there is no collective, the sort is the identity (one chunk
# row: arange(num_experts)), the Triton permute takes the static count (tokens x topk) and the turbo grouped GEMM
# walks device counts; GroupedMLP, the router's aux losses and the MoE logging read none on the host. So the swapped
# methods below keep the counts on the device; the rest (permute, shared experts, combine) is megatron's code.


def _sync_free_dispatcher(layer) -> int:
    """Swap one MoE layer's dispatcher methods (this instance only: a later run builds its own dispatchers, with
    megatron's methods); returns 1, the layer counted. The rule (features/turbo.py SYNC_FREE_DISPATCH) chose this
    run; megatron's config and the built layer are checked again here: a layer that does not qualify stops the run."""
    from megatron.core.transformer.moe.experts import GroupedMLP
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    d, c = layer.token_dispatcher, layer.config
    why = [w for bad, w in (
        (not isinstance(d, MoEAlltoAllTokenDispatcher), f"the dispatcher is {type(d).__name__}, not alltoall"),
        (getattr(d, "ep_size", 0) != 1 or getattr(d, "tp_size", 0) != 1,
         f"ep = {getattr(d, 'ep_size', '?')}, expert tp = {getattr(d, 'tp_size', '?')}"),
        (bool(getattr(d, "drop_and_pad", False)) or c.moe_expert_capacity_factor is not None
         or bool(c.moe_router_padding_for_quantization), "token dropping or padding (not dropless)"),
        (c.moe_permute_fusion, "megatron's own (TE) permute fusion is on"),
        (not isinstance(layer.experts, GroupedMLP) or not _on("use_turbo_grouped_gemm"),
         f"the experts are {type(layer.experts).__name__} without the turbo grouped GEMM"),
    ) if bad]
    if why:
        raise RuntimeError(f"sync-free MoE dispatch chosen for layer {layer.layer_number}, but " + "; ".join(why)
                           + ": primus/features/turbo.py SYNC_FREE_DISPATCH and this model disagree")
    d.preprocess = types.MethodType(_sf_preprocess, d)
    d.dispatch_postprocess = types.MethodType(_sf_dispatch_postprocess, d)
    d.combine_preprocess = types.MethodType(_sf_combine_preprocess, d)
    return 1


def _sf_preprocess(self, routing_map):
    """Dropless, ep = tp = 1: megatron's counts, left on the device. The D2H point is set to "no_sync", which the
    dispatcher never reaches (megatron's name for "no sync"), and the sync point is left at "no_sync"."""
    counts = routing_map.sum(dim=0).long()
    self.num_out_tokens = routing_map.size(0) * self.config.moe_router_topk  # static: the Triton permute's size
    if self.num_local_experts > 1:
        self.num_global_tokens_per_local_expert = counts.view(-1, self.num_local_experts)
    self.cuda_dtoh_point = "no_sync"
    return counts


def _sf_dispatch_postprocess(self, global_input_tokens, global_probs):
    """No all-gather (tp = 1), no sort (the identity at ep x tp = 1): the permuted tokens go to the experts with the
    device counts."""
    if self.shared_experts is not None:
        self.shared_experts.linear_fc1_forward_and_act(global_input_tokens)
    tokens_per_expert, self.tokens_per_expert = self.tokens_per_expert, None
    return global_input_tokens, tokens_per_expert, global_probs


def _sf_combine_preprocess(self, hidden_states):
    return hidden_states  # the identity un-sort, no reduce-scatter (tp = 1)


def count_modules(model) -> Dict[str, int]:
    """Spec-level swaps found in a built chunk (attention cores, norms)."""
    from megatron.core.transformer.moe.experts import GroupedMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.router import TopKRouter

    flags = _STATE["flags"]
    out = {"use_turbo_attention": 0, "use_turbo_rms_norm": 0}
    for m in model.modules():
        if isinstance(m, TurboSDPAttention):
            out["use_turbo_attention"] += 1
        elif isinstance(m, TurboRMSNorm):
            out["use_turbo_rms_norm"] += 1
        elif isinstance(m, TopKRouter) and flags.get("moe_use_fused_router_with_aux_score"):
            # patched function; served unless group-limited routing is configured
            ok = not (m.config.moe_router_num_groups or m.config.moe_router_group_topk)
            out["moe_use_fused_router_with_aux_score"] = out.get("moe_use_fused_router_with_aux_score", 0) + ok
        elif isinstance(m, GroupedMLP) and flags.get("use_turbo_grouped_gemm"):
            out["use_turbo_grouped_gemm"] = out.get("use_turbo_grouped_gemm", 0) + 1
        elif isinstance(m, MoELayer) and flags.get("moe_permute_fusion"):
            out["moe_permute_fusion"] = out.get("moe_permute_fusion", 0) + 1
    return out


def check_swapped(flags: Dict[str, Any], swaps: Dict[str, int]) -> List[str]:
    """The enabled flags that swapped nothing anywhere (a ConfigError for the trainer)."""
    from primus.features.turbo import megatron_swaps

    return [key for key in megatron_swaps() if flags.get(key) and not swaps.get(key)]
