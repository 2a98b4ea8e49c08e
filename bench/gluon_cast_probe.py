"""Probe (written in session 11 for the next H200 call): the blockwise both-ways cast (dy 1x128 along N and dy^T
1x128 along M from one read) written in Gluon, Triton's explicit-layout dialect, vs the production Triton kernel.

    python bench/gluon_cast_probe.py --sass            # on the CPU: sm90 SASS instruction counts of both kernels
    python bench/gluon_cast_probe.py [--shapes ...]    # on the GPU: bytes vs production, GPU time, % copy bw

Why (session 11, SASS read on the CPU with Triton's ptxas): the production kernel, 128x128 tile, 8 warps, runs
1,240 instructions per thread (19.4 per element) at 60-71% of copy bandwidth, and the blockwise linear's casts are
what it has left to give. Triton transposes the fp8 tile for dy^T through shared memory byte by byte (4 STS.128,
64 LDS.U8 and ~48 PRMT per thread). Plain Triton cannot ask for a register layout in which that transpose is free.
Here each thread holds an 8x8 block of the tile (BlockedLayout [8, 8] per thread, [4, 8] threads per warp, [4, 2]
warps): the transpose is a permute of a thread's own registers, then a register-only reorder (a linear layout with
the same lanes and warps, registers along dy^T's rows first) done on the fp32 values, so the fp8 conversion packs
bytes in store order: 16 8-byte stores, no shared-memory transpose. Compiled offline: 936 instructions per thread
(14.6 per element), 126 registers, no spill. Same arithmetic as production on CUDA (no clamp: the conversion
saturates; scales from rcp.approx, scale_inv = amax x (1 / max)), so the bytes should be bit-equal.
Not for ROCm (Gluon's layouts here are NVIDIA's 32-lane warps); production would keep the Triton kernel there.
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

from primus.turbo import fp8_linear as F8  # noqa: E402

BR = BC = 128
NUM_WARPS = 8


@gluon.jit
def _rcp(a):
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [a], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _cast_both_gluon(X, Y, YT, S, ST, R, C, RP, stride_xr, s_sr, s_sc, s_tr, s_tc, FP8_MAX,
                     BR: gl.constexpr, BC: gl.constexpr):
    # x tile (BR, BC): a thread owns 8 rows x 8 columns (8-byte bf16 loads along columns), 4 x 8 lanes, 4 x 2 warps
    L: gl.constexpr = gl.BlockedLayout([8, 8], [4, 8], [4, 2], [1, 0])
    # the permuted tile (BC, BR) in the same threads, with each thread's registers ordered along BR (dy^T's rows)
    LT: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        lane_bases=[[8, 0], [16, 0], [32, 0], [0, 8], [0, 16]],
        warp_bases=[[64, 0], [0, 32], [0, 64]], block_bases=[], shape=[BC, BR])
    pid_r = gl.program_id(0)
    pid_c = gl.program_id(1)
    r0 = pid_r * BR
    c0 = pid_c * BC
    lr = gl.arange(0, BR, layout=gl.SliceLayout(1, L))
    lc = gl.arange(0, BC, layout=gl.SliceLayout(0, L))
    rows = r0 + lr
    cols = c0 + lc
    x = gl.load(X + (r0.to(gl.int64) * stride_xr + c0) + (lr[:, None] * stride_xr + lc[None, :]),
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(gl.float32)
    ax = gl.abs(x)
    ra = gl.maximum(gl.max(ax, axis=1), 1e-12)  # one scale per row (1x128 along C)
    q = x * (FP8_MAX * _rcp(ra))[:, None]
    gl.store(Y + (r0.to(gl.int64) * C + c0) + (lr[:, None] * C + lc[None, :]), q.to(Y.dtype.element_ty),
             mask=(rows[:, None] < RP) & (cols[None, :] < C))
    gl.store(S + rows * s_sr + pid_c * s_sc, ra * (1.0 / FP8_MAX), mask=rows < RP)
    ca = gl.maximum(gl.max(ax, axis=0), 1e-12)  # one scale per column (1x128 along R, for dy^T)
    qt = gl.convert_layout(gl.permute(x * (FP8_MAX * _rcp(ca))[None, :], [1, 0]), LT).to(YT.dtype.element_ty)
    tc = gl.arange(0, BC, layout=gl.SliceLayout(1, LT))
    tr = gl.arange(0, BR, layout=gl.SliceLayout(0, LT))
    gl.store(YT + (c0.to(gl.int64) * RP + r0) + (tc[:, None] * RP + tr[None, :]), qt,
             mask=((c0 + tc)[:, None] < C) & ((r0 + tr)[None, :] < RP))
    gl.store(ST + pid_r * s_tr + cols * s_tc, ca * (1.0 / FP8_MAX), mask=cols < C)


SIG = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
       "RP": "i32", "stride_xr": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32", "s_tc": "i32", "FP8_MAX": "fp32"}


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

    prod_sig = {**{k: v for k, v in SIG.items()}, "stride_xc": "constexpr", "SPAD": "i32", "STPAD": "i32"}
    prod_ce = {"stride_xc": 1, "BR": BR, "BC": BC, "TILE": False, "WRITE_Y": True, "WRITE_T": True, "SAT": True}
    sig = {**prod_sig, **{k: "constexpr" for k in prod_ce}}
    real = {k: v for k, v in prod_sig.items() if v != "constexpr"}
    prod = ASTSource(fn=F8._cast_block, signature=sig, constexprs=prod_ce, attrs=attrs(F8._cast_block, real))
    g_ce = {"BR": BR, "BC": BC}
    glu = GluonASTSource(fn=_cast_both_gluon, signature={**SIG, **{k: "constexpr" for k in g_ce}}, constexprs=g_ce,
                         attrs=attrs(_cast_both_gluon, SIG))
    for name, src in (("production Triton", prod), ("Gluon", glu)):
        n, per, top = sass_counts(src, NUM_WARPS, BR * BC)
        print(f"{name}: {n} instructions per thread, {per:.2f} per element; {top}")


def cast_gluon(x, dtype):
    R, C = x.shape
    RP = F8._round_up(R, F8.GROUP)
    y = torch.empty((RP, C), dtype=dtype, device=x.device)
    yt = torch.empty((C, RP), dtype=dtype, device=x.device)
    sy = F8._scale_tensor(RP, C, False, x.device)
    syt = F8._scale_tensor(C, RP, False, x.device)
    grid = (triton.cdiv(RP, BR), triton.cdiv(C, BC))
    _cast_both_gluon[grid](x, y, yt, sy, syt, R, C, RP, x.stride(0), sy.stride(0), sy.stride(1), syt.stride(1),
                           syt.stride(0), F8._fmax(dtype), BR=BR, BC=BC, num_warps=NUM_WARPS)
    return y, sy, yt, syt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true", help="instruction counts only, on the CPU")
    ap.add_argument("--shapes", default="8192x4096,8192x14336,4096x4096,8192x28672,150x260")
    a = ap.parse_args()
    if a.sass:
        sass()
        return
    from turbo_kernels import copy_gbps, kernel_ms

    e4 = torch.float8_e4m3fn
    copy = copy_gbps()
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name(0)}, "
          f"copy {copy:.0f} GB/s")
    print("| x | production, ms (% copy) | Gluon, ms (% copy) | Gluon / production speed | same bytes and scales |")
    print("|---|---:|---:|---:|---|")
    for shape in a.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16) * torch.rand(R, 1, device="cuda").to(
            torch.bfloat16) * 4
        ref = F8.cast_blockwise(x, e4, want_t=True, pad_rows=True)
        got = cast_gluon(x, e4)
        same = all(torch.equal(p.view(torch.uint8), q.view(torch.uint8)) if p.dtype == e4 else torch.equal(p, q)
                   for p, q in zip(ref, got))
        t0 = kernel_ms(lambda: F8.cast_blockwise(x, e4, want_t=True, pad_rows=True))
        t1 = kernel_ms(lambda: cast_gluon(x, e4))
        gb = R * C * 4 / 1e9
        print(f"| {shape} | {t0:.4f} ({gb / t0 / copy * 1e5:.1f}) | {t1:.4f} ({gb / t1 / copy * 1e5:.1f}) | "
              f"{t0 / t1:.3f}x | {same} |", flush=True)
        del x, ref, got
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
