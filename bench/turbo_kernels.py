"""Turbo kernels on the GPU: correctness, then speed vs eager PyTorch and vs torch.compile, in one command.

    python bench/turbo_kernels.py [--no-tests] [--budget 330] [--quick]

1. Correctness: runs tests/test_turbo_*.py on the GPU (TRITON_INTERPRET=0: real Triton kernels; every kernel vs a
   float64 reference, fwd + bwd, awkward shapes, NaN-poisoned outputs) in a subprocess with a timeout, plus an
   fp8 linear check at a Llama shape here.
2. Speed: triton.testing.do_bench (median ms) of each kernel vs its eager PyTorch reference and torch.compile of
   that reference; achieved GB/s for memory-bound kernels against the measured device-to-device copy bandwidth;
   TFLOP/s for GEMM-like ones; fp8 linear fwd+bwd vs the bf16 linear at Llama-3-8B shapes.
Prints a markdown table last; writes JSON to $OUT/turbo_kernels.json when OUT is set. One failing kernel prints
its traceback and the rest carry on. A global time budget skips what would not fit (marked "skipped").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv  # CPU smoke run of this script: Triton interpreter, tiny sizes, no timing loop
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
else:  # real kernels, unless the caller asked for the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "0")
DEV = "cpu" if SMOKE else "cuda"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from primus.turbo import _common  # noqa: E402

T0 = time.time()
ROWS = []  # table rows
RESULTS = {"rows": ROWS, "checks": {}, "env": {}}
ARGS = None


def left() -> float:
    return ARGS.budget - (time.time() - T0)


def sz(big, small):
    return small if SMOKE else big


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


def ms(fn, grad_to_none=None) -> float:
    """Median ms. Default: triton's do_bench (L2 flushed per call; when the host is the bottleneck - ~35-90 us to
    launch a Triton kernel from Python on an H200 host - its time is inside).
    --gpu-time: the kernels' own GPU time per call, summed from a torch.profiler trace (host launch path and
    idle gaps excluded; nothing is captured, so calls that sync with the host are timed the same way)."""
    if SMOKE:
        t = time.time()
        fn()
        return (time.time() - t) * 1e3
    if ARGS.gpu_time:
        return kernel_ms(fn, grad_to_none)
    return do_bench(fn, warmup=20, rep=80, grad_to_none=grad_to_none, return_mode="median")


_FLUSH = {}


def kernel_ms(fn, grad_to_none=None, n=20) -> float:
    """Mean GPU time of fn's kernels per call (L2 flushed before each call; the flush kernel is not counted)."""
    from torch.profiler import ProfilerActivity, profile

    if "buf" not in _FLUSH:  # an int8 add: a kernel no bench function launches (a zero_ could be a memset like
        # theirs), recognised by name below
        _FLUSH["buf"] = torch.zeros(256 << 20, dtype=torch.int8, device=DEV)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            _FLUSH["buf"].add_(1)
            sync()
        _FLUSH["names"] = {e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    for _ in range(3):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            if grad_to_none is not None:
                for x in grad_to_none:
                    x.grad = None
            _FLUSH["buf"].add_(1)
            fn()
        sync()
    us = sum(e.time_range.elapsed_us() for e in p.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in _FLUSH["names"])
    if us <= 0:
        raise RuntimeError("the profiler recorded no kernel time for this call")
    return us / n / 1e3


def kernel_breakdown(fn, grad_to_none=None, n=10, top=12):
    """[(kernel name, us per call)] of fn's kernels from a profiler trace, largest first (the L2 flush excluded)."""
    from torch.profiler import ProfilerActivity, profile

    kernel_ms(fn, grad_to_none, n=1)  # warm up, and the flush buffer
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            if grad_to_none is not None:
                for x in grad_to_none:
                    x.grad = None
            fn()
        sync()
    tot = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in _FLUSH["names"]:
            tot[e.name] = tot.get(e.name, 0) + e.time_range.elapsed_us() / n
    return sorted(tot.items(), key=lambda kv: -kv[1])[:top]


def row(kernel, variant, t_ms, eager_ms=None, compile_ms=None, gbytes=None, flops=None, note=""):
    r = {"kernel": kernel, "variant": variant, "ms": t_ms, "eager_ms": eager_ms, "compile_ms": compile_ms,
         "vs_eager": (eager_ms / t_ms) if (eager_ms and t_ms) else None,
         "vs_compile": (compile_ms / t_ms) if (compile_ms and t_ms) else None,
         "GB/s": (gbytes / t_ms * 1e3) if (gbytes and t_ms) else None,
         "%copy": (gbytes / t_ms * 1e3 / RESULTS["env"]["copy_GBps"] * 100) if (gbytes and t_ms and RESULTS["env"].get("copy_GBps")) else None,
         "TFLOP/s": (flops / t_ms / 1e9) if (flops and t_ms) else None, "note": note}
    ROWS.append(r)
    print("  ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)


def guarded(name):
    def deco(fn):
        def run():
            if left() < 10:
                print(f"## {name}: skipped (time budget)", flush=True)
                ROWS.append({"kernel": name, "variant": "-", "note": "skipped (time budget)"})
                return
            print(f"## {name}  (t={time.time() - T0:.0f}s)", flush=True)
            try:
                fn()
            except Exception:
                traceback.print_exc()
                ROWS.append({"kernel": name, "variant": "-", "note": "FAILED: " + traceback.format_exc(limit=1)[-200:]})
            sync()
            if not SMOKE:
                torch.cuda.empty_cache()
        run.__name__ = name
        return run
    return deco


def compiled(fn):
    """torch.compile of the reference; None when compiling fails or the budget is short."""
    if ARGS.no_compile or SMOKE or left() < 40:
        return None
    try:
        return torch.compile(fn)
    except Exception:
        traceback.print_exc()
        return None


def try_ms(fn, **kw):
    if fn is None:
        return None
    try:
        return ms(fn, **kw)
    except Exception:
        traceback.print_exc()
        return None


def relerr(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------------------------- env


def env_and_copy():
    if SMOKE:
        RESULTS["env"].update(gpu="cpu smoke", copy_GBps=1.0)
        return
    d = torch.cuda.get_device_properties(0)
    RESULTS["env"].update(gpu=d.name, sms=d.multi_processor_count, torch=torch.__version__,
                          triton=triton.__version__, cuda=torch.version.cuda, hip=torch.version.hip,
                          timing="kernel time (profiler)" if ARGS.gpu_time else "do_bench")
    RESULTS["env"]["copy_GBps"] = copy_gbps()
    print("env:", RESULTS["env"], flush=True)


def copy_gbps() -> float:
    """The device's copy bandwidth, GB/s read + written, of a 1 GiB bf16 copy_: what "% of copy bandwidth" means
    in every table here."""
    a = torch.randn(1 << 29, device=DEV, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    t = do_bench(lambda: b.copy_(a), warmup=20, rep=80, return_mode="median")  # GPU-bound either way
    return 2 * a.numel() * 2 / t / 1e6


def run_tests():
    if ARGS.no_tests:
        return
    files = sorted(f for f in os.listdir(os.path.join(ROOT, "tests")) if f.startswith("test_turbo_"))
    if ARGS.test_files:
        files = [f for f in files if any(f == f"test_turbo_{k}.py" for k in ARGS.test_files.split(","))]
    # no:logging: a failure's report is its assertion, not pages of captured torch debug logs
    cmd = [sys.executable, "-m", "pytest", "-q", "-x" if ARGS.quick else "-q", "-p", "no:cacheprovider",
           "-p", "no:logging", "--tb=short", "-rf"] + [os.path.join("tests", f) for f in files]
    env = dict(os.environ, TRITON_INTERPRET="0")
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=ARGS.test_timeout)
        out = (p.stdout + p.stderr)[-6000:]
        RESULTS["checks"]["pytest_rc"] = p.returncode
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "pytest_gpu.log"), "w") as f:
                f.write(p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:
        out = f"pytest timed out after {ARGS.test_timeout}s\n" + str(e.stdout)[-3000:]
        RESULTS["checks"]["pytest_rc"] = "timeout"
    RESULTS["checks"]["pytest_tail"] = out[-3000:]
    RESULTS["checks"]["pytest_s"] = time.time() - t
    print(out, flush=True)


# ----------------------------------------------------------------------------------------------------- kernels


@guarded("rmsnorm")
def b_rmsnorm():
    from primus.turbo.rmsnorm import rms_norm, rms_norm_reference
    for M, N in sz(((16384, 4096), (16384, 8192)), ((33, 64),)):
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        err = relerr(rms_norm(x, w), rms_norm_reference(x.double(), w.double()))
        comp = compiled(rms_norm_reference)
        f = lambda: rms_norm(x, w)
        e = lambda: rms_norm_reference(x, w)
        c = (lambda: comp(x, w)) if comp else None
        nb = 2 * M * N * 2
        row("rmsnorm", f"fwd {M}x{N} bf16", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9, note=f"relerr {err:.1e}")
        fb = lambda fn: (lambda: fn().backward(dy))
        row("rmsnorm", f"fwd+bwd {M}x{N} bf16", ms(fb(f), [x, w]), try_ms(fb(e), grad_to_none=[x, w]),
            try_ms(fb(c), grad_to_none=[x, w]) if c else None, gbytes=(nb + 3 * M * N * 2) / 1e9)


@guarded("swiglu_with_probs")
def b_swiglu():
    from primus.turbo.moe_ops import swiglu_with_probs, swiglu_with_probs_reference
    T, F = sz((32768, 2048), (17, 48))
    h = torch.randn(T, 2 * F, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    p = torch.rand(T, device=DEV, dtype=torch.float32, requires_grad=True)
    dy = torch.randn(T, F, device=DEV, dtype=torch.bfloat16)
    err = relerr(swiglu_with_probs(h, p), swiglu_with_probs_reference(h.double(), p.double()))
    comp = compiled(swiglu_with_probs_reference)
    f = lambda: swiglu_with_probs(h, p)
    e = lambda: swiglu_with_probs_reference(h, p)
    c = (lambda: comp(h, p)) if comp else None
    nb = T * 3 * F * 2
    row("swiglu_with_probs", f"fwd T={T} F={F} bf16", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9, note=f"relerr {err:.1e}")
    fb = lambda fn: (lambda: fn().backward(dy))
    row("swiglu_with_probs", "fwd+bwd", ms(fb(f), [h, p]), try_ms(fb(e), grad_to_none=[h, p]),
        try_ms(fb(c), grad_to_none=[h, p]) if c else None, gbytes=(nb + T * 5 * F * 2) / 1e9)


@guarded("swiglu")
def b_swiglu_dense():
    """The dense MLP's SwiGLU at the megatron bench shape (Llama-3.2-1B: 8 x 4096 tokens, FFN 8192)."""
    from primus.turbo.swiglu import swiglu, swiglu_reference
    T, F = sz((32768, 8192), (17, 48))
    h = torch.randn(T, 2 * F, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, F, device=DEV, dtype=torch.bfloat16)
    err = relerr(swiglu(h), swiglu_reference(h.double()))
    comp = compiled(swiglu_reference)
    f, e = (lambda: swiglu(h)), (lambda: swiglu_reference(h))
    c = (lambda: comp(h)) if comp else None
    nb = T * 3 * F * 2
    row("swiglu", f"fwd T={T} F={F} bf16", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9, note=f"relerr {err:.1e}")
    fb = lambda fn: (lambda: fn().backward(dy))
    row("swiglu", "fwd+bwd", ms(fb(f), [h]), try_ms(fb(e), grad_to_none=[h]),
        try_ms(fb(c), grad_to_none=[h]) if c else None, gbytes=(nb + T * 5 * F * 2) / 1e9)


@guarded("cross_entropy")
def b_cross_entropy():
    """The LM loss at the megatron bench shape (Llama-3.2-1B: 8 x 4096 tokens, vocab 128256, bf16 logits) vs
    eager / compiled F.cross_entropy(logits.float()) (what perf._cross_entropy does); peak memory of fwd+bwd."""
    from primus.turbo.cross_entropy import cross_entropy
    F_ = torch.nn.functional
    N, V = sz((32768, 128256), (37, 1000))
    x = (torch.randn(N, V, device=DEV, dtype=torch.bfloat16) * 2).requires_grad_()
    labels = torch.randint(0, V, (N,), device=DEV)
    dl = torch.randn(N, device=DEV)
    k = min(N, 512)  # correctness on a slice (a float64 copy of the whole would be 34 GB)
    err = relerr(cross_entropy(x[:k], labels[:k]), F_.cross_entropy(x[:k].double(), labels[:k], reduction="none"))

    def ref(xx, ll):
        return F_.cross_entropy(xx.float(), ll, reduction="none")
    comp = compiled(ref)
    f, e = (lambda: cross_entropy(x, labels)), (lambda: ref(x, labels))
    c = (lambda: comp(x, labels)) if comp else None
    nb = N * V * 2
    row("cross_entropy", f"fwd N={N} V={V} bf16", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9, note=f"relerr {err:.1e}")

    def fb(fn):
        return lambda: fn().backward(dl)

    def peak(fn):
        if SMOKE or fn is None:
            return None
        x.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        x.grad = None
        return (torch.cuda.max_memory_allocated() - base) / 2**30
    t = (ms(fb(f), [x]), try_ms(fb(e), grad_to_none=[x]), try_ms(fb(c), grad_to_none=[x]) if c else None)
    fi = lambda: cross_entropy(x.view(N, V), labels, inplace_backward=True)  # a non-leaf view: x is overwritten
    mem = {n: peak(fb(fn)) for n, fn in (("turbo", f), ("eager", e), ("compile", c), ("turbo inplace", fi))}
    note = ", ".join(f"{n} {v:.1f}" for n, v in mem.items() if v is not None)
    note = f"peak GiB beyond the logits: {note}" if note else ""
    row("cross_entropy", "fwd+bwd", *t, gbytes=3 * nb / 1e9, note=note)
    row("cross_entropy", "fwd+bwd inplace_backward", ms(fb(fi), [x]), None, None, gbytes=3 * nb / 1e9)


@guarded("qkv_rope")
def b_qkv_rope():
    """megatron's q/k/v split + RoPE at the bench shape (seq 4096, micro batch 8, 8 groups x (4 q + k + v), d 64)."""
    from primus.turbo.rope import qkv_rope, qkv_rope_reference
    s, b, ng, r, d = sz((4096, 8, 8, 4, 64), (7, 2, 2, 2, 16))
    mixed = torch.randn(s, b, ng, (r + 2) * d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d)
    fr = torch.outer(torch.arange(s, device=DEV, dtype=torch.float32), inv)
    fr = torch.cat((fr, fr), -1)
    got = qkv_rope(mixed, fr, fr, r)
    want = qkv_rope_reference(mixed.double(), fr, fr, r)
    err = max(relerr(a, b_) for a, b_ in zip(got, want))
    comp = compiled(qkv_rope_reference)
    f, e = (lambda: qkv_rope(mixed, fr, fr, r)), (lambda: qkv_rope_reference(mixed, fr, fr, r))
    c = (lambda: comp(mixed, fr, fr, r)) if comp else None
    nb = 2 * mixed.numel() * 2
    row("qkv_rope", f"fwd s={s} b={b} {ng}x({r}+2)x{d} bf16", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9,
        note=f"relerr {err:.1e}")
    gs = [torch.randn_like(t) for t in got]

    def fb(fn):
        return lambda: torch.autograd.backward(list(fn()), gs)
    row("qkv_rope", "fwd+bwd", ms(fb(f), [mixed]), try_ms(fb(e), grad_to_none=[mixed]),
        try_ms(fb(c), grad_to_none=[mixed]) if c else None, gbytes=2 * nb / 1e9)
    from primus.turbo import rope as R
    default = R.ROWS
    try:  # the head-rows-per-program alternatives, ours only
        for rows in (32, 128, 256):
            R.ROWS = rows
            row("qkv_rope", f"fwd+bwd ROWS={rows} (default {default})", ms(fb(f), [mixed]), None, None,
                gbytes=2 * nb / 1e9)
    finally:
        R.ROWS = default


@guarded("fp8_casts")
def b_casts():
    from primus.turbo import fp8_linear as F8
    e4 = F8.fp8_dtypes(DEV)[0]
    fmax = torch.finfo(e4).max
    M, K = sz((8192, 4096), (40, 256))
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)

    def eager_tw(x):
        s = fmax / x.abs().amax().float().clamp_min(1e-12)
        y = (x.float() * s).clamp(-fmax, fmax).to(e4)
        return y, y.t().contiguous(), 1 / s

    def eager_rw(x):
        s = fmax / x.abs().amax(1, keepdim=True).float().clamp_min(1e-12)
        return (x.float() * s).clamp(-fmax, fmax).to(e4), 1 / s

    y, yt, sinv = F8.cast_tensorwise(x, e4, want_y=True, want_t=True)
    ye, yte, se = eager_tw(x)
    mism = (y[:M].float() != ye.float()).float().mean().item()
    ct, cr = compiled(eager_tw), compiled(eager_rw)
    row("fp8 cast tensorwise", f"amax+cast+transpose {M}x{K}", ms(lambda: F8.cast_tensorwise(x, e4, True, True)),
        try_ms(lambda: eager_tw(x)), try_ms((lambda: ct(x)) if ct else None),
        gbytes=M * K * (2 + 1 + 1) / 1e9, note=f"elements != eager: {mism:.1e}; min bytes: read bf16 once, write 2 fp8")
    hist = F8.DelayedScaling().history()
    F8.cast_tensorwise(x, e4, True, True, history=hist)  # primes the history (the first cast takes its own amax)
    row("fp8 cast delayed", f"cast + transpose + amax record {M}x{K}",
        ms(lambda: F8.cast_tensorwise(x, e4, True, True, history=hist)), try_ms(lambda: eager_tw(x)),
        try_ms((lambda: ct(x)) if ct else None), gbytes=M * K * (2 + 1 + 1) / 1e9,
        note="one pass over x (scale from the amax history); eager / compile columns: the tensorwise reference")
    row("fp8 cast rowwise", f"amax+cast {M}x{K}", ms(lambda: F8.cast_rowwise(x, e4)), try_ms(lambda: eager_rw(x)),
        try_ms((lambda: cr(x)) if cr else None), gbytes=M * K * 3 / 1e9)
    row("fp8 cast rowwise", f"along M (transposed out) {M}x{K}", ms(lambda: F8.cast_rowwise(x, e4, transpose=True)),
        None, None, gbytes=M * K * 3 / 1e9)
    row("fp8 cast blockwise", f"1x128 {M}x{K}", ms(lambda: F8.cast_blockwise(x, e4, pad_rows=True)), None, None,
        gbytes=M * K * 3 / 1e9)
    row("fp8 cast blockwise", f"1x128 both ways (dy, dy^T) {M}x{K}",
        ms(lambda: F8.cast_blockwise(x, e4, want_t=True, pad_rows=True)), None, None, gbytes=M * K * 4 / 1e9)
    row("fp8 cast blockwise", f"1x128 transposed out (x^T) {M}x{K}",
        ms(lambda: F8.cast_blockwise(x, e4, want_y=False, want_t=True, pad_rows=True)), None, None,
        gbytes=M * K * 3 / 1e9)
    row("fp8 cast blockwise", f"128x128 W and W^T {M}x{K}",
        ms(lambda: F8.cast_blockwise(x, e4, tile=True, want_t=True)), None, None, gbytes=M * K * 4 / 1e9)


@guarded("fp8_linear")
def b_fp8_linear():
    from primus.turbo import fp8_linear as F8
    if not F8.fp8_linear_available(DEV):
        ROWS.append({"kernel": "fp8 linear", "variant": "-", "note": "no fp8 on this GPU"})
        return
    M = sz(8192, 40)
    shapes = sz([(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")],
                [(256, 128, "tiny")])
    tot = {}
    # the blockwise recipe's GEMM: torch.nn.functional.scaled_mm (cuBLASLt, sm90) or the Triton fallback; when
    # scaled_mm serves this GPU, the Triton GEMM is timed too (forced), on the same casts
    prov = F8.blockwise_gemm_provider(DEV)
    ROWS.append({"kernel": "fp8 linear blockwise", "variant": "GEMM provider",
                 "note": f"{prov}" + ("" if prov == "scaled_mm" else f" ({F8._scaled_mm_blockwise_missing(DEV)})")})
    RESULTS["env"]["fp8_blockwise_gemm"] = prov
    variants = [("tensorwise", None), ("rowwise", None), ("blockwise", None)]
    if prov == "scaled_mm":
        variants.append(("blockwise", "triton"))
    for K, N, name in shapes:
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        ref_y = x.detach().double() @ w.detach().double().t()
        bf = lambda: torch.nn.functional.linear(x, w).backward(dy)
        t_bf = ms(bf, [x, w])
        tot["bf16"] = tot.get("bf16", 0) + t_bf
        fl = 6 * M * K * N
        row("linear bf16", f"fwd+bwd {name} {M}x{K}->{N}", t_bf, flops=fl)
        for recipe, force in variants:
            label = recipe if force is None else f"{recipe} gemm={force}"
            F8.BLOCKWISE_GEMM_OVERRIDE = force
            gemms = ""
            if recipe == "blockwise":
                plan = F8.blockwise_gemms(DEV, "e4m3", K, N)
                gemms = "; gemms " + " ".join(f"{k}={v}" for k, v in plan.items())
            try:
                x.grad = None
                w.grad = None
                y = F8.fp8_linear(x, w, None, recipe)
                err = relerr(y, ref_y)
                y.backward(dy)
                gx = x.grad.clone()
                x.grad = None
                w.grad = None
                errx = relerr(gx, dy.double() @ w.detach().double())
                t = ms(lambda: F8.fp8_linear(x, w, None, recipe).backward(dy), [x, w])
                t_f = ms(lambda: F8.fp8_linear(x, w, None, recipe))
                tot[label] = tot.get(label, 0) + t
                row(f"fp8 linear {label}", f"fwd+bwd {name} {M}x{K}->{N}", t, eager_ms=t_bf, flops=fl,
                    note=f"vs_eager = vs bf16 linear; fwd {t_f:.3f} ms; relerr y {err:.3f} dx {errx:.3f}{gemms}")
                if name == "gate+up" and force is None and not SMOKE:  # where the linear's time goes, per kernel
                    parts = kernel_breakdown(lambda: F8.fp8_linear(x, w, None, recipe).backward(dy), [x, w])
                    RESULTS.setdefault("breakdown", {})[label] = parts
                    print(f"   breakdown {label} {name} (us per fwd+bwd):", flush=True)
                    for kname, us in parts:
                        print(f"     {us:9.1f}  {kname[:110]}", flush=True)
            except Exception:
                traceback.print_exc()
                ROWS.append({"kernel": f"fp8 linear {label}", "variant": name, "note": "FAILED"})
            finally:
                F8.BLOCKWISE_GEMM_OVERRIDE = None
        del x, w, dy
        torch.cuda.empty_cache()
    for r in [v[0] if v[1] is None else f"{v[0]} gemm={v[1]}" for v in variants]:
        if r in tot:
            row(f"fp8 linear {r}", "Llama-3-8B layer GEMMs total fwd+bwd", tot[r], eager_ms=tot["bf16"],
                note="target >= 1.4x bf16")


@guarded("fp8_gemms")
def b_fp8_gemms():
    """Where the fp8 linear's time goes: each of its three GEMMs alone (operands already cast, in the layouts the
    linear hands them over) at Llama-3-8B shapes, bf16 torch.mm vs tensorwise torch._scaled_mm vs the blockwise
    GEMM (scaled_mm 1x128 x 128x128 for fprop / dgrad, 1x128 x 1x128 for wgrad)."""
    from primus.turbo import fp8_linear as F8
    if not F8.fp8_linear_available(DEV):
        return
    e4 = F8.fp8_dtypes(DEV)[0]
    M = sz(8192, 128)
    shapes = sz([(4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 28672, "gate+up"), (14336, 4096, "down")],
                [(256, 128, "tiny")])
    prov = F8.blockwise_gemm_provider(DEV)
    tot = {}
    for K, N, name in shapes:
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16)
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        xq, xqt, sx = F8.cast_tensorwise(x, e4, True, True)
        wq, wqt, sw = F8.cast_tensorwise(w, e4, True, True, pad_t=False)
        dq, dqt, sd = F8.cast_tensorwise(dy, e4, True, True)
        bx, bsx, bxt, bsxt = F8.cast_blockwise(x, e4, want_t=True, pad_rows=True)
        bw, bsw, bwt, bswt = F8.cast_blockwise(w, e4, tile=True, want_t=True)
        bd, bsd, bdt, bsdt = F8.cast_blockwise(dy, e4, want_t=True, pad_rows=True)
        gemms = {  # role: (bf16, tensorwise, blockwise)
            "fprop": (lambda: x @ w.t(), lambda: F8._mm(xq, wq.t(), sx, sw, torch.bfloat16, fast=True),
                      lambda: F8.blockwise_mm(bx, bsx, bw.t(), bsw, True, torch.bfloat16, prov)),
            "dgrad": (lambda: dy @ w, lambda: F8._mm(dq, wqt.t(), sd, sw, torch.bfloat16, fast=True),
                      lambda: F8.blockwise_mm(bd, bsd, bwt.t(), bswt, True, torch.bfloat16, prov)),
            "wgrad": (lambda: dy.t() @ x, lambda: F8._mm(dqt, xqt.t(), sd, sx, torch.bfloat16, fast=True),
                      lambda: F8.blockwise_mm(bdt, bsdt, bxt.t(), bsxt, False, torch.bfloat16, prov)),
        }
        for role, (fb, ft, fbw) in gemms.items():
            t_b, t_t, t_w = ms(fb), try_ms(ft), try_ms(fbw)
            fl = 2 * M * K * N
            for k, v in (("bf16", t_b), ("tensorwise", t_t), ("blockwise", t_w)):
                tot[(role, k)] = tot.get((role, k), 0) + (v or 0)
            row(f"fp8 gemm {role}", f"{name} {M}x{K}->{N} tensorwise", t_t, eager_ms=t_b, flops=fl,
                note="vs_eager = vs bf16 mm")
            row(f"fp8 gemm {role}", f"{name} {M}x{K}->{N} blockwise ({prov})", t_w, eager_ms=t_b, flops=fl)
        del x, w, dy
        if not SMOKE:
            torch.cuda.empty_cache()
    for role in ("fprop", "dgrad", "wgrad"):
        for k in ("tensorwise", "blockwise"):
            row(f"fp8 gemm {role}", f"all 4 linears, {k}", tot[(role, k)], eager_ms=tot[(role, "bf16")],
                note=f"bf16 {tot[(role, 'bf16')]:.3f} ms")


@guarded("tuned_spaces")
def b_tuned_spaces():
    """Every launch config of the blockwise casts', the rowwise transposed cast's, the tensorwise cast's and the
    SwiGLU forward's tuned
    spaces, timed alone (GPU time with
    --gpu-time), and the config _common.Tuned picked for the same call (its autotune times on the device too:
    _common.queued_gpu_time), so a pick that is not the fastest shows."""
    from primus.turbo import fp8_linear as F8
    from primus.turbo import swiglu as SW
    e4 = F8.fp8_dtypes(DEV)[0]
    M, K = sz((8192, 4096), (256, 256))
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    for tile, wy, wt, case in ((False, True, True, "dy and dy^T 1x128"), (True, True, True, "W and W^T 128x128"),
                               (False, False, True, "x^T 1x128"), (False, True, False, "x 1x128")):
        kw = dict(tile=tile, want_y=wy, want_t=wt, pad_rows=not tile)
        F8.cast_blockwise(x, e4, **kw)  # tunes (first call of this key), then the pick
        picked = [v for k, v in F8._CAST_BLOCK.picked.items() if k[0] == (M, K) and (
            ("TILE", tile) in k[1] and ("WRITE_Y", wy) in k[1] and ("WRITE_T", wt) in k[1])]
        nb = M * K * (2 + (1 if wy else 0) + (1 if wt else 0))
        for cfg in F8._CAST_BLOCK.space(TILE=tile, WRITE_Y=wy, WRITE_T=wt):
            t = ms(lambda: F8.cast_blockwise(x, e4, config=cfg, **kw))
            row("tuned blockwise cast", f"{case} {M}x{K} {cfg}", t, gbytes=nb / 1e9,
                note="PICKED" if picked and picked[-1] == cfg else "")
    # the rowwise recipe's transposed cast: its column amax pass and the cast with the transposed store, at the
    # gate+up dy (8192 x 28672) and x (8192 x 4096) shapes
    for R, C in (sz((8192, 28672), (256, 384)), (M, K)):
        xr = torch.randn(R, C, device=DEV, dtype=torch.bfloat16)
        F8.cast_rowwise(xr, e4, transpose=True, pad=True)  # tunes both spaces for this shape
        picked = [v for k, v in F8._COLMAX.picked.items() if k[0] == (R, C)]
        for cfg in F8._COLMAX.space((xr, None, R, C)):
            row("tuned column amax", f"{R}x{C} {cfg}", ms(lambda: F8.column_amax(xr, config=cfg)),
                gbytes=R * C * 2 / 1e9, note="PICKED" if picked and picked[-1] == cfg else "")
        picked = [v for k, v in F8._COLS_T.picked.items() if k[0] == (R, C)]
        for cfg in F8._COLS_T.configs:
            row("tuned rowwise cast along M", f"{R}x{C} {cfg} (amax pass included)",
                ms(lambda: F8.cast_rowwise(xr, e4, transpose=True, pad=True, config=cfg)), gbytes=R * C * 3 / 1e9,
                note="PICKED" if picked and picked[-1] == cfg else "")
    # the tensorwise / delayed cast pass (autotuned), y and y^T, with its amax pass
    for R, C in (sz((8192, 28672), (256, 384)), (M, K)):
        xr = torch.randn(R, C, device=DEV, dtype=torch.bfloat16)
        F8.cast_tensorwise(xr, e4, True, True)
        row("tensorwise amax pass", f"{R}x{C} (partial maxima)", ms(lambda: F8._amax_partials(xr.view(-1))),
            gbytes=R * C * 2 / 1e9, note="a pure read: its share of the cast")
        picked = [v for k, v in F8._TENSORWISE.picked.items() if k[0] == (R, C) and ("DELAYED", False) in k[1]]
        for cfg in F8._TENSORWISE.configs:
            row("tuned tensorwise cast", f"{R}x{C} {cfg} (amax pass included)",
                ms(lambda: F8.cast_tensorwise(xr, e4, True, True, config=cfg)), gbytes=R * C * 4 / 1e9,
                note="PICKED" if picked and picked[-1] == cfg else "")
    T, F = sz((32768, 8192), (64, 256))
    h = torch.randn(T, 2 * F, device=DEV, dtype=torch.bfloat16)
    SW._fwd(h, None)
    picked = [v for k, v in SW._FWD.picked.items() if k[0] == (T * F, F)]
    for cfg in SW._FWD.space(HAS_P=False):
        row("tuned swiglu fwd", f"T={T} F={F} {cfg}", ms(lambda: SW._fwd(h, None, config=cfg)),
            gbytes=T * F * 3 * 2 / 1e9, note="PICKED" if picked and picked[-1] == cfg else "")


@guarded("attention")
def b_attention():
    from primus.turbo.attention import attention_reference, turbo_attention
    B, S, H, KV, D = sz((2, 4096, 32, 8, 128), (1, 64, 4, 2, 16))
    q = torch.randn(B, S, H, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, KV, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, S, KV, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    fl_f = 4 * B * H * S * S * D / 2
    with torch.no_grad():
        qs, ks, vs = q[:1, :1024], k[:1, :1024], v[:1, :1024]
        if SMOKE:
            qs, ks, vs = qs.float(), ks.float(), vs.float()
        err = relerr(turbo_attention(qs, ks, vs), attention_reference(qs.double(), ks.double(), vs.double()))
    comp = compiled(attention_reference)
    fb = lambda fn: (lambda: fn().backward(do))
    e = lambda: attention_reference(q, k, v)
    t_e = try_ms(fb(e), grad_to_none=[q, k, v])
    t_c = try_ms(fb(lambda: comp(q, k, v)), grad_to_none=[q, k, v]) if comp else None
    for be in sz(("auto", "cudnn", "flash", "efficient"), ("auto",)):
        f = lambda: turbo_attention(q, k, v, causal=True, backend=be)
        try:
            t = ms(fb(f), [q, k, v])
            row("attention", f"fwd+bwd causal GQA {H}/{KV} B{B} S{S} D{D} backend={be}", t, t_e, t_c,
                flops=fl_f * 3.5, note=f"relerr(S=1024) {err:.1e}" if be == "auto" else "")
        except Exception as ex:
            ROWS.append({"kernel": "attention", "variant": f"backend={be}", "note": f"unavailable: {str(ex)[:80]}"})


@guarded("sink_attention")
def b_sink_attention():
    """Attention sinks (model.use_sink_attention) at gpt-oss's shape (64 heads of 64, 8 kv heads, seq 4096): the
    sink as one more SDPA key (attention_sinks.sink_attention), with and without a 128-token window, against plain
    causal SDPA at the same shape (what the layer costs without sinks). FLOPs: the causal convention of the plain
    call."""
    import math

    import torch.nn.functional as F

    from primus.backends.attention_sinks import sink_attention
    B, S, H, KV, D = sz((2, 4096, 64, 8, 64), (1, 64, 4, 2, 16))
    dt = torch.float32 if SMOKE else torch.bfloat16
    q = torch.randn(B, H, S, D, device=DEV, dtype=dt, requires_grad=True)
    k = torch.randn(B, KV, S, D, device=DEV, dtype=dt, requires_grad=True)
    v = torch.randn(B, KV, S, D, device=DEV, dtype=dt, requires_grad=True)
    sinks = torch.randn(H, device=DEV, dtype=torch.float32, requires_grad=True)
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(D)
    fl = 4 * B * H * S * S * D / 2 * 3.5  # causal fwd (QK^T, AV) + bwd (2.5x)
    fb = lambda fn: (lambda: fn().backward(do))
    plain = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    t_plain = ms(fb(plain), [q, k, v])
    row("sink_attention", f"plain causal SDPA GQA {H}/{KV} B{B} S{S} D{D} (baseline)", t_plain, flops=fl)
    for window in (None, sz((128, 0), (8, 0))):
        f = lambda: sink_attention(q, k, v, sinks, scale, True, window=window)
        t = ms(fb(f), [q, k, v, sinks])
        row("sink_attention", f"sinks{' + window ' + str(window[0]) if window else ''}: speed "
            f"{t_plain / t:.2f}x the plain call's", t, flops=fl)


@guarded("grouped_gemm")
def b_grouped_gemm():
    from primus.turbo.grouped_gemm import grouped_gemm, grouped_gemm_reference
    G, K, N, T = sz((8, 4096, 14336, 32768), (3, 32, 48, 50))
    g = torch.Generator().manual_seed(0)
    sizes = torch.distributions.Dirichlet(torch.ones(G)).sample() * T
    sizes = sizes.floor().long()
    sizes[-1] += T - sizes.sum()
    gs = sizes.to(DEV)
    x = torch.randn(T, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(G, K, N, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(T, N, device=DEV, dtype=torch.bfloat16)
    fl = 2 * T * K * N
    sl = sizes.tolist()
    e = lambda: grouped_gemm_reference(x, w, sl)
    t_e = try_ms(e)
    t_eb = try_ms(lambda: e().backward(dy), grad_to_none=[x, w])
    for prov in ("torch", "triton"):
        try:
            y = grouped_gemm(x, w, gs, provider=prov)
            err = relerr(y, grouped_gemm_reference(x.double(), w.double(), sl))
            row("grouped_gemm", f"fwd {prov} G{G} T{T} {K}->{N}", ms(lambda: grouped_gemm(x, w, gs, provider=prov)),
                t_e, None, flops=fl, note=f"relerr {err:.1e}; eager = per-expert loop")
            row("grouped_gemm", f"fwd+bwd {prov}", ms(lambda: grouped_gemm(x, w, gs, provider=prov).backward(dy), [x, w]),
                t_eb, None, flops=3 * fl)
        except Exception as ex:
            traceback.print_exc()
            ROWS.append({"kernel": "grouped_gemm", "variant": prov, "note": f"FAILED {str(ex)[:80]}"})
    from primus.turbo.fp8_linear import fp8_linear_available
    from primus.turbo.grouped_gemm import fp8_grouped_gemm
    if fp8_linear_available(DEV):  # fp8 experts (tensorwise, hybrid) vs the bf16 grouped GEMM (eager_ms column)
        t_b = try_ms(lambda: grouped_gemm(x, w, gs))
        t_bb = try_ms(lambda: grouped_gemm(x, w, gs).backward(dy), grad_to_none=[x, w])
        y = fp8_grouped_gemm(x, w, gs)
        err = relerr(y, grouped_gemm_reference(x.double(), w.double(), sl))
        row("grouped_gemm", f"fwd fp8 triton G{G} T{T} {K}->{N}", ms(lambda: fp8_grouped_gemm(x, w, gs)), t_b, None,
            flops=fl, note=f"relerr {err:.1e}; eager = bf16 grouped_gemm (auto provider)")
        row("grouped_gemm", "fwd+bwd fp8 triton", ms(lambda: fp8_grouped_gemm(x, w, gs).backward(dy), [x, w]), t_bb,
            None, flops=3 * fl)
        # torch._scaled_grouped_mm (CUTLASS sm90, e4m3, rowwise scales; wgrad groups padded to 16 on the device)
        from primus.turbo.grouped_gemm_fp8 import fp8_grouped_choice
        prov, why = fp8_grouped_choice(x, w, "e4m3")
        if prov != "torch_scaled":
            ROWS.append({"kernel": "grouped_gemm", "variant": "fp8 torch_scaled", "note": f"not run: {why}"})
            return
        try:
            f8 = lambda: fp8_grouped_gemm(x, w, gs, fmt="e4m3", provider="torch_scaled")  # noqa: E731
            err = relerr(f8(), grouped_gemm_reference(x.double(), w.double(), sl))
            row("grouped_gemm", f"fwd fp8 torch_scaled G{G} T{T} {K}->{N}", ms(f8), t_b, None, flops=fl,
                note=f"relerr {err:.1e}; e4m3 rowwise; eager = bf16 grouped_gemm (auto provider)")
            row("grouped_gemm", "fwd+bwd fp8 torch_scaled", ms(lambda: f8().backward(dy), [x, w]), t_bb, None,
                flops=3 * fl)
        except Exception as ex:
            traceback.print_exc()
            ROWS.append({"kernel": "grouped_gemm", "variant": "fp8 torch_scaled", "note": f"FAILED {str(ex)[:80]}"})


@guarded("router")
def b_router():
    from primus.turbo.moe_ops import fused_router, router_reference
    for T, E, k, sf in sz(((32768, 64, 8, "softmax"), (32768, 256, 8, "sigmoid")), ((20, 16, 4, "sigmoid"),)):
        logits = torch.randn(T, E, device=DEV, dtype=torch.float32, requires_grad=True)
        p, m, a = fused_router(logits, k, sf)
        pr, mr, ar = router_reference(logits.double(), k, sf)
        note = f"relerr p {relerr(p, pr):.1e} aux {relerr(a, ar):.1e} map equal {bool(torch.equal(m, mr))}"
        comp = compiled(lambda l: router_reference(l, k, sf))
        gp, ga = torch.randn(T, E, device=DEV), torch.randn(T, E, device=DEV)
        fb = lambda fn: (lambda: (lambda o: (o[0] * gp).sum().add((o[2] * ga).sum()).backward())(fn()))
        f = lambda: fused_router(logits, k, sf)
        e = lambda: router_reference(logits, k, sf)
        c = (lambda: comp(logits)) if comp else None
        nb = T * E * (4 + 4 + 1 + 4)
        row("fused_router", f"fwd T{T} E{E} k{k} {sf}", ms(f), try_ms(e), try_ms(c), gbytes=nb / 1e9, note=note)
        row("fused_router", f"fwd+bwd T{T} E{E} k{k} {sf}", ms(fb(f), [logits]), try_ms(fb(e), grad_to_none=[logits]),
            try_ms(fb(c), grad_to_none=[logits]) if c else None, gbytes=(nb + T * E * (4 + 1 + 4 + 4 + 4)) / 1e9)


@guarded("grouped_wgrad_accum")
def b_grouped_wgrad_accum():
    """training.gradient_accumulation_fusion on the experts: the grouped GEMM's forward + backward with the weight
    gradient added into an fp32 main_grad in its GEMM (grouped_gemm_accumulate) against the same GEMMs returning a
    bf16 weight gradient that is then added (megatron's unfused path), at the at-scale MoE rows' expert GEMMs for a
    micro batch of 2 x 4096 tokens: DeepSeek-V2-Lite (64 experts top-6, 2048 -> 2x1408 -> 2048) and Qwen3-30B-A3B
    (128 top-8, 2048 -> 2x768 -> 2048). Bytes: main_grad read + written (8 a parameter) either way; the unfused
    path also writes and reads the bf16 gradient."""
    from primus.turbo import grouped_gemm as GG
    from primus.turbo.grouped_gemm import grouped_gemm, grouped_gemm_accumulate, pick_provider
    shapes = sz([(64, 49152, 2048, 2816), (64, 49152, 1408, 2048), (128, 65536, 2048, 1536), (128, 65536, 768, 2048)],
                [(4, 40, 32, 48)])
    for G, T, K, N in shapes:
        sizes = torch.full((G,), T // G, dtype=torch.long)
        sizes[-1] += T - sizes.sum()
        gs = sizes.to(DEV)
        x = torch.randn(T, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(G, K, N, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(T, N, device=DEV, dtype=torch.bfloat16)
        main = torch.zeros(G * K, N, device=DEV)

        def unfused():
            grouped_gemm(x, w, gs).backward(dy)
            main.view(G, K, N).add_(w.grad)

        def fused():
            grouped_gemm_accumulate(x, w, gs, main).backward(dy)

        fl, gb = 3 * 2 * T * K * N, G * K * N * 8 / 1e9
        row("grouped_wgrad_accum", f"fwd+bwd, accumulated G{G} T{T} {K}->{N} ({pick_provider(x, w)} GEMMs)",
            ms(fused, [x]), try_ms(unfused, grad_to_none=[x, w]), None, flops=fl, gbytes=gb,
            note="eager = the same GEMMs returning a bf16 weight gradient, then main_grad.add_")
        # the weight-gradient GEMM alone: each config of its tuned space adding into main_grad, against CUTLASS's
        # (torch._grouped_mm, what autograd runs) writing a bf16 gradient that is then added
        mg, xd, dyd = main.view(G, K, N), x.detach(), dy
        ends = torch.cumsum(gs, 0).to(torch.int32)
        base = None
        if DEV == "cuda" and hasattr(torch, "_grouped_mm"):
            base = try_ms(lambda: mg.add_(torch._grouped_mm(xd.t(), dyd, offs=ends)))
        GG.wgrad_accumulate_launch(xd, dyd, ends, mg)  # tunes this shape (first call), then the pick
        picked = [v for k, v in GG._WGRAD_ACC.picked.items() if k[0] == (K, N)]
        for cfg in GG._WGRAD_ACC.configs:
            row("grouped_wgrad_accum", f"wgrad alone, accumulating G{G} T{T} {K}->{N} {cfg}",
                ms(lambda: GG.wgrad_accumulate_launch(xd, dyd, ends, mg, config=cfg)), base, None,
                flops=2 * T * K * N, gbytes=gb, note=("PICKED; " if picked and picked[-1] == cfg else "")
                + "eager = torch._grouped_mm's bf16 weight gradient, then main_grad.add_")


@guarded("fp8_wgrad_accum")
def b_fp8_wgrad_accum():
    """training.gradient_accumulation_fusion on the portable fp8 linears: the tensorwise weight-gradient GEMM adding
    into the fp32 main_grad in cuBLASLt's epilogue (primus.turbo.cublaslt.scaled_mm_add_) against what runs
    unfused, torch._scaled_mm's bf16 gradient then main_grad.add_ (megatron's hook), and against that GEMM alone,
    at Llama-2-7B's four linears for micro batches of 1 and 2 x 4096 tokens (e5m2 dy^T x e4m3 x, as "hybrid").
    Bytes: the unfused add reads the bf16 gradient and main_grad and writes main_grad (10 a parameter); the
    epilogue reads and writes main_grad (8)."""
    from primus.turbo import cublaslt
    from primus.turbo import fp8_linear as F8
    if not F8.fp8_linear_available(DEV):
        return
    why = cublaslt.unusable(DEV)
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    shapes = sz([(4096, 12288, "qkv"), (4096, 4096, "o"), (4096, 22016, "gate+up"), (11008, 4096, "down")],
                [(64, 48, "tiny")])
    for M in sz([4096, 8192], [32]):
        tot = {"fused": 0.0, "unfused": 0.0, "gemm": 0.0}
        for K, N, name in shapes:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
            _, xqt, sx = F8.cast_tensorwise(x, e4, want_y=False, want_t=True)
            _, dqt, sd = F8.cast_tensorwise(dy, e5, want_y=False, want_t=True)
            main = torch.zeros(N, K, device=DEV)
            del x, dy
            gemm = lambda: F8._mm(dqt, xqt.t(), sd, sx, torch.bfloat16)  # noqa: E731
            t_gemm = ms(gemm)
            t_unf = ms(lambda: main.add_(gemm()))
            t_fus = ms(lambda: cublaslt.scaled_mm_add_(main, dqt, xqt.t(), sd, sx))
            for k, v in (("fused", t_fus), ("unfused", t_unf), ("gemm", t_gemm)):
                tot[k] += v
            row("fp8_wgrad_accum", f"{name} {M} tokens, {K}->{N}" + (f" (fallback: {why})" if why else ""), t_fus,
                eager_ms=t_unf, flops=2 * M * K * N, gbytes=N * K * 8 / 1e9,
                note=f"eager = _scaled_mm bf16 + main_grad.add_; the GEMM alone {t_gemm:.3f} ms")
            del xqt, dqt, main
            if not SMOKE:
                torch.cuda.empty_cache()
        row("fp8_wgrad_accum", f"all 4 linears, {M} tokens", tot["fused"], eager_ms=tot["unfused"],
            note=f"the GEMMs alone {tot['gemm']:.3f} ms")


@guarded("permute")
def b_permute():
    """Mixtral-like (8 experts top-2) and the at-scale MoE rows' layers: DeepSeek-V2-Lite (64 top-6) and
    Qwen3-30B-A3B (128 top-8), a micro batch of 2 x 4096 tokens at hidden 2048."""
    from primus.turbo.moe_ops import fused_router, permute, permute_reference, unpermute, unpermute_reference
    shapes = sz([(16384, 8, 2, 4096), (8192, 64, 6, 2048), (8192, 128, 8, 2048)], [(20, 4, 2, 64), (12, 16, 6, 32)])
    for T, E, k, H in shapes:
        logits = torch.randn(T, E, device=DEV)
        probs, rmap, _ = fused_router(logits, k)
        x = torch.randn(T, H, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        y, py, rid = permute(x, rmap, probs, num_out_tokens=T * k)
        yr, pyr, idx = permute_reference(x, rmap, probs)
        note = f"permute exact {bool(torch.equal(y, yr))}"
        n = T * k
        gb = (T * H + n * H) * 2 / 1e9
        row("permute", f"fwd T{T} E{E} k{k} H{H}", ms(lambda: permute(x, rmap, probs, num_out_tokens=n)),
            try_ms(lambda: permute_reference(x, rmap, probs)), None, gbytes=gb,
            note=note + "; eager = nonzero + index (syncs)")
        yd = y.detach()
        row("unpermute", f"fwd (with probs) T{T} E{E} k{k} H{H}", ms(lambda: unpermute(yd, rid, probs)),
            try_ms(lambda: unpermute_reference(yd, idx, T, probs)), None, gbytes=gb)
        yg, pg = yd.clone().requires_grad_(), probs.detach().clone().requires_grad_()
        dout = torch.randn(T, H, device=DEV, dtype=torch.bfloat16)

        def fb(f):
            return lambda: f().backward(dout)

        # bytes: forward as above; backward reads dout and the rows, writes their gradient
        row("unpermute", f"fwd+bwd (with probs) T{T} E{E} k{k} H{H}",
            ms(fb(lambda: unpermute(yg, rid, pg)), [yg, pg]),
            try_ms(fb(lambda: unpermute_reference(yg, idx, T, pg)), grad_to_none=[yg, pg]), None,
            gbytes=gb + (T * H + 2 * n * H) * 2 / 1e9)


def table():
    cols = ["kernel", "variant", "ms", "eager_ms", "compile_ms", "vs_eager", "vs_compile", "GB/s", "%copy",
            "TFLOP/s", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in ROWS:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) and c.endswith("ms") else
                                               f"{v:.2f}" if isinstance(v, float) else str(v).replace("|", "/")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--gpu-time", action="store_true", help="time the X, not the host launch path")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for the whole script")
    ap.add_argument("--test-timeout", type=float, default=150.0)
    ap.add_argument("--test-files", default="", help="comma list: run only tests/test_turbo_<name>.py")
    ap.add_argument("--only", default="", help="comma list of kernel names")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run (interpreter, tiny sizes)")
    ARGS = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        print("no GPU: this bench needs CUDA or ROCm")
        return 2
    _common.POISON = False  # timing: no poison fills
    env_and_copy()
    run_tests()
    benches = [b_rmsnorm, b_swiglu, b_swiglu_dense, b_cross_entropy, b_qkv_rope, b_casts, b_fp8_linear, b_fp8_gemms,
               b_tuned_spaces, b_attention, b_sink_attention, b_grouped_gemm, b_grouped_wgrad_accum, b_fp8_wgrad_accum, b_router,
               b_permute]
    only = [s for s in ARGS.only.split(",") if s]
    for b in benches:
        if not only or b.__name__ in only:
            b()
    RESULTS["elapsed_s"] = time.time() - T0
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "turbo_kernels.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
    print("\npytest on GPU:", RESULTS["checks"].get("pytest_rc"), "in %.0fs" % RESULTS["checks"].get("pytest_s", 0)
          if not ARGS.no_tests else "skipped")
    print(f"copy bandwidth {RESULTS['env']['copy_GBps']:.0f} GB/s; elapsed {RESULTS['elapsed_s']:.0f}s; timing: "
          + ("kernel GPU time from the profiler" if ARGS.gpu_time else "do_bench (host launch path included)") + "\n")
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
