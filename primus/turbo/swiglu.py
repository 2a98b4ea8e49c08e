"""SwiGLU (Triton), forward and backward, with or without per-row probabilities, as torch custom ops.

    y = swiglu(h)                    h (..., 2F) = [gate | up]  ->  silu(gate) * up
    y = swiglu_with_probs(h, probs)  probs one value per row    ->  silu(gate) * up * probs   (MoE experts)

Forward reads h once and writes y; backward reads h and dy once and writes dh (and dprobs, reduced in-kernel).
Bytes: fwd 3*T*F*b, bwd 5*T*F*b: the floor.

`swiglu_fwd_amax(h)` / `swiglu_bwd_amax(dy, h)` also give max |output| (of the rounded values), as the partial
maxima a tensorwise fp8 cast reduces (`fp8_linear.cast_tensorwise(..., amax=)`): each program atomically maxes its
own into one of AMAX_SLOTS slots. The fused fp8 MLP (fp8_mlp.py) casts y and dh with them, so those casts skip
their amax pass, a whole read of a [T, F] / [T, 2F] tensor each. Being custom ops (torch.library) with registered fake and autograd
implementations, torch.compile keeps them inside a compiled graph as single nodes: no graph break around the
activation of a compiled layer (inductor's own SwiGLU backward, with the [gate | up] gradient assembled through a
cat, ran at about half the copy bandwidth on the H200).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from primus.turbo import _common


@triton.jit
def _swiglu_fwd(H, P, Y, AMAX, N, F, s_h, HAS_P: tl.constexpr, BLOCK: tl.constexpr, WANT_AMAX: tl.constexpr,
                NS: tl.constexpr):
    """Y (T, F) contiguous, walked flat: a program per BLOCK consecutive output elements, its rows and columns from
    the flat index (inductor's shape for this op: every program streams whole contiguous runs of Y and of h's
    gate / up halves, whatever F is)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    r = i // F
    c = i - r * F
    hp = H + r * s_h + c
    gate = tl.load(hp, mask=m, other=0.0).to(tl.float32)
    up = tl.load(hp + F, mask=m, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    if HAS_P:
        y = y * tl.load(P + r, mask=m, other=0.0).to(tl.float32)
    y = y.to(Y.dtype.element_ty)
    tl.store(Y + i, y, mask=m)
    if WANT_AMAX:  # of the stored (rounded) values, as the cast's own amax pass would read them; masked ones are 0
        tl.atomic_max(AMAX + tl.program_id(0) % NS, tl.max(tl.abs(y.to(tl.float32)), axis=0), sem="relaxed")


@triton.jit
def _swiglu_bwd(H, P, DY, DH, DP, AMAX, T, F, s_h, s_dy, s_dh, NCHUNK, HAS_P: tl.constexpr, BT: tl.constexpr,
                BF: tl.constexpr, WANT_AMAX: tl.constexpr, NS: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rmask = rows < T
    r64 = rows[:, None].to(tl.int64)
    if HAS_P:
        p = tl.load(P + rows, mask=rmask, other=0.0).to(tl.float32)
    dp = tl.zeros((BT,), dtype=tl.float32)
    am = tl.zeros((BT, BF), dtype=tl.float32)
    for i in range(0, NCHUNK):
        cols = i * BF + tl.arange(0, BF)
        m = rmask[:, None] & (cols[None, :] < F)
        gate = tl.load(H + r64 * s_h + cols[None, :], mask=m, other=0.0).to(tl.float32)
        up = tl.load(H + r64 * s_h + F + cols[None, :], mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64 * s_dy + cols[None, :], mask=m, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-gate))
        silu = gate * sig
        if HAS_P:
            dp += tl.sum(dy * silu * up, axis=1)
            dy = dy * p[:, None]
        dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
        dup = dy * silu
        dgate = dgate.to(DH.dtype.element_ty)
        dup = dup.to(DH.dtype.element_ty)
        tl.store(DH + r64 * s_dh + cols[None, :], dgate, mask=m)
        tl.store(DH + r64 * s_dh + F + cols[None, :], dup, mask=m)
        if WANT_AMAX:  # masked lanes are 0
            am = tl.maximum(am, tl.maximum(tl.abs(dgate.to(tl.float32)), tl.abs(dup.to(tl.float32))))
    if HAS_P:
        tl.store(DP + rows, dp, mask=rmask)
    if WANT_AMAX:
        tl.atomic_max(AMAX + tl.program_id(0) % NS, tl.max(tl.max(am, axis=1), axis=0), sem="relaxed")


def _rows(h: torch.Tensor) -> torch.Tensor:
    h2 = h.reshape(-1, h.shape[-1])
    return h2 if h2.stride(1) == 1 else h2.contiguous()


# The forward in 2-D tiles ([rows x 1024-2048 columns], any config) read 0.97x torch.compile at T=32768, F=8192
# bf16 (GPU time 0.380 vs 0.368 ms, 99.7% vs 103% of copy bandwidth: a 2:1 read:write stream beats the 1:1 copy);
# walked flat like inductor's kernel, 0.3683 ms, 1.000x (H200, 2026-12-01). Autotuned per (N, F).
_FWD = _common.Tuned(_swiglu_fwd, [
    {"BLOCK": 2048, "num_warps": 8}, {"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 4096, "num_warps": 8},
    {"BLOCK": 1024, "num_warps": 8}, {"BLOCK": 4096, "num_warps": 16},
], key=["N", "F"])


AMAX_SLOTS = 64  # atomic-max slots of the amax outputs (programs hash into them: less contention than one)


def amax_slots(device) -> torch.Tensor:
    return torch.zeros(AMAX_SLOTS, dtype=torch.float32, device=device)


def _fwd(h: torch.Tensor, p, config=None, amax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """config: one entry of _FWD's space (tests); None = the tuned choice (the interpreter: the space's first).
    amax: AMAX_SLOTS zeros (amax_slots), maxed with |y| by the kernel."""
    h2 = _rows(h)
    T, F2 = h2.shape
    if F2 % 2:
        raise ValueError(f"swiglu: last dim {F2} must be even ([gate | up])")
    F = F2 // 2
    y = _common.empty((T, F), h.dtype, h.device)
    if T and F:
        args = (h2, p if p is not None else h2, y, amax if amax is not None else y, T * F, F, h2.stride(0))
        consts = dict(HAS_P=p is not None, WANT_AMAX=amax is not None, NS=AMAX_SLOTS)

        def grid(meta):
            return (triton.cdiv(T * F, meta["BLOCK"]),)

        if config is not None:
            _FWD.run(config, grid, args, **consts)
        else:  # (tuning re-runs the kernel: its amax atomics are a max, the same on every run)
            _FWD.launch(grid, args, **consts)
    return y.view(*h.shape[:-1], F)


def _bwd(dy: torch.Tensor, h: torch.Tensor, p, amax: Optional[torch.Tensor] = None):
    h2 = _rows(h)
    T, F2 = h2.shape
    F = F2 // 2
    dy2 = dy.reshape(T, F)
    if dy2.stride(1) != 1:
        dy2 = dy2.contiguous()
    dh = _common.empty((T, F2), h.dtype, h.device)
    dp = _common.empty((T,), torch.float32, h.device) if p is not None else None
    if T and F:
        BF = min(512, triton.next_power_of_2(F))
        BT = max(1, 1024 // BF)
        _swiglu_bwd[(triton.cdiv(T, BT),)](h2, p if p is not None else h2, dy2, dh, dp if dp is not None else dh,
                                           amax if amax is not None else dh, T, F, h2.stride(0), dy2.stride(0),
                                           dh.stride(0), triton.cdiv(F, BF), HAS_P=p is not None, BT=BT, BF=BF,
                                           WANT_AMAX=amax is not None, NS=AMAX_SLOTS, num_warps=4)
    return dh.view(h.shape), dp


def swiglu_fwd_amax(h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y = silu(gate) * up, amax slots: max over them = max |y|). No autograd (fp8_mlp's ops call it)."""
    amax = amax_slots(h.device)
    return _fwd(h, None, amax=amax), amax


def swiglu_bwd_amax(dy: torch.Tensor, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dh, amax slots: max over them = max |dh|) for y = swiglu(h). No autograd."""
    amax = amax_slots(h.device)
    return _bwd(dy, h, None, amax=amax)[0], amax


# ------------------------------------------------------------------ one torch op pair: probs optional (None = 1)

@torch.library.custom_op("primus::swiglu", mutates_args=())
def _swiglu_op(h: torch.Tensor, probs: Optional[torch.Tensor]) -> torch.Tensor:
    return _fwd(h, probs)


@_swiglu_op.register_fake
def _(h, probs):
    return h.new_empty((*h.shape[:-1], h.shape[-1] // 2))


@torch.library.custom_op("primus::swiglu_bwd", mutates_args=())
def _swiglu_bwd_op(dy: torch.Tensor, h: torch.Tensor,
                   probs: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    dh, dp = _bwd(dy, h, probs)
    return dh, (dp if dp is not None else h.new_empty(0, dtype=torch.float32))  # no probs: an empty dp


@_swiglu_bwd_op.register_fake
def _(dy, h, probs):
    return torch.empty_like(h), h.new_empty(probs.shape if probs is not None else (0,), dtype=torch.float32)


def _setup(ctx, inputs, output):
    h, probs = inputs
    ctx.save_for_backward(h, probs)
    ctx.p_meta = None if probs is None else (probs.shape, probs.dtype)


def _backward(ctx, dy):
    h, p = ctx.saved_tensors
    dh, dp = _swiglu_bwd_op(dy, h, p)
    if ctx.p_meta is None:
        return dh, None
    shape, dtype = ctx.p_meta
    return dh, dp.to(dtype).view(shape)


_swiglu_op.register_autograd(_backward, setup_context=_setup)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[..., :F]) * h[..., F:] (fused fwd + bwd; a single node under torch.compile)."""
    return _swiglu_op(h, None)


def swiglu_with_probs(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """silu(h[..., :F]) * h[..., F:] * probs[..., None]  (fused fwd + bwd; probs one value per row)."""
    T = h.numel() // h.shape[-1] if h.shape[-1] else 0
    if probs.numel() != T:
        raise ValueError(f"probs must have one value per row of h ({T}), got {tuple(probs.shape)}")
    return _swiglu_op(h, probs.reshape(-1).contiguous())


def swiglu_reference(h):
    gate, up = h.chunk(2, dim=-1)
    y = torch.nn.functional.silu(gate.float()) * up.float()
    return y.to(h.dtype) if h.dtype != torch.float64 else y.double()


def swiglu_with_probs_reference(h, probs):
    gate, up = h.chunk(2, dim=-1)
    y = torch.nn.functional.silu(gate.float()) * up.float() * probs.reshape(*h.shape[:-1], 1).float()
    return y.to(h.dtype) if h.dtype != torch.float64 else y.double()
