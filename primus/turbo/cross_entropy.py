"""Cross entropy over big vocabularies (Triton), forward and backward, as torch custom ops (the LM loss).

    loss = cross_entropy(logits, labels, ignore_index=-100)     logits (N, V) bf16/fp16/fp32, labels (N,) int
    loss[i] = logsumexp(logits[i]) - logits[i, labels[i]]        (N,) fp32, reduction none; 0 where ignored

Forward: one program per row walks the row in BLOCK-wide chunks (online max / sum-exp in fp32, base-2
exponentials, one cross-lane max per chunk, the sum reduced once at the end), then reads the label's logit; it
writes the loss and the row's log-sum-exp (fp32, N each). Backward: a (row, chunk) grid re-reads the logits and
the lse and writes dlogits = (softmax - onehot) * dloss in the logits' dtype. Rows whose label is ignore_index
read nothing and get loss 0 and gradient 0; any other label outside [0, V) gives a NaN loss (loud, not clamped).
Offsets are int64 (N * V passes 2^31 at the LM shapes).
Bytes (logits of b bytes per entry): fwd N*V*b read; bwd N*V*b read + N*V*b written: the floor for a loss whose
backward needs the logits. Llama-3.2-1B bench (N = 32768, V = 128256, bf16): 8.4 GB fwd, 16.8 GB bwd; on the
H200 fwd 2.2 ms, fwd+bwd 6.4 ms (~92% of the copy bandwidth; torch.compile'd F.cross_entropy 4.9 / 9.8 ms).
inplace_backward=True writes the gradient into the logits' own storage (eager autograd on a non-leaf only; see
_can_write_in_place for when it falls back): the (N, V) gradient buffer is never allocated, 8.4 GB less peak at the bench shape. The logits
must not be read after the backward (megatron drops them once the loss is computed); an autograd node that saved
them and runs its backward later fails loudly on the version counter, as for any in-place op.
Being custom ops with fake and autograd implementations, torch.compile keeps them as single opaque nodes.
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from primus.turbo import _common

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# launch shapes, swept on the H200 at N = 32768, V = 128256 bf16 (copy bandwidth 4.25 TB/s read + written):
# fwd 4096 x 8 warps 2.16 ms (3.89 TB/s read; 8192 x 8 the same, 16 warps 2.5-2.7 ms, 16384 3.4 ms; per-lane running
# maxima instead of one max per chunk 2.34 ms); bwd 2048 x 4 warps 4.24 ms (3.96 TB/s; 4096 / 8192 4.29-4.34 ms)
FWD_BLOCK, FWD_WARPS = 4096, 8
BWD_BLOCK, BWD_WARPS = 2048, 4


@triton.jit
def _ce_fwd(X, LBL, LOSS, LSE, V, s_x, ignore_index, NCHUNK, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = X + row * s_x
    label = tl.load(LBL + row).to(tl.int64)
    keep = label != ignore_index
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)  # running max (log2 units)
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # per-lane sum of 2^(x - m)
    for i in range(0, tl.where(keep, NCHUNK, 0)):  # an ignored row reads nothing
        c = i * BLOCK + cols
        x = tl.load(base + c, mask=c < V, other=float("-inf")).to(tl.float32) * LOG2E
        m_new = tl.maximum(m, tl.max(x, axis=0))
        acc = acc * tl.exp2(m - m_new) + tl.exp2(x - m_new)
        m = m_new
    lse = (tl.where(keep, m, 0.0) + tl.log2(tl.where(keep, tl.sum(acc, axis=0), 1.0))) * LN2  # ignored: 0
    valid = (label >= 0) & (label < V)
    xt = tl.load(base + tl.where(valid, label, 0), mask=valid & keep, other=0.0).to(tl.float32)
    loss = tl.where(valid, lse - xt, float("nan"))
    tl.store(LOSS + row, tl.where(keep, loss, 0.0))
    tl.store(LSE + row, lse)


@triton.jit
def _ce_bwd(X, LBL, LSE, DL, DX, V, s_x, s_dl, s_dx, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = c < V
    label = tl.load(LBL + row).to(tl.int64)
    keep = label != ignore_index
    lse2 = tl.load(LSE + row) * LOG2E
    dl = tl.load(DL + row * s_dl).to(tl.float32)
    x = tl.load(X + row * s_x + c, mask=cmask & keep, other=0.0).to(tl.float32)
    p = tl.exp2(x * LOG2E - lse2)
    g = (p - tl.where(c == label, 1.0, 0.0)) * dl
    g = tl.where(keep, g, 0.0)
    tl.store(DX + row * s_dx + c, g.to(DX.dtype.element_ty), mask=cmask)


def _check(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"cross_entropy: logits must be (N, V), got {tuple(logits.shape)}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"cross_entropy: logits dtype {logits.dtype} (bf16, fp16 or fp32)")
    if labels.shape != (logits.shape[0],) or labels.dtype.is_floating_point:
        raise ValueError(f"cross_entropy: labels must be integers of shape ({logits.shape[0]},), "
                         f"got {labels.dtype} {tuple(labels.shape)}")
    if logits.shape[1] == 0:
        raise ValueError("cross_entropy: empty vocabulary")


def _fwd(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> Tuple[torch.Tensor, torch.Tensor]:
    N, V = logits.shape
    loss = _common.empty((N,), torch.float32, logits.device)
    lse = _common.empty((N,), torch.float32, logits.device)
    if N:
        block = min(FWD_BLOCK, triton.next_power_of_2(V))
        _ce_fwd[(N,)](logits, labels, loss, lse, V, logits.stride(0), ignore_index, triton.cdiv(V, block),
                      BLOCK=block, num_warps=FWD_WARPS if block >= 2048 else 4)
    return loss, lse


def _bwd_into(out: torch.Tensor, dloss: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
              ignore_index: int) -> torch.Tensor:
    """dlogits into `out` ((N, V), unit column stride; may be `logits` itself: each element is read, then written,
    by the same program)."""
    N, V = logits.shape
    if N:
        block = min(BWD_BLOCK, triton.next_power_of_2(V))
        _ce_bwd[(N, triton.cdiv(V, block))](logits, labels, lse, dloss, out, V, logits.stride(0), dloss.stride(0),
                                            out.stride(0), ignore_index, BLOCK=block,
                                            num_warps=BWD_WARPS if block >= 1024 else 4)
    return out


# ------------------------------------------------------------------ the op pair

@torch.library.custom_op("primus::cross_entropy", mutates_args=())
def _ce_op(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int,
           inplace_backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): lse is the row's log-sum-exp, kept for the backward (no gradient flows through it)."""
    return _fwd(logits, labels, ignore_index)


@_ce_op.register_fake
def _(logits, labels, ignore_index, inplace_backward):
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=torch.float32), logits.new_empty((n,), dtype=torch.float32)


@torch.library.custom_op("primus::cross_entropy_bwd", mutates_args=())
def _ce_bwd_op(dloss: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
               ignore_index: int) -> torch.Tensor:
    out = _common.empty(logits.shape, logits.dtype, logits.device)
    return _bwd_into(out, dloss, logits, lse, labels, ignore_index)


@_ce_bwd_op.register_fake
def _(dloss, logits, lse, labels, ignore_index):
    return logits.new_empty(logits.shape)


def _setup(ctx, inputs, output):
    logits, labels, ignore_index, inplace_backward = inputs
    _, lse = output
    ctx.save_for_backward(logits, lse, labels)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero "gradient" for lse (a fill kernel per backward)
    ctx.ignore_index = ignore_index
    ctx.inplace = inplace_backward


def _can_write_in_place(logits: torch.Tensor) -> bool:
    """Eager autograd on plain dense tensors only: not while torch.compile / export traces (fake or functional
    tensors, where a mutation of a saved activation would be functionalised anyway), not under create_graph (a
    double backward would need the logits), not on overlapping or strided rows, and not on a leaf (the caller's
    own data, not an activation; its .grad would alias it)."""
    return (type(logits) is torch.Tensor and not torch.compiler.is_compiling() and not torch.is_grad_enabled()
            and not logits.is_leaf and logits.is_contiguous())


def _backward(ctx, dloss, dlse):
    if dloss is None:  # the loss was not used
        return None, None, None, None
    logits, lse, labels = ctx.saved_tensors  # the version check on logits happens here, before any write
    if ctx.inplace and _can_write_in_place(logits):
        out = logits.detach()
        _bwd_into(out, dloss, out, lse, labels, ctx.ignore_index)
        torch.autograd.graph.increment_version(out)  # later readers of the saved logits fail loudly
        return out, None, None, None
    return _ce_bwd_op(dloss, logits, lse, labels, ctx.ignore_index), None, None, None


_ce_op.register_autograd(_backward, setup_context=_setup)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                  inplace_backward: bool = False) -> torch.Tensor:
    """Per-row cross entropy (reduction none, fp32) of (N, V) logits; gradient wrt the logits only, in their dtype.
    inplace_backward: the backward writes the gradient into the logits' storage (see the module doc)."""
    _check(logits, labels)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    labels = labels.contiguous()
    return _ce_op(logits, labels, int(ignore_index), bool(inplace_backward))[0]


def cross_entropy_reference(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """F.cross_entropy in the logits' precision raised to at least fp32 (float64 stays float64)."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    return torch.nn.functional.cross_entropy(x, labels, ignore_index=ignore_index, reduction="none")
