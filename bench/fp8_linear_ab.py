"""A/B (session 11): the fp8 linear of this tree vs an older tree's `fp8_linear.py`, per recipe, at the Llama-3-8B
layer's four linears (8192 tokens: qkv 4096->6144, o 4096->4096, gate+up 4096->28672, down 14336->4096), fwd+bwd,
with the bf16 linear as the baseline, all in one call.

    python bench/fp8_linear_ab.py --baseline OLD/fp8_linear.py [--recipes tensorwise,delayed,rowwise,blockwise]

GPU time: the sum of each call's kernel durations (`turbo_kernels.kernel_ms`, L2 flushed before each call), in the
order old, new, old, new (the two readings of each show the noise). The delayed recipe runs on a per-linear state
warmed up by 3 calls (steady state: the scale from the history). The outputs (y, dx, dw) of old and new must be
bit-equal after the same sequence of calls.
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
from turbo_kernels import ab_cell, ab_summary, kernel_ms, load_module, set_autotune_l2  # noqa: E402

SHAPES = [(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--recipes", default="tensorwise,delayed,rowwise,blockwise")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--baseline-warm-autotune", action="store_true",
                    help="the baseline's tuned spaces time their configs back to back (before session 18)")
    a = ap.parse_args()
    mods = {"old": load_module(a.baseline), "new": F8}
    if a.baseline_warm_autotune:
        set_autotune_l2(mods["old"], flush=False)
    recipes = a.recipes.split(",")
    M = a.tokens
    tot = {}
    same = {r: True for r in recipes}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {M} tokens; baseline autotune "
          f"{'warm (back to back)' if a.baseline_warm_autotune else 'as its _common times'}")
    print("| linear | bf16 ms | " + " | ".join(f"{r} old / new / old / new ms" for r in recipes) + " |")
    print("|---|---:|" + "---|" * len(recipes))
    for K, N, name in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        t_bf = kernel_ms(lambda: torch.nn.functional.linear(x, w).backward(dy), [x, w])
        tot.setdefault("bf16", 0.0)
        tot["bf16"] += t_bf
        cells = []
        for r in recipes:
            fns, outs = {}, {}
            for tag, mod in mods.items():
                st = mod.DelayedScaling(16, 0, "max").linear_state() if r == "delayed" else None

                def fn(mod=mod, st=st):
                    y = mod.fp8_linear(x, w, None, r, delayed=st)
                    y.backward(dy)
                    return y

                res = []
                for _ in range(4):  # the same call sequence on both trees (the delayed state moves on)
                    x.grad = w.grad = None
                    y = fn()
                    res.append((y.detach().clone(), x.grad.clone(), w.grad.clone()))
                outs[tag] = res
                fns[tag] = fn
            same[r] &= all(torch.equal(p, q) for o, n in zip(outs["old"], outs["new"]) for p, q in zip(o, n))
            cells.append(ab_cell(fns, "old", "new", r, tot, [x, w]))
        print(f"| {name} | {t_bf:.3f} | " + " | ".join(cells) + " |", flush=True)
        del x, w, dy
        torch.cuda.empty_cache()
    print()
    ab_summary(tot, recipes, same, "old", "new")
    print(f"bf16 total {tot['bf16']:.3f} ms")


if __name__ == "__main__":
    main()
