"""Probe (session 11): the blockwise wgrad GEMM (1x128 x 1x128 scales, cuBLASLt) in its two orientations.

    python bench/wgrad_orientation_probe.py

The linear computes dW (N, K) = dy^T (N, MP) @ x (MP, K). The same operands (dy^T and x^T in fp8, 1x128 groups
along the tokens, as the casts write them) also give dW^T (K, N) = x^T (K, MP) @ dy (MP, N): cuBLASLt then sees
M and N swapped. At 8192 tokens the wgrad ran ~25% slower than the fprop of the same FLOPs (gate+up 1.915 vs 1.473
ms, session 9). This times both orientations (GPU time, `turbo_kernels.kernel_ms`) at the Llama-3-8B linears, with
the fprop (1x128 x 128x128) of the same FLOPs for scale, and checks the two results agree.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from turbo_kernels import kernel_ms  # noqa: E402

SHAPES = [(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")]


def main():
    e4 = torch.float8_e4m3fn
    M = 8192
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| linear | fprop ms (TFLOP/s) | wgrad dW = dy^T x ms (TFLOP/s) | swapped dW^T = x^T dy ms (TFLOP/s) "
          "| swapped / wgrad speed | max rel diff |")
    print("|---|---:|---:|---:|---:|---:|")
    tot = [0.0, 0.0]
    for K, N, name in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        xq, sx, xqt, sxt = F8.cast_blockwise(x, e4, want_t=True, pad_rows=True)
        wq, sw, _, _ = F8.cast_blockwise(w, e4, tile=True, want_t=True)
        _, _, dyqt, sdyt = F8.cast_blockwise(dy, e4, want_y=False, want_t=True, pad_rows=True)
        bf = torch.bfloat16
        fprop = lambda: F8.blockwise_mm(xq, sx, wq.t(), sw, True, bf, "scaled_mm")
        wgrad = lambda: F8.blockwise_mm(dyqt, sdyt, xqt.t(), sxt, False, bf, "scaled_mm")
        swapped = lambda: F8.blockwise_mm(xqt, sxt, dyqt.t(), sdyt, False, bf, "scaled_mm")
        a, b = wgrad().float(), swapped().float().t()
        diff = ((a - b).abs().max() / a.abs().max()).item()
        fl = 2 * M * K * N / 1e9
        tf, tw, ts = kernel_ms(fprop), kernel_ms(wgrad), kernel_ms(swapped)
        tot[0] += tw
        tot[1] += ts
        print(f"| {name} | {tf:.3f} ({fl / tf:.0f}) | {tw:.3f} ({fl / tw:.0f}) | {ts:.3f} ({fl / ts:.0f}) | "
              f"{tw / ts:.3f}x | {diff:.1e} |", flush=True)
        del x, dy, w, xq, xqt, wq, dyqt
        torch.cuda.empty_cache()
    print(f"| total wgrads | | {tot[0]:.3f} | {tot[1]:.3f} | {tot[0] / tot[1]:.3f}x | |")


if __name__ == "__main__":
    main()
