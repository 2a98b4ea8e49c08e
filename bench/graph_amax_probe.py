"""Probe (session 16): the tensorwise fp8 casts' amaxes computed in the compiled graph (fp8_ops.graph_amax).

A compiled stand-in for a dense layer's fp8 path, fwd+bwd:
    n1 = rms_norm(h) -> qkv = fp8(n1) -> a = silu(qkv[:, :H]) -> o = fp8(a) -> h2 = h + o
    n2 = rms_norm(h2) -> m = fused fp8 MLP(n2) -> out = h2 + m
With GRAPH_AMAX on, inductor computes the amaxes of n1 and n2 (fused into the norm kernels, if it fuses), of a
(after the silu), of the MLP's output gradient (a graph input: a reduction of its own) and of o's output gradient
(the norm backward + residual add, if it fuses); the fp8 casts then run one pass each. Per shape, in one call:
whether the outputs and gradients equal the two-pass run's, GPU time fwd+bwd alternated (off / on / off / on),
and the largest kernels of each variant (names say what inductor fused).

    python bench/graph_amax_probe.py [--shapes 16384x2048x8192,8192x4096x14336]
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from primus.turbo import fp8_ops  # noqa: E402
from primus.turbo.fp8_mlp import fp8_swiglu_mlp  # noqa: E402
from turbo_kernels import copy_line, kernel_breakdown, kernel_ms  # noqa: E402


def block(h, w_in, wqkv, wo, w_mlp, w1, w2):
    H = h.shape[-1]
    n1 = F.rms_norm(h, (H,), w_in, 1e-5)
    qkv = fp8_ops.fp8_linear_traced(n1, wqkv, None, "tensorwise", "hybrid")
    a = F.silu(qkv[:, :H])
    h2 = h + fp8_ops.fp8_linear_traced(a, wo, None, "tensorwise", "hybrid")
    n2 = F.rms_norm(h2, (H,), w_mlp, 1e-5)
    return h2 + fp8_swiglu_mlp(n2, w1, w2, "hybrid")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048x8192,8192x4096x14336")
    args = ap.parse_args()
    copy = copy_line()
    compiled = torch.compile(block)
    for shape in args.shapes.split(","):
        T, H, Fd = map(int, shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(T + H)
        r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda", generator=g) * sc).to(torch.bfloat16)  # noqa: E731
        h = r(T, H).requires_grad_()
        params = [(1 + 0.1 * r(H)).requires_grad_(), (r(H + H // 2, H, sc=H ** -0.5)).requires_grad_(),
                  (r(H, H, sc=H ** -0.5)).requires_grad_(), (1 + 0.1 * r(H)).requires_grad_(),
                  (r(2 * Fd, H, sc=H ** -0.5)).requires_grad_(), (r(H, Fd, sc=Fd ** -0.5)).requires_grad_()]
        dout = r(T, H)
        leaves = [h] + params

        def run(on):
            fp8_ops.GRAPH_AMAX["enabled"] = on
            out = compiled(h, *params)
            out.backward(dout)

        res = {}
        for on in (False, True):
            for t in leaves:
                t.grad = None
            run(on)
            torch.cuda.synchronize()
            fp8_ops.GRAPH_AMAX["enabled"] = on
            res[on] = [compiled(h, *params).detach()] + [t.grad.clone() for t in leaves]
        same = all(torch.equal(a, b) for a, b in zip(res[False], res[True]))
        rel = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(res[False], res[True]))
        print(f"\n## {shape}: outputs and gradients bit-equal on vs off: {same} (max rel diff {rel:.2e})", flush=True)
        tot = {False: [], True: []}
        for on in (False, True, False, True):
            tot[on].append(kernel_ms(lambda: run(on), leaves))
        off, on = min(tot[False]), min(tot[True])
        print(f"| {shape} | off ms | on ms | on vs off | readings |\n|---|---:|---:|---:|---|\n| fwd+bwd | {off:.3f} | "
              f"{on:.3f} | **{off / on:.3f}x** | {' / '.join(f'{a:.3f}/{b:.3f}' for a, b in zip(tot[False], tot[True]))} |",
              flush=True)
        mb = T * H * 2 / 1e6
        print(f"one read of a [T, H] bf16 tensor ({mb:.0f} MB) at copy bandwidth: {mb / copy:.3f} ms")
        for on in (False, True):
            print(f"kernels, graph amax {'on' if on else 'off'} (us per fwd+bwd):")
            for name, us in kernel_breakdown(lambda: run(on), leaves, top=24):
                print(f"  {us:9.1f}  {name[:150]}")
    fp8_ops.GRAPH_AMAX["enabled"] = True


if __name__ == "__main__":
    main()
