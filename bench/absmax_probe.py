"""Probe (session 16): the tensorwise cast's amax pass (fp8_linear._absmax_partial), launch shapes and loop forms.

The pass reads the tensor once (2 B per element, nothing written but <= 1024 partial maxima). Session 16's
profile of a compiled fp8 layer (bench/graph_amax_probe.py, at commit 3415cf7) had it at ~2.95 TB/s, a read-only
kernel on a GPU whose copy runs 4.2 TB/s (read + write). Variants, each a grid-stride or contiguous walk of
BLOCK-element tiles:
  prod      production: BLOCK 4096, 8 warps, <= 1024 programs, grid-stride, masked loads, fp32 max
  b8k       BLOCK 8192, 8 warps (twice the bytes in flight per program)
  b16k      BLOCK 16384, 16 warps
  contig    each program a contiguous range (production tile sizes)
  unmasked  full tiles without a mask, the tail masked
  (a bf16 max, kept in the input dtype, does not compile: tl.maximum of bf16 promotes to fp32 in Triton 3.6)
  x2        two independent tiles loaded per iteration (b4096 each)
Partials must be equal to production's (a max: exact). GPU time per call (profiler, L2 flushed before each call).

    python bench/absmax_probe.py
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import copy_line, kernel_ms  # noqa: E402


@triton.jit
def _absmax_variant(X, PART, n, ITERS, BLOCK: tl.constexpr, SPAN: tl.constexpr, CONTIG: tl.constexpr,
                    UNMASKED: tl.constexpr, BF16ACC: tl.constexpr, PAIR: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if BF16ACC:
        acc = tl.zeros((BLOCK,), dtype=X.dtype.element_ty)
    else:
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, ITERS):
        if CONTIG:
            t = (pid * ITERS + i).to(tl.int64)
        else:
            t = (pid + i * nprog).to(tl.int64)
        offs = t * SPAN + tl.arange(0, BLOCK)
        if UNMASKED:
            if (t + 1) * SPAN <= n:
                x = tl.load(X + offs)
            else:
                x = tl.load(X + offs, mask=offs < n, other=0.0)
        else:
            x = tl.load(X + offs, mask=offs < n, other=0.0)
        if PAIR:
            x2 = tl.load(X + offs + BLOCK, mask=offs + BLOCK < n, other=0.0)
        if BF16ACC:
            acc = tl.maximum(acc, tl.abs(x).to(acc.dtype))
            if PAIR:
                acc = tl.maximum(acc, tl.abs(x2).to(acc.dtype))
        else:
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
            if PAIR:
                acc = tl.maximum(acc, tl.abs(x2.to(tl.float32)))
    tl.store(PART + pid, tl.max(acc, axis=0).to(tl.float32))


VARIANTS = {
    "b8k": dict(BLOCK=8192, num_warps=8),
    "b16k": dict(BLOCK=16384, num_warps=16),
    "contig": dict(BLOCK=4096, num_warps=8, CONTIG=True),
    "unmasked": dict(BLOCK=4096, num_warps=8, UNMASKED=True),
    "x2": dict(BLOCK=4096, num_warps=8, PAIR=True),
    "b8k_w16": dict(BLOCK=8192, num_warps=16),
}


def run_variant(flat, kw):
    kw = dict(kw)
    block, warps = kw.pop("BLOCK"), kw.pop("num_warps")
    span = block * (2 if kw.get("PAIR") else 1)
    n = flat.numel()
    nprog = max(1, min(F8._PARTS, triton.cdiv(n, span)))
    iters = triton.cdiv(triton.cdiv(n, span), nprog)
    part = torch.empty(nprog, device=flat.device, dtype=torch.float32)
    _absmax_variant[(nprog,)](flat, part, n, iters, BLOCK=block, SPAN=span, CONTIG=kw.get("CONTIG", False),
                              UNMASKED=kw.get("UNMASKED", False), BF16ACC=kw.get("BF16ACC", False),
                              PAIR=kw.get("PAIR", False), num_warps=warps)
    return part


def main():
    copy = copy_line()
    shapes = [(8192, 2048), (16384, 2048), (8192, 4096), (16384, 3072), (8192, 14336), (65536, 2048)]
    print("| tensor (bf16) | MB | prod us (TB/s read) | " + " | ".join(VARIANTS) + " |")
    print("|---|---:|---:|" + "---:|" * len(VARIANTS))
    best = {k: [] for k in VARIANTS}
    for R, C in shapes:
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        x.view(-1)[(R * C) // 2 + 7] = -77.0
        flat = x.view(-1)
        mb = flat.numel() * 2 / 1e6
        t0 = kernel_ms(lambda: F8._amax_partials(flat)) * 1e3
        want = F8._amax_partials(flat)[0].max().item()
        cells = []
        for k, kw in VARIANTS.items():
            got = run_variant(flat, kw).max().item()
            t = kernel_ms(lambda kw=kw: run_variant(flat, kw)) * 1e3
            best[k].append(t0 / t)
            cells.append(f"{t:.1f} ({mb / t:.2f}, {t0 / t:.3f}x){'' if got == want == 77.0 else ' WRONG'}")
        print(f"| {R}x{C} | {mb:.0f} | {t0:.1f} ({mb / t0:.2f}) | " + " | ".join(cells) + " |", flush=True)
    print("geomean vs prod: " + ", ".join(
        f"{k} {torch.tensor(v).log().mean().exp().item():.3f}x" for k, v in best.items()))
    print(f"(copy {copy:.0f} GB/s read+write; a read-only pass at the same rate would be {copy / 1e3:.2f} TB/s)")


if __name__ == "__main__":
    main()
