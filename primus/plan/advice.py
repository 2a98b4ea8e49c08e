"""What-if variants of a config, each re-estimated: which single settings (and, failing those, which combinations)
would make it fit. Every variant is a modified copy of the config; nothing here changes the caller's config."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, List, Optional

from primus.config.schema import ACMode, Backend, PrimusConfig, RecomputeGranularity, RecomputeMethod
from primus.metrics.flops import num_moe_layers
from primus.plan.gpus import GPUS, Gpu, lookup
from primus.plan.memory import MemoryBreakdown, estimate_memory, estimate_throughput, layout_of, stage_params


@dataclass
class Variant:
    label: str  # what to change, as overrides
    overrides: List[str]  # Hydra overrides that apply it
    breakdown: MemoryBreakdown
    gpus: int  # world size it needs
    note: str = ""
    why: str = ""  # the pick: why not the order's first fit (the step-time model's gain), when it is not

    @property
    def fits(self) -> bool:
        return self.breakdown.fits


Change = Callable[[PrimusConfig, int], Optional[tuple]]  # (cfg, world) -> (label, overrides, new world, note) or None


def _full_recompute(cfg, world):
    if cfg.backend.name == Backend.torchtitan:
        if cfg.recompute.activation_checkpoint_mode == ACMode.full or (
                cfg.recompute.activation_checkpoint_mode is None and cfg.recompute.recompute_granularity == RecomputeGranularity.full):
            return None
        cfg.recompute.activation_checkpoint_mode = ACMode.full
        return "full activation checkpointing", ["recompute.activation_checkpoint_mode=full"], world, ""
    r = cfg.recompute
    if r.recompute_granularity == RecomputeGranularity.full and r.recompute_layer_ids is None and (
            r.recompute_method in (None, RecomputeMethod.uniform)) and (r.recompute_num_layers or 1) == 1:
        return None
    r.recompute_granularity, r.recompute_method, r.recompute_num_layers, r.recompute_layer_ids = (
        RecomputeGranularity.full, RecomputeMethod.uniform, 1, None)
    return "full recompute", ["recompute=full"], world, ""


def _selective_recompute(cfg, world):
    r = cfg.recompute
    if cfg.backend.name == Backend.torchtitan:
        if r.activation_checkpoint_mode in (ACMode.selective, ACMode.full) or (
                r.activation_checkpoint_mode is None and r.recompute_granularity is not None):
            return None
        r.activation_checkpoint_mode = ACMode.selective
        return "selective activation checkpointing (op)", ["recompute.activation_checkpoint_mode=selective"], world, ""
    if r.recompute_granularity is not None:
        return None
    r.recompute_granularity, r.recompute_modules = RecomputeGranularity.selective, ["core_attn"]
    return "selective recompute (core_attn)", ["recompute=selective"], world, ""


def _distributed_optimizer(cfg, world):
    if cfg.backend.name == Backend.torchtitan or cfg.memory.use_distributed_optimizer:
        return None
    cfg.memory.use_distributed_optimizer = True
    dp = layout_of(cfg, world).dp
    return ("distributed optimizer", ["memory=distributed_optimizer"], world,
            "needs dp > 1 to save anything (dp=1 here)" if dp == 1 else f"shards main params + Adam over dp={dp}")


def _offload(cfg, world):
    m = cfg.memory
    if cfg.backend.name == Backend.torchtitan:
        if m.enable_cpu_offload:
            return None
        m.enable_cpu_offload = True
        dp = layout_of(cfg, world).dp_shard
        return ("FSDP CPU offload", ["memory.enable_cpu_offload=true"], world,
                "torchtitan offloads only under FSDP (dp_shard > 1)" if dp == 1 else "params, grads, optimizer on CPU")
    if m.optimizer_cpu_offload and m.optimizer_offload_fraction >= 1.0:
        return None
    m.use_distributed_optimizer, m.optimizer_cpu_offload, m.optimizer_offload_fraction = True, True, 1.0
    return "optimizer CPU offload (all Adam states)", ["memory=offload"], world, "slower steps: the optimizer runs on CPU"


def _tp2(cfg, world):
    p = cfg.parallel
    t = p.tensor_model_parallel_size * 2
    m = cfg.model
    if m.num_attention_heads % t or m.num_query_groups % t:
        return None
    if t > 8:  # tp stays inside one node
        return None
    p.tensor_model_parallel_size = t
    return f"tensor parallel {t}", [f"parallel.tensor_model_parallel_size={t}"], world * 2, ""


def _pp2(cfg, world):
    p = cfg.parallel
    from primus.features.parallel import stage_layer_counts

    pp = p.pipeline_model_parallel_size * 2
    if stage_layer_counts(cfg, pp) is None:  # the layers (and any uneven first / last split) must still fit
        return None
    p.pipeline_model_parallel_size = pp
    return f"pipeline parallel {pp}", [f"parallel.pipeline_model_parallel_size={pp}"], world * 2, ""


def _half_micro_batch(cfg, world):
    t = cfg.training
    if t.micro_batch_size < 2:
        return None
    t.micro_batch_size //= 2
    return (f"micro batch {t.micro_batch_size}", [f"training.micro_batch_size={t.micro_batch_size}"], world,
            "same global batch, twice the accumulation steps")


SAME_GPUS: List[Change] = [_selective_recompute, _full_recompute, _distributed_optimizer, _offload, _half_micro_batch]
MORE_GPUS: List[Change] = [_tp2, _pp2]
CHANGES: List[Change] = SAME_GPUS + MORE_GPUS
REPEATABLE = {_tp2, _pp2, _half_micro_batch}


def _apply(cfg, world, changes):
    c = copy.deepcopy(cfg)
    w0 = world
    labels, notes = [], []
    overrides = {}  # key -> value: a repeated change (tp 2 then tp 4) keeps its last value
    for ch in changes:
        got = ch(c, world)
        if got is None:
            return None
        label, ov, world, note = got
        key = label.rsplit(" ", 1)[0] if ch in REPEATABLE else label
        labels = [lab for lab in labels if lab[0] != key] + [(key, label)]
        for o in ov:
            k, _, v = o.partition("=")
            overrides.pop(k, None)
            overrides[k] = v
        if note:
            notes.append(note)
    if world != w0:
        per_node = min(8, world) if cfg.launcher.nnodes <= 1 else max(1, world // cfg.launcher.nnodes)
        overrides["launcher.nproc_per_node"] = str(per_node)
        if world // per_node > 1:
            overrides["launcher.nnodes"] = str(world // per_node)
        notes.insert(0, f"needs {world} GPUs (now {w0}); or keep {w0} at a smaller dp")
    ovs = [f"{k}={v}" for k, v in overrides.items()]
    return c, world, " + ".join(lab for _, lab in labels), ovs, "; ".join(dict.fromkeys(notes))


def _greedy(cfg, gpu, world, pool, max_steps) -> Optional[tuple]:
    """Add, one at a time, the change from `pool` that lowers the estimate most, until it fits."""
    chosen: List[Change] = []
    last = None
    for _ in range(max_steps):
        best = None
        for ch in pool:
            if (ch in chosen and ch not in REPEATABLE) or (ch is _selective_recompute and _full_recompute in chosen):
                continue
            got = _apply(cfg, world, chosen + [ch])
            if got is None:
                continue
            c, w, label, ov, note = got
            b = estimate_memory(c, gpu, w)
            if best is None or (b.total, w) < (best[1].total, best[2]):
                best = (ch, b, w, label, ov, note)
        if best is None or (last is not None and best[1].total >= last[1].total):
            break
        chosen.append(best[0])
        last = best
        if best[1].fits:
            break
    return last if (last is not None and len(chosen) > 1) else None


def variants(cfg: PrimusConfig, gpu: Gpu, world: int) -> List[Variant]:
    """Every single change (fitting or not); then, when no single change fits on the same GPUs, the smallest
    combination found greedily on them (a user with one GPU is shown a way on it even where pipeline parallel 2
    alone would fit), and when nothing fits yet, one that may add GPUs (tp / pp doubled as often as needed)."""
    out: List[Variant] = []
    for ch in CHANGES:
        got = _apply(cfg, world, [ch])
        if got is None:
            continue
        c, w, label, ov, note = got
        out.append(Variant(label, ov, estimate_memory(c, gpu, w), w, note))
    for pool, steps, done in ((SAME_GPUS, 6, lambda v: v.fits and v.gpus == world), (CHANGES, 12, lambda v: v.fits)):
        if any(done(v) for v in out):
            continue
        found = _greedy(cfg, gpu, world, pool, steps)
        if found is not None and not any(v.label == found[3] for v in out):
            out.append(Variant(found[3], found[4], found[1], found[2], found[5]))
    return out


def bigger_gpus(cfg: PrimusConfig, gpu: Gpu, world: int) -> List[str]:
    """Known GPUs on which this exact config fits."""
    out = []
    for frag, (label, _, _) in GPUS:
        if frag == "H100 PCIe":
            continue
        g = lookup(frag)
        if g.capacity_bytes > gpu.capacity_bytes and estimate_memory(cfg, g, world).fits:
            out.append(label)
    return out


OFFLOAD_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _set_offload(cfg, frac: float) -> List[str]:
    """The overrides for an Adam offload share, applied to cfg. An offloaded share comes with its transfers
    overlapped with the CPU step, as every offloaded preset runs it (the host Adam's price below is measured so);
    none turns that overlap off too where the config had it on, and puts a share the config set back to its default:
    the memory rules refuse either without offload."""
    from primus.features import default_of

    m = cfg.memory
    if frac == 0.0:
        ov = ["memory.optimizer_cpu_offload=false"]
        if m.overlap_cpu_optimizer_d2h_h2d:
            ov.append("memory.overlap_cpu_optimizer_d2h_h2d=false")
        share = default_of(m, "optimizer_offload_fraction")
        if m.optimizer_offload_fraction != share:
            ov.append(f"memory.optimizer_offload_fraction={share}")
        m.optimizer_cpu_offload = m.overlap_cpu_optimizer_d2h_h2d = False
        m.optimizer_offload_fraction = share
        return ov
    m.use_distributed_optimizer, m.optimizer_cpu_offload, m.optimizer_offload_fraction = True, True, frac
    m.overlap_cpu_optimizer_d2h_h2d = True
    return ["memory=offload", f"memory.optimizer_offload_fraction={frac}", "memory.overlap_cpu_optimizer_d2h_h2d=true"]


# The pick's step-time model: only the terms that change with the offload share and the micro batch at one
# recompute level, each priced from a measurement.
#  - Each micro batch, megatron's DDP hook adds every weight gradient its GEMM did not accumulate into the fp32
#    main_grad: a bf16 read, an fp32 read and write, 10 bytes a parameter, at 73% of the HBM bandwidth (the add's
#    measured speed on an H100). A larger micro batch makes fewer of them.
#  - Where the GEMM accumulates instead (training.gradient_accumulation_fusion), its epilogue reads and writes the
#    fp32 main_grad, 8 bytes a parameter, mostly behind its main loop: FUSED_ACCUM_BYTES of them are priced.
#    Calibrated on row 1 at 16 fp8 layers on an H100 with the fusion (docs/benchmarks.md): micro batch 1 -> 2 took
#    1.32 s a step off the forward + backward, where the passes' term below gives 0.74 s and the embedding's and
#    norms' adds 0.07 s; the rest, 0.51 s over 128 fewer micro batches of 3.24 B fused parameters, is 3 bytes a
#    parameter. bench/turbo_kernels.py's fp8_wgrad_accum agrees: the epilogue's read and write took 0.26 and 0.36 ms
#    a layer over the bare GEMMs at 4,096 and 8,192 tokens on an H100 (docs/turbo.md), 3.2 and 4.4 bytes a parameter
#    at this bandwidth. At 8 layers on an H200 the model then puts the fusion's saving at micro batch 2 at 0.45 s a
#    step (measured 0.62 s).
#  - The offloaded share of Adam runs on the host: megatron-core's CPU Adam did 3.5 G parameters a second on the
#    H200 machine's 16 cores (3.37 B in 0.95 s; 3.9-4.7 G/s on an H100 machine's; 6.74 B in 1.40-1.90 s, 3.5-4.8
#    G/s, at Llama-2-7B's full depth on an H200), each rank assumed to have such a share of its host. The GPU share
#    reads and writes about 28 bytes a parameter (fp32 param, grad, two moments; the bf16 copy).
#  - With pipeline parallelism, 1F1B's bubble: (pp - 1) / (vp x micro batches) of the compute, at the throughput
#    estimate's MFU.
#  - Each micro batch's own cost beyond its FLOPs, MICRO_BATCH_LAYER_S a layer: the GEMMs of a smaller micro batch
#    run less efficiently, and every pass has its fixed launches. Calibrated on row 4 (docs/benchmarks.md: Llama-2-7B's
#    16 fp8 layers on an H100, global batch 256): beyond the adds, micro batch 1 -> 2 -> 4 took 0.49 s and 0.62 s a
#    step off the forward + backward, 1.11 s over 192 fewer passes of 16 layers. Without it the model under-predicted
#    those gaps (1.6 and 2.3 s a step against the measured 2.1 and 3.4 s), and where the adds are gone
#    (training.gradient_accumulation_fusion reaching every linear) it would see no gain in a larger micro batch.
#  - Each MoE layer's pass costs MOE_MICRO_BATCH_LAYER_S more: its experts' grouped GEMMs, at a few hundred tokens
#    an expert, and its router, permute and unpermute launches gain more from a larger micro batch than a dense
#    layer's GEMMs. Calibrated on row 2 at 5 of DeepSeek-V2-Lite's layers (4 MoE) and 4 of Qwen3-30B-A3B's on an
#    H100, global batch 64 (docs/benchmarks.md, row 2's micro batch): micro batch 2 -> 4 took 0.17-0.20 s and
#    0.17 s a step off the forward + backward, where the terms above give 0.10 s each; the rest over 64 fewer MoE
#    layer passes is 1.27 and 1.06 ms a pass.
# The model orders the three measured points as measured (micro batch 1 with half of Adam offloaded < 2 with 0.75 <
# 4 with all of it: 1.000x, 1.073x, 1.12x) and now puts the gaps at 2.3 and 3.4 s a step (measured 2.1 and 3.4);
# with the fusion it puts micro batch 2 with all of Adam offloaded 0.86 s ahead of micro batch 1 with half (measured
# 0.76 s, 1.027x).
# The pick leaves the order's first fit for the model's best only when the model puts it at least MODEL_GAIN of the
# step (at the throughput estimate's MFU) ahead: below that the model's error is larger than the gain.
MODEL_GAIN = 0.01
ADD_BYTES = 10
FUSED_ACCUM_BYTES = 3
ADD_HBM_FRACTION = 0.73
HOST_ADAM_PARAMS_PER_S = 3.5e9
GPU_ADAM_BYTES = 28
MICRO_BATCH_LAYER_S = 1.11 / (192 * 16)
MOE_MICRO_BATCH_LAYER_S = 1.15e-3


def unfused_grad_params(cfg: PrimusConfig, world: int, stage: int = 0) -> int:
    """Parameters of one rank whose weight gradients megatron's DDP hook adds into main_grad each micro batch: all
    of them, but where training.gradient_accumulation_fusion has megatron's own linears (and, where the fusion
    reaches them, the experts' grouped GEMMs) accumulate in their GEMM, as do the portable fp8 linears where
    FP8_LINEARS_GRAD_ACCUM_FUSION holds; the decoder's turbo linears return their gradients
    (features.training.linears_unfused)."""
    from primus.features.training import experts_grad_accum_fusion, linears_unfused

    lay = layout_of(cfg, world)
    sp = stage_params(cfg, lay, stage)
    if not cfg.training.gradient_accumulation_fusion:
        return sp.total
    output_layer = sp.output - cfg.model.hidden_size if sp.output else 0  # its own projection (megatron's linear)
    fused = output_layer if linears_unfused(cfg) else sp.linear - sp.experts
    if experts_grad_accum_fusion(cfg) == []:
        fused += sp.experts
    return sp.total - fused


def step_cost_s(cfg: PrimusConfig, b: MemoryBreakdown, gpu: Gpu, world: int) -> Optional[float]:
    """Seconds a step spends on what the offload share and the micro batch change (the model above); None for a
    GPU whose bandwidth the GPU table does not know."""
    if not gpu.hbm_tbps or cfg.backend.name != Backend.megatron:
        return None
    lay = layout_of(cfg, world)
    bw = gpu.hbm_tbps * 1e12 * ADD_HBM_FRACTION
    unfused = unfused_grad_params(cfg, world, b.stage)
    fused = stage_params(cfg, lay, b.stage).total - unfused
    adds = lay.num_microbatches * (unfused * ADD_BYTES + fused * FUSED_ACCUM_BYTES) / bw
    m = cfg.memory
    frac = m.optimizer_offload_fraction if m.optimizer_cpu_offload else 0.0
    host = frac * b.main_params_numel / HOST_ADAM_PARAMS_PER_S
    device = (1 - frac) * b.main_params_numel * GPU_ADAM_BYTES / bw
    bubble = 0.0
    if lay.pp > 1:
        tp = estimate_throughput(cfg, gpu, world)
        bubble = (lay.pp - 1) / (lay.vp * lay.num_microbatches) * (tp.step_time_s or 0.0)
    layer_s = cfg.model.num_layers * MICRO_BATCH_LAYER_S + num_moe_layers(cfg.model) * MOE_MICRO_BATCH_LAYER_S
    passes = lay.num_microbatches * layer_s / lay.pp
    return adds + host + device + bubble + passes


def pick(cfg: PrimusConfig, gpu: Gpu, world: int, margin: float = 0.10,
         micro_batches=(1, 2, 4, 8, 16)) -> Optional[Variant]:
    """The planner's pick for one job on its GPUs: the cheapest recompute whose estimate leaves `margin` of the GPU
    free (the estimate's accuracy bar) with some optimizer offload share (megatron) and micro batch; among those,
    the first in the order "the smallest offload share, then the largest micro batch", unless the model above
    puts another's step at least MODEL_GAIN shorter (the model applies to megatron on a GPU of known bandwidth;
    the order alone elsewhere). Recompute first because full recompute costs about a third more compute on every
    step, more than any offload share's host time (measured: selective 0.95x, full at micro batch 4 0.88x the
    pick, docs/benchmarks.md row 4). None when nothing on these GPUs fits."""
    t = cfg.training
    dp = layout_of(cfg, world).dp
    mbs = sorted((b for b in micro_batches if t.global_batch_size % (b * dp) == 0), reverse=True)
    recomputes = [lambda c, w: ("no recompute", [], w, ""), _selective_recompute, _full_recompute]
    fracs = OFFLOAD_FRACTIONS if cfg.backend.name == Backend.megatron else (None,)
    base = copy.deepcopy(cfg)
    if cfg.backend.name == Backend.megatron:
        base.memory.optimizer_cpu_offload = False
    r = base.recompute
    if cfg.backend.name == Backend.torchtitan:
        r.activation_checkpoint_mode = ACMode.none
    r.recompute_granularity = None
    for rc in recomputes:
        fitting = []
        for frac in fracs:
            for mb in mbs:
                c = copy.deepcopy(base)
                got = rc(c, world)
                if got is None:
                    continue
                label, ov, _, _ = got
                if cfg.backend.name == Backend.torchtitan and not ov:
                    ov = ["recompute.activation_checkpoint_mode=none"]
                elif not ov:
                    ov = ["recompute=none"]
                if frac is not None:
                    ov = ov + _set_offload(c, frac)
                    label += f", offload {frac:g}"
                c.training.micro_batch_size = mb
                ov = ov + [f"training.micro_batch_size={mb}"]
                b = estimate_memory(c, gpu, world)
                if b.needed <= b.capacity * (1 - margin):
                    cost = step_cost_s(c, b, gpu, world)
                    fitting.append((cost, Variant(f"{label}, micro batch {mb}", ov, b, world,
                                                  f"{b.needed / b.capacity:.0%} of {gpu.label}")))
        if fitting:
            first_cost, v = fitting[0]
            if first_cost is None:
                return v
            cost, best = min(fitting, key=lambda f: f[0])
            step = estimate_throughput(base, gpu, world).step_time_s
            if first_cost - cost >= MODEL_GAIN * (step or 0.0):
                best.why = (f"modelled {first_cost - cost:.2f} s a step ahead of the order's first fit ({v.label}) "
                            "on gradient adds, Adam, the micro batches' passes and the pipeline bubble")
                return best
            return v
    return None
