"""SwiGLU forward: this project's kernel vs variants and torch.compile, GPU time, one call (H200).

    python bench/swiglu_probe.py        # table; inductor's generated kernel in $OUT/inductor_swiglu.py

The forward reads 0.97x torch.compile at T=32768, F=8192 bf16 with every config of its tuned space (all at
99-100% of the copy bandwidth; inductor at 104%: a 2:1 read:write stream beats the 1:1 copy). Variants: the tuned
kernel, the same with streaming cache hints (loads evict_first, stores .cs), and a flat 1D walk (inductor's
shape: a program per BLOCK output elements, row / column from the flat index). Session 6 call 6 measured the flat
walk as its own kernel here (1.000x compile); it became primus.turbo.swiglu's forward, whose configs these rows
now time, with the tuned pick first (the 2-D tile kernel is gone).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import turbo_kernels as TK  # noqa: E402

from primus.turbo import swiglu as SW  # noqa: E402


@triton.jit
def _fwd_stream(H, Y, T, F, s_h, s_y, BT: tl.constexpr, BF: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    m = (rows[:, None] < T) & (cols[None, :] < F)
    r64 = rows[:, None].to(tl.int64)
    gate = tl.load(H + r64 * s_h + cols[None, :], mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
    up = tl.load(H + r64 * s_h + F + cols[None, :], mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Y + r64 * s_y + cols[None, :], y.to(Y.dtype.element_ty), mask=m, cache_modifier=".cs")


def main():
    TK.ARGS = argparse.Namespace(gpu_time=True, budget=1e9, no_compile=False)
    T, F = 32768, 8192
    h = torch.randn(T, 2 * F, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(T, F, device="cuda", dtype=torch.bfloat16)
    ref = SW.swiglu_reference(h.double())
    nb = T * F * 3 * 2
    copy = 4245.0  # GB/s, this session's copy bandwidth (bench/turbo_kernels.py env row)
    comp = torch.compile(SW.swiglu_reference)
    rows = []

    def add(name, fn):
        err = TK.relerr(fn(), ref)
        t = TK.kernel_ms(fn, None, n=30)
        rows.append((name, t, nb / t / 1e6 / copy * 100, err))

    add("torch.compile reference", lambda: comp(h))
    add("primus swiglu (tuned pick)", lambda: SW._fwd(h, None))

    def stream(bt, bf, w):
        def fn():
            _fwd_stream[(triton.cdiv(T, bt), triton.cdiv(F, bf))](h, y, T, F, h.stride(0), y.stride(0), BT=bt, BF=bf,
                                                                  num_warps=w)
            return y
        return fn

    for bt, bf, w in ((1, 2048, 8), (2, 1024, 4), (4, 1024, 8)):
        add(f"streaming hints BT={bt} BF={bf} warps={w}", stream(bt, bf, w))

    for cfg in SW._FWD.configs:  # the flat walk: the production kernel, each config of its space
        add(f"flat 1D BLOCK={cfg['BLOCK']} warps={cfg['num_warps']}", lambda cfg=cfg: SW._fwd(h, None, config=cfg))
    base = rows[0][1]
    print("| variant | GPU ms | % copy | vs compile | relerr |\n|---|---:|---:|---:|---:|")
    for name, t, pc, err in rows:
        print(f"| {name} | {t:.4f} | {pc:.1f} | {base / t:.3f}x | {err:.1e} |")
    out = os.environ.get("OUT")
    if out:  # inductor's kernel for the reference, to read what it does
        for f in glob.glob("/tmp/torchinductor_*/**/*.py", recursive=True):
            if "silu" in open(f).read() or "sigmoid" in open(f).read():
                shutil.copy(f, os.path.join(out, "inductor_swiglu.py"))


if __name__ == "__main__":
    main()
