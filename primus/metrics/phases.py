"""Where a megatron step goes, by model phase: router, dispatch/permute, experts, combine/unpermute, shared experts,
attention, dense MLP, gradient accumulation, optimizer, other.

The kernel-category table (profiler.py) names kernels, and a router's top-k, a permute's gather and an expert's
GEMM share kernel names with everything else. So, while the profiler window is open, `install` wraps the model's
parts in `torch.profiler.record_function` ranges named `primus.phase:<phase>`:

    router              MoELayer.router (gating GEMM, top-k, aux-loss)
    dispatch/permute    token_dispatcher.dispatch_preprocess + token_dispatch + dispatch_postprocess
                        (permute, token counts, the all-to-all / all-gather where expert parallel)
    experts             MoELayer.experts (the grouped GEMMs and their activation)
    combine/unpermute   token_dispatcher.combine_preprocess + token_combine + combine_postprocess
    shared experts      MoELayer.shared_experts
    attention           TransformerLayer.self_attention (QKV, RoPE, core attention, output projection)
    dense MLP           TransformerLayer.mlp where it is not an MoE layer
    gradient accumulation  what runs under autograd's AccumulateGrad nodes: megatron DDP's hook adding each micro
                        batch's weight gradient into the fp32 main_grad (no range needed: the hook runs inside the
                        node's profiler scope), autograd's own .grad accumulation; a weight gradient fused into its
                        GEMM (training.gradient_accumulation_fusion) counts for that GEMM's phase
    optimizer           the trainer's optimizer.step (grad norm and clipping, Adam, master-weight copies)

Backward: autograd gives each backward node the sequence number of the forward op that made it (the profiler's
`autograd::engine::evaluate_function: XBackward` events carry it, with the forward thread). A forward op inside a
phase range hands its phase to its backward node, so the backward kernels of a phase count as that phase; a
recomputed forward (activation checkpointing) runs inside the same wrapped calls and is attributed the same way.
"other" is what no range claims: embedding, layer norms, residual adds, the loss, the gradients' reduction, and
kernels launched outside any op.

Time is the GPU time of the kernels each op launched (GPU runs) or the self CPU time of aten ops (CPU runs), the
same totals as the kernel table. The wrappers are instance attributes set at the window's first step and removed
after its last, so that the unprofiled steps run the library's own methods. A torch.compile'd layer is left
unwrapped (new ranges would recompile it inside the window, and inductor fuses across them anyway). Inside it the
ops that keep their names in the compiled graph say their phase (`_OPS`): the router, permute and unpermute custom
ops, the experts' grouped GEMMs and the core attention, forward and backward (a backward op is one under an
autograd node; the permute's backward is an unpermute op and the unpermute's a permute op, so those two swap
phases there). The layer's other kernels (its projections, norms, inductor's fused kernels) stay "other", and the
table says how many layers that was.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

PREFIX = "primus.phase:"
GRAD_ACC = "gradient accumulation"
PHASES = ["router", "dispatch/permute", "experts", "combine/unpermute", "shared experts", "attention", "dense MLP",
          GRAD_ACC, "optimizer"]
OTHER = "other"
# ops of a compiled layer that name their phase: (op name or prefix*, phase in the forward, phase in the backward)
_OPS = (
    ("primus::moe_router", "router", "router"),
    ("primus::moe_router_bwd", "router", "router"),
    ("primus::moe_permute", "dispatch/permute", "combine/unpermute"),  # backward: the unpermute's gradient
    ("primus::moe_unpermute", "combine/unpermute", "dispatch/permute"),  # backward: the permute's gradient
    ("primus::moe_unpermute_bwd", "combine/unpermute", "combine/unpermute"),
    ("aten::_grouped_mm", "experts", "experts"),
    ("aten::_scaled_grouped_mm", "experts", "experts"),
    ("primus::grouped_wgrad_accumulate", "experts", "experts"),
    ("aten::_scaled_dot_product*", "attention", "attention"),
    ("aten::_flash_attention*", "attention", "attention"),
    ("aten::_efficient_attention*", "attention", "attention"),
    ("aten::_cudnn_attention*", "attention", "attention"),
)
_OPS_EXACT = {n: (f, b) for n, f, b in _OPS if not n.endswith("*")}
_OPS_PREFIX = tuple((n[:-1], (f, b)) for n, f, b in _OPS if n.endswith("*"))
_DISPATCH = ("dispatch_preprocess", "token_dispatch", "dispatch_postprocess")
_COMBINE = ("combine_preprocess", "token_combine", "combine_postprocess")
_MISSING = object()


def _ranged(fn: Callable, name: str) -> Callable:
    import torch

    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapped


class Installed:
    """The wrappers set on a model; `remove` puts every attribute back as it was."""

    def __init__(self):
        self._saved: List[Tuple[object, str, object]] = []
        self.compiled_layers = 0
        self.counts: Dict[str, int] = defaultdict(int)

    def wrap(self, obj, attr: str, phase: str) -> None:
        self._saved.append((obj, attr, obj.__dict__.get(attr, _MISSING)))
        setattr(obj, attr, _ranged(getattr(obj, attr), PREFIX + phase))
        self.counts[phase] += 1

    def remove(self) -> None:
        for obj, attr, old in reversed(self._saved):
            if old is _MISSING:
                del obj.__dict__[attr]
            else:
                obj.__dict__[attr] = old
        self._saved.clear()


def install(model_chunks, optimizer=None) -> Installed:
    """Wrap each TransformerLayer's attention and MLP (MoE: router, dispatcher, experts, shared experts) of the
    given megatron model chunks, and the optimizer's step, in phase ranges."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_layer import TransformerLayer

    done = Installed()
    try:
        for chunk in model_chunks:
            for layer in chunk.modules():
                if not isinstance(layer, TransformerLayer):
                    continue
                if getattr(layer, "_compiled_call_impl", None) is not None:
                    done.compiled_layers += 1
                    continue
                attn = getattr(layer, "self_attention", None)
                if attn is not None and not _is_identity(attn):
                    done.wrap(attn, "forward", "attention")
                mlp = getattr(layer, "mlp", None)
                if isinstance(mlp, MoELayer):
                    done.wrap(mlp.router, "forward", "router")
                    done.wrap(mlp.experts, "forward", "experts")
                    if getattr(mlp, "shared_experts", None) is not None:
                        done.wrap(mlp.shared_experts, "forward", "shared experts")
                    for name in _DISPATCH:
                        done.wrap(mlp.token_dispatcher, name, "dispatch/permute")
                    for name in _COMBINE:
                        done.wrap(mlp.token_dispatcher, name, "combine/unpermute")
                elif mlp is not None and not _is_identity(mlp):
                    done.wrap(mlp, "forward", "dense MLP")
        if optimizer is not None:
            done.wrap(optimizer, "step", "optimizer")
    except BaseException:
        done.remove()
        raise
    return done


def _is_identity(m) -> bool:
    import torch

    return type(m).__name__ in ("IdentityOp", "IdentityFuncOp") or isinstance(m, torch.nn.Identity)


def _phase_of_range(name: str) -> Optional[str]:
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


_BACKWARD = "autograd::engine::evaluate_function:"
_ACCUMULATE = _BACKWARD + " torch::autograd::AccumulateGrad"


def _op_phases(name: str) -> Optional[Tuple[str, str]]:
    hit = _OPS_EXACT.get(name)
    if hit is None:
        hit = next((fb for prefix, fb in _OPS_PREFIX if name.startswith(prefix)), None)
    return hit


def _op_phase(e) -> Optional[str]:
    """The phase the innermost named op (_OPS) above e gives it: its backward phase under an autograd node."""
    x, hit = e, None
    while x is not None:
        if hit is None:
            hit = _op_phases(x.name)
        elif x.name.startswith(_BACKWARD):
            return hit[1]
        x = x.cpu_parent
    return hit[0] if hit else None


def phase_breakdown(events, on_gpu: bool) -> Tuple[Dict[str, float], float]:
    """({phase: time in us}, total us) over the profiler's FunctionEvents; phases absent from the window are 0,
    and OTHER is the total less the phases."""
    from primus.metrics.profiler import is_annotation

    events = list(events)
    memo: Dict[int, Optional[str]] = {}

    def enclosing(e, through_backward: bool) -> Optional[str]:
        """The innermost phase range above e; through_backward: a backward node's forward op's phase."""
        chain, x, found = [], e, None
        while x is not None:
            key = id(x)
            if through_backward and key in memo:
                found = memo[key]
                break
            chain.append(key)
            p = _phase_of_range(x.name)
            if p is not None:
                found = p
                break
            if x.name == _ACCUMULATE:
                found = GRAD_ACC
                break
            if through_backward and x.name.startswith(_BACKWARD):
                found = by_seq.get((x.fwd_thread, x.sequence_nr))
                break
            x = x.cpu_parent
        if through_backward:
            for key in chain:
                memo[key] = found
        return found

    # forward ops that recorded a sequence number: their backward nodes inherit their phase
    by_seq: Dict[Tuple[int, int], str] = {}
    for e in events:
        if e.sequence_nr is None or e.sequence_nr < 0 or e.name.startswith(_BACKWARD) or e.fwd_thread:
            continue
        key = (e.thread, e.sequence_nr)
        if key not in by_seq:
            p = enclosing(e, through_backward=False)
            if p is not None:
                by_seq[key] = p

    per: Dict[str, float] = {p: 0.0 for p in PHASES}
    total = 0.0
    for e in events:
        dev = str(getattr(e, "device_type", ""))
        if on_gpu:
            if "CPU" in dev:
                own = [k for k in e.kernels if not (e.is_user_annotation and k.name == e.name)]
                t = sum(k.duration for k in own)
                if t:
                    p = enclosing(e, through_backward=True) or _op_phase(e)
                    if p is not None:
                        per[p] = per.get(p, 0.0) + t
            elif not is_annotation(e):
                total += e.time_range.elapsed_us()
        elif e.name.startswith("aten::") and "CPU" in dev:
            t = e.self_cpu_time_total
            total += t
            p = enclosing(e, through_backward=True) or _op_phase(e)
            if p is not None:
                per[p] = per.get(p, 0.0) + t
    per[OTHER] = max(0.0, total - sum(per.values()))
    return per, total


def phase_table(per: Dict[str, float], total: float, on_gpu: bool, steps: int, compiled_layers: int = 0) -> str:
    unit = "GPU kernel" if on_gpu else "CPU (aten ops)"
    lines = [f"| phase (forward + backward) | time/step (ms) | share of {unit} time |", "|---|---:|---:|"]
    for p in PHASES + [OTHER]:
        t = per.get(p, 0.0)
        lines.append(f"| {p} | {t / 1000 / steps:.2f} | {100 * t / (total or 1.0):.1f}% |")
    lines.append(f"| total | {total / 1000 / steps:.2f} | 100.0% |")
    if compiled_layers:
        lines += ["", f"{compiled_layers} torch.compile'd layers: their phases are those of the ops that keep their "
                      "names in a compiled graph (the router, permute and unpermute ops, the experts' grouped GEMMs, "
                      "the core attention); their projections, norms and fused kernels are in \"other\"."]
    return "\n".join(lines)


def as_json(per: Dict[str, float], total: float, steps: int) -> Dict[str, Dict[str, float]]:
    """{phase: {"ms_per_step", "share"}} for result.json."""
    return {p: {"ms_per_step": round(per.get(p, 0.0) / 1000 / steps, 3),
                "share": round(per.get(p, 0.0) / (total or 1.0), 4)} for p in PHASES + [OTHER]}
