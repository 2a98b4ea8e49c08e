"""Probe (written in session 10, run in session 11 call 1): what recording costs in the delayed cast, and variants.

Result (docs/benchmarks.md, session 11): "relaxed+kernel" ran 1.16-1.19x session 10's production kernel and became
the production design; since then the "production (tuned)" row below times that design.

    python bench/delayed_record_probe.py [--shapes 8192x4096,8192x28672]

The production delayed cast (one kernel: cast, amax atomic, arrival count, the last program computes the next
scale) ran at 45.1 us at 8192x4096 where a replay of the same cast (no amax recorded) ran at 35.8 us (session 10,
call 8): recording costs 16-26%. Suspect: the amax atomic and the arrival (acq_rel, after the stores) wait for the
program's fp8 stores to land. Variants of the cast kernel (below, a copy of the production kernel's delayed path):
  relaxed+count  the amax atomic relaxed; the arrival count kept (acq_rel): one kernel
  relaxed+kernel the amax atomic relaxed, no arrival; a one-program kernel after the cast computes the next scale
                 (fp8_linear._delayed_next_scale, the production epilogue): two kernels
  replay         no recording at all (the lower bound)
Each variant over the 8 tiles of the production space (best shown), timed as the sum of its kernels' durations and
as queued wall time (`_common.queued_gpu_time`). Bytes and state must equal the production cast's, call by call.
On CPU (TRITON_INTERPRET=1, `--shapes 70x96 --cpu`) it checks the bytes only.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from primus.turbo.fp8_linear import _delayed_next_scale, _last_to_arrive  # noqa: E402


@triton.jit
def _cast_delayed_variant(X, SC, Y, YT, SINV, AMAX, META, HIST, R, C, RP, stride_xr, L, FP8_MAX, MARGIN_MULT,
                          BR: tl.constexpr, BC: tl.constexpr, NS: tl.constexpr, MOST_RECENT: tl.constexpr,
                          LB: tl.constexpr, SEM: tl.constexpr, COUNT: tl.constexpr, RECORD: tl.constexpr):
    scale = tl.load(SC)
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    inb = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=inb, other=0.0).to(tl.float32)
    y = tl.clamp(x * scale, -FP8_MAX, FP8_MAX)
    pmask = (rows[:, None] < RP) & (cols[None, :] < C)
    tl.store(Y + rows[:, None].to(tl.int64) * C + cols[None, :], y.to(Y.dtype.element_ty), mask=pmask)
    tl.store(YT + cols[None, :].to(tl.int64) * RP + rows[:, None], y.to(YT.dtype.element_ty), mask=pmask)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(SINV, 1.0 / scale)
    if RECORD:
        tile_amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        tl.atomic_max(AMAX + (pid_r * tl.num_programs(1) + pid_c) % NS, tile_amax, sem=SEM)
        if COUNT:
            if _last_to_arrive(META + 1, tl.num_programs(0) * tl.num_programs(1)):
                _delayed_next_scale(tl.load(META), scale, HIST, AMAX, SC, META, L, FP8_MAX, MARGIN_MULT,
                                    MOST_RECENT, LB, NS)


@triton.jit
def _next_scale_after(SC, AMAX, META, HIST, L, FP8_MAX, MARGIN_MULT, MOST_RECENT: tl.constexpr, LB: tl.constexpr,
                      NS: tl.constexpr):
    _delayed_next_scale(tl.load(META), tl.load(SC), HIST, AMAX, SC, META, L, FP8_MAX, MARGIN_MULT, MOST_RECENT,
                        LB, NS)


VARIANTS = {"relaxed+count": ("relaxed", True, True), "relaxed+kernel": ("relaxed", False, True),
            "acq_rel+count (production's)": ("acq_rel", True, True), "replay": ("relaxed", False, False)}


def variant_cast(name, x, h, cfg):
    sem, count, record = VARIANTS[name]
    R, C = x.shape
    RP = F8._pad16(R)
    e4 = torch.float8_e4m3fn
    y = torch.empty((RP, C), dtype=e4, device=x.device)
    yt = torch.empty((C, RP), dtype=e4, device=x.device)
    sinv = torch.empty((), dtype=torch.float32, device=x.device)
    hist, amax, sc, meta = h._state(x.device)
    st = h.settings
    L, mr, lb = st.history_len, st.algo == "most_recent", triton.next_power_of_2(st.history_len)
    fmax, mm = F8._fmax(e4), 2.0 ** -st.margin
    grid = (triton.cdiv(RP, cfg["BR"]), triton.cdiv(C, cfg["BC"]))
    _cast_delayed_variant[grid](x, sc, y, yt, sinv, amax, meta, hist, R, C, RP, x.stride(0), L, fmax, mm,
                                BR=cfg["BR"], BC=cfg["BC"], NS=F8.AmaxHistory.SPREAD, MOST_RECENT=mr, LB=lb, SEM=sem,
                                COUNT=count, RECORD=record, num_warps=cfg["num_warps"])
    if record and not count:
        _next_scale_after[(1,)](sc, amax, meta, hist, L, fmax, mm, MOST_RECENT=mr, LB=lb, NS=F8.AmaxHistory.SPREAD,
                                num_warps=4)
    return y, yt, sinv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096,4096x4096,8192x14336,8192x28672")
    ap.add_argument("--cpu", action="store_true", help="check the bytes only (TRITON_INTERPRET=1)")
    a = ap.parse_args()
    dev = "cpu" if a.cpu else "cuda"
    e4 = torch.float8_e4m3fn
    settings = F8.DelayedScaling(16, 0, "max")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        xs = [torch.randn(R, C, device=dev, dtype=torch.bfloat16) * (1 + i) for i in range(6)]
        cfgs = F8._TENSORWISE.configs[:1] if a.cpu else F8._TENSORWISE.configs
        for name in VARIANTS:
            if VARIANTS[name][2] is False:
                continue
            ok = True
            for cfg in cfgs:
                p, v = settings.history(), settings.history()
                for x in xs[:3]:  # both primed by production casts
                    F8.cast_tensorwise(x, e4, want_y=True, want_t=True, history=p)
                    F8.cast_tensorwise(x, e4, want_y=True, want_t=True, history=v)
                for x in xs[3:]:
                    yp, tp, sp = F8.cast_tensorwise(x, e4, want_y=True, want_t=True, history=p)
                    yv, tv, sv = variant_cast(name, x, v, cfg)
                    ok &= torch.equal(yp.view(torch.uint8), yv.view(torch.uint8)) and torch.equal(sp, sv)
                    ok &= torch.equal(tp.view(torch.uint8), tv.view(torch.uint8))
                    ok &= torch.equal(p.buf, v.buf) and torch.equal(p.meta, v.meta)
            print(f"{shape} {name}: bytes and state {'equal' if ok else 'DIFFERENT'} to production ({len(cfgs)} "
                  f"tiles)", flush=True)
        if a.cpu:
            continue
        from turbo_kernels import kernel_ms
        from primus.turbo import _common
        h = settings.history()
        for x in xs[:3]:
            F8.cast_tensorwise(x, e4, want_y=True, want_t=True, history=h)
        prod = lambda: F8.cast_tensorwise(xs[0], e4, want_y=True, want_t=True, history=h)
        gb = R * C * 4 / 1e9
        rows = [("production (tuned)", kernel_ms(prod), _common.queued_gpu_time(prod, quantiles=None), "")]
        for name in VARIANTS:
            best = None
            for cfg in F8._TENSORWISE.configs:
                fn = lambda cfg=cfg, name=name: variant_cast(name, xs[0], h, cfg)
                k = kernel_ms(fn)
                if best is None or k < best[0]:
                    best = (k, _common.queued_gpu_time(fn, quantiles=None), cfg)
            rows.append((name, best[0], best[1], f"{best[2]}"))
        base = rows[0][1]
        for name, k, w, cfg in rows:
            print(f"| {shape} | {name} | {k * 1e3:.1f} us ({gb / k * 1e3:.0f} GB/s) | {w * 1e3:.1f} us | "
                  f"{base / k:.3f}x | {cfg} |", flush=True)


if __name__ == "__main__":
    main()
