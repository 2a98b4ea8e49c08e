"""Per-GPU memory and per-step throughput estimates for a PrimusConfig: pure functions, no torch, no GPU.

Every formula lives in this file, each term commented with what it is. The estimate is the peak of
`torch.cuda.max_memory_allocated()` on the busiest rank (pipeline stage 0 for activations, the last stage for the
output layer and the loss: both are evaluated and the larger is reported). The CUDA context, NCCL buffers and
allocator fragmentation are not allocations: they are the `reserve` that `fits` adds on top.

Units: elements are counted exactly (the tests compare them with real models); bytes = elements x dtype width.
Notation: T tokens per micro batch on this rank (micro_batch x seq / cp), h hidden, hq = heads x head_dim,
hkv = kv_heads x head_dim, f FFN inner width, V vocabulary, t tp, P parameters on this rank.

Backends modelled (what their code really allocates; see docs/planning.md for the derivation):

megatron-core 0.16.1 (Float16Module + its DDP + its optimizer):
  weights        bf16 (2 B/param; fp32 when neither bf16 nor fp16)
  grads          the DDP contiguous grad buffer, always resident: fp32 when grad_reduce_in_fp32 else the param
                 dtype (megatron-core's DistributedDataParallelConfig default: False -> bf16)
  main params    fp32 copy of the params in the optimizer (4 B), sharded over dp by the distributed optimizer;
                 stays on the GPU even with CPU offload (HybridDeviceOptimizer offloads the Adam states only)
  Adam states    exp_avg + exp_avg_sq fp32 (8 B), sharded over dp by the distributed optimizer; the offload
                 fraction of them lives on the CPU
  step temps     fp32 main grads (`main_grad.float()` allocates when the grad buffer is bf16; freed at the next
                 zero_grad) and torch AdamW's foreach temporaries (one fp32 tensor per param: sqrt(exp_avg_sq));
                 the GPU part of the offloading optimizer is fused (no temporaries)
torchtitan 0.2.2:
  1 GPU / no FSDP  fp32 params + torch.autocast(bf16): the autocast cast cache holds a bf16 copy of every linear
                   weight from its forward to its backward; fp32 grads appear during backward (and stay through
                   the later micro batches when accumulating); fused AdamW
                   (8 B/param, no temporaries)
  FSDP (dp_shard>1) fp32 params, grads and Adam states sharded over dp_shard; bf16 (mixed_precision_param)
                   all-gathered blocks (current + prefetched), the output layer gathered from its forward to its
                   backward, unsharded bf16 grads + fp32 (mixed_precision_reduce) reduce-scatter input per block
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from primus.config.schema import Backend, PrimusConfig
from primus.features.model import moe_layers, windowed_layers
from primus.features.parallel import uneven
from primus.features.precision import recipes, te_available
from primus.metrics.flops import (attention_params, dense_mlp_params, expert_params, flops_per_token, head_dim,
                                  num_moe_layers, qkv_bias_params, shared_expert_params, sink_params)
from primus.plan.gpus import GiB, Gpu

# ------------------------------------------------------------------------------------------------ settings


# The `plan.*` settings are the schema's (primus/features/plan.py: PlanConfig); these two are the planner's own
RESERVE_GB = 1.0  # CUDA context + cuBLAS workspaces, not counted by the allocator
FRAGMENTATION = 0.05  # caching-allocator slack on top of the peak allocated


def target_gpu_name(cfg: PrimusConfig) -> Optional[str]:
    """plan.gpu, None for auto (this machine's GPU, else H200)."""
    gpu = cfg.plan.gpu
    return None if gpu is None or str(gpu).lower() == "auto" else gpu


@dataclass
class BackendHints:
    """Implementation choices of our backends that change memory, read from primus/backends/megatron/args.py
    (the settings a real GPU run uses) when it imports; the fallbacks are that file's values at the time of writing.
    """
    grad_reduce_in_fp32: bool = True  # megatron DDP grad buffer dtype (args.ddp_config_kwargs)
    swiglu_fused: bool = True  # megatron bias_activation_fusion on the GPU: SwiGLU saves only fc1's output
    te_linears: bool = False  # Transformer Engine linears: fp8 saves 1-byte inputs and keeps fp8 weight copies
    # primus' portable fp8 linear (megatron without TE), tensorwise / delayed / blockwise: saves the 1-byte
    # transposed fp8 input and a transposed fp8 weight per forward in flight (rowwise keeps the bf16 input)
    portable_fp8_saves_fp8: bool = False
    # megatron's unfused split: v is a view of the fused QKV output, so SDPA's saved v keeps all of it alive;
    # primus.turbo.rope (rope_fusion "triton") writes q, k and v to new tensors and saves none of its input
    v_keeps_qkv: bool = True


def backend_hints(cfg: PrimusConfig) -> BackendHints:
    h = BackendHints()
    if cfg.backend.name != Backend.megatron:
        return replace(h, v_keeps_qkv=False)
    spec = cfg.backend.layer_spec.value
    h.te_linears = spec == "te" or (spec == "auto" and te_available())
    h.portable_fp8_saves_fp8 = (cfg.precision.fp8 is not None and not h.te_linears  # all but rowwise: megatron has none
                                and cfg.precision.fp8_recipe.value in recipes(backend="megatron", provider="portable"))
    try:  # the real settings of a GPU run (pure Python, no torch)
        from primus.backends.megatron import args as margs
        from primus.context import RunContext

        gpu_ctx = RunContext(device="cuda", world_size=1)
        h.grad_reduce_in_fp32 = margs.GRAD_REDUCE_IN_FP32
        h.swiglu_fused = margs.activation_fusion(cfg, gpu_ctx) is not None
        h.v_keeps_qkv = margs.rope_fusion(cfg, gpu_ctx) != "triton"
    except Exception:  # planning never depends on the backend importing
        pass
    return h


# ------------------------------------------------------------------------------------------------ layout


@dataclass
class Layout:
    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    vp: int
    dp_shard: int  # torchtitan FSDP shard degree (1 = no FSDP)
    num_microbatches: int  # gradient-accumulation steps per optimizer step


def layout_of(cfg: PrimusConfig, world: Optional[int] = None) -> Layout:
    from primus.context import data_parallel_size, world_size_of
    from primus.features.training import global_batch

    p = cfg.parallel
    world = world or world_size_of(cfg)
    dp = max(1, data_parallel_size(cfg, world))
    t = cfg.training
    nmb = max(1, global_batch(cfg, world) // max(1, t.micro_batch_size * dp))
    if cfg.backend.name == Backend.torchtitan:
        shard = dp // max(1, p.data_parallel_replicate_degree) if p.data_parallel_shard_degree == -1 else p.data_parallel_shard_degree
    else:
        shard = 1
    return Layout(world=world, tp=p.tensor_model_parallel_size, pp=p.pipeline_model_parallel_size,
                  cp=p.context_parallel_size, ep=p.expert_model_parallel_size, dp=dp,
                  vp=p.virtual_pipeline_model_parallel_size or 1, dp_shard=max(1, shard), num_microbatches=nmb)


# ------------------------------------------------------------------------------------------------ parameters


@dataclass
class StageParams:
    """Parameters held by one rank of one pipeline stage (elements)."""
    layers: int  # decoder layers on this stage
    layer_params: int  # all decoder layers on this rank
    embedding: int  # input embedding (stage 0; vocab-parallel over tp)
    output: int  # output projection + final norm (last stage)
    largest_block: int  # the largest single decoder layer on this rank (FSDP gathers one at a time)
    linear: int  # params in matmul weights (autocast / fp8 copies)
    experts: int = 0  # of those, the routed experts' (their fp8 casts follow the grouped GEMM's rules)

    @property
    def total(self) -> int:
        return self.layer_params + self.embedding + self.output


def _layer_params(m, moe_layer: bool, tp: int, ep: int) -> Dict[str, int]:
    """One decoder layer on one rank: matmul weights split over tp (experts over ep x tp), norms replicated."""
    h = m.hidden_size
    norms = 2 * h + (2 * head_dim(m) if m.qk_layernorm else 0)  # input + pre-MLP RMSNorm (+ q/k norms per head)
    if m.multi_latent_attention:
        norms += m.kv_lora_rank + (m.q_lora_rank or 0)  # MLA's kv / q low-rank norms
    attn = attention_params(m) // tp
    norms += qkv_bias_params(m) // tp  # the q/k/v biases are sharded with their column-parallel projection
    norms += sink_params(m) // tp  # the sinks of this rank's heads
    if moe_layer:
        router = h * m.num_experts  # replicated
        experts = m.num_experts // ep * expert_params(m) // tp
        return {"linear": attn + experts + shared_expert_params(m) // tp, "other": norms + router,
                "experts": experts}
    return {"linear": attn + dense_mlp_params(m) // tp, "other": norms, "experts": 0}


def _stage_ids(cfg: PrimusConfig, lay: Layout, stage: int) -> List[int]:
    """The layers of pp rank `stage`, the uneven split (decoder_first/last_pipeline_num_layers) included; taken as
    one contiguous run even with virtual stages (the same layer count; only which layers are MoE may differ)."""
    from primus.features.parallel import stage_layer_ids

    return stage_layer_ids(cfg, lay.pp, 1, stage)


def stage_params(cfg: PrimusConfig, lay: Layout, stage: int) -> StageParams:
    m = cfg.model
    ids = _stage_ids(cfg, lay, stage)
    per_stage = len(ids)
    is_moe = moe_layers(m)
    layer_total, linear, experts, largest = 0, 0, 0, 0
    for i in ids:
        d = _layer_params(m, bool(is_moe[i]), lay.tp, lay.ep)
        layer_total += d["linear"] + d["other"]
        linear += d["linear"]
        experts += d["experts"]
        largest = max(largest, d["linear"] + d["other"])
    vh = m.vocab_size * m.hidden_size // lay.tp
    embedding = vh if stage == 0 else 0
    output = 0
    if stage == lay.pp - 1:
        output = m.hidden_size  # final RMSNorm
        if not m.tie_word_embeddings or lay.pp > 1:  # tied + pp>1: megatron keeps a copy on the last stage
            output += vh
            linear += vh
        elif stage == 0:
            linear += vh  # tied, one stage: the embedding is also the output matmul
    return StageParams(layers=per_stage, layer_params=layer_total, embedding=embedding, output=output,
                       largest_block=largest, linear=linear, experts=experts)


# ------------------------------------------------------------------------------------------------ activations


def _act_dtype_bytes(cfg: PrimusConfig) -> int:
    p = cfg.precision
    return 2 if (p.bf16 or p.fp16) else 4


def _autocast(cfg: PrimusConfig, lay: Layout) -> bool:
    """torchtitan 0.2.2 uses torch.autocast only without FSDP and without TP/PP (maybe_enable_amp)."""
    return cfg.backend.name == Backend.torchtitan and lay.dp_shard == 1 and lay.tp == 1 and lay.pp == 1


def layer_activation_bytes(cfg: PrimusConfig, lay: Layout, hints: BackendHints, moe_layer: bool = False) -> Dict[str, float]:
    """Bytes saved for backward by ONE decoder layer for ONE micro batch on one rank, without recompute.

    Korthikanti et al. (2022) count s*b*h*(34 + 5*a*s/h) bytes per layer for GPT (4h GELU MLP, dropout, fp16,
    explicit s^2 scores). Adapted here: no dropout masks; SwiGLU MLP; GQA k/v at their own width; SDPA/flash
    attention saves q, k, v, the output O and a fp32 log-sum-exp per head instead of the s^2 score/softmax tensors;
    the attention output is reshaped (copied) into linear_proj's saved input, so O is held twice.
    Returns the parts by name (bytes): `input` is the layer input (what full recompute keeps).
    """
    m = cfg.model
    t = lay.tp
    T = cfg.training.micro_batch_size * cfg.training.seq_length / lay.cp  # tokens on this rank
    a = _act_dtype_bytes(cfg)
    sp = cfg.parallel.sequence_parallel and t > 1  # sequence parallel splits the tp-replicated parts over tp
    rep = 1.0 / t if sp else 1.0  # the replicated (norm / residual) activations' share on this rank
    h = m.hidden_size
    dh = head_dim(m)
    if m.multi_latent_attention:
        hq = m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim)
        hk = hq
        hv = m.num_attention_heads * m.v_head_dim
        ho = hv
        extra_attn = (m.kv_lora_rank + m.qk_pos_emb_head_dim) + (m.q_lora_rank or 0)  # compressed kv (+ q) outputs
        extra_attn += m.num_attention_heads * (m.qk_head_dim + m.v_head_dim) / t  # kv up-projection output
    else:
        hq, hk, hv, ho = m.num_attention_heads * dh, m.num_query_groups * dh, m.num_query_groups * dh, m.num_attention_heads * dh
        extra_attn = 0
    heads = m.num_attention_heads / t
    # linear inputs: TE fp8 and the portable tensorwise / delayed / blockwise fp8 linear save the 1-byte fp8 cast of
    # the input (the bf16 input is freed when nothing else holds it); everything else saves the bf16 input
    lin = 1 if (cfg.precision.fp8 is not None and (hints.te_linears or hints.portable_fp8_saves_fp8)) else a
    autocast = _autocast(cfg, lay)
    resid = 4 if autocast else a  # autocast: embeddings and residual stream stay fp32, norms run in fp32
    parts: Dict[str, float] = {}
    parts["input"] = T * h * resid * rep  # layer input = input RMSNorm's saved input
    parts["norm_stats"] = 2 * T * 4 * rep  # two RMSNorms' fp32 rstd
    # attention linears' saved input: one norm output for the fused QKV (megatron) / shared by wq,wk,wv (torchtitan
    # FSDP); under autocast each of wq, wk, wv saves its own bf16 cast of the fp32 norm output.
    # Compiled (training.compile), a block is one graph: CSE makes the three casts one, so one copy is saved.
    eager_casts = autocast and not cfg.training.compile
    n_qkv_in = 3 if eager_casts else 1
    parts["qkv_in"] = n_qkv_in * T * h * lin * rep
    # SDPA's saved q, k (new tensors after RoPE) and v; megatron's v is a view into the fused QKV output, which
    # therefore stays alive whole (hq + hk + hv) instead of v alone
    qkv_w = hq + hk + (hq + hk + hv if hints.v_keeps_qkv else hv)
    o_w = ho
    if m.use_sink_attention and not hints.te_linears:
        # attention_sinks.sink_attention: SDPA saves q, k, v widened by the sink's channels (the head dim padded to a
        # multiple of 8; v only where it is as wide as q / k), new tensors: the fused QKV output is not kept alive by v
        dqk, dv = hq // m.num_attention_heads, ho // m.num_attention_heads
        fq = (dqk + 2 + (-(dqk + 2)) % 8) / dqk
        fv = fq if dv == dqk else 1.0
        qkv_w, o_w = (hq + hk) * fq + hv * fv, ho * fv
        n_win = windowed_layers(m)
        if n_win:  # SDPA's saved mask, bf16 [s + 1, s + 1] (its last dim padded to 16) per windowed layer
            s_ = cfg.training.seq_length / lay.cp
            parts["window_mask"] = 2 * (s_ + 1) * (s_ + 17) * n_win / m.num_layers
    parts["qkv"] = T * qkv_w * a / t + extra_attn * T * a
    parts["core_attn"] = T * o_w * a / t + T * heads * 4  # SDPA's saved output O + fp32 log-sum-exp
    parts["proj_in"] = T * ho * lin / t  # O reshaped to [T, heads*dh] (a copy): linear_proj / wo input
    parts["pre_mlp_in"] = T * h * resid * rep  # pre-MLP RMSNorm's saved input (the residual stream)
    if moe_layer:
        k = m.moe_router_topk
        fe = m.moe_ffn_hidden_size or m.ffn_hidden_size
        fs = m.moe_shared_expert_intermediate_size or 0
        mlp_in = T * h * lin * rep  # router + shared expert input (norm output)
        routed = T * k * (h * lin + (3 * fe * a if hints.swiglu_fused else 4 * fe * a)) / t  # permuted tokens + expert fc1/act/fc2
        routed += T * k * h * a  # unpermute's saved expert outputs
        shared = T * (3 * fs * a if hints.swiglu_fused else 4 * fs * a) / t if fs else 0
        parts["mlp_in"] = mlp_in
        parts["mlp"] = routed + shared + T * m.num_experts * 4 * 2  # + router logits / probs fp32
    else:
        f = m.ffn_hidden_size
        n_fc1_in = 2 if eager_casts else 1  # eager autocast: w1 and w3 each save their own bf16 cast
        parts["mlp_in"] = n_fc1_in * T * h * lin * rep
        # SwiGLU: fc1 output [gate|up] (2f) + silu(gate) (f) + fc2 input (f); fused swiglu saves fc1 output only
        act = (2 * f * a + f * lin) if hints.swiglu_fused else (3 * f * a + f * lin)
        parts["mlp"] = T * act / t
    return parts


def _selective_saved(cfg: PrimusConfig, parts: Dict[str, float], lay: Layout) -> float:
    """Bytes one layer keeps under selective recompute."""
    if cfg.backend.name == Backend.torchtitan:
        # torchtitan op-level SAC: keeps every op in its save list (mm, SDPA, ...) except every second mm;
        # per layer saved: wq out, wv out, w1 out, w2 out (odd mms), SDPA outputs, and the block input.
        m = cfg.model
        T = cfg.training.micro_batch_size * cfg.training.seq_length / lay.cp
        a = _act_dtype_bytes(cfg)
        dh = head_dim(m)
        kept = T * a * (m.num_attention_heads * dh + m.num_query_groups * dh + m.ffn_hidden_size + m.hidden_size) / lay.tp
        return parts["input"] + parts["core_attn"] + kept
    mods = set(cfg.recompute.recompute_modules or ["core_attn"])
    dropped = 0.0
    if "core_attn" in mods:
        dropped += parts["core_attn"]  # SDPA's O + lse; q, k, v stay as the checkpoint's inputs
    if "mlp" in mods or "moe" in mods:
        dropped += parts["mlp"]  # keeps only the MLP input (already counted in mlp_in)
    elif "moe_act" in mods:
        dropped += parts["mlp"] * 0.25  # the activation's output (f of the 4f)
    if "layernorm" in mods:
        dropped += parts["qkv_in"] + parts["mlp_in"]  # the norm outputs, recomputed from their kept inputs
    return sum(parts.values()) - dropped


def _granularity(cfg: PrimusConfig) -> Optional[str]:
    r = cfg.recompute
    if cfg.backend.name == Backend.torchtitan and r.activation_checkpoint_mode is not None:
        mode = r.activation_checkpoint_mode.value
        return None if mode == "none" else mode
    return r.recompute_granularity.value if r.recompute_granularity is not None else None


def stage_activation_bytes(cfg: PrimusConfig, lay: Layout, hints: BackendHints, stage: int) -> Dict[str, float]:
    """Activations held at the peak (end of the last forward before a backward) on one rank of `stage`.

    1F1B: stage s keeps min(pp - s, micro batches) micro batches in flight (stage 0: pp); interleaved (vp > 1)
    scales that by 1 + (pp - 1) / (pp x vp) (Korthikanti et al., eq. 5). Without pp one micro batch is in flight
    (gradient accumulation finishes each backward before the next forward).
    Full recompute keeps only the checkpointed layer inputs plus, during the backward, one recomputed chunk's
    full activations for one micro batch.
    """
    m = cfg.model
    ids = _stage_ids(cfg, lay, stage)
    per_stage = len(ids)
    is_moe = moe_layers(m)
    in_flight = min(lay.pp - stage, lay.num_microbatches) if lay.pp > 1 else 1
    if lay.vp > 1 and stage == 0:
        in_flight *= 1 + (lay.pp - 1) / (lay.pp * lay.vp)
    gran = _granularity(cfg)
    r = cfg.recompute
    per_layer_full, per_layer_kept = [], []
    for i in ids:
        parts = layer_activation_bytes(cfg, lay, hints, moe_layer=bool(is_moe[i]))
        full = sum(parts.values())
        per_layer_full.append(full)
        per_layer_kept.append((full, parts["input"], _selective_saved(cfg, parts, lay)))
    kept, working = 0.0, 0.0
    if gran == "full":
        if cfg.backend.name == Backend.torchtitan:
            recomputed = set(ids)
            chunk = 1
        elif r.recompute_layer_ids is not None:
            recomputed, chunk = set(r.recompute_layer_ids) & set(ids), 1
        elif r.recompute_method is not None and r.recompute_method.value == "block":
            recomputed, chunk = set(ids[: (r.recompute_num_layers or per_stage)]), 1
        else:  # uniform: chunks of n layers, each keeps its first input
            chunk = r.recompute_num_layers or 1
            recomputed = set(ids)
        for j, i in enumerate(ids):
            full, inp, _ = per_layer_kept[j]
            if i in recomputed:
                kept += inp if (j % chunk == 0) else 0.0
            else:
                kept += full
        if recomputed:
            working = chunk * max(per_layer_full)  # one chunk recomputed for one micro batch during backward
    elif gran == "selective":
        kept = sum(k[2] for k in per_layer_kept)
        working = max(k[0] - k[2] for k in per_layer_kept)
    else:
        kept = sum(per_layer_full)
    # backward working set: the gradients of one layer's intermediates (about its saved size), plus, under
    # recompute, the recomputed chunk's activations
    working += max(per_layer_full)
    out = {"layers": kept * in_flight, "backward_working": working}
    # the head on the last stage: final norm input + output-layer input (one micro batch: the loss runs at once)
    if stage == lay.pp - 1:
        T = cfg.training.micro_batch_size * cfg.training.seq_length / lay.cp
        a = _act_dtype_bytes(cfg)
        resid = 4 if _autocast(cfg, lay) else a
        out["head"] = T * m.hidden_size * (resid + a)
    return out


def logits_bytes(cfg: PrimusConfig, lay: Layout) -> float:
    """The loss's temporaries on the last stage, one micro batch (vocab-parallel over tp).

    megatron: bf16 logits (2 B) + the fp32 copy for vocab_parallel_cross_entropy, which exponentiates in place and
    keeps it for backward (4 B) -> 6 B per token per vocab entry at the peak. With the compiled loss
    (args.compiled_loss) the logits stay bf16 and the backward writes their bf16 gradient -> 4 B (measured on the
    H200 at the bench shape: 8.3 GiB less peak than the 6 B path, i.e. 2.1 B per entry). With primus' Triton cross
    entropy (args.turbo_loss) the backward writes the gradient into the logits' own storage -> 2 B (H200 bench shape,
    bench/turbo_kernels.py: 0.0 GiB beyond the logits for the loss's fwd+bwd, vs 7.8 GiB compiled).
    torchtitan: F.cross_entropy on `pred.float()` is log_softmax + nll_loss. Forward: the bf16 logits (2, held by
    the train step until the loss returns) + the `.float()` copy (4) + log_softmax's output (4), saved for backward.
    The peak is in the loss's backward: the saved output (4), nll_loss's dense fp32 gradient of it (4) and
    log_softmax's fp32 input gradient (4) live together -> 12 B (fp32 training: the same three); with
    training.compile TorchTitan compiles the loss too (compile.components has "loss"): inductor fuses the cast into
    the reduction and the backward writes the bf16 gradient -> 4 B, as megatron's compiled loss (H200, the
    llama3_2_1b_torchtitan_bf16 preset: 75.9 GiB measured peak; 104.7 GiB planned with the eager 10 B).
    """
    T = cfg.training.micro_batch_size * cfg.training.seq_length / lay.cp
    v = cfg.model.vocab_size / lay.tp
    fp32 = _act_dtype_bytes(cfg) == 4
    if cfg.backend.name == Backend.torchtitan:
        per = (8 if fp32 else 4) if cfg.training.compile else 12
    else:
        from primus.backends.megatron.args import compiled_loss, turbo_loss

        if turbo_loss(cfg):
            per = 4 if fp32 else 2
        else:
            per = (8 if fp32 else 4) if compiled_loss(cfg) else (8 if fp32 else 6)
    return T * v * per


# ------------------------------------------------------------------------------------------------ the breakdown


@dataclass
class MemoryBreakdown:
    """Bytes per GPU on the busiest rank, by component, plus the exact element counts the tests check."""
    backend: str
    stage: int  # the pipeline stage reported (the one with the largest total)
    params_numel: int  # parameters on this rank
    main_params_numel: int  # fp32 master params held by the optimizer on this rank (GPU + CPU)
    optimizer_state_numel: int  # Adam exp_avg + exp_avg_sq elements on this rank (GPU + CPU)
    params: float  # model weights
    grads: float  # gradient storage
    optimizer: float  # fp32 main params + Adam states kept on the GPU
    optimizer_cpu: float  # the offloaded share (host memory, not counted in total)
    activations: float  # saved for backward at the peak (all micro batches in flight, recompute applied)
    temporary: float  # loss logits, all-gather / reduce buffers, optimizer-step temporaries (at the peak phase)
    peak_phase: str  # "forward/backward" or "optimizer step"
    total: float  # estimated peak allocated bytes (compare with torch.cuda.max_memory_allocated)
    reserve: float  # CUDA context + allocator fragmentation, not allocations
    capacity: float  # the target GPU's usable bytes
    gpu: str  # label of the target GPU
    details: Dict[str, float] = field(default_factory=dict)  # finer terms (bytes) for the report
    notes: List[str] = field(default_factory=list)
    stage_layers: int = 0  # transformer layers on the reported stage (uneven splits differ per stage)

    @property
    def needed(self) -> float:
        return self.total + self.reserve

    @property
    def fits(self) -> bool:
        return self.needed <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.needed


def _portable_weight_cache(cfg, lay) -> bool:
    """Whether the portable fp8 linears keep their weights' fp8 casts through a step (megatron args' rule)."""
    try:
        from primus.backends.megatron import args as margs

        return margs.fp8_weight_cache(cfg, lay.num_microbatches)
    except ImportError:  # planning never depends on the backend importing
        return bool(cfg.precision.fp8_weight_cache)


def _cached_expert_bytes(cfg) -> int:
    """Bytes per routed-expert weight element that the fp8 weight cache keeps (primus/turbo/grouped_gemm_fp8.py):
    0 when the experts' GEMMs run bf16 (no fp8 cast); e4m3: torch._scaled_grouped_mm's two casts, along K for the
    forward and along N for the dgrad (on GPUs other than sm90 the Triton path keeps one: an over-estimate there);
    hybrid: the Triton path's one tensorwise cast, which the backward reuses."""
    try:
        from primus.backends.megatron import args as margs

        fmt = margs.turbo_args(cfg).get("grouped_gemm_fp8")
    except ImportError:  # planning never depends on the backend importing
        fmt = cfg.precision.fp8.value if cfg.turbo.grouped_gemm_fp8 else None
    return 0 if not fmt else 2 if fmt == "e4m3" else 1


def _megatron_stage(cfg, lay, hints, stage, sp: StageParams) -> Dict[str, float]:
    mem = cfg.memory
    P = sp.total
    w = 2 if _act_dtype_bytes(cfg) == 2 else 4
    g = 4 if (hints.grad_reduce_in_fp32 or w == 4) else 2
    shard = lay.dp if mem.use_distributed_optimizer else 1
    opt_elems = math.ceil(P / shard)  # the optimizer's share of this rank's params
    frac = mem.optimizer_offload_fraction if mem.optimizer_cpu_offload else 0.0
    main = 4 * opt_elems if w == 2 else 0  # fp32 master params (fp32 training: the params themselves)
    states = 8 * opt_elems  # Adam exp_avg + exp_avg_sq
    d = {"weights": w * P, "grad_buffer": g * P, "main_params": main, "adam_states_gpu": states * (1 - frac),
         "adam_states_cpu": states * frac, "main_params_numel": opt_elems if w == 2 else 0,
         "states_numel": 2 * opt_elems}
    if cfg.precision.fp8 is not None and hints.te_linears:
        d["fp8_weight_copies"] = 2 * sp.linear  # TE: fp8 weight + its transpose per linear
        d["fp8_weight_copies_at_step"] = d["fp8_weight_copies"]  # TE's modules keep them through the step
    elif cfg.precision.fp8 is not None and _portable_weight_cache(cfg, lay):
        # fp8_weight_cache: each weight's two fp8 forms, kept through a step; the experts' per their grouped GEMM
        d["fp8_weight_copies"] = 2 * (sp.linear - sp.experts) + _cached_expert_bytes(cfg) * sp.experts
    elif hints.portable_fp8_saves_fp8:
        # the transposed fp8 weight each forward keeps for its backward (the fp8 grouped GEMMs keep the bf16 one)
        d["fp8_weight_copies"] = 1 * (sp.linear - sp.experts)
    # the portable path's copies are gone by the optimizer step: the trainer clears the weight cache before it, and
    # the uncached transposed weights are saved tensors the backward frees
    d.setdefault("fp8_weight_copies_at_step", 0)
    # optimizer step: fp32 main grads (bf16 buffer -> .float() copies) + torch AdamW foreach sqrt temporaries
    step = (4 * opt_elems if g == 2 else 0)
    step += 4 * opt_elems * (1 - frac) if not mem.optimizer_cpu_offload else 0
    d["step_temps"] = step
    return d


def _torchtitan_stage(cfg, lay, hints, stage, sp: StageParams) -> Dict[str, float]:
    P = sp.total
    n = lay.dp_shard
    pe = math.ceil(P / n)  # FSDP2 pads each param's dim-0 shard; the padding is negligible at these sizes
    off = cfg.memory.enable_cpu_offload and n > 1
    d = {"weights": 0.0 if off else 4 * pe, "grad_buffer": 0.0, "main_params": 0.0,
         "adam_states_gpu": 0.0 if off else 8 * pe, "adam_states_cpu": 8 * pe if off else 0.0,
         "main_params_numel": 0, "states_numel": 2 * pe}
    grads = 0.0 if off else 4 * pe  # fp32 grads (sharded under FSDP), allocated during the first backward
    if n == 1:
        if _autocast(cfg, lay) and not cfg.training.compile:
            # bf16 copies of linear weights, forward -> backward; compiled, the partitioner recomputes a cast of a
            # graph input it keeps anyway (the fp32 weight) in the backward instead of saving the copy
            d["autocast_weight_cache"] = 2 * sp.linear
        if lay.dp > 1:
            grads += 4 * P  # DDP's bucket copies of the grads
        # one micro batch: the grads appear during the backward, as the activations go, after the activation peak;
        # accumulating, the first micro batch's fp32 grads stay through every later micro batch's forward
        d["grads_at_peak"] = grads if lay.num_microbatches > 1 else 0.0
        d["grads_end"] = grads
    else:
        mp = 2 if cfg.precision.mixed_precision_param.value == "bfloat16" else 4
        red = 4 if cfg.precision.mixed_precision_reduce.value == "float32" else 2
        blk = sp.largest_block  # one whole block (FSDP all-gathers it to its unsharded size)
        out_layer = sp.output  # output + final norm: gathered from its forward through its backward
        # two blocks gathered (current + prefetched) + the gathered output layer; in backward one block's
        # unsharded grads (param dtype) and the reduce-dtype copy fed to reduce-scatter
        d["fsdp_gather"] = mp * (2 * blk + out_layer)
        d["fsdp_reduce"] = (mp + red) * max(blk, out_layer)
        d["grads_at_peak"] = grads
        d["grads_end"] = grads
    d["step_temps"] = 0.0  # fused AdamW
    return d


def estimate_memory(cfg: PrimusConfig, gpu: Gpu, world: Optional[int] = None) -> MemoryBreakdown:
    lay = layout_of(cfg, world)
    hints = backend_hints(cfg)
    best: Optional[MemoryBreakdown] = None
    # the first and last stages hold the embedding / output; with an uneven split a middle stage may hold the most
    # layers, and stage 1 keeps the most micro batches in flight of the middle ones
    stages = sorted({0, lay.pp - 1} | ({1} if uneven(cfg) and lay.pp > 2 else set()))
    for stage in stages:
        sp = stage_params(cfg, lay, stage)
        acts = stage_activation_bytes(cfg, lay, hints, stage)
        act = sum(acts.values()) - acts["backward_working"]
        logits = logits_bytes(cfg, lay) if stage == lay.pp - 1 else 0.0
        if cfg.backend.name == Backend.megatron:
            d = _megatron_stage(cfg, lay, hints, stage, sp)
            grads = d["grad_buffer"]
            resident = d["weights"] + grads + d["main_params"] + d["adam_states_gpu"] + d.get("fp8_weight_copies", 0)
            fwd_temp = max(logits, acts["backward_working"])
            step_temp = d["step_temps"]
        else:
            d = _torchtitan_stage(cfg, lay, hints, stage, sp)
            grads = d["grads_end"]
            base = d["weights"] + d["adam_states_gpu"]
            resident = base + d["grads_at_peak"] + d.get("autocast_weight_cache", 0)
            fwd_temp = max(logits, acts["backward_working"]) + d.get("fsdp_gather", 0) + d.get("fsdp_reduce", 0)
            step_temp = 0.0
        peak_fb = resident + act + fwd_temp
        if cfg.backend.name == Backend.megatron:
            peak_step = (d["weights"] + grads + d["main_params"] + d["adam_states_gpu"] + d["fp8_weight_copies_at_step"]
                         + step_temp)
        else:
            peak_step = d["weights"] + d["adam_states_gpu"] + grads
        phase = "forward/backward" if peak_fb >= peak_step else "optimizer step"
        total = max(peak_fb, peak_step)
        temporary = fwd_temp if phase == "forward/backward" else (step_temp if cfg.backend.name == Backend.megatron else 0.0)
        acts_shown = act if phase == "forward/backward" else 0.0
        optimizer_gpu = d["main_params"] + d["adam_states_gpu"]
        params_b = d["weights"] + d.get("fp8_weight_copies", 0) + d.get("autocast_weight_cache", 0)
        if phase == "forward/backward":
            grads_shown = grads if cfg.backend.name == Backend.megatron else d["grads_at_peak"]
        else:
            grads_shown = grads
            params_b = d["weights"] + d.get("fp8_weight_copies_at_step", 0)
        reserve = RESERVE_GB * GiB + (0.5 * GiB if lay.world > 1 else 0.0) + FRAGMENTATION * total
        details = {k: float(v) for k, v in d.items() if not k.endswith("numel")}
        details.update({f"act_{k}": v for k, v in acts.items()})
        details["logits"] = logits
        details["peak_forward_backward"] = peak_fb
        details["peak_optimizer_step"] = peak_step
        bd = MemoryBreakdown(
            backend=cfg.backend.name.value, stage=stage, params_numel=sp.total,
            main_params_numel=int(d["main_params_numel"]), optimizer_state_numel=int(d["states_numel"]),
            params=params_b, grads=grads_shown, optimizer=optimizer_gpu, optimizer_cpu=d["adam_states_cpu"],
            activations=acts_shown, temporary=temporary, peak_phase=phase, total=total, reserve=reserve,
            capacity=gpu.capacity_bytes, gpu=gpu.label, details=details, stage_layers=sp.layers)
        if best is None or bd.total > best.total:
            best = bd
    assert best is not None
    best.notes.extend(_notes(cfg, lay, hints))
    return best


def _notes(cfg: PrimusConfig, lay: Layout, hints: BackendHints) -> List[str]:
    out = []
    mem = cfg.memory
    if cfg.backend.name == Backend.megatron:
        if mem.use_distributed_optimizer and lay.dp == 1:
            out.append("distributed optimizer with dp=1 shards nothing")
        if mem.optimizer_cpu_offload:
            out.append("offload moves Adam states to the CPU; megatron keeps the fp32 main params on the GPU")
        out.append("grad buffer dtype: %s (grad_reduce_in_fp32=%s)" % ("fp32" if hints.grad_reduce_in_fp32 else "bf16",
                                                                         hints.grad_reduce_in_fp32))
    else:
        if lay.dp_shard == 1 and not _autocast(cfg, lay):
            out.append("torchtitan 0.2.2 disables mixed precision with tp/pp and no FSDP: activations in fp32")
        if mem.optimizer_cpu_offload or mem.use_distributed_optimizer:
            out.append("torchtitan ignores the megatron optimizer settings: FSDP (dp_shard > 1) shards the "
                       "optimizer, memory.enable_cpu_offload offloads it")
    if cfg.model.num_experts:
        out.append("MoE activations assume balanced routing (tokens x top-k spread evenly over experts)")
    if cfg.model.mtp_num_layers:
        out.append("multi-token-prediction layers are not counted")
    return out


# ------------------------------------------------------------------------------------------------ throughput


# The MFU the throughput estimate assumes where plan.assumed_mfu is unset: what this project's presets measured on
# H100 and H200 (docs/benchmarks.md; MFU on the bf16 peak, attention not causal-halved), by backend, whether the
# linears run fp8 (or fp4), and dense or MoE. A flat guess under-stated the fp8 presets twice over (45% against the
# Llama-2-7B fp8 preset's measured 92.6%). Measured on NVIDIA GPUs only: elsewhere the same figures are a guess.
MEASURED_MFU = {
    # megatron, dense: bf16 59.7-60.4% (Llama-3.2-1B, H200), 61.5-64.2% (16 of Llama-2-7B's layers, 8 of
    # Llama-3.1-8B's, H100); fp8 77.0% (1B, H200), 84.9% (8 of 8B's layers, H100), 88.4-92.6% (7B: 16 layers,
    # H100; 32 layers, H200)
    ("megatron", False, False): 0.60,
    ("megatron", True, False): 0.80,
    # megatron, MoE (the routed experts' grouped GEMMs at a few hundred tokens an expert): bf16 48.8% (2 Mixtral
    # layers, H200); fp8 linears 48.0-49.7% with bf16 routed experts (4 of Qwen3-30B-A3B's layers, 5 of
    # DeepSeek-V2-Lite's, H100), 56.1% with fp8 experts (2 Mixtral layers, H200)
    ("megatron", False, True): 0.48,
    ("megatron", True, True): 0.50,
    # torchtitan, dense (the project's settings): bf16 54.0%, fp8 67.1-68.5% (1B, H200)
    ("torchtitan", False, False): 0.54,
    ("torchtitan", True, False): 0.67,
    # torchtitan, MoE: stock TorchTitan's at the DeepSeek-V2-Lite and Qwen3-30B-A3B shapes, 21.9-28.3% (H100)
    ("torchtitan", False, True): 0.25,
    ("torchtitan", True, True): 0.25,
}
# MFU counts the model's FLOPs, not the recomputed forward: against no recompute, full recompute ran 0.78x (the
# Llama-3.1-8B shape at seq 16384, 8 layers, H100) and 0.88x at 4x the micro batch (16 of Llama-2-7B's fp8 layers,
# H100); selective recompute 0.95x (the latter).
RECOMPUTE_MFU = {"full": 0.80, "selective": 0.95, "none": 1.0}


def measured_mfu(cfg: PrimusConfig) -> Tuple[float, str]:
    """(MFU, where it comes from): plan.assumed_mfu, else MEASURED_MFU for this backend, precision and model kind
    times RECOMPUTE_MFU for its recompute."""
    from primus.features.recompute import ac_mode

    given = cfg.plan.assumed_mfu
    if given is not None:
        return given, "plan.assumed_mfu"
    p = cfg.precision
    low = p.fp8 is not None or p.fp4 is not None
    moe = num_moe_layers(cfg.model) > 0
    backend = cfg.backend.name.value
    recompute = ac_mode(cfg.recompute)
    what = f"{backend}, {'fp8' if low else 'bf16'}, {'MoE' if moe else 'dense'}" + (
        f", {recompute} recompute" if recompute != "none" else "")
    mfu = MEASURED_MFU[(backend, low, moe)] * RECOMPUTE_MFU.get(recompute, 1.0)
    return mfu, f"measured for {what}; plan.assumed_mfu sets another"


@dataclass
class Throughput:
    flops_per_token: float  # training FLOPs (fwd + bwd) per token, primus.metrics.flops
    tokens_per_step: int  # global batch x seq
    flops_per_step: float  # whole job
    flops_per_gpu_step: float
    peak_tflops: Optional[float]  # bf16 dense peak of the target GPU
    assumed_mfu: float  # plan.assumed_mfu or measured_mfu's
    mfu_source: str  # where assumed_mfu comes from
    step_time_s: Optional[float]
    tokens_per_s: Optional[float]  # whole job
    tokens_per_s_per_gpu: Optional[float]


def estimate_throughput(cfg: PrimusConfig, gpu: Gpu, world: Optional[int] = None) -> Throughput:
    from primus.metrics.peaks import peak_tflops

    from primus.features.training import global_batch

    lay = layout_of(cfg, world)
    mfu, source = measured_mfu(cfg)
    t = cfg.training
    fpt = flops_per_token(cfg.model, t.seq_length)
    tokens = global_batch(cfg, lay.world) * t.seq_length
    total = fpt * tokens
    per_gpu = total / lay.world
    peaks = peak_tflops(gpu.name)
    peak = peaks[0] if peaks else None
    if peak and mfu > 0:
        step = per_gpu / (mfu * peak * 1e12)
        tps = tokens / step
        return Throughput(fpt, tokens, total, per_gpu, peak, mfu, source, step, tps, tps / lay.world)
    return Throughput(fpt, tokens, total, per_gpu, peak, mfu, source, None, None, None)
