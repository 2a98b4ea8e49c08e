"""Where a small turbo kernel's time goes on the GPU: every launch config of a tuned kernel, the tuned pick, and
optionally an older revision's kernels, each timed three ways:

    bench_ms  triton.testing.do_bench median (L2 flushed before each call; the host's launch path is inside the
              timed region whenever the host, not the GPU, is the bottleneck) - what bench/turbo_kernels.py reports
    graph_ms  the same calls replayed from a CUDA graph: GPU time alone
    host_us   host time to enqueue one call (Python + launches), GPU left running

    python bench/kernel_probe.py [--old-dir DIR]     # DIR holds old_rmsnorm.py, old_fp8_linear.py, old_moe_ops.py
      e.g. mkdir -p outputs/probe_old; for f in rmsnorm fp8_linear moe_ops; do
             git show <rev>:primus/turbo/$f.py > outputs/probe_old/old_$f.py; done
Prints a markdown table; writes $OUT/kernel_probe.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

ROWS = []


def host_us(fn, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def measure(case, variant, fn, graph=True, note=""):
    try:
        fn()
        torch.cuda.synchronize()
        b = do_bench(fn, warmup=20, rep=80, return_mode="median")
        g = None
        if graph:
            try:
                g = do_bench_cudagraph(fn, rep=40, return_mode="median")
            except Exception as e:  # capture can fail (a host sync inside): say so, keep going
                note = (note + f" graph: {type(e).__name__}").strip()
        h = host_us(fn)
    except Exception:
        traceback.print_exc()
        b = g = h = None
        note = (note + " failed").strip()
    ROWS.append(dict(case=case, variant=variant, bench_ms=b, graph_ms=g, host_us=h, note=note))
    f = lambda v, d=3: "" if v is None else f"{v:.{d}f}"
    print(f"| {case} | {variant} | {f(b)} | {f(g)} | {f(h, 1)} | {note} |", flush=True)


@contextmanager
def forced(tuned, cfg):
    """Every launch of this Tuned kernel runs `cfg`."""
    orig = tuned.launch
    tuned.launch = lambda grid, args, default=None, **consts: tuned.run(cfg, grid, args, **consts)
    try:
        yield
    finally:
        tuned.launch = orig


def load_old(d, name):
    path = os.path.join(d, f"old_{name}.py")
    if not d or not os.path.exists(path):
        return None
    from turbo_kernels import load_module
    return load_module(path, f"old_{name}")


def cfg_name(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def probe_rmsnorm(old):
    from primus.turbo import rmsnorm as R
    import triton
    for N in (4096, 8192):
        M = 16384
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        case = f"rmsnorm fwd {M}x{N}"
        measure(case, "tuned (launch)", lambda: R.rms_norm_fwd(x, w, 1e-6))
        print("   picked:", {k: v for k, v in R._FWD.picked.items() if k[0] == (N,)}, flush=True)
        for c in R._FWD.space(BLOCK_N=triton.next_power_of_2(N)):
            measure(case, cfg_name(c), lambda c=c: R.rms_norm_fwd(x, w, 1e-6, config=c))
        if old:
            measure(case, "old (session 1)", lambda: old.rms_norm_fwd(x, w, 1e-6))
        _, rstd = R.rms_norm_fwd(x, w, 1e-6)
        measure(f"rmsnorm bwd {M}x{N}", "current", lambda: R.rms_norm_bwd(dy, x, w, rstd))
        if old:
            measure(f"rmsnorm bwd {M}x{N}", "old (session 1)", lambda: old.rms_norm_bwd(dy, x, w, rstd))


def probe_casts(old):
    from primus.turbo import fp8_linear as F
    e4 = F.fp8_dtypes("cuda")[0]
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    case = "fp8 cast tensorwise 8192x4096 (y + yT)"
    measure(case, "current", lambda: F.cast_tensorwise(x, e4, True, True))
    flat = x.view(-1)
    measure(case, "its amax pass alone", lambda: F._amax_partials(flat))
    if old:
        measure(case, "old (session 1)", lambda: old.cast_tensorwise(x, e4, True, True))
    for transpose, tuned in ((False, F._ROWWISE_ROWS), (True, F._COLS_T)):
        case = f"fp8 cast rowwise 8192x4096{' along M' if transpose else ''}"
        measure(case, "tuned (launch)", lambda: F.cast_rowwise(x, e4, transpose=transpose))
        print("   picked:", tuned.picked, flush=True)
        src = x.t() if transpose else x
        args = (src, None, None, src.shape[0], src.shape[1], src.shape[0], src.shape[1])
        for c in (tuned.configs if transpose else tuned.space(args)):
            measure(case, cfg_name(c), lambda c=c: F.cast_rowwise(x, e4, transpose=transpose, config=c))
        if old:
            measure(case, "old (session 1)", lambda: old.cast_rowwise(x, e4, transpose=transpose))


def probe_router(old):
    from primus.turbo import moe_ops as MO
    for T, E, k, sf in ((32768, 64, 8, "softmax"), (32768, 256, 8, "sigmoid")):
        logits = torch.randn(T, E, device="cuda", dtype=torch.float32, requires_grad=True)
        gp, ga = torch.randn(T, E, device="cuda"), torch.randn(T, E, device="cuda")
        p, m, a = MO.fused_router(logits, k, sf)
        pr, mr, _ = MO.router_reference(logits.detach().double(), k, sf)
        bad = (m != mr).any(1).nonzero().flatten()
        gaps = []
        if sf == "sigmoid":
            v = torch.sigmoid(logits.detach().double()[bad]).sort(-1, descending=True).values
            gaps = (v[:, k - 1] - v[:, k]).tolist()[:5]
        note = f"rows whose top-{k} differs from float64: {bad.numel()}; their k-th/(k+1)-th score gaps {gaps}"
        case = f"router T{T} E{E} k{k} {sf}"

        def fwd(mod=MO):
            return mod.fused_router(logits, k, sf)

        def bwd(mod=MO):
            o = mod.fused_router(logits, k, sf)
            return torch.autograd.grad((o[0] * gp).sum() + (o[2] * ga).sum(), logits)

        measure(case + " fwd", "tuned (launch)", fwd, note=note)
        measure(case + " fwd+bwd", "tuned (launch)", bwd, graph=False)
        print("   picked fwd:", MO._ROUTER_FWD.picked, "bwd:", MO._ROUTER_BWD.picked, flush=True)
        BE = max(16, 1 << (E - 1).bit_length())
        for c in MO._ROUTER_FWD.space(BE=BE):
            with forced(MO._ROUTER_FWD, c), forced(MO._ROUTER_BWD, c):
                measure(case + " fwd", cfg_name(c), fwd)
                measure(case + " fwd+bwd", cfg_name(c), bwd, graph=False)
        if old:
            measure(case + " fwd", "old (session 1)", lambda: fwd(old))
            measure(case + " fwd+bwd", "old (session 1)", lambda: bwd(old), graph=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-dir", default="")
    ap.add_argument("--only", default="rmsnorm,casts,router")
    a = ap.parse_args()
    print({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, flush=True)
    print("| case | variant | bench_ms | graph_ms | host_us | note |\n|---|---|---|---|---|---|", flush=True)
    for name in a.only.split(","):
        old = load_old(a.old_dir, {"rmsnorm": "rmsnorm", "casts": "fp8_linear", "router": "moe_ops"}[name])
        try:
            globals()[f"probe_{name}"](old)
        except Exception:
            traceback.print_exc()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "kernel_probe.json"), "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
