"""Probe (written in session 11, run in session 12): the fp8 casts with a transposed output, their transpose done
in registers with Gluon (Triton's explicit-layout dialect), vs the production Triton kernels.

    python bench/gluon_cast_probe.py --sass            # on the CPU: sm90 SASS instruction counts
    python bench/gluon_cast_probe.py [--shapes ...]    # on the GPU: bytes vs production, GPU time, % copy bw
    python bench/gluon_cast_probe.py --threshold       # on the GPU: production's cast with / without the Gluon
                                                       # kernel (primus/turbo/fp8_cast_gluon.py), small to large

Why (session 11, SASS read on the CPU with Triton's ptxas): the blockwise both-ways cast (dy 1x128 along N and
dy^T 1x128 along M from one read), 128x128 tile, 8 warps, ran 1,240 instructions per thread at 60-71% of copy
bandwidth; Triton transposes its fp8 tile through shared memory byte by byte (64 LDS.U8 and ~48 PRMT per thread).
With each thread holding an 8x8 block (fp8_cast_gluon.TILE) the transpose is a permute of its own registers plus a
register-only reorder (TILE_T): 936 instructions, no byte-wide shared-memory traffic. Session 12 call 1: 1.11-1.12x
at Llama shapes, bytes equal, so that kernel is production's since (primus/turbo/fp8_cast_gluon.py, timed here
from there). The same transpose in the rowwise x^T cast pass (MODE 1) and the delayed replay (MODE 2), kept below
as the record: 0.96-1.01x, since those kernels store through a strided pointer, which Triton already converts well.
Not for ROCm (the layouts are NVIDIA's 32-lane warps).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

from primus.turbo import fp8_cast_gluon as G  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import same_bytes  # noqa: E402

BR = BC = 128
NUM_WARPS = 8


@gluon.jit
def _cast_t_gluon(X, Y, YT, S, ST, SRC, R, C, RT, CT, stride_xr, FP8_MAX, BR: gl.constexpr, BC: gl.constexpr,
                  MODE: gl.constexpr):
    """fp8_cast_gluon's register transpose applied to the other transposed casts (call 1: no faster there), the
    transposed output YT (CT, RT) (row-major, zero pad past C / R). MODE 1, rowwise transposed: YT only,
    per-column amax given in SRC (_colmax's), tiles in reversed order (as _cast_cols_t), exact division and clamp.
    MODE 2, delayed replay: one scale (SRC[1]), Y (RT, C) and YT, clamp, scale_inv in S[0]."""
    if MODE == 1:
        pid_r = gl.num_programs(0) - 1 - gl.program_id(0)
        pid_c = gl.num_programs(1) - 1 - gl.program_id(1)
    else:
        pid_r = gl.program_id(0)
        pid_c = gl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr, lc, rows, cols, x = G.load_tile(X, R, C, stride_xr, r0, c0, BR, BC)
    if MODE == 1:
        cs = FP8_MAX / gl.maximum(gl.load(SRC + cols, mask=cols < C, other=0.0), 1e-12)
        yt = gl.minimum(gl.maximum(x * cs[None, :], -FP8_MAX), FP8_MAX)
        gl.store(ST + cols, 1.0 / cs, mask=(cols < CT) & (pid_r == 0))
    else:
        scale = gl.load(SRC + 1)
        yt = gl.minimum(gl.maximum(x * scale, -FP8_MAX), FP8_MAX)
        gl.store(Y + (r0.to(gl.int64) * C + c0) + (lr[:, None] * C + lc[None, :]), yt.to(Y.dtype.element_ty),
                 mask=(rows[:, None] < RT) & (cols[None, :] < C))
        if (pid_r == 0) & (pid_c == 0):
            gl.store(S, 1.0 / scale)
    qt = gl.convert_layout(gl.permute(yt, [1, 0]), G.TILE_T).to(YT.dtype.element_ty)
    tc = gl.arange(0, BC, layout=gl.SliceLayout(1, G.TILE_T))
    tr = gl.arange(0, BR, layout=gl.SliceLayout(0, G.TILE_T))
    gl.store(YT + (c0.to(gl.int64) * RT + r0) + (tc[:, None] * RT + tr[None, :]), qt,
             mask=((c0 + tc)[:, None] < CT) & ((r0 + tr)[None, :] < RT))


PROD_SIG = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
            "RP": "i32", "stride_xr": "i32", "stride_xc": "constexpr", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32",
            "s_tc": "i32", "SPAD": "i32", "STPAD": "i32", "FP8_MAX": "fp32"}
GLU_SIG = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "SRC": "*fp32", "R": "i32",
           "C": "i32", "RT": "i32", "CT": "i32", "stride_xr": "i32", "FP8_MAX": "fp32"}
PROD_GLU_SIG = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
                "RP": "i32", "stride_xr": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32", "s_tc": "i32",
                "FP8_MAX": "fp32"}


def sass_counts(src, num_warps, elements):
    """(instructions per thread, per element, the top opcodes) of a compiled source, sm90, on the CPU."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    k = triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", out)
    top = collections.Counter(o.split(".")[0] for o in ops).most_common(10)
    return len(ops), len(ops) * num_warps * 32 / elements, top


def sass():
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    def attrs(fn, sig):
        return {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, t in sig.items()
                if t.startswith("*") or t == "i32"}

    prod_ce = {"stride_xc": 1, "BR": BR, "BC": BC, "TILE": False, "WRITE_Y": True, "WRITE_T": True, "SAT": True}
    real = {k: v for k, v in PROD_SIG.items() if v != "constexpr"}
    prod = ASTSource(fn=F8._cast_block, signature={**PROD_SIG, **{k: "constexpr" for k in prod_ce}},
                     constexprs=prod_ce, attrs=attrs(F8._cast_block, real))
    print(f"production blockwise both-ways: %d instructions per thread, %.2f per element; %s"
          % sass_counts(prod, NUM_WARPS, BR * BC))
    ce = {"BR": BR, "BC": BC}
    glu = GluonASTSource(fn=G._cast_both_1x128, signature={**PROD_GLU_SIG, **{k: "constexpr" for k in ce}},
                         constexprs=ce, attrs=attrs(G._cast_both_1x128, PROD_GLU_SIG))
    print("Gluon blockwise both-ways (fp8_cast_gluon): %d instructions per thread, %.2f per element; %s"
          % sass_counts(glu, NUM_WARPS, BR * BC))
    for mode, name in ((1, "rowwise transposed"), (2, "delayed replay both-ways")):
        g_ce = {"BR": BR, "BC": BC, "MODE": mode}
        glu = GluonASTSource(fn=_cast_t_gluon, signature={**GLU_SIG, **{k: "constexpr" for k in g_ce}},
                             constexprs=g_ce, attrs=attrs(_cast_t_gluon, GLU_SIG))
        print(f"Gluon {name}: %d instructions per thread, %.2f per element; %s"
              % sass_counts(glu, NUM_WARPS, BR * BC))


def _launch(x, y, yt, s, st, src, RT, CT, fmax, mode):
    R, C = x.shape
    grid = (triton.cdiv(max(R, RT), BR), triton.cdiv(max(C, CT), BC))
    _cast_t_gluon[grid](x, y, yt, s, st, src, R, C, RT, CT, x.stride(0), fmax, BR=BR, BC=BC, MODE=mode,
                        num_warps=NUM_WARPS)


def gluon_blockwise(x, dtype):
    """= F8.cast_blockwise(x, dtype, want_t=True, pad_rows=True) through fp8_cast_gluon whatever the shape."""
    R, C = x.shape
    RP = F8._round_up(R, F8.GROUP)
    y = torch.empty((RP, C), dtype=dtype, device=x.device)
    yt = torch.empty((C, RP), dtype=dtype, device=x.device)
    sy = F8._scale_tensor(RP, C, False, x.device)
    syt = F8._scale_tensor(C, RP, False, x.device)
    G.cast_both_1x128(x, y, sy, yt, syt, RP, F8._fmax(dtype))
    return y, sy, yt, syt


def gluon_cols_t(x, amax, dtype, YR, YC):
    """= F8._cast_along_rows_t's cast pass (amax from F8.column_amax), in Gluon: (y (YR, YC), scale_inv (YR, 1))."""
    y = torch.empty((YR, YC), dtype=dtype, device=x.device)
    sinv = torch.empty((YR, 1), dtype=torch.float32, device=x.device)
    _launch(x, y, y, sinv, sinv, amax, YC, YR, F8._fmax(dtype), 1)
    return y, sinv


def prod_cols_t(x, amax, dtype, YR, YC):
    """F8._cast_along_rows_t's cast pass alone (tuned), amax given."""
    R, C = x.shape
    y = torch.empty((YR, YC), dtype=dtype, device=x.device)
    sinv = torch.empty((YR, 1), dtype=torch.float32, device=x.device)
    args = (x, amax, y, sinv, R, C, YR, YC, x.stride(0), F8._fmax(dtype))
    F8._COLS_T.launch(lambda m: (triton.cdiv(YC, m["BM"]), triton.cdiv(YR, m["BK"])), args,
                      default=F8._COLS_T.configs[0])
    return y, sinv


def gluon_delayed_replay(x, hist, dtype):
    """= F8.cast_tensorwise(x, dtype, want_t=True, history=hist, record=False), in Gluon: (y, yt, scale_inv)."""
    R, C = x.shape
    RP = F8._pad16(R)
    y = torch.empty((RP, C), dtype=dtype, device=x.device)
    yt = torch.empty((C, RP), dtype=dtype, device=x.device)
    sinv = torch.empty((), dtype=torch.float32, device=x.device)
    part = hist._state(x.device)[2]
    _launch(x, y, yt, sinv, sinv, part, RP, C, F8._fmax(dtype), 2)
    return y, yt, sinv



def threshold():
    """The both-ways cast through fp8_cast_gluon whatever the shape (gluon_blockwise) vs fp8_linear.cast_blockwise
    with the Gluon kernel off (the Triton kernel's tuned pick), from a few tiles to many: where
    fp8_cast_gluon.MIN_TILES should sit. (Session 12 call 2 toggled MIN_TILES instead, before the alignment rule,
    which now keeps unaligned rows such as 150x260 on Triton whatever MIN_TILES says.)"""
    from turbo_kernels import copy_line, kernel_ms

    e4 = torch.float8_e4m3fn
    copy = copy_line(f"MIN_TILES in the tree {G.MIN_TILES}")
    print("| dy | tiles | Triton, ms (% copy) | Gluon, ms (% copy) | Gluon / Triton speed | same bytes |")
    print("|---|---:|---:|---:|---:|---|")
    keep = G.MIN_TILES
    for shape in ("150x260", "256x1024", "512x1024", "1024x1024", "512x4096", "2048x2048", "1024x4096",
                  "4096x2048", "4096x4096", "16384x4096"):
        R, C = (int(v) for v in shape.split("x"))
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        G.MIN_TILES = 1 << 60
        outs, times = [], []
        for fn in (lambda: F8.cast_blockwise(x, e4, want_t=True, pad_rows=True), lambda: gluon_blockwise(x, e4)):
            outs.append(fn())
            times.append(kernel_ms(fn))
        G.MIN_TILES = keep
        gb = R * C * 4 / 1e9
        t0, t1 = times
        print(f"| {shape} | {-(-R // 128) * -(-C // 128)} | {t0:.4f} ({gb / t0 / copy * 1e5:.1f}) | "
              f"{t1:.4f} ({gb / t1 / copy * 1e5:.1f}) | {t0 / t1:.3f}x | {same_bytes(*outs)} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true", help="instruction counts only, on the CPU")
    ap.add_argument("--shapes", default="8192x4096,8192x14336,4096x4096,8192x28672,150x260")
    ap.add_argument("--threshold", action="store_true",
                    help="production's cast_blockwise (dy, dy^T) with and without fp8_cast_gluon, small to large")
    a = ap.parse_args()
    if a.sass:
        sass()
        return
    if a.threshold:
        threshold()
        return
    from turbo_kernels import copy_line, kernel_ms

    e4 = torch.float8_e4m3fn
    copy = copy_line()
    print("| cast | x | production, ms (% copy) | Gluon, ms (% copy) | Gluon / production speed | same bytes |")
    print("|---|---|---:|---:|---:|---|")

    def row(name, shape, gb, ref_fn, got_fn):
        same = same_bytes(ref_fn(), got_fn())
        t0, t1 = kernel_ms(ref_fn), kernel_ms(got_fn)
        print(f"| {name} | {shape} | {t0:.4f} ({gb / t0 / copy * 1e5:.1f}) | {t1:.4f} ({gb / t1 / copy * 1e5:.1f}) "
              f"| {t0 / t1:.3f}x | {same} |", flush=True)

    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16) * torch.rand(R, 1, device="cuda").to(
            torch.bfloat16) * 4
        n = R * C
        row("blockwise dy, dy^T", shape, n * 4 / 1e9,
            lambda: F8.cast_blockwise(x, e4, want_t=True, pad_rows=True), lambda: gluon_blockwise(x, e4))
        amax = F8.column_amax(x)
        YR, YC = F8._pad16(C), F8._pad16(R)
        row("rowwise x^T, cast pass", shape, n * 3 / 1e9,
            lambda: prod_cols_t(x, amax, e4, YR, YC), lambda: gluon_cols_t(x, amax, e4, YR, YC))
        row("rowwise x^T, both passes", shape, n * 3 / 1e9,
            lambda: F8._cast_along_rows_t(x, e4, YR, YC),
            lambda: gluon_cols_t(x, F8.column_amax(x), e4, YR, YC))
        hist = F8.DelayedScaling().history().allocate(x.device)
        F8.cast_tensorwise(x, e4, want_t=True, history=hist)  # call 0: primes the scale
        F8.cast_tensorwise(x, e4, want_t=True, history=hist)
        row("delayed replay x, x^T", shape, n * 4 / 1e9,
            lambda: F8.cast_tensorwise(x, e4, want_t=True, history=hist, record=False),
            lambda: gluon_delayed_replay(x, hist, e4))
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
