"""GPU validation and benchmark of the three-stage GEMM tuning workflow (one H200, a few minutes).

    PYTHONPATH=. python bench/gemm_tuning.py [--max-candidates 64]   # logs/JSON go to $OUT (or ./bench_out)

1. correctness: tuned linear (forward, dgrad, wgrad) vs torch's default, several shapes; also under
   torch.compile and inside a captured CUDA graph. Tuning here keeps the best cuBLASLt algorithm even when it is
   not faster (min_gain=-1), so every GEMM really goes through the tuned path.
2. Llama-3.2-1B-shaped step (dim 2048, FFN 8192, 32/8 heads, vocab 128256, seq 4096, micro batch 2; two blocks +
   lm_head, bf16 nn.Linear): record its GEMMs, tune them, call-count-weighted GEMM time default vs tuned.
3. end to end: that step (fwd + bwd + AdamW) with and without the tuned linear, each timed twice.
Each section catches its own errors and the script carries on.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tuning import apply  # noqa: E402
from tuning.shapes import record_gemms  # noqa: E402
from tuning.tune import tune  # noqa: E402

OUT = Path(os.environ.get("OUT") or "bench_out")
OUT.mkdir(parents=True, exist_ok=True)
WORK = OUT / "gemm_tuning"
SUMMARY: dict = {"sections": {}}
TABLE: list[tuple[str, str, str]] = []  # (section, metric, value)


def section(name):
    def wrap(fn):
        def run():
            t0 = time.time()
            print(f"\n=== {name} ===", flush=True)
            try:
                fn()
                SUMMARY["sections"][name] = {"ok": True, "seconds": round(time.time() - t0, 1)}
            except Exception as e:  # noqa: BLE001 - report and continue with the next section
                traceback.print_exc()
                SUMMARY["sections"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                             "seconds": round(time.time() - t0, 1)}
                TABLE.append((name, "ERROR", f"{type(e).__name__}: {e}"[:120]))
            finally:
                apply.uninstall_tuned_linear()
                torch.cuda.empty_cache()
        return run
    return wrap


def rel_err(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


@section("0 environment")
def env():
    from tuning.lt_bindings import Lt
    lt = Lt.load("cublaslt")
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
            "cublasLt_path": lt.path, "cublasLt_version": lt.version()}
    SUMMARY["env"] = info
    print(json.dumps(info, indent=1))
    TABLE.append(("0 environment", "cuBLASLt", f"{lt.version()} ({Path(lt.path).name})"))


# -- 1 ------------------------------------------------------------------------------------------------------------

CHECK_SHAPES = [  # (in, out, bias, tokens)
    (2048, 2048, False, 4096),
    (2048, 512, True, 1000),
    (8192, 2048, False, 2048),
    (1024, 3072, True, 136),
]


def _fwd_bwd(lin, x, g):
    x = x.detach().requires_grad_(True)
    lin.zero_grad(set_to_none=True)
    y = lin(x)
    y.backward(g)
    grads = [x.grad, lin.weight.grad] + ([lin.bias.grad] if lin.bias is not None else [])
    return y.detach(), [t.detach().clone() for t in grads]


@section("1 correctness")
def correctness():
    torch.manual_seed(0)
    shape_dir = WORK / "check" / "gemm_shape"
    results = WORK / "check" / "gemm_tune" / "tune_hipblas_gemm_results.txt"
    mods, data = [], []
    with record_gemms(shape_dir, rank=0):
        for fin, fout, bias, tokens in CHECK_SHAPES:
            lin = nn.Linear(fin, fout, bias=bias, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(tokens, fin, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(tokens, fout, device="cuda", dtype=torch.bfloat16)
            _fwd_bwd(lin, x, g)
            mods.append(lin)
            data.append((x, g))
    rep = tune(shape_dir, results, devices=[0], max_candidates=12, warmup=2, iters=5, rotating_mb=128,
               min_gain=-1.0, progress=False)
    print(rep.markdown())
    n_tuned = rep.counts().get("tuned", 0)
    TABLE.append(("1 correctness", "problems tuned (forced)", f"{n_tuned}/{len(rep.lines)}"))

    refs = [_fwd_bwd(lin, x, g) for lin, (x, g) in zip(mods, data)]
    handle = apply.install_tuned_linear(results)
    worst = 0.0
    for lin, (x, g), (ry, rg) in zip(mods, data, refs):
        y, gr = _fwd_bwd(lin, x, g)
        errs = [rel_err(y, ry)] + [rel_err(a, b) for a, b in zip(gr, rg)]
        worst = max(worst, *errs)
        print(f"  {lin}: rel err out/grads {['%.2e' % e for e in errs]}")
    stats = handle.stats()
    expected_calls = 3 * len(CHECK_SHAPES)
    TABLE.append(("1 correctness", "eager fwd/dgrad/wgrad worst rel err", f"{worst:.2e} (tol 2e-2)"))
    TABLE.append(("1 correctness", "GEMMs routed to tuned cuBLASLt", f"{stats.get('tuned', 0)}/{expected_calls}"))
    SUMMARY["correctness"] = {"worst_rel_err": worst, "stats": stats, "ok": worst < 2e-2 and
                              stats.get("tuned", 0) == expected_calls}

    # torch.compile (inductor) through the custom op, forward and backward
    lin, (x, g), (ry, rg) = mods[0], data[0], refs[0]
    compiled = torch.compile(lin)
    before = handle.stats().get("tuned", 0)
    y, gr = _fwd_bwd(compiled, x, g)
    c_err = max([rel_err(y, ry)] + [rel_err(a, b) for a, b in zip(gr, rg)])
    c_calls = handle.stats().get("tuned", 0) - before
    TABLE.append(("1 correctness", "torch.compile worst rel err / tuned calls", f"{c_err:.2e} / {c_calls}"))

    # CUDA graph capture of a forward (no host sync inside the op)
    lin = mods[1]
    static_x = data[1][0].clone()
    with torch.no_grad():
        ref = F.linear(static_x, lin.weight, lin.bias)  # patched: tuned path, eager
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                lin(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = lin(static_x)
        static_x.copy_(data[1][0] * 0.5)
        graph.replay()
        torch.cuda.synchronize()
        g_err = rel_err(static_y, ref * 0.5 + lin.bias * 0.5)
    TABLE.append(("1 correctness", "CUDA graph replay rel err", f"{g_err:.2e}"))
    SUMMARY["correctness"].update({"compile_rel_err": c_err, "compile_tuned_calls": c_calls, "graph_rel_err": g_err})


# -- 2 ------------------------------------------------------------------------------------------------------------

DIM, FFN, HEADS, KV_HEADS, VOCAB, SEQ, MBS, LAYERS = 2048, 8192, 32, 8, 128256, 4096, 2, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        hd = DIM // HEADS
        kw = dict(bias=False)
        self.q = nn.Linear(DIM, DIM, **kw)
        self.k = nn.Linear(DIM, KV_HEADS * hd, **kw)
        self.v = nn.Linear(DIM, KV_HEADS * hd, **kw)
        self.o = nn.Linear(DIM, DIM, **kw)
        self.gate, self.up, self.down = nn.Linear(DIM, FFN, **kw), nn.Linear(DIM, FFN, **kw), nn.Linear(FFN, DIM, **kw)
        self.n1, self.n2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)

    def forward(self, x):
        B, S, _ = x.shape
        hd = DIM // HEADS
        h = self.n1(x)
        q = self.q(h).view(B, S, HEADS, hd).transpose(1, 2)
        k = self.k(h).view(B, S, KV_HEADS, hd).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = self.v(h).view(B, S, KV_HEADS, hd).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, DIM)
        x = x + self.o(a)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class SmallLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.norm(x))


def make_model():
    torch.manual_seed(0)
    return SmallLlama().to(device="cuda", dtype=torch.bfloat16)


def batch():
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, VOCAB, (MBS, SEQ + 1), device="cuda", generator=g)
    return ids[:, :-1], ids[:, 1:]


def train_step(model, opt, ids, labels):
    logits = model(ids)
    loss = F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


LLAMA_RESULTS = WORK / "llama" / "gemm_tune" / "tune_hipblas_gemm_results.txt"
# candidates timed per problem in section 2: the tuner's own default (tuning/cuda_tuner.py); --max-candidates N
MAX_CANDIDATES = 64


@section("2 llama GEMM tuning")
def llama_tuning():
    model = make_model()
    ids, labels = batch()
    shape_dir = WORK / "llama" / "gemm_shape"
    with record_gemms(shape_dir, rank=0, steps=1) as rec:
        logits = model(ids)
        F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1)).backward()
    del logits
    model.zero_grad(set_to_none=True)
    del model
    torch.cuda.empty_cache()
    problems = rec.results()
    print(f"recorded {len(problems)} distinct GEMM problems, {sum(p.count for p in problems):g} calls per step")
    t0 = time.time()
    rep = tune(shape_dir, LLAMA_RESULTS, devices=[0], max_candidates=MAX_CANDIDATES, warmup=3, iters=10,
               rotating_mb=256, progress=True)
    secs = time.time() - t0
    sp = rep.step_speedup or 0.0
    TABLE.append(("2 llama GEMMs", "distinct problems / calls per step", f"{len(problems)} / "
                  f"{sum(p.count for p in problems):g}"))
    TABLE.append(("2 llama GEMMs", "weighted GEMM time default -> tuned",
                  f"{rep.step_default_us / 1e3:.3f} ms -> {rep.step_tuned_us / 1e3:.3f} ms"))
    TABLE.append(("2 llama GEMMs", "speedup (target >= 1.05x)", f"{sp:.3f}x {'PASS' if sp >= 1.05 else 'below'}"))
    TABLE.append(("2 llama GEMMs", "tuning time / status", f"{secs:.0f} s / {rep.counts()}"))
    TABLE.append(("2 llama GEMMs", "candidates per problem (max)", str(MAX_CANDIDATES)))
    SUMMARY["llama_gemms"] = rep.to_json() | {"tuning_seconds": secs}


# -- 3 ------------------------------------------------------------------------------------------------------------


def time_steps(model, opt, n=8, warmup=3):
    ids, labels = batch()
    for _ in range(warmup):
        train_step(model, opt, ids, labels)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        train_step(model, opt, ids, labels)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


@section("3 end-to-end step")
def end_to_end():
    if not LLAMA_RESULTS.exists():
        raise RuntimeError("section 2 produced no results file")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    runs = {"default": [], "tuned": []}
    tuned_calls = 0
    for variant in ("default", "tuned", "default", "tuned"):
        handle = apply.install_tuned_linear(LLAMA_RESULTS) if variant == "tuned" else None
        runs[variant].append(time_steps(model, opt))
        if handle:
            tuned_calls = handle.stats().get("tuned", 0)
            handle.uninstall()
    d, t = min(runs["default"]), min(runs["tuned"])
    tokens = MBS * SEQ
    print(json.dumps(runs))
    TABLE.append(("3 end-to-end", "step ms default (2 runs)", " / ".join(f"{x:.2f}" for x in runs["default"])))
    TABLE.append(("3 end-to-end", "step ms tuned (2 runs)", " / ".join(f"{x:.2f}" for x in runs["tuned"])))
    TABLE.append(("3 end-to-end", "best-of-2 speedup / tokens/s tuned",
                  f"{d / t:.3f}x / {tokens / t * 1e3:,.0f} ({'not slower' if t <= d * 1.02 else 'SLOWER'})"))
    TABLE.append(("3 end-to-end", "tuned GEMM calls over 11 steps", str(tuned_calls)))
    SUMMARY["end_to_end"] = {"runs_ms": runs, "speedup_best_of_2": d / t, "tuned_calls": tuned_calls}


def main():
    global MAX_CANDIDATES
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-candidates", type=int, default=MAX_CANDIDATES,
                    help="cuBLASLt candidates timed per GEMM problem in section 2 (>= 1)")
    MAX_CANDIDATES = ap.parse_args().max_candidates
    if MAX_CANDIDATES < 1:
        ap.error(f"--max-candidates must be >= 1, got {MAX_CANDIDATES}")
    t0 = time.time()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 1
    for fn in (env, correctness, llama_tuning, end_to_end):
        fn()
    SUMMARY["total_seconds"] = round(time.time() - t0, 1)
    md = ["| section | metric | value |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in TABLE]
    text = "\n".join(md)
    print("\n" + text + f"\n\ntotal {SUMMARY['total_seconds']} s")
    (OUT / "gemm_tuning_bench.md").write_text(text + "\n")
    (OUT / "gemm_tuning_bench.json").write_text(json.dumps(SUMMARY, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
