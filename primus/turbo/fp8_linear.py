"""fp8 linear without Transformer Engine: Triton cast kernels with fused amax/scale + fp8 GEMMs, fwd and bwd.

    y = fp8_linear(x, weight, bias, recipe="tensorwise")   # autograd: dgrad and wgrad also in fp8
    FP8Linear(in, out, recipe=...)                          # drop-in nn.Linear (same parameters / state_dict)
    swap_linears_to_fp8(model, recipe, filter_fqns)         # in place, returns the swapped module names

Recipes ("current scaling": the scale comes from this tensor's own amax, except delayed):
  tensorwise  one scale per tensor. Per tensor: one amax pass (per-program partial maxima, no atomics, no host
              sync) + one cast pass that reduces the partials and computes the scale inside the kernel, writing the
              fp8 tensor AND its transpose (the layout the backward GEMM needs) in the same pass. GEMMs:
              torch._scaled_mm (cuBLASLt / hipBLASLt).
  delayed     Transformer Engine's DelayedScaling, per tensor: the scale comes from the amax history of the
              earlier calls of the same operand (x, weight, dy of one linear; `DelayedScaling`: history length,
              margin, "max" | "most_recent"), so the cast is ONE pass: it writes fp8 (and the transpose) and feeds
              this tensor's amax into a few spread slots in the same kernel (relaxed atomic max); a one-program
              kernel after it pushes that amax into the history and computes the next call's scale. Two kernels
              per call, all on the device: no host sync, no host-side call counter (it runs as a custom op inside
              compiled graphs: fp8_ops). The first call of each operand takes its scale from its own amax (an
              amax pass, launched until the host has launched that first cast: AmaxHistory.primed) instead of
              TE's initial scale 1, which would flush the first step's gradients to zero. Saves the amax pass of
              tensorwise (one read of every operand). Activation recompute replays a forward inside the
              backward: a replayed cast reuses the operand's last scale and records nothing
              (`replaying_forward`), so a history counts each forward once and, without pipelining, the replay
              is bit-identical to the forward it repeats (TE keeps the forward's scales for its recompute too).
  rowwise     one scale per row of each GEMM operand along the contraction dim (torchao's "rowwise"): each
              operand is quantised once per GEMM it feeds (x along K for fprop, along M for wgrad...). One kernel
              per cast: amax and cast in the same program (the row chunk is re-read from L2). torch._scaled_mm
              with (M,1) x (1,N) scales.
  blockwise   DeepSeek-V3 / Megatron: activations and grads 1x128 groups, weights 128x128 tiles. One cast kernel
              per operand, reading it once (coalesced) and writing the fp8 layouts the GEMMs need: x (M, K) and
              x^T (K, M) together in the forward (x^T saved for the wgrad); W (N, K) and W^T (K, N); dy (M, N)
              and dy^T (N, M) together; the token dim padded to 128. x and x^T, dy and dy^T (16-bit, 16-aligned
              rows, NVIDIA GPUs): fp8_cast_gluon's Gluon kernel (the transpose in registers; the same bytes).
              Scales are written in the layout torch.nn.functional.scaled_mm takes (blockwise_scale_layout).
              GEMMs: torch.nn.functional.scaled_mm (cuBLASLt 1x128 / 128x128 block scaling) on CUDA sm90 with
              CUDA >= 12.9 for e4m3 x e4m3 with the contraction dim a multiple of 128; else this file's Triton
              kernel applying the per-block scales inside the K loop (ROCm, the interpreter, other GPUs, e5m2
              gradients). `blockwise_gemm_provider(device)` / `blockwise_gemms(...)` say which; the choice is
              logged once per shape.
Weight casts: with WEIGHT_CASTS enabled (the megatron trainer, precision.fp8_weight_cache) a weight is cast once per
step and its fp8 forms reused by the step's other micro batches and recompute's replays; the trainer clears it.
Formats: e4m3 everywhere, or "hybrid" (e4m3 forward, e5m2 gradients). On MI300 (gfx942) the fnuz variants are used.
fp8 GEMM needs K and N (in/out features) multiples of 16; the token dim M is padded to 16 (blockwise: 128) where it
is the contraction dim (wgrad) by the cast kernels themselves (they write zeros in the pad).
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, List, Optional, Sequence

import torch
import triton
import triton.language as tl
from torch import nn

from primus.turbo import _common, fp8_cast_gluon

log = logging.getLogger("primus.turbo")

from primus.features.precision import PORTABLE_AMAX_ALGOS, gpu_has_fp8  # noqa: E402
from primus.features.precision import PORTABLE_FP8_RECIPES as RECIPES  # noqa: E402
_DEVICE_WORDS = ("cpu", "cuda", "rocm")
GROUP = 128  # blockwise group / tile edge
_PARTS = 1024  # max programs of the amax pass (its partial maxima fit one load of the cast kernel)


# -------------------------------------------------------------------------------------------------- availability


def fp8_dtypes(device=None):
    """(forward dtype, e5m2 dtype) for this device: the fnuz variants on MI300 (gfx942), OCP fp8 elsewhere."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.version.hip is not None:
        arch = getattr(torch.cuda.get_device_properties(dev), "gcnArchName", "")
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz, torch.float8_e5m2fnuz
    return torch.float8_e4m3fn, torch.float8_e5m2


def fp8_formats(device, fmt: str):
    """(forward dtype, gradient dtype) of an fp8 format on this device: "e4m3" everywhere, or "hybrid" (e5m2
    gradients)."""
    f_dt, e5 = fp8_dtypes(device)
    return f_dt, (e5 if fmt == "hybrid" else f_dt)


def _gpu_has_fp8(dev: torch.device) -> bool:
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.version.hip is not None:
        return gpu_has_fp8("rocm", gcn_arch=getattr(torch.cuda.get_device_properties(dev), "gcnArchName", ""))
    return gpu_has_fp8("cuda", torch.cuda.get_device_capability(dev))


def fp8_linear_available(recipe_or_device=None, device=None, recipe: Optional[str] = None) -> bool:
    """Can this fp8 linear run `recipe` on `device` here? Accepts `(device)`, `(recipe)` or `(recipe, device)`.

    Device None = "cuda" when a GPU is present. CPU answers True only under TRITON_INTERPRET=1 (kernel tests)."""
    if recipe_or_device is not None:
        s = str(recipe_or_device)
        if isinstance(recipe_or_device, torch.device) or s.split(":")[0] in _DEVICE_WORDS:
            device = device or recipe_or_device
        else:
            recipe = recipe or s
    recipe = getattr(recipe, "value", recipe)
    if recipe is not None and recipe not in RECIPES:
        return False
    if not hasattr(torch, "_scaled_mm"):
        return False
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device("cuda" if str(device) == "rocm" else device)
    if dev.type == "cpu":
        return _common.interpreting()
    return _gpu_has_fp8(dev)


def fp8_shape_ok(in_features: int, out_features: int) -> bool:
    """fp8 GEMMs (cuBLASLt / hipBLASLt) need K and N multiples of 16."""
    return in_features % 16 == 0 and out_features % 16 == 0


# ------------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _absmax_partial(X, PART, n, ITERS, META, SC, FP8_MAX, MARGIN_MULT, BLOCK: tl.constexpr,
                    DELAYED: tl.constexpr):
    """PART[pid] = max |X| over this program's blocks.
    DELAYED (delayed scaling; launched until the host knows the operand's first cast ran, AmaxHistory.primed): X
    is read only while META[0] (the operand's call count) is 0, and the last program to finish turns the partials
    into the first call's scale (SC[0]): the first call takes its scale from its own amax. Later calls read nothing."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    todo = n
    first = True
    if DELAYED:
        first = tl.load(META) == 0
        todo = tl.where(first, n, 0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, ITERS):
        offs = (pid + i * nprog).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < todo, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(x))
    tl.store(PART + pid, tl.max(acc, axis=0))
    if DELAYED:
        if first:
            if _last_to_arrive(META + 1, nprog):
                p = tl.load(PART + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < nprog, other=0.0,
                            cache_modifier=".cg")
                amax = tl.max(p, axis=0)
                tl.store(SC, _delayed_scale(amax, FP8_MAX, MARGIN_MULT))
                tl.store(META + 1, 0)


@triton.jit
def _delayed_scale(amax, FP8_MAX, MARGIN_MULT):
    """TE's delayed scale from an amax: fp8_max / amax / 2^margin (1 for an all-zero tensor)."""
    return tl.where(amax > 0.0, FP8_MAX / tl.maximum(amax, 1e-30) * MARGIN_MULT, 1.0)


@triton.jit
def _last_to_arrive(COUNT, nprog):
    """Whether this program is the last of the nprog to get here. The barrier orders every thread's earlier stores
    and atomics before the counting atomic (acq_rel), so the last program sees every program's results; the last
    program resets COUNT for the next launch (in its epilogue)."""
    tl.debug_barrier()
    return tl.atomic_add(COUNT, 1, sem="acq_rel") == nprog - 1


@triton.jit
def _delayed_next_scale(n, used, HIST, AMAX, SC, META, L, FP8_MAX, MARGIN_MULT, MOST_RECENT: tl.constexpr,
                        LB: tl.constexpr, NS: tl.constexpr):
    """After delayed-scaling cast n (_delayed_advance): push this call's amax (AMAX, the NS slots the programs'
    atomics filled) into the history, turn the history into call n+1's scale, keep the scale this call `used`
    (a replayed forward's), zero AMAX, count the call. TE semantics: scale = fp8_max / max(history) / 2^margin
    ("max") or fp8_max / the last amax ("most_recent"). One dependent round trip: the loads are independent."""
    s = tl.arange(0, NS)
    cur = tl.max(tl.load(AMAX + s, cache_modifier=".cg"), axis=0)
    idx = tl.arange(0, LB)
    slot = n % L
    # every slot but the one this call's amax overwrites
    hmax = tl.max(tl.load(HIST + idx, mask=(idx < L) & (idx != slot), other=0.0), axis=0)
    if MOST_RECENT:
        amax = cur
    else:
        amax = tl.maximum(hmax, cur)
    tl.store(SC, _delayed_scale(amax, FP8_MAX, MARGIN_MULT))
    tl.store(SC + 1, used)
    tl.store(HIST + slot, cur)
    tl.store(AMAX + s, tl.zeros((NS,), dtype=tl.float32))
    tl.store(META, n + 1)


@triton.jit
def _cast_tensorwise(X, PART, Y, YT, SINV, AMAX, R, C, RP, stride_xr, NPART, FP8_MAX,
                     NP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                     WRITE_Y: tl.constexpr, WRITE_T: tl.constexpr, DELAYED: tl.constexpr, NS: tl.constexpr,
                     RECORD: tl.constexpr):
    """DELAYED: PART is the state's [scale of this call, scale of the last recorded call]. RECORD: a recorded
    call, cast with the first; each program also max-es its tile's amax into AMAX's NS slots, which _delayed_advance
    (launched after this kernel) turns into the history and the next call's scale. RECORD off: a replayed forward,
    cast with the second, the state left as it is."""
    if DELAYED:
        if RECORD:
            scale = tl.load(PART)
        else:
            scale = tl.load(PART + 1)
    else:  # scale from the amax partials (reduced here: no separate amax-reduce / scale kernel, no host sync)
        p = tl.load(PART + tl.arange(0, NP), mask=tl.arange(0, NP) < NPART, other=0.0)
        amax = tl.max(p, axis=0)
        scale = FP8_MAX / tl.maximum(amax, 1e-12)
    # Tile order. After the amax pass (tensorwise, a 1-D grid): reversed row-major, the last rows first, the bytes
    # that pass (a grid-stride loop) read last and L2 still holds (H200, GPU time: 1.03-1.06x the
    # column-strip order at 4096-14336 rows). Alone (delayed, a 2-D grid): column strips, down the rows (a 1-D
    # grid, either order, made its cast ~4% slower on the H200).
    if DELAYED:
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
    else:
        nc = tl.cdiv(C, BC)
        t = tl.num_programs(0) - 1 - tl.program_id(0)
        pid_r = t // nc
        pid_c = t % nc
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    inb = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=inb, other=0.0).to(tl.float32)
    y = tl.clamp(x * scale, -FP8_MAX, FP8_MAX)
    if WRITE_Y:  # (RP, C); rows R..RP-1 are the zero pad
        pmask = (rows[:, None] < RP) & (cols[None, :] < C)
        tl.store(Y + rows[:, None].to(tl.int64) * C + cols[None, :], y.to(Y.dtype.element_ty), mask=pmask)
    if WRITE_T:  # (C, RP) row-major; rows R..RP-1 are the zero pad
        tmask = (rows[:, None] < RP) & (cols[None, :] < C)
        tl.store(YT + cols[None, :].to(tl.int64) * RP + rows[:, None], y.to(YT.dtype.element_ty), mask=tmask)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(SINV, 1.0 / scale)
    if DELAYED and RECORD:  # this tensor's amax, for the next call's scale; NS slots (less contention)
        # Relaxed, and no arrival count: the kernel boundary orders these atomics before _delayed_advance. An
        # earlier version had the last program to arrive (an acq_rel count after the stores) compute the next scale in this
        # kernel; every program then waited for its stores to land: the cast ran 1.16-1.19x slower than now, from
        # 4096x4096 to 8192x28672 (H200, 2026-12-01).
        tile_amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        tl.atomic_max(AMAX + (pid_r * tl.num_programs(1) + pid_c) % NS, tile_amax, sem="relaxed")


@triton.jit
def _delayed_advance(SC, AMAX, META, HIST, L, FP8_MAX, MARGIN_MULT, MOST_RECENT: tl.constexpr, LB: tl.constexpr,
                     NS: tl.constexpr):
    """One program, launched after a recorded delayed cast: move the operand's state on (_delayed_next_scale) with
    the scale that cast used (SC[0])."""
    _delayed_next_scale(tl.load(META), tl.load(SC), HIST, AMAX, SC, META, L, FP8_MAX, MARGIN_MULT, MOST_RECENT, LB,
                        NS)


@triton.jit
def _cast_rowwise(X, Y, SINV, R, C, RP, CP, stride_xr, stride_xc, stride_yr, stride_yc, FP8_MAX,
                  BR: tl.constexpr, BC: tl.constexpr):
    """Quantise each row of the (R, C) view along C; output (RP, CP) (rows >= R, cols >= C: zero pad), scales (RP,)."""
    NCHUNK = tl.cdiv(CP, BC)
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    rmask = rows < R
    pmask = rows < RP
    r64 = rows[:, None].to(tl.int64)
    # (names in the one-chunk branch differ from the loop's: Triton requires a name set in both branches of a
    # runtime `if` to have one type, and only `scale` leaves the branches)
    if NCHUNK == 1:  # the whole (padded) row in one tile: read once, amax and cast from registers
        c1 = tl.arange(0, BC)
        xf = tl.load(X + r64 * stride_xr + c1[None, :].to(tl.int64) * stride_xc,
                     mask=rmask[:, None] & (c1[None, :] < C), other=0.0).to(tl.float32)
        scale = FP8_MAX / tl.maximum(tl.max(tl.abs(xf), axis=1), 1e-12)
        q = tl.clamp(xf * scale[:, None], -FP8_MAX, FP8_MAX)
        tl.store(Y + r64 * stride_yr + c1[None, :].to(tl.int64) * stride_yc, q.to(Y.dtype.element_ty),
                 mask=pmask[:, None] & (c1[None, :] < CP))
    else:  # chunks along the row: an amax pass, then the cast pass (the chunks re-read, mostly from L2)
        amax = tl.zeros((BR,), dtype=tl.float32)
        for i in range(0, NCHUNK):
            cols = i * BC + tl.arange(0, BC)
            m = rmask[:, None] & (cols[None, :] < C)
            x = tl.load(X + r64 * stride_xr + cols[None, :].to(tl.int64) * stride_xc, mask=m, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        scale = FP8_MAX / tl.maximum(amax, 1e-12)
        for i in range(0, NCHUNK):
            cols = i * BC + tl.arange(0, BC)
            m = rmask[:, None] & (cols[None, :] < C)
            x = tl.load(X + r64 * stride_xr + cols[None, :].to(tl.int64) * stride_xc, mask=m, other=0.0)
            y = tl.clamp(x.to(tl.float32) * scale[:, None], -FP8_MAX, FP8_MAX)
            om = pmask[:, None] & (cols[None, :] < CP)
            tl.store(Y + r64 * stride_yr + cols[None, :].to(tl.int64) * stride_yc, y.to(Y.dtype.element_ty),
                     mask=om)
    tl.store(SINV + rows, 1.0 / scale, mask=pmask)


@triton.jit
def _colmax(X, AMAX, R, C, stride_xr, BM: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr,
            PREFETCH: tl.constexpr, ACC16: tl.constexpr):
    """AMAX[c] = max(AMAX[c], max |X[r, c]| over this program's ROWS rows): row-major X read along its rows, BM rows
    at a time; the tile-shaped running max is reduced over rows once, after the loop, then one relaxed atomic per
    column (a max needs no ordering; the next kernel sees it). PREFETCH: the next tile is loaded before the current
    one is folded in (two in flight per program). ACC16: the running max in X's dtype (exact: a max of X's values
    is one of them), half the registers."""
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    cmask = cols < C
    r0 = tl.program_id(0) * ROWS
    if ACC16:
        acc = tl.zeros((BM, BK), dtype=X.dtype.element_ty)
    else:
        acc = tl.zeros((BM, BK), dtype=tl.float32)
    if PREFETCH:
        rn = r0 + tl.arange(0, BM)
        xn = tl.load(X + rn[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=(rn < R)[:, None] & cmask[None, :],
                     other=0.0)
    for i in range(0, ROWS // BM):
        rows = r0 + i * BM + tl.arange(0, BM)
        if PREFETCH:
            x = xn
            rn = rows + BM
            xn = tl.load(X + rn[:, None].to(tl.int64) * stride_xr + cols[None, :],
                         mask=((rn < R) & (rn < r0 + ROWS))[:, None] & cmask[None, :], other=0.0)
        else:
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                        mask=(rows < R)[:, None] & cmask[None, :], other=0.0)
        if ACC16:
            acc = tl.maximum(acc, tl.abs(x)).to(X.dtype.element_ty)
        else:
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    tl.atomic_max(AMAX + cols, tl.max(acc, axis=0).to(tl.float32), mask=cmask, sem="relaxed")


@triton.jit
def _cast_cols_t(X, AMAX, Y, SINV, R, C, YR, YC, stride_xr, FP8_MAX, BM: tl.constexpr, BK: tl.constexpr):
    """Y (YR, YC) = the transpose of X (R, C) quantised per column of X (its amax over all R rows, from _colmax):
    X read in row-major tiles, Y written transposed; Y's rows >= C and columns >= R are the zero pad. SINV (YR,).
    Tiles in reversed order: the last column blocks first, the bytes _colmax's last programs read and L2 holds."""
    pid_r = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_c = tl.num_programs(1) - 1 - tl.program_id(1)
    rows = pid_r * BM + tl.arange(0, BM)  # X rows = Y columns
    cols = pid_c * BK + tl.arange(0, BK)  # X columns = Y rows
    amax = tl.load(AMAX + cols, mask=cols < C, other=0.0)
    scale = FP8_MAX / tl.maximum(amax, 1e-12)
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(tl.float32)
    y = tl.clamp(x * scale[None, :], -FP8_MAX, FP8_MAX)
    tl.store(Y + cols[None, :].to(tl.int64) * YC + rows[:, None], y.to(Y.dtype.element_ty),
             mask=(rows[:, None] < YC) & (cols[None, :] < YR))
    if pid_r == 0:
        tl.store(SINV + cols, 1.0 / scale, mask=cols < YR)


@triton.jit
def _sat(v, FP8_MAX, SAT: tl.constexpr):
    """v clamped to +-FP8_MAX for the fp8 conversion, unless that conversion saturates by itself (SAT)."""
    if not SAT:
        v = tl.clamp(v, -FP8_MAX, FP8_MAX)
    return v


@triton.jit
def _group_scales(amax, FP8_MAX, SAT: tl.constexpr):
    """(scale, scale_inv) of fp8 groups with this amax (1e-12 at least). Each thread of the blockwise cast holds
    ~8 rows' and 8 columns' scales (Triton replicates a reduced vector over the threads that share it), and a
    division compiles to ~7 instructions there (reciprocal and range fix-ups): ~16% of the kernel's instructions
    in the both-ways 128x128 config (sm90 SASS). Under SAT (CUDA): scale = FP8_MAX x
    rcp.approx(amax) and scale_inv = amax x (1 / FP8_MAX), one instruction each after the reciprocal; x * scale
    may then round an ulp above FP8_MAX, which the saturating conversion takes to FP8_MAX."""
    a = tl.maximum(amax, 1e-12)
    if SAT:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [a], dtype=tl.float32, is_pure=True,
                                      pack=1)
        scale = FP8_MAX * r
        sinv = a * (1.0 / FP8_MAX)
    else:
        scale = FP8_MAX / a
        sinv = 1.0 / scale
    return scale, sinv


def _conversion_saturates(device) -> bool:
    """Whether Triton's fp32 -> fp8 conversion saturates to the format's largest finite value on this device, so
    that a clamp before it is redundant (inf -> max as well; NaN stays NaN, where Triton leaves a clamp's NaN
    unspecified). On CUDA (sm89+, the GPUs with fp8) it compiles to `cvt.rn.satfinite.e4m3x2.f32` (read in the PTX
    on the H200). Not assumed elsewhere: ROCm's conversion and the interpreter's (numpy)
    are not known to saturate, so they keep the clamp."""
    return device.type == "cuda" and torch.version.hip is None and not _common.interpreting()


@triton.jit
def _cast_block(X, Y, YT, S, ST, R, C, RP, stride_xr, stride_xc, s_sr, s_sc, s_tr, s_tc, SPAD, STPAD, FP8_MAX,
                BR: tl.constexpr, BC: tl.constexpr, TILE: tl.constexpr, WRITE_Y: tl.constexpr,
                WRITE_T: tl.constexpr, SAT: tl.constexpr):
    """Blockwise cast of X (R, C) (any strides) into Y (RP, C) and / or YT (C, RP) = its transpose, both row-major;
    rows R..RP-1 are zero pad. One program per BR x BC tile of X, read once (coalesced along C). scale_inv stores:
      TILE=False  Y in 1xBC groups along C (BC = 128): S[r, g] at S + r*s_sr + g*s_sc
                  YT in 1xBR groups along R (BR = 128): ST[g, c] at ST + g*s_tr + c*s_tc
      TILE=True   one scale per tile (BR = BC = 128), tile (tr, tc): at S + tr*s_sr + tc*s_sc and ST + tc*s_tr +
                  tr*s_tc. S's tc in [C tiles, SPAD) and ST's tr in [R tiles, STPAD) are set to 0: the pad cuBLAS
                  wants on the contraction-block dim of 128x128 scales (see blockwise_scale_layout).
    YT is stored from tl.trans of the fp8 tile, so that store is coalesced along R too (no column-view reads).
    SAT: the fp8 conversion saturates by itself (_conversion_saturates): no clamp before it, and the 1x128 groups'
    scales from a fast reciprocal (_group_scales)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr = tl.arange(0, BR)
    lc = tl.arange(0, BC)
    rows = r0 + lr
    cols = c0 + lc
    # 64-bit tile bases, 32-bit offsets inside the tile: per-element int64 offsets cost registers (sm90, 8 warps,
    # both outputs, compiled without the alignment hints a launch adds: 255 registers and a 384-byte spill stack
    # with them, none without; with the hints, 113 registers, no spill: ptxas for sm90)
    x = tl.load(X + (r0.to(tl.int64) * stride_xr + c0.to(tl.int64) * stride_xc)
                + (lr[:, None] * stride_xr + lc[None, :] * stride_xc),
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(tl.float32)
    ymask = (rows[:, None] < RP) & (cols[None, :] < C)
    tmask = (cols[:, None] < C) & (rows[None, :] < RP)
    ypt = Y + (r0.to(tl.int64) * C + c0) + (lr[:, None] * C + lc[None, :])
    tpt = YT + (c0.to(tl.int64) * RP + r0) + (lc[:, None] * RP + lr[None, :])
    # each output is stored as soon as it is computed (fewer live 128x128 tiles)
    if TILE:
        # one scale per tile: the exact division (the fast one saved nothing here: 0.985-0.991x on the H200)
        scale, sinv = _group_scales(tl.max(tl.max(tl.abs(x), axis=1), axis=0), FP8_MAX, False)
        q = _sat(x * scale, FP8_MAX, SAT)
        pad = tl.arange(0, 4)
        if WRITE_Y:
            tl.store(ypt, q.to(Y.dtype.element_ty), mask=ymask)
            tl.store(S + pid_r * s_sr + pid_c * s_sc, sinv)
            if pid_c == tl.num_programs(1) - 1:
                tl.store(S + pid_r * s_sr + (pid_c + 1 + pad) * s_sc, tl.zeros((4,), tl.float32),
                         mask=pid_c + 1 + pad < SPAD)
        if WRITE_T:
            tl.store(tpt, tl.trans(q.to(YT.dtype.element_ty)), mask=tmask)
            tl.store(ST + pid_c * s_tr + pid_r * s_tc, sinv)
            if pid_r == tl.num_programs(0) - 1:
                tl.store(ST + pid_c * s_tr + (pid_r + 1 + pad) * s_tc, tl.zeros((4,), tl.float32),
                         mask=pid_r + 1 + pad < STPAD)
    else:
        if WRITE_Y:  # one scale per row of the tile
            rs, rsinv = _group_scales(tl.max(tl.abs(x), axis=1), FP8_MAX, SAT)
            q = _sat(x * rs[:, None], FP8_MAX, SAT)
            tl.store(ypt, q.to(Y.dtype.element_ty), mask=ymask)
            tl.store(S + rows * s_sr + pid_c * s_sc, rsinv, mask=rows < RP)
        if WRITE_T:  # one scale per column of the tile
            cs, csinv = _group_scales(tl.max(tl.abs(x), axis=0), FP8_MAX, SAT)
            qt = _sat(x * cs[None, :], FP8_MAX, SAT)
            tl.store(tpt, tl.trans(qt.to(YT.dtype.element_ty)), mask=tmask)
            tl.store(ST + pid_r * s_tr + cols * s_tc, csinv, mask=cols < C)


@triton.jit
def _gemm_blockwise(A, B, Cp, SA, SB, M, N, K,
                    s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_sam, s_sak, s_sbk, s_sbn,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SB_GN: tl.constexpr,
                    UPCAST: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """C[M,N] = sum_kb (A[:, kb] @ B[kb, :]) * SA[m, kb] * SB[kb, n // SB_GN]; BK = the scale group (128).
    1-D grid, GROUP_M row tiles per band (the band's A and B tiles are reused from L2); rows / columns past M / N
    wrap (their results are not stored), so only K needs a mask, and none when EVEN_K; pointers advance by BK."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    band = GROUP_M * num_n
    first_m = (pid // band) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % size_m
    pid_n = (pid % band) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    am = rm % M
    bn = rn % N
    a_ptr = A + am[:, None].to(tl.int64) * s_am + rk[None, :].to(tl.int64) * s_ak
    b_ptr = B + rk[:, None].to(tl.int64) * s_bk + bn[None, :].to(tl.int64) * s_bn
    sa_ptr = SA + am * s_sam
    sb_ptr = SB + (bn // SB_GN) * s_sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptr)
            b = tl.load(b_ptr)
        else:
            kin = rk < K - kb * BK
            a = tl.load(a_ptr, mask=kin[None, :], other=0.0)
            b = tl.load(b_ptr, mask=kin[:, None], other=0.0)
        if UPCAST:
            p = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            p = tl.dot(a, b)
        sa = tl.load(sa_ptr + kb * s_sak)
        sb = tl.load(sb_ptr + kb * s_sbk)
        acc += p * sa[:, None] * sb[None, :]
        a_ptr += BK * s_ak
        b_ptr += BK * s_bk
    tl.store(Cp + rm[:, None].to(tl.int64) * s_cm + rn[None, :].to(tl.int64) * s_cn, acc.to(Cp.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


# ------------------------------------------------------------------------------------------------ cast wrappers


def _fmax(dtype) -> float:
    return float(torch.finfo(dtype).max)


def _pad16(n: int) -> int:
    return (n + 15) // 16 * 16


class DelayedScaling:
    """Transformer Engine's DelayedScaling settings (precision.fp8_amax_history_len / fp8_margin /
    fp8_amax_compute_algo): scale = fp8_max / amax / 2**margin, amax = the max over the last `history_len` amaxes
    ("max") or the last one ("most_recent")."""

    ALGOS = PORTABLE_AMAX_ALGOS

    def __init__(self, history_len: int = 1024, margin: int = 0, algo: str = "max"):
        if history_len < 1:
            raise ValueError(f"amax history_len must be >= 1, not {history_len}")
        if algo not in self.ALGOS:
            raise ValueError(f"amax compute algo must be one of {self.ALGOS}, not {algo!r}")
        self.history_len, self.margin, self.algo = int(history_len), int(margin), algo

    def history(self) -> "AmaxHistory":
        return AmaxHistory(self)

    def linear_state(self) -> "DelayedLinearState":
        return DelayedLinearState(self)


class AmaxHistory:
    """The device state of one delayed-scaling operand (a linear's x, weight or dy): amax history, the atomic-max
    slots of the cast in flight, the call counter and the scales. Allocated on first use, on its device."""

    SPREAD = 64  # atomic-max slots per call (programs hash into them)

    def __init__(self, settings: DelayedScaling, buf: Optional[torch.Tensor] = None,
                 meta: Optional[torch.Tensor] = None):
        """buf / meta: existing state tensors (the custom ops of fp8_ops rebuild the view from their inputs)."""
        self.settings = settings
        self.buf, self.meta = buf, meta

    def allocate(self, device) -> "AmaxHistory":
        """The state tensors on `device`, zeroed (call count 0): [history L | amax slots SPREAD | scale of the next
        call, scale of the last call] fp32 and the int32 META [calls, programs arrived (0 between launches)]. Done
        at the first cast when not called earlier; a compiled graph wants them to exist before it is traced
        (fp8_ops)."""
        L = self.settings.history_len
        self.buf = torch.zeros(L + self.SPREAD + 2, dtype=torch.float32, device=device)
        self.meta = torch.zeros(2, dtype=torch.int32, device=device)
        return self

    def _state(self, device):
        if self.buf is None or self.buf.device != device:
            self.allocate(device)
        L = self.settings.history_len
        return self.buf[:L], self.buf[L:L + self.SPREAD], self.buf[L + self.SPREAD:], self.meta

    # Whether this operand's first recorded cast has been launched (outside a CUDA-graph capture), kept on the META
    # tensor (fp8_ops rebuilds AmaxHistory views around the same tensors). Until then every recorded cast launches
    # the amax pass (the first call computes its scale from its own amax there; later calls skip it on the GPU); after,
    # the cast kernel alone. A missing flag (a copy of META) only costs that pass again, never a wrong scale.
    @property
    def primed(self) -> bool:
        return self.meta is not None and getattr(self.meta, "_primus_primed", False)

    def _mark_primed(self) -> None:
        if not (self.meta.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.meta._primus_primed = True

    @property
    def calls(self) -> int:
        """Casts so far (the device counter; reading it syncs: diagnostics and tests)."""
        return 0 if self.meta is None else int(self.meta[0].item())

    @property
    def amax_history(self) -> torch.Tensor:
        """The history ring: the amax of call k in slot k % len, entered at the end of that call's cast."""
        return self.buf[:self.settings.history_len]


class DelayedLinearState:
    """The three operand histories of one linear under the delayed recipe: input x, weight, output gradient dy.
    Not checkpointed: after a resume each operand's first cast takes its scale from its own amax again."""

    def __init__(self, settings: DelayedScaling):
        self.settings = settings
        self.x, self.w, self.dy = AmaxHistory(settings), AmaxHistory(settings), AmaxHistory(settings)

    def allocate(self, device) -> "DelayedLinearState":
        for h in (self.x, self.w, self.dy):
            h.allocate(device)
        return self


class WeightCasts:
    """The fp8 casts of weights, made at a step's first forward and reused until the weights change: the micro
    batches of one step and activation recompute's replayed forwards see the same weights (Transformer Engine's fp8
    weight cache, refreshed at each step's first micro batch through megatron's is_first_microbatch).

    Off unless a trainer turns it on (`enable`): only the trainer knows when the weights change, and it `clear`s the
    cache after each step's forwards and backwards, before the optimizer step. A cast is keyed by the weight's
    storage (address, shape, strides, dtype, device) and by the cast (recipe form, fp8 dtype). That is sound for
    weights that stay in one place through a step, as megatron's parameters do; an FSDP-style unsharded weight can
    land at another layer's address (so the TorchTitan backend does not use it). Casts captured into a CUDA graph
    are not cached. Under the delayed recipe a weight's amax is recorded by its first cast of a step only, as TE
    records it. The MoE experts' fp8 grouped GEMMs (grouped_gemm.py, grouped_gemm_fp8.py) keep their weight casts
    here too."""

    def __init__(self):
        self.enabled = False
        self._casts: dict = {}
        self.hits = self.misses = 0

    def enable(self, on: bool = True) -> None:
        self.enabled = bool(on)
        self.clear()

    def clear(self) -> None:
        """Forget every cast (the weights are about to change, or have): the next forward of each weight casts it."""
        self._casts.clear()

    def get(self, weight: torch.Tensor, form, make):
        """make()'s result for this weight and form, made once until the next clear()."""
        if not self.enabled or (weight.is_cuda and torch.cuda.is_current_stream_capturing()):
            return make()
        key = (weight.data_ptr(), weight.device, weight.dtype, tuple(weight.shape), weight.stride(), form)
        got = self._casts.get(key)
        if got is None:
            got = self._casts[key] = make()
            self.misses += 1
        else:
            self.hits += 1
        return got


WEIGHT_CASTS = WeightCasts()


def _amax_partials(flat: torch.Tensor, delayed=None):
    """(partial maxima of |flat|, their count). delayed: (history, its _state tensors, fp8 dtype): the pass reads
    flat only at that operand's first call, and its last program writes that call's scale into the state."""
    n = flat.numel()
    BLOCK = 4096
    nprog = max(1, min(_PARTS, triton.cdiv(n, BLOCK)))
    iters = triton.cdiv(triton.cdiv(n, BLOCK), nprog)
    part = _common.empty((nprog,), torch.float32, flat.device)
    if delayed is None:
        _absmax_partial[(nprog,)](flat, part, n, iters, part, part, 1.0, 1.0, BLOCK=BLOCK, DELAYED=False,
                                  num_warps=8)
    else:
        history, (_, _, scales, meta), dtype = delayed
        _absmax_partial[(nprog,)](flat, part, n, iters, meta, scales, _fmax(dtype), 2.0 ** -history.settings.margin,
                                  BLOCK=BLOCK, DELAYED=True, num_warps=8)
    return part, nprog


def cast_tensorwise(x2: torch.Tensor, dtype, want_y: bool = True, want_t: bool = False, pad_t: bool = True,
                    history: Optional[AmaxHistory] = None, config=None, record: bool = True,
                    amax: Optional[torch.Tensor] = None):
    """x2 (R, C) -> (y (RP, C) fp8 | None, yT (C, RP) fp8 | None, scale_inv fp32 scalar).
    RP = R padded to a multiple of 16 (fp8 GEMM operand rule) when pad_t, with zero rows; else R.
    history: delayed scaling (the scale from earlier calls; this call's amax recorded in the same pass).
    record=False (with history): a replayed forward; cast with the history's last scale, leave the state as it is.
    config: one launch config of _TENSORWISE's space (tests); None = tuned on a GPU / the space's first.
    amax: partial maxima of |x2| (fp32, at most _PARTS; their max is x2's amax) from the kernel that produced x2
    (swiglu.swiglu_fwd_amax / swiglu_bwd_amax): the cast then skips its own amax pass (one read of x2)."""
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    R, C = x2.shape
    flat = x2 if x2.is_contiguous() else x2.contiguous()
    RP = _pad16(R) if pad_t else R
    y = _common.empty((RP, C), dtype, x2.device) if want_y else None
    yt = _common.empty((C, RP), dtype, x2.device) if want_t else None
    sinv = _common.empty((), torch.float32, x2.device)  # this call's own (read by GEMMs after later calls)
    if amax is not None:
        if history is not None or amax.dtype != torch.float32 or not 0 < amax.numel() <= _PARTS:
            raise ValueError(f"cast_tensorwise: amax= takes up to {_PARTS} fp32 partial maxima, current scaling only")
        part, nprog = amax, amax.numel()
        amax_slots = sinv
    elif history is None:
        part, nprog = _amax_partials(flat)
        amax_slots = sinv
    else:
        state = history._state(x2.device)
        hist, amax_slots, part, meta = state  # part: the state's two scales
        if record and not history.primed:  # the first call (or not known not to be): its scale from its own amax
            _amax_partials(flat, delayed=(history, state, dtype))
            history._mark_primed()
        nprog = 1
    # fp32 input (TorchTitan's fp32 weights on one GPU) with both outputs from one kernel: on the H200 (Triton 3.6,
    # ptxas 12.9) the transposed fp8 store leaves elements unwritten whenever the plain store is in the same
    # kernel (260 of 3072 for a 48x64 weight; none with the transpose alone, none for
    # bf16 input up to 8192x2048; storing the bytes as int8 did not help). The likely upstream bug:
    # triton-lang/triton#11111. This was the intermittent NaN gradient norm of TorchTitan + turbo fp8 linear.
    # So fp32 input gets one launch per output (one more read of a weight-sized tensor).
    passes = ([(True, False), (False, True)] if want_y and want_t and x2.dtype == torch.float32
              else [(want_y, want_t)])

    def grid(meta):  # 2-D for the delayed cast, 1-D for the tensorwise one (_cast_tensorwise's tile order)
        nr, nc = triton.cdiv(RP, meta["BR"]), triton.cdiv(C, meta["BC"])
        return (nr, nc) if history is not None else (nr * nc,)

    for wy, wt in passes:  # (two launches of a delayed cast record the same amax twice: a max, so no harm)
        args = (x2, part, y if wy else sinv, yt if wt else sinv, sinv, amax_slots, R, C, RP, x2.stride(0), nprog,
                _fmax(dtype))
        consts = dict(NP=_PARTS, WRITE_Y=wy, WRITE_T=wt, DELAYED=history is not None, NS=AmaxHistory.SPREAD,
                      RECORD=record)
        if config is not None:
            _TENSORWISE.run(config, grid, args, **consts)
        else:  # a recorded delayed cast writes its amax slots: tuned on copies of them
            _TENSORWISE.launch(grid, args, stateful=(5,) if history is not None and record else (), **consts)
    if history is not None and record:  # after every launch of this call: they all cast with this call's scale
        st = history.settings
        _delayed_advance[(1,)](part, amax_slots, meta, hist, st.history_len, _fmax(dtype), 2.0 ** -st.margin,
                               MOST_RECENT=st.algo == "most_recent", LB=triton.next_power_of_2(st.history_len),
                               NS=AmaxHistory.SPREAD, num_warps=4)
    return y, yt, sinv


# The tensorwise (and delayed) cast pass first ran one fixed 64x64 tile, 4 warps (55% of its minimum bytes with
# the amax pass on the H200); it is autotuned per (R, C) and outputs, its tiles in reversed row-major order.
# Wider tiles store Y and YT in whole 128-byte lines. Autotuning re-runs the
# pass: its outputs are the same on every run, and a recorded delayed cast tunes on copies of its state.
_TENSORWISE = _common.Tuned(_cast_tensorwise, [
    {"BR": 64, "BC": 64, "num_warps": 4}, {"BR": 128, "BC": 64, "num_warps": 4},
    {"BR": 64, "BC": 128, "num_warps": 4}, {"BR": 128, "BC": 128, "num_warps": 8},
    {"BR": 128, "BC": 128, "num_warps": 4}, {"BR": 32, "BC": 128, "num_warps": 4},
    {"BR": 128, "BC": 32, "num_warps": 4}, {"BR": 64, "BC": 128, "num_warps": 8},
], key=["R", "C"])


def _rowwise_ok(cfg, CP=1, **_):
    """A config may not make a tile over 16K elements, nor a chunk wider than the row needs."""
    return cfg["BR"] * cfg["BC"] <= 16384 and cfg["BC"] <= max(64, triton.next_power_of_2(CP))


# The rowwise cast ran 0.68x torch.compile (33% of copy bandwidth) along contiguous rows with the default below
# (first of the space; H200). Autotuned on the GPU per (R, CP): rows read once when a chunk spans the row, wider /
# taller tiles, more warps (1.87x compile, 97% of copy bandwidth in GPU time, H200).
_ROWWISE_ROWS = _common.Tuned(_cast_rowwise, [
    {"BR": 2, "BC": 1024, "num_warps": 4}, {"BR": 1, "BC": 2048, "num_warps": 4},
    {"BR": 1, "BC": 4096, "num_warps": 4}, {"BR": 1, "BC": 4096, "num_warps": 8},
    {"BR": 2, "BC": 4096, "num_warps": 8}, {"BR": 1, "BC": 8192, "num_warps": 8},
    {"BR": 4, "BC": 2048, "num_warps": 8}, {"BR": 4, "BC": 1024, "num_warps": 4},
], key=["R", "CP"], valid=_rowwise_ok)
# Quantising along the other dimension (the rowwise backward's x^T and dy^T, scales over the tokens) used to read a
# column view: 17% of copy bandwidth at best (GPU time, H200: bytes 64 contiguous at a time). Now two passes
# that read x row-major: per-column amax (_colmax, atomic max over row chunks), then the cast with a transposed
# store (_cast_cols_t, tuned below); ~2 reads + 1 fp8 write of x instead of the column-view walk. It is tuned
# after the column amax pass (`before`), as it runs: that pass leaves part of x in the L2. Tuned from a flushed
# L2, all 8 picks at 8192x4096 and 16384x2048 were a config 2.4-3.2% slower in use; tuned after the pass, 10 of 12
# were the fastest (H200, 2026-12-03).
_COLS_T = _common.Tuned(_cast_cols_t, [
    {"BM": 64, "BK": 128, "num_warps": 8}, {"BM": 128, "BK": 64, "num_warps": 8},
    {"BM": 64, "BK": 64, "num_warps": 4}, {"BM": 128, "BK": 128, "num_warps": 8},
    {"BM": 32, "BK": 128, "num_warps": 4}, {"BM": 128, "BK": 64, "num_warps": 4},
    {"BM": 128, "BK": 32, "num_warps": 4},
], key=["R", "C"], before=lambda args, consts: column_amax(args[0]))


def _colmax_ok(cfg, R=1, C=1, **_):
    """No program spans more rows, nor a tile more columns, than x has (rounded up to a power of two)."""
    return cfg["ROWS"] <= max(cfg["BM"], triton.next_power_of_2(R)) and cfg["BK"] <= max(64, triton.next_power_of_2(C))


# The column amax pass was the largest cast of a rowwise gate+up linear (532 of 1,123 us: 1.45 TB/s for a pure
# read, H200) with one fixed config (the first); now autotuned per (R, C). ROWS rows per program
# (one atomic per column each): more rows, fewer atomics but fewer programs. Autotuned (H200, 2026-12-03), the
# pass still read at 43-81% of copy bandwidth. Relaxed atomics (Triton's default is acq_rel) ran every
# config 1.04-1.05x. A prefetched tile with a 16-bit running max (the last three configs) took the best form to
# 1.01-1.21x. Those were first admitted only from 48M elements up: an autotuner timing launches back to back had
# picked them at smaller x where they lost on a cold x. The autotuner now flushes L2 before each launch
# (_common.queued_gpu_time), and measured at every size (H200): 1.08-1.10x the gated pass
# at 8192x2048 and 4096x4096, the same pick as before at 8192x4096, so no size gate.
_PLAIN = {"PREFETCH": 0, "ACC16": 0}
_AHEAD = {"PREFETCH": 1, "ACC16": 1}
_COLMAX = _common.Tuned(_colmax, [
    {"BM": 32, "BK": 128, "ROWS": 256, "num_warps": 4, **_PLAIN},
    {"BM": 64, "BK": 128, "ROWS": 512, "num_warps": 4, **_PLAIN},
    {"BM": 32, "BK": 256, "ROWS": 256, "num_warps": 4, **_PLAIN},
    {"BM": 64, "BK": 256, "ROWS": 512, "num_warps": 8, **_PLAIN},
    {"BM": 16, "BK": 512, "ROWS": 256, "num_warps": 4, **_PLAIN},
    {"BM": 32, "BK": 512, "ROWS": 512, "num_warps": 8, **_PLAIN},
    {"BM": 32, "BK": 256, "ROWS": 128, "num_warps": 4, **_PLAIN},
    {"BM": 64, "BK": 128, "ROWS": 256, "num_warps": 8, **_PLAIN},
    {"BM": 64, "BK": 128, "ROWS": 256, "num_warps": 4, **_AHEAD},
    {"BM": 16, "BK": 512, "ROWS": 256, "num_warps": 4, **_AHEAD},
    {"BM": 32, "BK": 256, "ROWS": 512, "num_warps": 4, **_AHEAD},
], key=["R", "C"], valid=_colmax_ok)


def column_amax(x: torch.Tensor, config=None) -> torch.Tensor:
    """max |x[:, c]| for each column of a row-major x (R, C), fp32 (C,). config: one of _COLMAX's (tests)."""
    R, C = x.shape
    amax = torch.zeros(C, dtype=torch.float32, device=x.device)
    if R and C:
        args = (x, amax, R, C, x.stride(0))

        def grid(meta):
            return (triton.cdiv(R, meta["ROWS"]), triton.cdiv(C, meta["BK"]))

        if config is not None:
            _COLMAX.run(config, grid, args)
        else:
            _COLMAX.launch(grid, args)
    return amax


def _cast_along_rows_t(x: torch.Tensor, dtype, YR: int, YC: int, config=None):
    """x (R, C), rows contiguous -> (y (YR, YC) = x^T quantised per column of x (over its R rows), zero pad;
    scale_inv (YR, 1))."""
    R, C = x.shape
    y = _common.empty((YR, YC), dtype, x.device)
    sinv = _common.empty((YR, 1), torch.float32, x.device)
    amax = column_amax(x)
    args = (x, amax, y, sinv, R, C, YR, YC, x.stride(0), _fmax(dtype))

    def grid(meta):
        return (triton.cdiv(YC, meta["BM"]), triton.cdiv(YR, meta["BK"]))

    if config is not None:
        _COLS_T.run(config, grid, args)
    else:
        _COLS_T.launch(grid, args, default=_COLS_T.configs[0])
    return y, sinv


def cast_rowwise(x2: torch.Tensor, dtype, transpose: bool = False, pad: bool = False, pad_rows: bool = False,
                 config=None):
    """Per-row scaling of x2 (R, C) along C -> (y (RP, CP), scale_inv (RP, 1)); pad / pad_rows round C / R up
    to multiples of 16 with zeros. transpose=True quantises along R instead: y = the transpose, scales (C, 1).
    config: one launch config of the space this call uses (_ROWWISE_ROWS', or _COLS_T's for a quantisation along a
    column view, e.g. transpose=True of a row-major x2: tests); None = tuned on a GPU / the default."""
    src = x2.t() if transpose else x2
    R, C = src.shape
    CP = _pad16(C) if pad else C
    RP = _pad16(R) if pad_rows else R
    if src.stride(1) != 1:
        if src.stride(0) == 1:  # a column view of a row-major tensor: read that tensor along its rows
            return _cast_along_rows_t(src.t(), dtype, RP, CP, config)
        src = src.contiguous()
    y = _common.empty((RP, CP), dtype, x2.device)
    sinv = _common.empty((RP, 1), torch.float32, x2.device)
    default = {"BC": min(1024, triton.next_power_of_2(CP))}  # rows contiguous: wide chunks along C
    default.update(BR=max(1, 2048 // default["BC"]), num_warps=4)
    args = (src, y, sinv, R, C, RP, CP, src.stride(0), src.stride(1), y.stride(0), y.stride(1), _fmax(dtype))

    def grid(meta):
        return (triton.cdiv(RP, meta["BR"]),)

    if config is not None:
        _ROWWISE_ROWS.run(config, grid, args)
    else:
        _ROWWISE_ROWS.launch(grid, args, default=default)
    return y, sinv


# ------------------------------------------------------------------------- blockwise: scale layout and which GEMM
#
# The blockwise recipe's operands and scales are laid out once, the way torch.nn.functional.scaled_mm takes them on
# CUDA (cuBLASLt 1D / 2D block scaling); this file's Triton GEMM reads the same tensors through their strides, so
# both GEMMs take one layout and the cast kernels write it directly (no transposing copies of data or scales).
#
# PyTorch's rules (pytorch/pytorch, aten/src/ATen/native/cuda/ScaledBlas.cpp, the v2 entry point
# _scaled_mm_cuda_v2_out and its per-recipe functions _scaled_block1x128_block1x128,
# _scaled_block1x128_block128x128, _scaled_block128x128_block1x128; aten/src/ATen/native/ScaledBlasUtils.cpp
# check_deepseek_recipe; test/test_scaled_matmul_cuda.py test_scaled_mm_block_wise_numerics):
#   * recipes: (1x128, 128x128), (128x128, 1x128) and (1x128, 1x128) for (mat_a, mat_b); one fp32 scale tensor
#     each ("decoding" factors: multiplied into the product, i.e. our scale_inv);
#   * both operands float8_e4m3fn (check_deepseek_recipe): e5m2 (the "hybrid" gradients) has no such GEMM;
#   * CUDA only, compute capability major == 9 (_check_deepseek_support: "only supported in CUDA for SM90"; sm100
#     raises NotImplementedError), cuBLASLt >= 12.9; ROCm: "1x128 and 128x128 scaling not available";
#   * mat_a row-major, mat_b column-major on sm90 (_scaled_gemm: "Only multiplication of row-major and
#     column-major matrices is supported by cuBLASLt"); mat_a.size(1) % 16 == 0, mat_b sizes % 16 == 0;
#   * scale shapes / strides, for an operand with `outer` rows (M of mat_a; N of mat_b, i.e. of mat_b.t()) and
#     contraction K (the same rule for A and B in the v2 API):
#       1x128    (outer, ceil(K/128))            strides (1, outer)   "outer-dim-major"
#       128x128  (L4, ceil(outer/128))           strides (1, L4)      L4 = ceil(K/128) rounded up to 4; the test
#                                                                     pads the extra rows with zeros
#     (the v1 torch._scaled_mm infers blockwise from the shapes instead, with unpadded 128x128 scales: not used).
# Not covered by PyTorch's tests: K not a multiple of 128 and M / N not multiples of 128. This file pads the token
# dim to 128 and sends a GEMM to scaled_mm only when its contraction dim is a multiple of 128.


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def blockwise_scale_layout(outer: int, k: int, tile: bool):
    """(shape, strides) of the fp32 scale_inv tensor torch.nn.functional.scaled_mm takes for one blockwise operand
    with `outer` rows (mat_a: M; mat_b: N, the rows of mat_b.t()) and contraction dim `k`: 1x128 groups along k
    (tile=False) or 128x128 tiles (tile=True). Rules and sources: the comment above. The storage is row-major
    (shape[1], shape[0]), i.e. the tensor is the transpose of a contiguous one."""
    if tile:
        l4 = _round_up(_cdiv(k, GROUP), 4)
        return (l4, _cdiv(outer, GROUP)), (1, l4)
    return (outer, _cdiv(k, GROUP)), (1, outer)


def _scale_tensor(outer: int, k: int, tile: bool, device) -> torch.Tensor:
    shape, _ = blockwise_scale_layout(outer, k, tile)
    return _common.empty((shape[1], shape[0]), torch.float32, device).t()


# Set (or PRIMUS_TURBO_FP8_BLOCKWISE_GEMM) to "triton" / "scaled_mm" to force a blockwise GEMM; None = the rule
# below. The bench times both through it.
BLOCKWISE_GEMM_OVERRIDE: Optional[str] = os.environ.get("PRIMUS_TURBO_FP8_BLOCKWISE_GEMM") or None
_GEMM_NAMES = ("scaled_mm", "triton")


def _scaled_mm_blockwise_missing(device) -> Optional[str]:
    """Why torch.nn.functional.scaled_mm's 1x128 / 128x128 recipes cannot serve `device`, or None when they can.
    The checks PyTorch makes before its blockwise GEMM (see the comment above), asked without running a GEMM."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if _common.interpreting():
        return "Triton interpreter (CPU tests)"
    if dev.type != "cuda" or not torch.cuda.is_available():
        return f"{dev.type}: cuBLASLt block scaling is CUDA-only"
    if torch.version.hip is not None:
        return "ROCm: PyTorch has no 1x128 / 128x128 scaled_mm there"
    fn = getattr(torch.nn.functional, "scaled_mm", None)
    st = getattr(torch.nn.functional, "ScalingType", None)
    if fn is None or not all(hasattr(st, n) for n in ("BlockWise1x128", "BlockWise128x128")):
        return f"torch {torch.__version__} has no torch.nn.functional.scaled_mm with BlockWise1x128 / 128x128"
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):
        return f"CUDA {torch.version.cuda} < 12.9 (cuBLASLt block scaling)"
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] != 9:
        return f"sm{cap[0]}{cap[1]}: PyTorch runs 1x128 / 128x128 scaling on sm90 only"
    return None


def blockwise_gemm_provider(device=None) -> str:
    """The GEMM the blockwise recipe runs on `device` when dtypes and shapes allow: "scaled_mm"
    (torch.nn.functional.scaled_mm with BlockWise1x128 / BlockWise128x128, cuBLASLt, CUDA sm90) or "triton" (this
    file's _gemm_blockwise: ROCm, the CPU interpreter, other GPUs, older torch). The one rule choosing between them;
    BLOCKWISE_GEMM_OVERRIDE forces either (scaled_mm where it cannot run is an error, never a silent fallback).
    `blockwise_gemms` says which GEMM each of the linear's three matmuls takes (dtypes and shapes too)."""
    forced = BLOCKWISE_GEMM_OVERRIDE
    if forced is not None and forced not in _GEMM_NAMES:
        raise ValueError(f"blockwise GEMM override PRIMUS_TURBO_FP8_BLOCKWISE_GEMM (fp8_linear."
                         f"BLOCKWISE_GEMM_OVERRIDE) must be one of {_GEMM_NAMES} or unset, not {forced!r}")
    if forced == "triton":
        return "triton"
    why = _scaled_mm_blockwise_missing(device)
    if forced == "scaled_mm" and why:
        raise RuntimeError(f"blockwise GEMM forced to scaled_mm, which cannot run here: {why}")
    return "triton" if why else "scaled_mm"


def _blockwise_gemm(provider: str, a_dtype, b_dtype, k: int) -> str:
    """One GEMM: scaled_mm needs both operands e4m3fn (check_deepseek_recipe) and, here, the contraction dim a
    multiple of 128 (the shapes PyTorch tests); else the Triton GEMM."""
    if provider == "scaled_mm" and a_dtype == b_dtype == torch.float8_e4m3fn and k % GROUP == 0:
        return "scaled_mm"
    return "triton"


def _blockwise_plan(device, f_dt, g_dt, in_features: int, out_features: int) -> dict:
    """Decided (and logged) once per linear shape, device, dtypes and override: every fp8 forward and backward asks."""
    key = (str(device), str(f_dt), str(g_dt), in_features, out_features, BLOCKWISE_GEMM_OVERRIDE)
    plan = _PLANS.get(key)
    if plan is None:
        p = blockwise_gemm_provider(device)
        plan = _PLANS[key] = {"fprop": _blockwise_gemm(p, f_dt, f_dt, in_features),  # x @ W^T: contraction K
                              "dgrad": _blockwise_gemm(p, g_dt, f_dt, out_features),  # dy @ W: contraction N
                              "wgrad": _blockwise_gemm(p, g_dt, f_dt, GROUP)}  # dy^T @ x: M, padded to 128
        log.info("fp8 blockwise %dx%d on %s: %s (provider %s)", out_features, in_features, device,
                 " ".join(f"{k}={v}" for k, v in plan.items()), p)
    return plan


_PLANS: dict = {}


def blockwise_gemms(device=None, fmt: str = "e4m3", in_features: int = 4096, out_features: int = 4096) -> dict:
    """{"fprop" | "dgrad" | "wgrad": "scaled_mm" | "triton"}: the GEMM each matmul of a blockwise fp8 linear takes
    on `device` (the hybrid format's e5m2 gradients keep dgrad and wgrad on Triton)."""
    return _blockwise_plan(device, *fp8_formats(device, fmt), in_features, out_features)


def _block_ok(cfg, TILE=False, WRITE_Y=True, WRITE_T=False, **_):
    """A tile spans the 128-wide groups of every output it writes: along C for Y's 1x128 groups, along R for YT's,
    both for 128x128 tiles."""
    return (cfg["BC"] == GROUP or not (TILE or WRITE_Y)) and (cfg["BR"] == GROUP or not (TILE or WRITE_T))


# The blockwise casts, autotuned per (R, C) and outputs; each output's default first in the space _block_ok admits
# for it. H200, 8192x4096 bf16, GPU time, every config alone (2026-12-01): Y alone (32, 128, 4
# warps) 0.026 ms, 92% of copy bandwidth, the others within 10%; YT alone (128, 64, 4) 0.032 ms, 77%, next best
# (128, 32, 4) 0.036; Y and YT / 128x128 tiles (128, 128, 8) 0.056 / 0.039 ms, 57% / 81%, 16 warps 0.072 / 0.058
# (32 warps, and a sliced two-pass walk that held fewer registers, were slower still and are gone). The space is
# kept for other GPUs (ROCm's 64-wide wavefronts): the autotune costs one compile per config at the first call.
_CAST_BLOCK = _common.Tuned(_cast_block, [
    {"BR": 32, "BC": GROUP, "num_warps": 4}, {"BR": GROUP, "BC": 64, "num_warps": 4},
    {"BR": GROUP, "BC": GROUP, "num_warps": 8}, {"BR": GROUP, "BC": GROUP, "num_warps": 16},
    {"BR": 64, "BC": GROUP, "num_warps": 8}, {"BR": 16, "BC": GROUP, "num_warps": 4},
    {"BR": GROUP, "BC": 32, "num_warps": 4}, {"BR": GROUP, "BC": 64, "num_warps": 8},
], key=["R", "C"], valid=_block_ok)


def cast_blockwise(x2: torch.Tensor, dtype, tile: bool = False, want_y: bool = True, want_t: bool = False,
                   pad_rows: bool = False, config=None):
    """x2 (R, C) -> (y (RP, C), sy, yt (C, RP), syt): fp8 and its transpose (None where not wanted), with fp32
    scale_inv tensors in blockwise_scale_layout (y's for outer RP / contraction C; yt's for outer C / contraction
    RP). tile=False: y in 1x128 groups along C, yt in 1x128 groups along R; tile=True: 128x128 tiles (one scale per
    tile, in both layouts). pad_rows: RP = R rounded up to 128 with zero rows, else R. One read of x2 for both.
    config: one launch config of _CAST_BLOCK's space for these outputs (tests); None = tuned on a GPU, where
    both 1x128 outputs of a 16-bit x2 take fp8_cast_gluon's kernel on NVIDIA GPUs (the same bytes, 1.11x).
    """
    if not (want_y or want_t):
        raise ValueError("cast_blockwise: want_y and / or want_t")
    R, C = x2.shape
    RP = _round_up(R, GROUP) if pad_rows else R
    dev = x2.device
    y = _common.empty((RP, C), dtype, dev) if want_y else None
    yt = _common.empty((C, RP), dtype, dev) if want_t else None
    sy = _scale_tensor(RP, C, tile, dev) if want_y else None
    syt = _scale_tensor(C, RP, tile, dev) if want_t else None
    saturates = _conversion_saturates(dev)
    if (want_y and want_t and not tile and config is None
            and fp8_cast_gluon.unavailable(x2, saturates) is None):  # dy and dy^T: the register transpose
        fp8_cast_gluon.cast_both_1x128(x2, y, sy, yt, syt, RP, _fmax(dtype))
        return y, sy, yt, syt
    # fp32 input with both outputs in one kernel: see cast_tensorwise (an H200 Triton/ptxas defect left transposed
    # fp8 stores unwritten); one launch per output there
    passes = ([(True, False), (False, True)] if want_y and want_t and x2.dtype == torch.float32
              else [(want_y, want_t)])
    for wy, wt in passes:
        s_y = sy if sy is not None else syt
        s_t = syt if syt is not None else sy
        ssr, ssc = (s_y.stride(1), s_y.stride(0)) if tile else (s_y.stride(0), s_y.stride(1))
        args = (x2, y if y is not None else yt, yt if yt is not None else y, s_y, s_t, R, C, RP, x2.stride(0),
                x2.stride(1), ssr, ssc, s_t.stride(1), s_t.stride(0), s_y.shape[0], s_t.shape[0], _fmax(dtype))
        # no clamp where the conversion saturates: 1.07-1.10x for dy and dy^T, 1.07x for W and W^T tiles; the
        # x^T-alone cast ran 0.92-0.97x without it (H200, 8192x4096 / 8192x14336), so it
        # keeps its clamp
        consts = dict(TILE=tile, WRITE_Y=wy, WRITE_T=wt, SAT=saturates and (wy or tile))

        def grid(meta):
            return (triton.cdiv(RP, meta["BR"]), triton.cdiv(C, meta["BC"]))

        if config is not None:
            _CAST_BLOCK.run(config, grid, args, **consts)
        else:
            _CAST_BLOCK.launch(grid, args, **consts)
    return y, sy, yt, syt


def _tile_scales_padded(s: torch.Tensor, outer: int, k: int) -> torch.Tensor:
    """A 128x128 scale tensor saved as its unpadded (ceil(k/128), ceil(outer/128)) view (the shape callers such as
    the TorchTitan custom op declare), back in blockwise_scale_layout(outer, k, tile=True). The cast wrote the
    zero pad, so this is a view when `s` still has the cast's strides; a small copy when something (a compiler,
    an offload) made it contiguous."""
    shape, strides = blockwise_scale_layout(outer, k, True)
    if tuple(s.shape) == shape and s.stride() == strides:
        return s
    last = s.storage_offset() + (shape[0] - 1) * strides[0] + (shape[1] - 1) * strides[1]
    if s.stride() == strides and s.untyped_storage().nbytes() >= (last + 1) * s.element_size():
        return s.as_strided(shape, strides, s.storage_offset())
    buf = torch.zeros((shape[1], shape[0]), dtype=torch.float32, device=s.device)
    buf[:, :s.shape[0]] = s.t()
    return buf.t()


def gemm_blockwise(a, sa, b, sb, b_tile: bool, out_dtype, config=None):
    """Triton: c (M, N) = a (M, K) @ b (K, N), fp8, with scales in blockwise_scale_layout: sa (M, ceil(K/128)) 1x128;
    sb (L4, ceil(N/128)) for 128x128 tiles (b_tile) or (N, ceil(K/128)) for 1x128 groups along K. Any strides.
    config: one of _GEMM_BLOCKWISE's (tests); None = tuned on a GPU / the space's first."""
    M, K = a.shape
    N = b.shape[1]
    c = _common.empty((M, N), out_dtype, a.device)
    if b_tile:  # SB[kb, n // 128] = sb[kb, n // 128]
        ssb_k, ssb_n, gn = sb.stride(0), sb.stride(1), GROUP
    else:  # SB[kb, n] = sb[n, kb]
        ssb_k, ssb_n, gn = sb.stride(1), sb.stride(0), 1
    args = (a, b, c, sa, sb, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            sa.stride(0), sa.stride(1), ssb_k, ssb_n)
    consts = dict(BK=GROUP, SB_GN=gn, UPCAST=a.dtype != b.dtype, EVEN_K=K % GROUP == 0)

    def grid(meta):
        return (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)

    if config is not None:
        _GEMM_BLOCKWISE.run(config, grid, args, **consts)
    else:
        _GEMM_BLOCKWISE.launch(grid, args, **consts)
    return c


def _gemm_blockwise_ok(cfg, M=1, N=1, UPCAST=False, **_):
    """No tile wider than the problem (rounded up to a power of two); the e5m2 x e4m3 upcast (bf16 operands) keeps
    the 128x128 tiles (its operand tiles are twice as large in shared memory)."""
    fits = cfg["BM"] <= max(64, triton.next_power_of_2(M)) and cfg["BN"] <= max(64, triton.next_power_of_2(N))
    return fits and (not UPCAST or cfg["BM"] * cfg["BN"] <= 128 * 128)


# The Triton blockwise GEMM (ROCm, other GPUs, e5m2 gradients) ran one 128x128 tile, 8 warps, 3 stages, a 2-D grid
# and masked loads in its K loop at first (~535 TFLOP/s in the fp8 linear on the H200, half of cuBLASLt's
# blockwise kernel); since then a grouped 1-D grid, unmasked loads for K % 128 == 0 and a tuned tile space.
_GEMM_BLOCKWISE = _common.Tuned(_gemm_blockwise, [
    {"BM": 128, "BN": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BM": 128, "BN": 256, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BM": 128, "BN": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BM": 128, "BN": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
    {"BM": 256, "BN": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BM": 64, "BN": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BM": 128, "BN": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BM": 64, "BN": 256, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
], key=["M", "N", "K"], valid=_gemm_blockwise_ok)
# Triton's interpreter runs the space's first tile that fits the problem, as an untuned GPU does: its cost is per op
# of each program, so the largest tile is the fastest (128x128 ran a 128x128x384 product 13x faster than 32x32)


def blockwise_mm(a, sa, b, sb, b_tile: bool, out_dtype, gemm: str):
    """c (M, N) = a (M, K) @ b (K, N) with blockwise scales (blockwise_scale_layout) through `gemm`: "scaled_mm"
    (torch.nn.functional.scaled_mm: a 1x128, b 128x128 (b_tile) or 1x128) or "triton" (gemm_blockwise)."""
    if gemm == "triton":
        return gemm_blockwise(a, sa, b, sb, b_tile, out_dtype)
    if gemm != "scaled_mm":
        raise ValueError(f"blockwise GEMM must be one of {_GEMM_NAMES}, not {gemm!r}")
    # sm90 cuBLASLt: a row-major, b column-major (the casts produce these; a copy only if a caller changed them)
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    S = torch.nn.functional.ScalingType
    return torch.nn.functional.scaled_mm(a, b, sa, S.BlockWise1x128, sb,
                                         S.BlockWise128x128 if b_tile else S.BlockWise1x128,
                                         output_dtype=out_dtype)


# -------------------------------------------------------------------------------------------------- the linear


def _mm(a, b, sa, sb, out_dtype, bias=None, fast=False):
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype, use_fast_accum=fast)


def _out_dtype(t: torch.Tensor):
    return t.dtype if t.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16


class FP8State:
    """What the fp8 backward needs from the forward (tensors are listed for ctx.save_for_backward)."""

    def __init__(self, recipe, f_dt, g_dt, w_dtype, has_bias, tensors, delayed=None):
        self.recipe, self.f_dt, self.g_dt, self.w_dtype, self.has_bias = recipe, f_dt, g_dt, w_dtype, has_bias
        self.tensors = tensors
        self.delayed = delayed


def replaying_forward() -> bool:
    """Whether this forward runs inside a backward pass: activation recompute (megatron's CheckpointFunction,
    torch.utils.checkpoint) replays forwards there; a training forward never runs inside one. Read inside the
    custom ops too (their bodies run eagerly, also in a compiled graph), so no graph is specialised on it."""
    return torch._C._current_graph_task_id() != -1


def fp8_forward(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], recipe: str = "tensorwise",
                fmt: str = "e4m3", need_wgrad: bool = True, delayed: Optional[DelayedLinearState] = None,
                x_amax: Optional[torch.Tensor] = None):
    """y2 (M, N) = x2 (M, K) @ weight.T (+ bias) in fp8, plus the FP8State the backward needs.
    delayed: this linear's amax histories (recipe "delayed" only; `DelayedScaling(...).linear_state()`).
    x_amax: tensorwise only, x2's amax as partial maxima from its producer (cast_tensorwise's amax=)."""
    if (recipe == "delayed") != (delayed is not None):
        raise ValueError("the delayed recipe needs this linear's DelayedLinearState (and other recipes take none)")
    if x_amax is not None and recipe != "tensorwise":
        raise ValueError(f"x_amax is the tensorwise recipe's (recipe {recipe!r} has no amax pass to skip)")
    f_dt, g_dt = fp8_formats(x2.device, fmt)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out_dt = _out_dtype(x2)
    fast = x2.device.type == "cuda"
    if recipe in ("tensorwise", "delayed"):
        hx, hw = (delayed.x, delayed.w) if delayed is not None else (None, None)
        record = delayed is None or not replaying_forward()
        xq, xqt, sx = cast_tensorwise(x2, f_dt, want_y=True, want_t=need_wgrad, history=hx, record=record,
                                      amax=x_amax)
        wq, wqt, sw = WEIGHT_CASTS.get(weight, (recipe, f_dt), lambda: cast_tensorwise(
            weight, f_dt, want_y=True, want_t=True, pad_t=False, history=hw, record=record))
        y = _mm(xq, wq.t(), sx, sw, out_dt, bias=bias.to(out_dt) if bias is not None else None, fast=fast)
        y = y[:x2.shape[0]]
        tensors = [xqt, sx, wqt, sw]
    elif recipe == "rowwise":
        xq, sx = cast_rowwise(x2, f_dt, pad_rows=True)
        wq, sw = WEIGHT_CASTS.get(weight, ("rowwise", f_dt), lambda: cast_rowwise(weight, f_dt))
        y = _mm(xq, wq.t(), sx, sw.t(), out_dt, fast=fast)[:x2.shape[0]]
        if bias is not None:
            y = y + bias.to(out_dt)
        tensors = [x2 if need_wgrad else None, weight]
    elif recipe == "blockwise":
        N, K = weight.shape
        gemms = _blockwise_plan(x2.device, f_dt, g_dt, K, N)
        # one read of x: x (MP, K) 1x128 along K for this GEMM and, for the wgrad, x^T (K, MP) 1x128 along the
        # tokens (saved in fp8: the backward neither re-reads nor keeps the bf16 input)
        xq, sx, xqt, sxt = cast_blockwise(x2, f_dt, want_t=need_wgrad, pad_rows=True)
        # 128x128 tiles, W (N, K) and W^T (K, N) from one read of the weight, with both scale layouts
        wq, sw, wqt, swt = WEIGHT_CASTS.get(weight, ("blockwise", f_dt),
                                            lambda: cast_blockwise(weight, f_dt, tile=True, want_t=True))
        y = blockwise_mm(xq, sx, wq.t(), sw, True, out_dt, gemms["fprop"])[:x2.shape[0]]  # B = W^T col-major
        if bias is not None:
            y = y + bias.to(out_dt)
        # x^T's scales as their contiguous (MP/128, K) storage; for dgrad: W as an (N, K) column-major view of W^T,
        # and its scales as the unpadded (N/128, K/128) view (the shapes the TorchTitan custom op declares;
        # _tile_scales_padded restores the padded layout)
        tensors = [xqt, sxt.t() if sxt is not None else None, wqt.t(), swt[:_cdiv(N, GROUP)]]
    else:
        raise ValueError(f"fp8 recipe must be one of {RECIPES}, not {recipe!r}")
    return y, FP8State(recipe, f_dt, g_dt, weight.dtype, bias is not None, tensors, delayed)


def fp8_backward(st: FP8State, dy2: torch.Tensor, need_dx: bool = True, need_dw: bool = True,
                 need_db: bool = True, after_dgrad=None, dy_amax: Optional[torch.Tensor] = None,
                 main_grad: Optional[torch.Tensor] = None):
    """(dx2, dw, db) for y2 = fp8_forward(...). `after_dgrad(dx2)` runs between the dgrad and the wgrad GEMMs
    (tensor parallelism launches the dgrad all-reduce / reduce-scatter there, so it overlaps the wgrad).
    dy_amax: tensorwise only, dy2's amax as partial maxima from its producer (cast_tensorwise's amax=).
    main_grad: tensorwise only, the weight's fp32 (N, K) gradient accumulator: the weight gradient is added into it
    inside the GEMM (primus.turbo.cublaslt.scaled_mm_add_) and dw is None."""
    recipe, g_dt, f_dt = st.recipe, st.g_dt, st.f_dt
    if dy_amax is not None and recipe != "tensorwise":
        raise ValueError(f"dy_amax is the tensorwise recipe's (recipe {recipe!r} has no amax pass to skip)")
    if main_grad is not None and (recipe != "tensorwise" or not need_dw):
        raise ValueError(f"main_grad is the tensorwise recipe's weight gradient (recipe {recipe!r}, need_dw {need_dw})")
    if dy2.stride(1) != 1:
        dy2 = dy2.contiguous()
    out_dt = _out_dtype(dy2)
    w_dt = st.w_dtype if st.w_dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    dx = dw = db = None
    if recipe in ("tensorwise", "delayed"):
        xqt, sx, wqt, sw = st.tensors
        hdy = st.delayed.dy if st.delayed is not None else None
        dyq, dyqt, sdy = cast_tensorwise(dy2, g_dt, want_y=need_dx, want_t=need_dw, history=hdy, amax=dy_amax)
        if need_dx:
            dx = _mm(dyq, wqt.t(), sdy, sw, out_dt)[:dy2.shape[0]]  # (MP,N) @ (N,K)
        if after_dgrad is not None:
            after_dgrad(dx)
        if main_grad is not None:
            from primus.turbo.cublaslt import scaled_mm_add_

            scaled_mm_add_(main_grad, dyqt, xqt.t(), sdy, sx)
        elif need_dw:
            dw = _mm(dyqt, xqt.t(), sdy, sx, w_dt)  # (N,MP) @ (MP,K), pad rows are zero
    elif recipe == "rowwise":
        x2, weight = st.tensors
        if need_dx:
            dyq, sdy = cast_rowwise(dy2, g_dt, pad_rows=True)  # along N
            wqt, swt = WEIGHT_CASTS.get(weight, ("rowwise_t", f_dt),  # W^T (K, N) rows along N
                                        lambda: cast_rowwise(weight, f_dt, transpose=True))
            dx = _mm(dyq, wqt.t(), sdy, swt.t(), out_dt)[:dy2.shape[0]]
        if after_dgrad is not None:
            after_dgrad(dx)
        if need_dw:
            dyqt, sdyt = cast_rowwise(dy2, g_dt, transpose=True, pad=True)  # dy^T (N, MP) along M
            xqt, sxt = cast_rowwise(x2, f_dt, transpose=True, pad=True)  # x^T (K, MP) along M
            dw = _mm(dyqt, xqt.t(), sdyt, sxt.t(), torch.bfloat16 if w_dt == torch.float32 else w_dt).to(w_dt)
    else:  # blockwise
        # xqt: x^T (K, MP) fp8, sxt_t: its 1x128 scales transposed (MP/128, K); wt: W (N, K) fp8 (column-major view
        # of W^T), swt: its tile scales (N/128, K/128)
        xqt, sxt_t, wt, swt = st.tensors
        N, K = wt.shape
        gemms = _blockwise_plan(dy2.device, f_dt, g_dt, K, N)
        if need_dx or need_dw:  # one read of dy: (MP, N) 1x128 along N and dy^T (N, MP) 1x128 along M
            dyq, sdy, dyqt, sdyt = cast_blockwise(dy2, g_dt, want_y=need_dx, want_t=need_dw, pad_rows=True)
        if need_dx:
            dx = blockwise_mm(dyq, sdy, wt, _tile_scales_padded(swt, K, N), True, out_dt,
                              gemms["dgrad"])[:dy2.shape[0]]
        if after_dgrad is not None:
            after_dgrad(dx)
        if need_dw:
            dw = blockwise_mm(dyqt, sdyt, xqt.t(), sxt_t.t(), False, w_dt, gemms["wgrad"])  # (N, MP) @ (MP, K)
    if st.has_bias and need_db:
        db = dy2.float().sum(0).to(st.w_dtype)
    return dx, dw, db


class _FP8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, fmt, delayed):
        shape = x.shape
        y, st = fp8_forward(x.reshape(-1, shape[-1]), weight, bias, recipe, fmt, need_wgrad=ctx.needs_input_grad[1],
                            delayed=delayed)
        ctx.save_for_backward(*st.tensors)
        st.tensors = None
        ctx.st = st
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        st = ctx.st
        st.tensors = list(ctx.saved_tensors)
        dx, dw, db = fp8_backward(st, dy.reshape(-1, dy.shape[-1]), ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                  ctx.needs_input_grad[2])
        if dx is not None:
            dx = dx.view(*dy.shape[:-1], dx.shape[-1])
        return dx, dw, db, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               recipe: str = "tensorwise", fmt: str = "e4m3",
               delayed: Optional[DelayedLinearState] = None) -> torch.Tensor:
    """y = x @ weight.T + bias with all three GEMMs (fprop, dgrad, wgrad) in fp8. fmt: "e4m3" or "hybrid".
    recipe "delayed" takes this linear's `delayed` state (kept by the caller across calls)."""
    recipe = getattr(recipe, "value", recipe)
    fmt = getattr(fmt, "value", fmt)
    return _FP8LinearFn.apply(x, weight, bias, recipe, fmt, delayed)


class FP8Linear(nn.Linear):
    """nn.Linear whose matmuls run in fp8 (same parameters, same state_dict keys)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: str = "tensorwise", fmt: str = "e4m3", delayed_scaling: Optional[DelayedScaling] = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._set_recipe(recipe, fmt, delayed_scaling)

    def _set_recipe(self, recipe, fmt, delayed_scaling):
        self.recipe, self.fmt = getattr(recipe, "value", recipe), getattr(fmt, "value", fmt)
        self.fp8_delayed = ((delayed_scaling or DelayedScaling()).linear_state() if self.recipe == "delayed"
                            else None)

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: str = "tensorwise", fmt: str = "e4m3",
                    delayed_scaling: Optional[DelayedScaling] = None) -> "FP8Linear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight, new.bias = lin.weight, lin.bias  # shared, not copied
        new._set_recipe(recipe, fmt, delayed_scaling)
        return new

    def forward(self, x):
        if x.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return fp8_linear(x, self.weight, self.bias, self.recipe, self.fmt, self.fp8_delayed)

    def extra_repr(self):
        return super().extra_repr() + f", recipe={self.recipe}, fmt={self.fmt}"


def swap_linears_to_fp8(module: nn.Module, recipe: str = "tensorwise", filter_fqns: Iterable[str] = ("output",),
                        fmt: str = "e4m3", delayed_scaling: Optional[DelayedScaling] = None) -> List[str]:
    """Replace, in place, every nn.Linear whose name contains none of `filter_fqns` and whose dims are multiples
    of 16 by an FP8Linear sharing its parameters. Returns the swapped names; skipped ones are logged."""
    recipe = getattr(recipe, "value", recipe)
    if recipe not in RECIPES:
        raise ValueError(f"fp8 recipe must be one of {RECIPES}, not {recipe!r}")
    filters: Sequence[str] = tuple(filter_fqns or ())
    swapped: List[str] = []
    for name, child in list(module.named_modules()):
        for cname, c in list(child.named_children()):
            fqn = f"{name}.{cname}" if name else cname
            if type(c) is not nn.Linear:
                continue
            if any(f and f in fqn for f in filters):
                continue
            if not fp8_shape_ok(c.in_features, c.out_features):
                log.info("fp8: %s kept in high precision (dims %dx%d not multiples of 16)", fqn, c.in_features,
                         c.out_features)
                continue
            setattr(child, cname, FP8Linear.from_linear(c, recipe, fmt, delayed_scaling))
            swapped.append(fqn)
    return swapped
