"""A/B (session 14): the fp8 weight cache (`fp8_linear.WEIGHT_CASTS`, precision.fp8_weight_cache) off vs on for
the MoE experts' fp8 grouped GEMMs (turbo.grouped_gemm_fp8), per provider, at three models' expert shapes (the
local experts of one GPU, megatron GroupedMLP's layout: fc1 w (E, hidden, 2 x ffn), fc2 w (E, ffn, hidden)):
Mixtral-8x7B (8 experts, 4096 -> 2 x 14336, top 2), DeepSeek-V2-Lite (64, 2048 -> 2 x 1408, top 6), Qwen3-30B-A3B
(128, 2048 -> 2 x 768, top 8). One "step" = `--micro` micro batches of `--tokens` tokens (x top-k routed rows,
spread over the experts as a random multinomial draw), fc1 and fc2 fwd+bwd, the weights unchanged. With the
cache on the step starts with an empty cache, as the megatron trainer's does. The bf16 grouped GEMM
(grouped_gemm's default provider) is the baseline of the same call.

    python bench/expert_cache_ab.py [--providers torch_scaled,triton] [--micro 4] [--tokens 4096]

GPU time: the sum of the step's kernel durations (`turbo_kernels.kernel_ms`, L2 flushed before each step), in the
order off, on, off, on. Outputs (y, dx, dw of every micro batch) must be bit-equal off and on.
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
from primus.turbo.grouped_gemm import fp8_grouped_gemm, grouped_gemm  # noqa: E402
from turbo_kernels import ab_cell, ab_summary, copy_line, kernel_ms  # noqa: E402

MODELS = [("mixtral_8x7b", 8, 4096, 14336, 2), ("deepseek_v2_lite", 64, 2048, 1408, 6),
          ("qwen3_30b_a3b", 128, 2048, 768, 8)]
CACHE = F8.WEIGHT_CASTS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--providers", default="torch_scaled,triton")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per micro batch (before top-k)")
    a = ap.parse_args()
    provs = a.providers.split(",")
    copy_line(f"{a.micro} micro batches x {a.tokens} tokens per step")
    print("| experts (E, hidden, ffn, top-k) | bf16 step ms | "
          + " | ".join(f"{p} off / on / off / on ms" for p in provs) + " |")
    print("|---|---:|" + "---|" * len(provs))
    summaries = []
    for name, E, H, F, k in MODELS:
        torch.manual_seed(0)
        rows = a.tokens * k
        counts = [torch.multinomial(torch.ones(E), rows, replacement=True).bincount(minlength=E).to("cuda")
                  for _ in range(a.micro)]
        xs = [torch.randn(rows, H, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(a.micro)]
        w1 = (torch.randn(E, H, 2 * F, device="cuda") / H ** 0.5).to(torch.bfloat16).requires_grad_()
        w2 = (torch.randn(E, F, H, device="cuda") / F ** 0.5).to(torch.bfloat16).requires_grad_()
        dys = [torch.randn(rows, H, device="cuda", dtype=torch.bfloat16) for _ in range(a.micro)]
        leaves = [*xs, w1, w2]

        def mlp(gemm, x, c):
            h = gemm(x, w1, c)
            return gemm(h[:, :F] * h[:, F:], w2, c)  # a gated product between fc1 and fc2 (timed in both)

        def bf16_step():
            for x, c, dy in zip(xs, counts, dys):
                mlp(grouped_gemm, x, c).backward(dy)

        tot = {"bf16": kernel_ms(bf16_step, leaves)}
        same, cells = {}, []
        for p in provs:
            def gemm(x, w, c, p=p):
                return fp8_grouped_gemm(x, w, c, fmt="e4m3", provider=p)

            fns, outs = {}, {}
            for tag in ("off", "on"):
                def step(tag=tag, keep=None):
                    CACHE.enable(tag == "on")  # enable() clears: the step's first micro batch casts the weights
                    for x, c, dy in zip(xs, counts, dys):
                        y = mlp(gemm, x, c)
                        y.backward(dy)
                        if keep is not None:
                            keep.append(y.detach().clone())
                    CACHE.enable(False)

                for t in leaves:
                    t.grad = None
                ys = []
                step(keep=ys)
                fns[tag] = step
                outs[tag] = [*ys, *[x.grad.clone() for x in xs], w1.grad.clone(), w2.grad.clone()]
            same[p] = all(torch.equal(u, v) for u, v in zip(outs["off"], outs["on"]))
            cells.append(ab_cell(fns, "off", "on", p, tot, leaves))
        print(f"| {name} ({E}, {H}, {F}, {k}) | {tot['bf16']:.3f} | " + " | ".join(cells) + " |", flush=True)
        summaries.append((name, tot, same))
        del xs, w1, w2, dys, outs
        torch.cuda.empty_cache()
    for name, tot, same in summaries:
        print(f"\n{name}:")
        ab_summary(tot, provs, same, "off", "on")


if __name__ == "__main__":
    main()
