"""Cheap speed-ups of the megatron backend without Transformer Engine / apex (issue 3/10).

compile_layers (training.compile=true)
    Each decoder TransformerLayer's call goes through torch.compile (`nn.Module.compile`, default inductor mode,
    not fullgraph). The local spec's layer is norm -> QKV linear -> RoPE -> SDPA -> proj -> residual -> norm ->
    fc1 -> SwiGLU -> fc2 -> residual: eagerly that is a dozen elementwise kernels per layer (RoPE alone is several:
    split, neg, cat, mul, add for q and k; SwiGLU: chunk, silu, mul; residual adds; casts). Inductor fuses them into
    a few Triton kernels and leaves the GEMMs to cuBLAS and SDPA to its fused kernel. megatron's linears are custom
    autograd Functions (LinearWithGradAccumulationAndAsyncCommunication); with tp=1 / no SP dynamo traces them
    whole once the workaround `megatron.compile.quiet_tp_group_lookup` (patches/torch_compile.py) removes a
    per-call deprecation warning (measured on CPU with TORCH_LOGS=graph_breaks,recompiles: 11 breaks that left most
    of each layer eager -> 0 breaks, 0 recompiles across layers; losses equal to eager). Turbo kernel calls are
    graph breaks by design (turbo.py).
    Expected on the H200 (platform facts: the plain-PyTorch reference goes 42.0% -> 53.9% MFU with per-block
    compile): most of the 47.4% -> ~55% gap of megatron bf16 to the compiled reference.
    The DDP grad hooks are on the parameters' AccumulateGrad nodes, outside the compiled graphs: unchanged.
    On CPU the CPU redirections (patches/cpu.py) turn dynamo off for megatron's jit helpers; with compile on it is
    turned back on (CPU inductor needs a C++ compiler; the first step pays the compile, ~15 s for the debug model).

compile_loss (training.compile=true, tensor parallel size 1)
    megatron's unfused vocab-parallel cross entropy turns the bf16 logits ([tokens, vocab]: 32768 x 128256 for the
    Llama-3.2-1B bench, 8.4 GB) into an fp32 copy (16.8 GB) and then makes about a dozen full passes over fp32
    tensors of that size (max, subtract, exp, sum, softmax kept for the backward, its gradient): ~200 GB of memory
    traffic per step, ~50 ms at the H200's 4.2 TB/s, ~9% of the step. With the vocabulary not split over TP ranks
    there is nothing to all-reduce, and inductor compiles `F.cross_entropy` on the bf16 logits into a fused
    log-sum-exp reduction (forward) and one softmax-minus-one-hot kernel (backward): ~4 passes over bf16 logits,
    and no fp32 copy kept alive for the backward. Same loss (cross entropy over the padded vocabulary, no label
    smoothing). Left alone when tp > 1 or when the user asked for megatron's fused cross entropy
    (`model.cross_entropy_loss_fusion=true`).

turbo_loss (model.cross_entropy_loss_fusion=true, model.cross_entropy_fusion_impl=turbo; tp = 1; compile on or off)
    The LM loss through primus.turbo.cross_entropy (Triton): the forward reads the bf16 logits once (online max /
    sum-exp in fp32) and keeps only the per-row log-sum-exp; the backward reads the logits once more and writes
    their bf16 gradient into the logits' own storage (inplace_backward: megatron never reads the logits after the
    loss), so no (tokens x vocab) buffer is allocated for the loss at all. H200 at the bench shape (bench/turbo_kernels.py):
    fwd+bwd 6.4 ms at 92% of the copy bandwidth vs 9.8 ms for the compiled loss above, 7.8 GiB less peak; end to
    end (llama3_2_1b_megatron_bf16, 16 steps) 513 vs 516 ms per step, peak 68.5 vs 75.8 GiB, same losses. A custom
    op: called eagerly here (the loss is outside the compiled layers), and one opaque node wherever it is traced.

fused_adamw
    megatron-core without TE/apex builds torch.optim.AdamW with its defaults: on CUDA that is the `foreach`
    implementation (a dozen multi-tensor kernels per step, each materialising temporaries the size of a parameter
    list chunk). The `fused` implementation does the whole update in one kernel per parameter chunk, reading and
    writing each of param / grad / exp_avg / exp_avg_sq once, with no temporaries. Reference figure (platform
    facts): +3% tokens/s for the plain-PyTorch 1B run (59.0k -> 60.8k). torch reads `fused` / `foreach` from each
    param group at every step, so switching the built optimizer before its first step is enough (no megatron patch).
"""
from __future__ import annotations

import logging
from typing import Iterable, List

import torch

log = logging.getLogger("primus.megatron")


def enable_dynamo() -> None:
    """Undo the CPU redirections' `torch._dynamo.config.disable` (compile requested) and start the compile counters
    afresh (compile_layers leaves room for the per-layer graphs). megatron's per-call TP-group warning, which would
    break every layer's graph, is quietened by the registered workaround `megatron.compile.quiet_tp_group_lookup`
    (patches/torch_compile.py)."""
    import torch._dynamo

    torch._dynamo.config.disable = False
    # result.json's compile stats (graph breaks, graphs) are this run's: not an earlier run's in this process (a
    # sweep point)
    torch._dynamo.utils.counters.clear()


def leave_room(layers: int) -> None:
    """dynamo compiles a code object at most recompile_limit times, then runs it uncompiled, silently but for a
    warning. The layers share their code objects, and guards specialise on per-layer attributes (megatron-core
    0.16.1's MoE layer on its router's layer_number: one graph per MoE layer), with a few one-time recompiles besides
    (the aux-loss tracker's first entry, the loss scale's first set): room for two graphs a layer and 16 more, and
    never less than 64."""
    import torch._dynamo

    need = max(64, 2 * layers + 16)
    cfg = torch._dynamo.config  # the names since torch 2.6; cache_size_limit and its accumulated twin are aliases
    cfg.recompile_limit = max(cfg.recompile_limit, need)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 8 * need)


def compile_layers(model, before: int = 0) -> int:
    """torch.compile each TransformerLayer of one GPTModel chunk (decoder and MTP layers), with room for them and the
    `before` layers of earlier chunks in dynamo's recompile limit; returns how many."""
    n = 0
    decoder = getattr(model, "decoder", None)
    for layer in (decoder.layers if decoder is not None else []):
        layer.compile()
        n += 1
    leave_room(before + n)
    return n


def _cross_entropy(labels, logits):
    """megatron's compute_language_model_loss contract: labels [b, s], logits [s, b, V] -> per-token loss [b, s]."""
    s, b, v = logits.shape
    loss = torch.nn.functional.cross_entropy(logits.float().view(s * b, v), labels.transpose(0, 1).reshape(-1),
                                             reduction="none")
    return loss.view(s, b).transpose(0, 1).contiguous()


def compile_loss(model) -> bool:
    """Route one GPTModel chunk's LM loss through a compiled cross entropy (see the module doc); True if done.
    Called when args["compile_loss"] (args.compiled_loss: compile on, tp = 1, no megatron fused cross entropy)."""
    if not getattr(model, "post_process", False):
        return False
    model.compute_language_model_loss = torch.compile(_cross_entropy, dynamic=False)
    return True


def _turbo_cross_entropy(labels, logits):
    """compute_language_model_loss through primus.turbo.cross_entropy (labels [b, s], logits [s, b, V] -> [b, s]);
    the backward overwrites the logits with their gradient."""
    from primus.turbo.cross_entropy import cross_entropy

    s, b, v = logits.shape
    loss = cross_entropy(logits.reshape(s * b, v), labels.transpose(0, 1).reshape(-1), inplace_backward=True)
    return loss.view(s, b).transpose(0, 1).contiguous()


def turbo_loss(model) -> bool:
    """Route one GPTModel chunk's LM loss (and its MTP losses) through the Triton cross entropy; True if done.
    Called when args["turbo_loss"] (args.turbo_loss: model.cross_entropy_fusion_impl=turbo, checked for tp = 1)."""
    if not getattr(model, "post_process", False):
        return False
    model.compute_language_model_loss = _turbo_cross_entropy
    return True


def _torch_optimizers(opt) -> Iterable[torch.optim.Optimizer]:
    for sub in getattr(opt, "chained_optimizers", None) or [opt]:
        inner = getattr(sub, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            yield inner


def fused_adamw(opt) -> List[str]:
    """Switch megatron's torch AdamW/Adam param groups to the fused implementation where torch has it for the
    parameters' device and dtype; returns the optimizers switched (class names)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    done = []
    for o in _torch_optimizers(opt):
        if type(o) not in (torch.optim.AdamW, torch.optim.Adam):
            continue
        params = [p for g in o.param_groups for p in g["params"]]
        if any(o.state.get(p) for p in params):
            continue  # already stepped: its state layout (step tensors) was built for the old implementation
        if not params or not all(p.device.type in devices and p.dtype in (torch.float32, torch.bfloat16, torch.float16)
                                 for p in params):
            continue
        for g in o.param_groups:
            if g.get("differentiable") or g.get("capturable"):
                break
        else:
            for g in o.param_groups:
                g["foreach"] = False
                g["fused"] = True
            done.append(type(o).__name__)
    return done
