"""Probe: ways to write the blockwise both-ways cast (dy (M, N) 1x128 along N and dy^T (N, M) 1x128 along M from
one read), timed in GPU time against the production kernel's configs, outputs checked bit-equal to it.

    python bench/blockcast_probe.py [--shapes 8192x4096,8192x14336,4096x14336] [--cases "dy and dy^T 1x128",...]

`--baseline OLD/fp8_linear.py` times an older tree's cast next to this one's. Variants (`--variants`, session 7):
`trans16` transposes the bf16 input tile before dy^T's amax and cast (call 4: 1.04x; now the production kernel's
way), `hold16` keeps the tile in the input dtype (amax is exact there; fp32 only per product), `tma` stores Y / YT
through tensor descriptors (TMA on sm90), `tma_load` also loads x through one (call 1: slower); docs/benchmarks.md.
`--persistent` (session 8): the dy / dy^T cast as a persistent kernel whose tile loop's loads are pipelined.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from primus.turbo import _common  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import same_bytes  # noqa: E402


@triton.jit
def _hold16(X, Y, YT, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, FP8_MAX,
            BR: tl.constexpr, BC: tl.constexpr, COLS_FIRST: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr = tl.arange(0, BR)
    lc = tl.arange(0, BC)
    rows = r0 + lr
    cols = c0 + lc
    x = tl.load(X + r0.to(tl.int64) * stride_xr + c0 + (lr[:, None] * stride_xr + lc[None, :]),
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0)
    ax = tl.abs(x)
    ypt = Y + (r0.to(tl.int64) * C + c0) + (lr[:, None] * C + lc[None, :])
    tpt = YT + (c0.to(tl.int64) * RP + r0) + (lc[:, None] * RP + lr[None, :])
    ymask = (rows[:, None] < RP) & (cols[None, :] < C)
    tmask = (cols[:, None] < C) & (rows[None, :] < RP)
    if COLS_FIRST:
        cs = FP8_MAX / tl.maximum(tl.max(ax, axis=0).to(tl.float32), 1e-12)
        qt = tl.clamp(x.to(tl.float32) * cs[None, :], -FP8_MAX, FP8_MAX)
        tl.store(tpt, tl.trans(qt.to(YT.dtype.element_ty)), mask=tmask)
        tl.store(ST + pid_r * s_tr + cols * s_tc, 1.0 / cs, mask=cols < C)
    rs = FP8_MAX / tl.maximum(tl.max(ax, axis=1).to(tl.float32), 1e-12)
    q = tl.clamp(x.to(tl.float32) * rs[:, None], -FP8_MAX, FP8_MAX)
    tl.store(ypt, q.to(Y.dtype.element_ty), mask=ymask)
    tl.store(S + rows * s_sr + pid_c * s_sc, 1.0 / rs, mask=rows < RP)
    if not COLS_FIRST:
        cs = FP8_MAX / tl.maximum(tl.max(ax, axis=0).to(tl.float32), 1e-12)
        qt = tl.clamp(x.to(tl.float32) * cs[None, :], -FP8_MAX, FP8_MAX)
        tl.store(tpt, tl.trans(qt.to(YT.dtype.element_ty)), mask=tmask)
        tl.store(ST + pid_r * s_tr + cols * s_tc, 1.0 / cs, mask=cols < C)


@triton.jit
def _trans16(X, Y, YT, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, FP8_MAX,
             BR: tl.constexpr, BC: tl.constexpr):
    """The input tile transposed first (tl.trans of the bf16 tile): dy^T's groups are then rows of that tile, its
    amax an axis-1 reduction and its fp8 store row-major, like Y's."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr = tl.arange(0, BR)
    lc = tl.arange(0, BC)
    rows = r0 + lr
    cols = c0 + lc
    x = tl.load(X + r0.to(tl.int64) * stride_xr + c0 + (lr[:, None] * stride_xr + lc[None, :]),
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0)
    xf = x.to(tl.float32)
    rs = FP8_MAX / tl.maximum(tl.max(tl.abs(xf), axis=1), 1e-12)
    q = tl.clamp(xf * rs[:, None], -FP8_MAX, FP8_MAX)
    tl.store(Y + (r0.to(tl.int64) * C + c0) + (lr[:, None] * C + lc[None, :]), q.to(Y.dtype.element_ty),
             mask=(rows[:, None] < RP) & (cols[None, :] < C))
    tl.store(S + rows * s_sr + pid_c * s_sc, 1.0 / rs, mask=rows < RP)
    xt = tl.trans(x).to(tl.float32)  # (BC, BR)
    cs = FP8_MAX / tl.maximum(tl.max(tl.abs(xt), axis=1), 1e-12)
    qt = tl.clamp(xt * cs[:, None], -FP8_MAX, FP8_MAX)
    tl.store(YT + (c0.to(tl.int64) * RP + r0) + (lc[:, None] * RP + lr[None, :]), qt.to(YT.dtype.element_ty),
             mask=(cols[:, None] < C) & (rows[None, :] < RP))
    tl.store(ST + pid_r * s_tr + cols * s_tc, 1.0 / cs, mask=cols < C)


def run_trans16(x, dt, warps):
    R, C = x.shape
    RP, y, sy, yt, syt = outputs(x, dt, False, True, True)
    _trans16[(RP // 128, triton.cdiv(C, 128))](
        x, y, yt, sy, syt, R, C, RP, x.stride(0), sy.stride(0), sy.stride(1), syt.stride(1), syt.stride(0),
        F8._fmax(dt), BR=128, BC=128, num_warps=warps)
    return y, sy, yt, syt


@triton.jit
def _tma(X, XD, YD, YTD, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, SPAD, STPAD, FP8_MAX,
         BR: tl.constexpr, BC: tl.constexpr, TMA_LOAD: tl.constexpr, TILE: tl.constexpr, WRITE_Y: tl.constexpr,
         WRITE_T: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr = tl.arange(0, BR)
    lc = tl.arange(0, BC)
    rows = r0 + lr
    cols = c0 + lc
    if TMA_LOAD:
        x = XD.load([r0, c0]).to(tl.float32)
    else:
        x = tl.load(X + r0.to(tl.int64) * stride_xr + c0 + (lr[:, None] * stride_xr + lc[None, :]),
                    mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(tl.float32)
    if TILE:
        scale = FP8_MAX / tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-12)
        q = tl.clamp(x * scale, -FP8_MAX, FP8_MAX).to(YD.dtype)
        pad = tl.arange(0, 4)
        YD.store([r0, c0], q)
        tl.store(S + pid_r * s_sr + pid_c * s_sc, 1.0 / scale)
        if pid_c == tl.num_programs(1) - 1:
            tl.store(S + pid_r * s_sr + (pid_c + 1 + pad) * s_sc, tl.zeros((4,), tl.float32),
                     mask=pid_c + 1 + pad < SPAD)
        YTD.store([c0, r0], tl.trans(q))
        tl.store(ST + pid_c * s_tr + pid_r * s_tc, 1.0 / scale)
        if pid_r == tl.num_programs(0) - 1:
            tl.store(ST + pid_c * s_tr + (pid_r + 1 + pad) * s_tc, tl.zeros((4,), tl.float32),
                     mask=pid_r + 1 + pad < STPAD)
    else:
        if WRITE_Y:
            rs = FP8_MAX / tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12)
            q = tl.clamp(x * rs[:, None], -FP8_MAX, FP8_MAX)
            YD.store([r0, c0], q.to(YD.dtype))
            tl.store(S + rows * s_sr + pid_c * s_sc, 1.0 / rs, mask=rows < RP)
        if WRITE_T:
            cs = FP8_MAX / tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12)
            qt = tl.clamp(x * cs[None, :], -FP8_MAX, FP8_MAX)
            YTD.store([c0, r0], tl.trans(qt.to(YTD.dtype)))
            tl.store(ST + pid_r * s_tr + cols * s_tc, 1.0 / cs, mask=cols < C)


@triton.jit
def _persist(X, Y, YT, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, FP8_MAX, NTC, NT,
             BR: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr):
    """The both-ways 1x128 cast as a persistent kernel: each program walks tiles pid, pid + nprog, ... with the
    loop's loads pipelined STAGES deep (the next tile is in flight while this one is cast and stored)."""
    lr = tl.arange(0, BR)
    lc = tl.arange(0, BC)
    for t in tl.range(tl.program_id(0), NT, tl.num_programs(0), num_stages=STAGES):
        pid_r = t // NTC
        pid_c = t % NTC
        r0 = pid_r * BR
        c0 = pid_c * BC
        rows = r0 + lr
        cols = c0 + lc
        x = tl.load(X + (r0.to(tl.int64) * stride_xr + c0) + (lr[:, None] * stride_xr + lc[None, :]),
                    mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(tl.float32)
        rs = FP8_MAX / tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12)
        q = tl.clamp(x * rs[:, None], -FP8_MAX, FP8_MAX)
        tl.store(Y + (r0.to(tl.int64) * C + c0) + (lr[:, None] * C + lc[None, :]), q.to(Y.dtype.element_ty),
                 mask=(rows[:, None] < RP) & (cols[None, :] < C))
        tl.store(S + rows * s_sr + pid_c * s_sc, 1.0 / rs, mask=rows < RP)
        cs = FP8_MAX / tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12)
        qt = tl.clamp(x * cs[None, :], -FP8_MAX, FP8_MAX)
        tl.store(YT + (c0.to(tl.int64) * RP + r0) + (lc[:, None] * RP + lr[None, :]),
                 tl.trans(qt.to(YT.dtype.element_ty)), mask=(cols[:, None] < C) & (rows[None, :] < RP))
        tl.store(ST + pid_r * s_tr + cols * s_tc, 1.0 / cs, mask=cols < C)


def run_persist(x, dt, warps, stages, per_sm):
    R, C = x.shape
    RP, y, sy, yt, syt = outputs(x, dt, False, True, True)
    ntc = triton.cdiv(C, 128)
    nt = (RP // 128) * ntc
    nprog = min(nt, per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count)
    _persist[(nprog,)](
        x, y, yt, sy, syt, R, C, RP, x.stride(0), sy.stride(0), sy.stride(1), syt.stride(1), syt.stride(0),
        F8._fmax(dt), ntc, nt, BR=128, BC=128, STAGES=stages, num_warps=warps)
    return y, sy, yt, syt


def outputs(x, dt, tile, wy, wt):
    R, C = x.shape
    RP = R if tile else F8._round_up(R, 128)
    y = torch.empty((RP, C), dtype=dt, device=x.device) if wy else None
    yt = torch.empty((C, RP), dtype=dt, device=x.device) if wt else None
    sy = F8._scale_tensor(RP, C, tile, x.device) if wy else None
    syt = F8._scale_tensor(C, RP, tile, x.device) if wt else None
    return RP, y, sy, yt, syt


def run_hold16(x, dt, warps, cols_first):
    R, C = x.shape
    RP, y, sy, yt, syt = outputs(x, dt, False, True, True)
    _hold16[(RP // 128, triton.cdiv(C, 128))](
        x, y, yt, sy, syt, R, C, RP, x.stride(0), sy.stride(0), sy.stride(1), syt.stride(1), syt.stride(0),
        F8._fmax(dt), BR=128, BC=128, COLS_FIRST=cols_first, num_warps=warps)
    return y, sy, yt, syt


def run_tma(x, dt, warps, tma_load, tile=False, wy=True, wt=True, BR=128, BC=128):
    R, C = x.shape
    RP, y, sy, yt, syt = outputs(x, dt, tile, wy, wt)
    xd = TensorDescriptor.from_tensor(x, [BR, BC])
    yd = TensorDescriptor.from_tensor(y if wy else yt, [BR, BC] if wy else [BC, BR])
    ytd = TensorDescriptor.from_tensor(yt if wt else y, [BC, BR] if wt else [BR, BC])
    s_y = sy if sy is not None else syt
    s_t = syt if syt is not None else sy
    ssr, ssc = (s_y.stride(1), s_y.stride(0)) if tile else (s_y.stride(0), s_y.stride(1))
    _tma[(triton.cdiv(RP, BR), triton.cdiv(C, BC))](
        x, xd, yd, ytd, s_y, s_t, R, C, RP, x.stride(0), ssr, ssc, s_t.stride(1), s_t.stride(0), s_y.shape[0],
        s_t.shape[0], F8._fmax(dt), BR=BR, BC=BC, TMA_LOAD=tma_load, TILE=tile, WRITE_Y=wy, WRITE_T=wt,
        num_warps=warps)
    return y, sy, yt, syt


CASES = {  # name: (tile, want_y, want_t, the tile shapes tried)
    "dy and dy^T 1x128": (False, True, True, [(128, 128)]),
    "W and W^T 128x128": (True, True, True, [(128, 128)]),
    "x^T 1x128": (False, False, True, [(128, 64), (128, 128), (128, 32)]),
    "x 1x128": (False, True, False, [(32, 128), (64, 128), (128, 128)]),
}



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096,8192x14336,4096x14336")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--baseline", help="an older primus/turbo/fp8_linear.py: its cast_blockwise (autotuned) is "
                                       "timed next to this tree's, outputs checked bit-equal")
    ap.add_argument("--persistent", action="store_true", help="the dy / dy^T cast as a persistent, pipelined kernel")
    ap.add_argument("--variants", action="store_true", help="also the probe's own variants (hold16, trans16, tma)")
    args = ap.parse_args()
    base = None
    if args.baseline:
        from turbo_kernels import load_module
        base = load_module(args.baseline)
    dt = torch.float8_e4m3fn
    gbs = None
    print("| shape | case | variant | tile | warps | ms | % copy bw | bit-equal |\n|---|---|---|---|---:|---:|---:|---|")
    for s in args.shapes.split(","):
        R, C = (int(v) for v in s.split("x"))
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16) * 3
        x[5, 7] = 1000.0  # one large element: a group whose scale differs
        if gbs is None:  # copy bandwidth: read + write of this tensor
            z = torch.empty_like(x)
            ms = _common.queued_gpu_time(lambda: z.copy_(x))[0]
            gbs = 2 * x.numel() * 2 / ms / 1e6
            print(f"<!-- copy {gbs:.0f} GB/s -->")
        for case in args.cases.split(","):
            tile, wy, wt, tiles = CASES[case]
            need = x.numel() * (2 + int(wy) + int(wt))

            def prod():
                return F8.cast_blockwise(x, dt, tile=tile, want_y=wy, want_t=wt, pad_rows=not tile)

            ref = prod()
            cands = [("production (autotuned)", "", 0, prod)]
            if base is not None:
                cands.append(("baseline (autotuned)", "", 0, lambda: base.cast_blockwise(
                    x, dt, tile=tile, want_y=wy, want_t=wt, pad_rows=not tile)))
            if args.persistent and case.startswith("dy"):
                for w in (4, 8):
                    for stages in (1, 2, 3):
                        for per_sm in (1, 2, 4):
                            cands.append((f"persistent {per_sm}/SM, {stages} stages", "128x128", w,
                                          lambda w=w, st=stages, ps=per_sm: run_persist(x, dt, w, st, ps)))
            if args.variants and case.startswith("dy"):
                for w in (4, 8, 16):
                    cands.append(("input tile transposed (bf16)", "128x128", w, lambda w=w: run_trans16(x, dt, w)))
                for w in (8, 16):
                    for cf in (False, True):
                        cands.append((f"hold16 {'cols' if cf else 'rows'} first", "128x128", w,
                                      lambda w=w, cf=cf: run_hold16(x, dt, w, cf)))
            for br, bc in (tiles if args.variants else []):
                for w in (4, 8, 16):
                    for ld in (False, True):
                        cands.append((f"tma {'load+' if ld else ''}store", f"{br}x{bc}", w,
                                      lambda w=w, ld=ld, br=br, bc=bc: run_tma(x, dt, w, ld, tile, wy, wt, br, bc)))
            for name, t, w, fn in cands:
                try:
                    out = fn()
                    eq = same_bytes(out, ref)
                    ms = _common.queued_gpu_time(fn)[0]
                    print(f"| {s} | {case} | {name} | {t} | {w} | {ms:.4f} | {need / ms / 1e6 / gbs * 100:.1f} "
                          f"| {eq} |", flush=True)
                except Exception as e:  # noqa: BLE001 - a probe reports every variant
                    print(f"| {s} | {case} | {name} | {t} | {w} | error | {type(e).__name__}: {str(e)[:150]} | |",
                          flush=True)


if __name__ == "__main__":
    main()
