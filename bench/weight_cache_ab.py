"""A/B (session 13): the fp8 weight cache (`fp8_linear.WEIGHT_CASTS`, precision.fp8_weight_cache) off vs on, per
recipe, at the Llama-3-8B layer's four linears (qkv 4096->6144, o 4096->4096, gate+up 4096->28672, down
14336->4096). One "step" = `--micro` micro batches of `--tokens` tokens each, fwd+bwd, the weight unchanged. With
the cache on, the step starts with `clear()`, as the megatron trainer's does. bf16 is the baseline of the same call.

    python bench/weight_cache_ab.py [--recipes tensorwise,delayed,rowwise,blockwise] [--micro 4] [--tokens 2048]

GPU time: the sum of the step's kernel durations (`turbo_kernels.kernel_ms`, L2 flushed before each step), in the
order off, on, off, on: the two readings of each show the noise. Expected saving: one weight cast per micro batch
after the first. Outputs (y, dx, dw of every micro batch) must be bit-equal off and on.
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
from turbo_kernels import ab_cell, ab_summary, copy_line, kernel_ms  # noqa: E402

SHAPES = [(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")]
CACHE = F8.WEIGHT_CASTS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="tensorwise,delayed,rowwise,blockwise")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per micro batch")
    a = ap.parse_args()
    recipes = a.recipes.split(",")
    copy_line(f"{a.micro} micro batches x {a.tokens} tokens per step")
    tot, same = {}, {r: True for r in recipes}
    print("| linear | bf16 step ms | " + " | ".join(f"{r} off / on / off / on ms" for r in recipes) + " |")
    print("|---|---:|" + "---|" * len(recipes))
    for K, N, name in SHAPES:
        torch.manual_seed(0)
        xs = [torch.randn(a.tokens, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(a.micro)]
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16).requires_grad_()
        dys = [torch.randn(a.tokens, N, device="cuda", dtype=torch.bfloat16) for _ in range(a.micro)]

        def bf16_step():
            for x, dy in zip(xs, dys):
                torch.nn.functional.linear(x, w).backward(dy)

        t_bf = kernel_ms(bf16_step, [*xs, w])
        tot["bf16"] = tot.get("bf16", 0.0) + t_bf
        cells = []
        for r in recipes:
            fns, outs = {}, {}
            for tag in ("off", "on"):
                st = F8.DelayedScaling(16, 0, "max").linear_state() if r == "delayed" else None

                def step(tag=tag, st=st, keep=None):
                    CACHE.enable(tag == "on")  # enable() clears: the step's first micro batch casts the weight
                    for x, dy in zip(xs, dys):
                        y = F8.fp8_linear(x, w, None, r, delayed=st)
                        y.backward(dy)
                        if keep is not None:
                            keep.append(y.detach().clone())
                    CACHE.enable(False)

                res = []
                for _ in range(3):  # the same sequence of steps both ways (the delayed state moves on)
                    for t in (*xs, w):
                        t.grad = None
                    ys = []
                    step(keep=ys)
                    res.append((ys, [x.grad.clone() for x in xs], w.grad.clone()))
                outs[tag], fns[tag] = res, step
            same[r] &= all(torch.equal(p, q) for o, n in zip(outs["off"], outs["on"])
                           for p, q in zip([*o[0], *o[1], o[2]], [*n[0], *n[1], n[2]]))
            cells.append(ab_cell(fns, "off", "on", r, tot, [*xs, w]))
        print(f"| {name} | {t_bf:.3f} | " + " | ".join(cells) + " |", flush=True)
        del xs, w, dys
        torch.cuda.empty_cache()
    print()
    ab_summary(tot, recipes, same, "off", "on")
    print(f"bf16 total {tot['bf16']:.3f} ms per step")


if __name__ == "__main__":
    main()
