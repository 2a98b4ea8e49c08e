"""A/B (session 15): the fused fp8 SwiGLU MLP (primus/turbo/fp8_mlp.py) vs the unfused fp8 linears + SwiGLU.

The SwiGLU kernels keep max |output| (fp8_mlp's docstring), so the tensorwise casts of y = swiglu(h) (fc2's input)
and of dh (fc1's output gradient) run one pass instead of two. Per shape, in one call:
  1. the kernels: SwiGLU fwd / bwd without and with the amax output; the two casts with their own amax pass vs with
     the producer's (GB/s on minimum bytes, % of the copy bandwidth measured in this call);
  2. the MLP fwd+bwd, alternated pairs, outputs bit-equal: bf16 (F.linear + SwiGLU + F.linear) as the baseline;
     fp8 unfused through the autograd.Function linears ("unfused") or the custom-op linears ("ops"), fused;
     "*_filled": the custom ops as before call 2, autograd filling a zero gradient per saved output.

    python bench/fp8_mlp_ab.py [--shapes 8192x4096x14336,8192x2048x8192] [--breakdown] [--no-kernels]

GPU time: the sum of kernel durations per call (`turbo_kernels.kernel_ms`, L2 flushed before each call).
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
from primus.turbo import swiglu as S  # noqa: E402
from primus.turbo.fp8_mlp import fp8_swiglu_mlp  # noqa: E402
from turbo_kernels import ab_cell, ab_summary, copy_line, kernel_ms, same_bytes  # noqa: E402

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def pct(mb, ms, copy):
    return f"{mb / ms:.0f} GB/s ({mb / ms / copy * 100:.1f}%)"


def kernels(T, H, F, copy):
    h = torch.randn(T, 2 * F, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(T, F, device="cuda", dtype=torch.bfloat16)
    rows = []
    mb_f, mb_b = T * F * 6 / 1e6, T * F * 10 / 1e6  # fwd reads 2F writes F; bwd reads 2F + F, writes 2F (bf16)
    t0, t1 = kernel_ms(lambda: S._fwd(h, None)), kernel_ms(lambda: S.swiglu_fwd_amax(h))
    rows.append(("SwiGLU fwd", f"{t0:.3f}", f"{t1:.3f}", f"{t0 / t1:.3f}x", pct(mb_f, t1, copy)))
    t0, t1 = kernel_ms(lambda: S._bwd(dy, h, None)), kernel_ms(lambda: S.swiglu_bwd_amax(dy, h))
    rows.append(("SwiGLU bwd", f"{t0:.3f}", f"{t1:.3f}", f"{t0 / t1:.3f}x", pct(mb_b, t1, copy)))
    y, ya = S.swiglu_fwd_amax(h)
    dh, dha = S.swiglu_bwd_amax(dy, h)
    same = True
    for name, x, amax, dt in (("cast y (fc2 x, x and x^T)", y, ya, E4), ("cast dh (fc1 dy, both ways)", dh, dha, E5)):
        mb = x.numel() * 4 / 1e6  # read 2 B, write 1 B twice
        t0 = kernel_ms(lambda: F8.cast_tensorwise(x, dt, want_y=True, want_t=True))
        t1 = kernel_ms(lambda: F8.cast_tensorwise(x, dt, want_y=True, want_t=True, amax=amax))
        same &= same_bytes(F8.cast_tensorwise(x, dt, want_y=True, want_t=True),
                           F8.cast_tensorwise(x, dt, want_y=True, want_t=True, amax=amax))
        rows.append((name, f"{t0:.3f} ({mb / t0 / copy * 100:.1f}%)", f"{t1:.3f}", f"{t0 / t1:.3f}x",
                     pct(mb, t1, copy)))
    print(f"| {T}x{H}x{F} kernel | without amax out / two-pass cast, ms | with, ms | ratio | with: min bytes |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"casts bit-equal: {same}\n", flush=True)


class _FilledZeros:
    """The fp8 custom ops as they were before session 15's call 2: autograd filled a zero gradient for each saved
    output before the backward (re-registered for the "before" runs only)."""

    def __init__(self, op, setup, backward):
        self.op, self.setup, self.backward = op, setup, backward

    def __enter__(self):
        def filled(ctx, inputs, output):
            self.setup(ctx, inputs, output)
            ctx.set_materialize_grads(True)
        self.op.register_autograd(self.backward, setup_context=filled)

    def __exit__(self, *exc):
        self.op.register_autograd(self.backward, setup_context=self.setup)


def mlp(T, H, F, fmt, tot, same, breakdown=False):
    from primus.turbo import fp8_mlp, fp8_ops
    from turbo_kernels import kernel_breakdown

    torch.manual_seed(0)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(2 * F, H, device="cuda") / H ** 0.5).to(torch.bfloat16).requires_grad_()
    w2 = (torch.randn(H, F, device="cuda") / F ** 0.5).to(torch.bfloat16).requires_grad_()
    dout = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    leaves = [x, w1, w2]

    def bf16():
        torch.nn.functional.linear(S.swiglu(torch.nn.functional.linear(x, w1)), w2).backward(dout)

    def unfused():  # the autograd.Function linears (megatron at tp > 1)
        F8.fp8_linear(S.swiglu(F8.fp8_linear(x, w1, None, "tensorwise", fmt)), w2, None, "tensorwise",
                      fmt).backward(dout)

    def ops():  # the custom-op linears (megatron at tp = 1, eager or compiled)
        lin = fp8_ops.fp8_linear_traced
        lin(S.swiglu(lin(x, w1, None, "tensorwise", fmt)), w2, None, "tensorwise", fmt).backward(dout)

    def ops_filled():
        with _FilledZeros(fp8_ops.fp8_linear_fwd, fp8_ops._fp8_setup, fp8_ops._fp8_backward):
            ops()

    def fused_filled():
        with _FilledZeros(fp8_mlp.fp8_swiglu_mlp_fwd, fp8_mlp._setup, fp8_mlp._backward):
            fused()

    def fused():
        fp8_swiglu_mlp(x, w1, w2, fmt).backward(dout)

    fns = dict(unfused=unfused, ops=ops, ops_filled=ops_filled, fused=fused, fused_filled=fused_filled)
    outs = {}
    for tag, fn in fns.items():
        for t in leaves:
            t.grad = None
        fn()
        outs[tag] = [t.grad.clone() for t in leaves]
    key = f"{T}x{H}x{F} {fmt}"
    tot["bf16"] = kernel_ms(bf16, leaves)
    print(f"| MLP fwd+bwd {key} | bf16 ms | A / B / A / B ms |\n|---|---:|---|")
    pairs = (("ops_filled", "ops"), ("fused_filled", "fused"), ("unfused", "fused"), ("ops", "fused"))
    for a_, b_ in pairs:
        k = f"{key}: {a_} -> {b_}"
        same[k] = same_bytes(outs[a_], outs[b_])
        cell = ab_cell({a_: fns[a_], b_: fns[b_]}, a_, b_, k, tot, leaves)
        print(f"| {a_} -> {b_} | {tot['bf16']:.3f} | {cell} |", flush=True)
    for a_, b_ in pairs:
        ab_summary(tot, [f"{key}: {a_} -> {b_}"], same, a_, b_)
    if breakdown:
        for tag in ("ops", "fused"):
            print(f"kernels, {tag} (us per call):")
            for name, us in kernel_breakdown(fns[tag], leaves, top=14):
                print(f"  {us:8.1f}  {name[:110]}")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096x14336,8192x2048x8192")
    ap.add_argument("--fmts", default="e4m3,hybrid")
    ap.add_argument("--breakdown", action="store_true", help="per-kernel times of the ops and fused runs")
    ap.add_argument("--no-kernels", action="store_true", help="skip the SwiGLU / cast table")
    a = ap.parse_args()
    copy = copy_line("fused fp8 SwiGLU MLP")  # GB/s; sizes below in MB, times in ms: MB/ms = GB/s
    for s in a.shapes.split(","):
        T, H, F = (int(v) for v in s.split("x"))
        if not a.no_kernels:
            kernels(T, H, F, copy)
        for fmt in a.fmts.split(","):
            mlp(T, H, F, fmt, {}, {}, breakdown=a.breakdown and fmt == "e4m3")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
