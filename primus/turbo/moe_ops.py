"""Fused MoE kernels (Triton), each forward and backward, none of them syncing with the host.

    probs, routing_map, aux_scores = fused_router(logits, topk, score_function="softmax", pre_softmax=False)
        probs (T, E) float32, zero off the top-k; routing_map (T, E) bool; aux_scores (T, E) float32: the scores
        the aux (load-balancing) loss uses (softmax over all experts, or sigmoid normalised per token) - computed
        from the same read of the logits. Megatron's TE-fused router returns the same (probs, routing_map).
    y = swiglu_with_probs(h, probs)          # h (T, 2F) = [gate | up], probs (T,) -> silu(gate) * up * probs
    permuted, permuted_probs, row_id_map = permute(tokens, routing_map, probs, num_out_tokens)
    out = unpermute(permuted, row_id_map, probs)   # sum over each token's experts, weighted by probs if given

Permutation order: expert-major, tokens in order within an expert (megatron-core's), so `routing_map.sum(0)`
(a device tensor) is directly the group sizes of `grouped_gemm`. `row_id_map` is (E, T) int32: the destination
row of token t for expert e, or -1. Pass `num_out_tokens` (T * topk for dropless routing) to stay sync-free.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from primus.turbo import _common

# ------------------------------------------------------------------------------------------------------- router


@triton.jit
def _router_fwd(L, P, RMAP, A, BIAS, T, E, s_l, TOPK: tl.constexpr, SIGMOID: tl.constexpr,
                PRE_SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE, BT: tl.constexpr, BE: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    rmask = rows < T
    cmask = cols < E
    m2 = rmask[:, None] & cmask[None, :]
    r64 = rows[:, None].to(tl.int64)
    x = tl.load(L + r64 * s_l + cols[None, :], mask=m2, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        s = tl.where(m2, 1.0 / (1.0 + tl.exp(-x)), 0.0)
        ssum = tl.sum(s, axis=1)
        aux = s / (ssum[:, None] + 1e-20)
        sel_val = s
        if HAS_BIAS:
            sel_val = s + tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    else:
        mx = tl.max(x, axis=1)
        ex = tl.exp(x - mx[:, None])
        ex = tl.where(m2, ex, 0.0)
        sm = ex / tl.sum(ex, axis=1)[:, None]
        aux = sm
        if PRE_SOFTMAX:
            sel_val = sm
        else:
            sel_val = x
    sel_val = tl.where(m2, sel_val, float("-inf"))
    sel = tl.zeros((BT, BE), dtype=tl.int32) != 0
    for _ in tl.static_range(TOPK):
        idx = tl.argmax(sel_val, axis=1)
        hit = cols[None, :] == idx[:, None]
        sel = sel | hit
        sel_val = tl.where(hit, float("-inf"), sel_val)
    if SIGMOID:
        q = tl.where(sel, s, 0.0)
        if TOPK > 1:
            q = q / (tl.sum(q, axis=1)[:, None] + 1e-20)
        p = q
    else:
        if PRE_SOFTMAX:
            p = tl.where(sel, sm, 0.0)
        else:
            xs = tl.where(sel, x, float("-inf"))
            mxs = tl.max(xs, axis=1)
            es = tl.where(sel, tl.exp(xs - mxs[:, None]), 0.0)
            p = es / tl.sum(es, axis=1)[:, None]
    p = p * SCALE
    off = r64 * E + cols[None, :]
    tl.store(P + off, p, mask=m2)
    tl.store(RMAP + off, sel.to(tl.int8), mask=m2)
    tl.store(A + off, aux, mask=m2)


@triton.jit
def _router_bwd(L, RMAP, GP, GA, DL, T, E, s_l, TOPK: tl.constexpr, SIGMOID: tl.constexpr,
                PRE_SOFTMAX: tl.constexpr, SCALE, HAS_GA: tl.constexpr, BT: tl.constexpr, BE: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    m2 = (rows[:, None] < T) & (cols[None, :] < E)
    r64 = rows[:, None].to(tl.int64)
    off = r64 * E + cols[None, :]
    x = tl.load(L + r64 * s_l + cols[None, :], mask=m2, other=float("-inf")).to(tl.float32)
    sel = tl.load(RMAP + off, mask=m2, other=0) != 0
    g = tl.load(GP + off, mask=m2, other=0.0).to(tl.float32) * SCALE
    if SIGMOID:
        s = tl.where(m2, 1.0 / (1.0 + tl.exp(-x)), 0.0)
        ds = s * (1.0 - s)
        q = tl.where(sel, s, 0.0)
        if TOPK > 1:
            z = tl.sum(q, axis=1)[:, None] + 1e-20
            p = q / z
            dq = (g - tl.sum(g * p, axis=1)[:, None]) / z
        else:
            dq = g
        dl = tl.where(sel, dq * ds, 0.0)
        if HAS_GA:
            ga = tl.load(GA + off, mask=m2, other=0.0).to(tl.float32)
            ssum = tl.sum(s, axis=1)[:, None] + 1e-20
            a = s / ssum
            dl += (ga - tl.sum(ga * a, axis=1)[:, None]) / ssum * ds
    else:
        mx = tl.max(x, axis=1)
        ex = tl.where(m2, tl.exp(x - mx[:, None]), 0.0)
        sm = ex / tl.sum(ex, axis=1)[:, None]
        if PRE_SOFTMAX:
            gs = tl.where(sel, g, 0.0)
            dl = sm * (gs - tl.sum(gs * sm, axis=1)[:, None])
        else:
            xs = tl.where(sel, x, float("-inf"))
            mxs = tl.max(xs, axis=1)
            es = tl.where(sel, tl.exp(xs - mxs[:, None]), 0.0)
            p = es / tl.sum(es, axis=1)[:, None]
            dl = p * (g - tl.sum(g * p, axis=1)[:, None])
        if HAS_GA:
            ga = tl.load(GA + off, mask=m2, other=0.0).to(tl.float32)
            dl += sm * (ga - tl.sum(ga * sm, axis=1)[:, None])
    tl.store(DL + r64 * E + cols[None, :], dl.to(DL.dtype.element_ty), mask=m2)


def _router_blocks(E: int):
    BE = max(16, triton.next_power_of_2(E))
    BT = max(1, min(64, 4096 // BE))
    return BT, BE


def _router_config_ok(cfg, BE=16, **_):
    return cfg["BT"] * BE <= 4096 and cfg["num_warps"] * 32 <= cfg["BT"] * BE


# fwd+bwd ran 0.89x eager at T=32768, E=64, k=8 with one config (64 tokens x 64 experts per program, 4 warps; the
# backward keeps ~10 such fp32 tiles live: register spills are the suspect). Autotuned per (T, E) on the GPU over
# fewer tokens per program and more warps; the interpreter runs _router_blocks' choice.
_ROUTER_SPACE = [{"BT": bt, "num_warps": w} for bt in (64, 32, 16, 8, 4) for w in (4, 8)]
_ROUTER_FWD = _common.Tuned(_router_fwd, _ROUTER_SPACE, key=["T", "E"], valid=_router_config_ok)
_ROUTER_BWD = _common.Tuned(_router_bwd, _ROUTER_SPACE, key=["T", "E"], valid=_router_config_ok)


# Each kernel pair is a torch custom op with a fake kernel and its autograd: torch.compile keeps the router, permute
# and unpermute inside a compiled MoE layer as single nodes (an autograd.Function launching Triton would be a graph
# break on each side of it), and eager calls run the same ops.
@torch.library.custom_op("primus::moe_router", mutates_args=())
def _router_op(logits: torch.Tensor, topk: int, sigmoid: bool, pre_softmax: bool, scale: float,
               expert_bias: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    p = _common.empty((T, E), torch.float32, logits.device)
    rmap = _common.empty((T, E), torch.int8, logits.device)
    aux = _common.empty((T, E), torch.float32, logits.device)
    BT, BE = _router_blocks(E)
    has_bias = expert_bias is not None
    _ROUTER_FWD.launch(lambda meta: (triton.cdiv(T, meta["BT"]),),
                       (logits, p, rmap, aux, expert_bias if has_bias else p, T, E, logits.stride(0)),
                       default={"BT": BT, "num_warps": 4}, TOPK=topk, SIGMOID=sigmoid, PRE_SOFTMAX=pre_softmax,
                       HAS_BIAS=has_bias, SCALE=scale, BE=BE)
    # bool out of the op (a view of the kernel's int8 map): a dtype view inside a compiled graph would be inductor's
    # to generate, and its CPU code cannot convert a bit-cast bool vector (torch 2.13: a C++ compile error)
    return p, rmap.view(torch.bool), aux


@_router_op.register_fake
def _(logits, topk, sigmoid, pre_softmax, scale, expert_bias):
    shape = tuple(logits.shape)
    return (logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.bool),
            logits.new_empty(shape, dtype=torch.float32))


@torch.library.custom_op("primus::moe_router_bwd", mutates_args=())
def _router_bwd_op(logits: torch.Tensor, rmap: torch.Tensor, gp: torch.Tensor, ga: Optional[torch.Tensor], topk: int,
                   sigmoid: bool, pre_softmax: bool, scale: float) -> torch.Tensor:
    T, E = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    gp = gp.contiguous()
    has_ga = ga is not None
    ga = ga.contiguous() if has_ga else gp
    dl = _common.empty((T, E), logits.dtype, logits.device)
    BT, BE = _router_blocks(E)
    rmap = rmap.view(torch.int8)
    _ROUTER_BWD.launch(lambda meta: (triton.cdiv(T, meta["BT"]),), (logits, rmap, gp, ga, dl, T, E, logits.stride(0)),
                       default={"BT": BT, "num_warps": 4}, TOPK=topk, SIGMOID=sigmoid, PRE_SOFTMAX=pre_softmax,
                       SCALE=scale, HAS_GA=has_ga, BE=BE)
    return dl


@_router_bwd_op.register_fake
def _(logits, rmap, gp, ga, topk, sigmoid, pre_softmax, scale):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _router_setup(ctx, inputs, output):
    logits, topk, sigmoid, pre_softmax, scale, _ = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.cfg = (topk, sigmoid, pre_softmax, scale)
    ctx.set_materialize_grads(False)  # an unused aux-score output gets no zero gradient (the kernel skips it)


def _router_backward(ctx, gp, _grmap, ga):
    if gp is None and ga is None:
        return None, None, None, None, None, None
    logits, rmap = ctx.saved_tensors
    if gp is None:
        gp = torch.zeros(logits.shape, device=logits.device, dtype=torch.float32)
    return _router_bwd_op(logits, rmap, gp, ga, *ctx.cfg), None, None, None, None, None


_router_op.register_autograd(_router_backward, setup_context=_router_setup)


def fused_router(logits: torch.Tensor, topk: int, score_function: str = "softmax", pre_softmax: bool = False,
                 scaling_factor: Optional[float] = None, expert_bias: Optional[torch.Tensor] = None):
    """Top-k routing with the aux-loss scores in one kernel (fwd) and one kernel (bwd). See the module doc."""
    score_function = getattr(score_function, "value", score_function)
    if score_function not in ("softmax", "sigmoid"):
        raise ValueError(f"score_function must be softmax or sigmoid, not {score_function!r}")
    if logits.shape[-1] > 1024:
        raise ValueError("fused_router supports up to 1024 experts")
    return _router_op(logits, int(topk), score_function == "sigmoid", bool(pre_softmax), float(scaling_factor or 1.0),
                      expert_bias)


def router_reference(logits, topk, score_function="softmax", pre_softmax=False, scaling_factor=None,
                     expert_bias=None):
    """megatron-core's topk_softmax_with_capacity (dropless) + compute_routing_scores_for_aux_loss, in torch."""
    x = logits.float() if logits.dtype != torch.float64 else logits
    if score_function == "softmax":
        aux = torch.softmax(x, -1)
        if pre_softmax:
            vals, idx = torch.topk(aux, topk, dim=-1)
            probs = vals
        else:
            vals, idx = torch.topk(x, topk, dim=-1)
            probs = torch.softmax(vals, -1)
    else:
        s = torch.sigmoid(x)
        aux = s / (s.sum(-1, keepdim=True) + 1e-20)
        sel = s + expert_bias.to(s.dtype) if expert_bias is not None else s
        _, idx = torch.topk(sel, topk, dim=-1)
        probs = torch.gather(s, 1, idx)
        if topk > 1:
            probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    probs = probs * (scaling_factor or 1.0)
    dense = torch.zeros_like(x).scatter(1, idx, probs)
    rmap = torch.zeros_like(x, dtype=torch.bool).scatter(1, idx, True)
    return dense, rmap, aux


# ------------------------------------------------------------------------------------------ swiglu with probs
# (kernels in primus/turbo/swiglu.py: one SwiGLU for the dense MLP and the experts)
from primus.turbo.swiglu import swiglu_with_probs, swiglu_with_probs_reference  # noqa: E402,F401


# Each token's program reads its column of the (E, T) row-id map once and gathers its routed (expert, row) pairs into
# BK slots (BK = the routes a token has, top-k when dropless), so the row traffic runs as [BK, columns] tiles whose
# lanes are all routed. The kernels before walked [E, columns] tiles with the unrouted rows masked off: at 64
# experts top-6, 58 of every 64 lanes did nothing, and the unpermute ran at a tenth of the copy bandwidth on an
# H100 (docs/benchmarks.md, "Where the compiled step goes"); the work grew with the expert count, not with top-k.


@triton.jit
def _token_routes(MAP, t, T, E, BE: tl.constexpr):
    """Token t's column of the row-id map: (row per expert, -1 unrouted; the slot of each routed expert among the
    token's routes, in expert order; how many routes it has)."""
    es = tl.arange(0, BE)
    row = tl.load(MAP + es * T + t, mask=es < E, other=-1)
    routed = row >= 0
    slot = tl.cumsum(routed.to(tl.int32), axis=0) - 1
    return row, slot, tl.sum(routed.to(tl.int32), axis=0)


@triton.jit
def _slots(row, slot, k0, BE: tl.constexpr, BK: tl.constexpr):
    """Routes k0 .. k0+BK-1 of a token: (their rows, -1 past its last route; their experts)."""
    es = tl.arange(0, BE)
    ks = k0 + tl.arange(0, BK)
    hit = (row[None, :] >= 0) & (slot[None, :] == ks[:, None])  # [BK, BE]: at most one hit per slot
    rows = tl.sum(tl.where(hit, row[None, :] + 1, 0), axis=1) - 1
    return rows, tl.sum(tl.where(hit, es[None, :], 0), axis=1)


@triton.jit
def _permute_kernel(X, MAP, P, Y, PY, T, E, H, s_x, s_y, NCHUNK, HAS_P: tl.constexpr, BH: tl.constexpr,
                    BE: tl.constexpr, BK: tl.constexpr):
    """Copy token t to each of its routed rows (and its probs), as [BK, BH] stores."""
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    row, slot, n = _token_routes(MAP, t, T, E, BE)
    for k0 in range(0, n, BK):
        dst, ex = _slots(row, slot, k0, BE, BK)
        ok = dst >= 0
        drow = dst.to(tl.int64)[:, None] * s_y
        for i in range(0, NCHUNK):
            cols = i * BH + tl.arange(0, BH)
            cm = cols < H
            x = tl.load(X + t64 * s_x + cols, mask=cm, other=0.0)
            tl.store(Y + drow + cols[None, :], tl.broadcast_to(x[None, :], (BK, BH)), mask=ok[:, None] & cm[None, :])
        if HAS_P:
            tl.store(PY + dst, tl.load(P + t64 * E + ex, mask=ok, other=0.0), mask=ok)


@triton.jit
def _unpermute_kernel(Y, MAP, P, OUT, T, E, H, s_y, s_o, NCHUNK, HAS_P: tl.constexpr, BH: tl.constexpr,
                      BE: tl.constexpr, BK: tl.constexpr):
    """out[t] = sum over the routes of token t: y[row] (* probs[t, expert]). The first BK routes' rows and weights
    are gathered once; a token with more (a caller's BK below its routes) adds the rest slot group by group."""
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    row, slot, n = _token_routes(MAP, t, T, E, BE)
    src, ex = _slots(row, slot, 0, BE, BK)
    ok = src >= 0
    srow = src.to(tl.int64)[:, None] * s_y
    if HAS_P:
        w = tl.load(P + t64 * E + ex, mask=ok, other=0.0).to(tl.float32)
    for i in range(0, NCHUNK):
        cols = i * BH + tl.arange(0, BH)
        cm = cols < H
        v = tl.load(Y + srow + cols[None, :], mask=ok[:, None] & cm[None, :], other=0.0).to(tl.float32)
        if HAS_P:
            v = v * w[:, None]
        acc = tl.sum(v, axis=0)
        for k0 in range(BK, n, BK):
            src2, ex2 = _slots(row, slot, k0, BE, BK)
            ok2 = src2 >= 0
            v2 = tl.load(Y + src2.to(tl.int64)[:, None] * s_y + cols[None, :], mask=ok2[:, None] & cm[None, :],
                         other=0.0).to(tl.float32)
            if HAS_P:
                v2 = v2 * tl.load(P + t64 * E + ex2, mask=ok2, other=0.0).to(tl.float32)[:, None]
            acc += tl.sum(v2, axis=0)
        tl.store(OUT + t64 * s_o + cols, acc.to(OUT.dtype.element_ty), mask=cm)


@triton.jit
def _unpermute_bwd_kernel(DO, Y, MAP, P, DY, DP, T, E, H, s_do, s_y, s_dy, NCHUNK, BH: tl.constexpr,
                          BE: tl.constexpr, BK: tl.constexpr):
    """d y[row of (t, e)] = dout[t] * probs[t, e];  d probs[t, e] = <dout[t], y[row of (t, e)]> (0 off the routing
    map), [BK, BH] tiles per slot group; the token's d probs row is written once, [BE] wide."""
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    es = tl.arange(0, BE)
    row, slot, n = _token_routes(MAP, t, T, E, BE)
    dp = tl.zeros((BE,), dtype=tl.float32)
    for k0 in range(0, n, BK):
        src, ex = _slots(row, slot, k0, BE, BK)
        ok = src >= 0
        p = tl.load(P + t64 * E + ex, mask=ok, other=0.0).to(tl.float32)
        acc = tl.zeros((BK,), dtype=tl.float32)
        for i in range(0, NCHUNK):
            cols = i * BH + tl.arange(0, BH)
            cm = cols < H
            m2 = ok[:, None] & cm[None, :]
            do = tl.load(DO + t64 * s_do + cols, mask=cm, other=0.0).to(tl.float32)
            y = tl.load(Y + src.to(tl.int64)[:, None] * s_y + cols[None, :], mask=m2, other=0.0).to(tl.float32)
            acc += tl.sum(y * do[None, :], axis=1)
            tl.store(DY + src.to(tl.int64)[:, None] * s_dy + cols[None, :],
                     (do[None, :] * p[:, None]).to(DY.dtype.element_ty), mask=m2)
        dp += tl.sum(tl.where(ok[:, None] & (ex[:, None] == es[None, :]), acc[:, None], 0.0), axis=0)
    tl.store(DP + t64 * E + es, dp, mask=es < E)


def make_row_id_map(routing_map: torch.Tensor) -> torch.Tensor:
    """(T, E) bool -> (E, T) int32: destination row of (token, expert) in expert-major order, -1 if not routed."""
    m = routing_map.t().contiguous().to(torch.int32)
    pos = torch.cumsum(m.view(-1), 0).view_as(m) - 1
    return torch.where(m.bool(), pos, torch.full_like(pos, -1)).to(torch.int32)


def _bh(H):
    return min(1024 if not _common.interpreting() else 256, triton.next_power_of_2(H))


def _blocks(E: int, H: int, rows: int, T: int):
    """(BE, BK, BH): the row-id map's column, the route slots (the routes per token when every token has as many,
    as dropless top-k routing gives: rows = T x top-k) and the column chunk of a [BK, BH] tile of at most 8K."""
    BE = triton.next_power_of_2(E)
    BK = min(BE, triton.next_power_of_2(max(1, -(-rows // max(T, 1)))))
    return BE, BK, max(16, min(_bh(H), 8192 // BK))


def _permute_rows(x, row_id_map, n_out, probs=None):
    T, H = x.shape
    E = row_id_map.shape[0]
    y = _common.empty((n_out, H), x.dtype, x.device)
    py = _common.empty((n_out,), probs.dtype, x.device) if probs is not None else None
    BE, BK, BH = _blocks(E, H, n_out, T)
    _permute_kernel[(T,)](x, row_id_map, probs if probs is not None else x, y, py if py is not None else y, T, E, H,
                          x.stride(0), y.stride(0), triton.cdiv(H, BH), HAS_P=probs is not None, BH=BH, BE=BE,
                          BK=BK, num_warps=4)
    return y, py


def _unpermute_rows(y, row_id_map, T, probs=None, out_dtype=None):
    H = y.shape[1]
    E = row_id_map.shape[0]
    out = _common.empty((T, H), out_dtype or y.dtype, y.device)
    BE, BK, BH = _blocks(E, H, y.shape[0], T)
    _unpermute_kernel[(T,)](y, row_id_map, probs if probs is not None else y, out, T, E, H, y.stride(0),
                            out.stride(0), triton.cdiv(H, BH), HAS_P=probs is not None, BH=BH, BE=BE, BK=BK,
                            num_warps=4)
    return out


@torch.library.custom_op("primus::moe_permute", mutates_args=())
def _permute_op(x: torch.Tensor, row_id_map: torch.Tensor, n_out: int,
                probs: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    y, py = _permute_rows(x, row_id_map, n_out, probs)
    return y, py if py is not None else x.new_empty((0,))  # an op returns tensors: (0,) stands for "no probs"


@_permute_op.register_fake
def _(x, row_id_map, n_out, probs):
    return x.new_empty((n_out, x.shape[1])), probs.new_empty((n_out,)) if probs is not None else x.new_empty((0,))


def _permute_setup(ctx, inputs, output):
    x, row_id_map, _, probs = inputs
    ctx.save_for_backward(row_id_map)
    ctx.T, ctx.has_p = x.shape[0], probs is not None


def _permute_backward(ctx, dy, dpy):
    (row_id_map,) = ctx.saved_tensors
    dx = _unpermute_op(dy.contiguous(), row_id_map, ctx.T, None)
    dp = None
    if ctx.has_p:  # probs move with the rows: gather the grads back to (T, E)
        idx = row_id_map.t().long()
        dp = torch.where(idx >= 0, dpy[idx.clamp_min(0)], torch.zeros((), dtype=dpy.dtype, device=dpy.device))
    return dx, None, None, dp


_permute_op.register_autograd(_permute_backward, setup_context=_permute_setup)


@torch.library.custom_op("primus::moe_unpermute", mutates_args=())
def _unpermute_op(y: torch.Tensor, row_id_map: torch.Tensor, T: int, probs: Optional[torch.Tensor]) -> torch.Tensor:
    return _unpermute_rows(y, row_id_map, T, probs)


@_unpermute_op.register_fake
def _(y, row_id_map, T, probs):
    return y.new_empty((T, y.shape[1]))


@torch.library.custom_op("primus::moe_unpermute_bwd", mutates_args=())
def _unpermute_bwd_op(dout: torch.Tensor, y: torch.Tensor, row_id_map: torch.Tensor,
                      probs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    E, T = row_id_map.shape
    H = y.shape[1]
    dout = dout.contiguous()
    dy = _common.empty(y.shape, y.dtype, y.device)
    dp = _common.empty((T, E), torch.float32, y.device)
    BE, BK, BH = _blocks(E, H, y.shape[0], T)
    _unpermute_bwd_kernel[(T,)](dout, y, row_id_map, probs, dy, dp, T, E, H, dout.stride(0), y.stride(0),
                                dy.stride(0), triton.cdiv(H, BH), BH=BH, BE=BE, BK=BK, num_warps=4)
    return dy, dp.to(probs.dtype)


@_unpermute_bwd_op.register_fake
def _(dout, y, row_id_map, probs):
    return y.new_empty(y.shape), probs.new_empty(tuple(row_id_map.shape[::-1]))


def _unpermute_setup(ctx, inputs, output):
    y, row_id_map, _, probs = inputs
    ctx.has_p, ctx.rows = probs is not None, y.shape[0]
    ctx.save_for_backward(y if ctx.has_p else None, row_id_map, probs)  # y is read back only to weight probs' grad


def _unpermute_backward(ctx, dout):
    y, row_id_map, probs = ctx.saved_tensors
    if not ctx.has_p:
        return _permute_op(dout.contiguous(), row_id_map, ctx.rows, None)[0], None, None, None
    dy, dp = _unpermute_bwd_op(dout, y, row_id_map, probs)
    return dy, None, None, dp


_unpermute_op.register_autograd(_unpermute_backward, setup_context=_unpermute_setup)


def permute(tokens: torch.Tensor, routing_map: torch.Tensor, probs: Optional[torch.Tensor] = None,
            num_out_tokens: Optional[int] = None):
    """Copy each token to one row per expert it is routed to (expert-major). Returns (permuted (n, H),
    permuted_probs (n,) or None, row_id_map (E, T) int32). num_out_tokens=None reads routing_map.sum() (a sync)."""
    if tokens.stride(-1) != 1:
        tokens = tokens.contiguous()
    row_id_map = make_row_id_map(routing_map)
    n_out = int(num_out_tokens) if num_out_tokens is not None else int(routing_map.sum().item())
    p = probs.contiguous() if probs is not None else None
    y, py = _permute_op(tokens, row_id_map, n_out, p)
    return y, (py if p is not None else None), row_id_map


def unpermute(permuted: torch.Tensor, row_id_map: torch.Tensor, probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Inverse of `permute`: out[t] = sum over t's experts of permuted[row] (times probs[t, e] when given)."""
    if permuted.stride(-1) != 1:
        permuted = permuted.contiguous()
    T = row_id_map.shape[1]
    return _unpermute_op(permuted, row_id_map, T, probs.contiguous() if probs is not None else None)


def permute_reference(tokens, routing_map, probs=None):
    idx_e, idx_t = routing_map.t().nonzero(as_tuple=True)  # expert-major, tokens in order
    y = tokens[idx_t]
    py = probs.t()[idx_e, idx_t] if probs is not None else None
    return y, py, (idx_e, idx_t)


def unpermute_reference(permuted, idx, T, probs=None):
    idx_e, idx_t = idx
    v = permuted.double() if permuted.dtype == torch.float64 else permuted.float()
    if probs is not None:
        v = v * probs[idx_t, idx_e].to(v.dtype)[:, None]
    out = torch.zeros(T, permuted.shape[1], dtype=v.dtype, device=permuted.device)
    out.index_add_(0, idx_t, v)
    return out.to(permuted.dtype)
