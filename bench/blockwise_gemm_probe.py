"""Probe (session 9): the Triton blockwise fp8 GEMM (the fallback of cuBLASLt's, and ROCm's path) vs an older tree's
kernel and vs torch's scaled_mm (cuBLASLt), same operands, same call, GPU time (turbo_kernels.kernel_ms).

    python bench/blockwise_gemm_probe.py [--baseline OLD/fp8_linear.py] [--linears gate+up,down]

The three GEMMs of a Llama-3-8B linear at 8192 tokens (fprop: x 1x128 @ W^T 128x128; dgrad: dy 1x128 @ W 128x128;
wgrad: dy^T 1x128 @ x 1x128, fp32 out). Outputs of the variants are checked against each other (rel. error).
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import kernel_ms, load_module  # noqa: E402

LINEARS = {"qkv": (4096, 6144), "o": (4096, 4096), "gate+up": (4096, 28672), "down": (14336, 4096)}



def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--linears", default="gate+up,down")
    ap.add_argument("--tokens", type=int, default=8192)
    a = ap.parse_args()
    base = load_module(a.baseline) if a.baseline else None
    e4 = torch.float8_e4m3fn
    M = a.tokens
    print("| linear | GEMM | scaled_mm (cuBLASLt) | Triton, baseline | Triton, this tree | this / baseline | "
          "this / cuBLASLt | TFLOP/s this tree | pick |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    tot = {"lt": 0.0, "base": 0.0, "new": 0.0}
    for name in a.linears.split(","):
        K, N = LINEARS[name]
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        xq, sx, xqt, sxt = F8.cast_blockwise(x, e4, want_t=True, pad_rows=True)
        wq, sw, wqt, swt = F8.cast_blockwise(w, e4, tile=True, want_t=True)
        dyq, sdy, dyqt, sdyt = F8.cast_blockwise(dy, e4, want_t=True, pad_rows=True)
        forms = {"fprop": (xq, sx, wq.t(), sw, True, torch.bfloat16),
                 "dgrad": (dyq, sdy, wqt.t(), swt, True, torch.bfloat16),
                 "wgrad": (dyqt, sdyt, xqt.t(), sxt, False, torch.float32)}
        for form, (A, SA, B, SB, tile, odt) in forms.items():
            flops = 2 * A.shape[0] * A.shape[1] * B.shape[1]
            ref = F8.blockwise_mm(A, SA, B, SB, tile, odt, "scaled_mm")
            new = F8.gemm_blockwise(A, SA, B, SB, tile, odt)  # tunes on first call
            t_lt = kernel_ms(lambda: F8.blockwise_mm(A, SA, B, SB, tile, odt, "scaled_mm"))
            t_new = kernel_ms(lambda: F8.gemm_blockwise(A, SA, B, SB, tile, odt))
            err = rel(new, ref)
            t_base = None
            if base is not None:
                old = base.gemm_blockwise(A, SA, B, SB, tile, odt)
                err = max(err, rel(old, ref))
                t_base = kernel_ms(lambda: base.gemm_blockwise(A, SA, B, SB, tile, odt))
                tot["base"] += t_base
            tot["lt"] += t_lt
            tot["new"] += t_new
            pick = [v for k, v in F8._GEMM_BLOCKWISE.picked.items() if k[0] == (A.shape[0], B.shape[1], A.shape[1])]
            fb = f"{t_base:.3f} ms" if t_base else "-"
            ratio = f"{t_base / t_new:.2f}x" if t_base else "-"
            print(f"| {name} | {form} {A.shape[0]}x{A.shape[1]}x{B.shape[1]} | {t_lt:.3f} ms | {fb} | {t_new:.3f} ms | "
                  f"{ratio} | {t_lt / t_new:.2f}x | {flops / t_new / 1e9:.0f} | {pick} (rel. err vs cuBLASLt "
                  f"{err:.1e}) |", flush=True)
    if tot["base"]:
        print(f"total: cuBLASLt {tot['lt']:.3f} ms, baseline {tot['base']:.3f} ms, this tree {tot['new']:.3f} ms; "
              f"this / baseline {tot['base'] / tot['new']:.2f}x, this / cuBLASLt {tot['lt'] / tot['new']:.2f}x")


if __name__ == "__main__":
    main()
