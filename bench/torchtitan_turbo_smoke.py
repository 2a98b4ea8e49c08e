"""TorchTitan turbo flags on the GPU: module checks (seconds), then end-to-end tokens/s with and without turbo.

    python bench/torchtitan_turbo_smoke.py                 # checks + 4 e2e points (llama3_2_1b, seq 4096, compile)
    python bench/torchtitan_turbo_smoke.py --checks-only
    python bench/torchtitan_turbo_smoke.py --steps 12 --timeout 300

Checks (CUDA, bf16, inductor): the swapped attention core (cuDNN) == TorchTitan's SDPA wrapper; TurboFP8Linear
(compile-safe custom ops) compiled == eager within the fp8 band and both near the bf16 linear; turbo grouped experts
== TorchTitan's grouped_mm experts. Then `bench/e2e.py` points, each in its own process:
  tt bf16 compile            backend=torchtitan training.compile=true
  tt bf16 compile turbo      + turbo=torchtitan           (turbo attention core)
  tt fp8 compile             + precision=fp8              (torchao float8)
  tt fp8 compile turbo       + precision=fp8 turbo=torchtitan_fp8   (turbo attention + turbo fp8 linear)
  tt fp8 blockwise / delayed compile turbo   the turbo fp8 linear's other recipes (torchao has neither)
`--points NAME,...` runs some of them (`--ref` names the ratio column's baseline, default `tt bf16 compile`).
Prints the markdown table and writes it under $OUT when set.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

POINTS = [
    ("tt bf16 compile", []),
    ("tt bf16 compile turbo", ["turbo=torchtitan"]),
    ("tt fp8 compile", ["precision=fp8"]),
    ("tt fp8 compile turbo", ["precision=fp8", "turbo=torchtitan_fp8"]),
    ("tt fp8 blockwise compile turbo", ["precision=fp8_blockwise", "turbo=torchtitan_fp8"]),
    ("tt fp8 delayed compile turbo", ["precision=fp8_delayed", "turbo=torchtitan_fp8"]),
]


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def checks() -> dict:
    import torch
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs
    from torchtitan.models.moe.moe import GroupedExperts

    from primus.backends.torchtitan import turbo
    from primus.turbo.attention import active_backend

    out = {}
    dev = "cuda"
    torch.manual_seed(0)
    # attention core: 32/8 GQA heads, head dim 128, seq 2048, bf16
    with torch.device(dev):
        m = Transformer(TransformerModelArgs(dim=4096, n_layers=1, n_heads=32, n_kv_heads=8, vocab_size=1024,
                                             max_seq_len=2048, attn_type="sdpa"))
        with torch.no_grad():
            m.init_weights()
    m = m.bfloat16()
    t = copy.deepcopy(m)
    out["attention_swapped"] = turbo.swap_attention(t)
    h = torch.randn(2, 2048, 4096, device=dev, dtype=torch.bfloat16)
    q = torch.randn(2, 32, 2048, 128, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(2, 8, 2048, 128, device=dev, dtype=torch.bfloat16)
    out["attention_backend"] = active_backend(q, kv, kv, layout="bhsd")
    blk = torch.compile(t.layers["0"], fullgraph=True)
    out["attention_rel_vs_stock"] = rel(blk(h, t.freqs_cis, attention_masks=None),
                                        m.layers["0"](h, m.freqs_cis, attention_masks=None))
    # fp8 linear: 8192 tokens x 4096 -> 14336 under bf16 autocast, fp32 weight (TorchTitan on one GPU)
    lin = torch.nn.Linear(4096, 14336, bias=False, device=dev)
    x = torch.randn(8192, 4096, device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y_bf16 = lin(x)
    for recipe, fmt in (("tensorwise", "hybrid"), ("blockwise", "e4m3"), ("delayed", "hybrid")):
        eager, comp = torch.nn.Sequential(copy.deepcopy(lin)), torch.nn.Sequential(copy.deepcopy(lin))
        delayed = {"history_len": 16, "margin": 0, "algo": "max"}
        for m in (eager, comp):
            turbo.swap_float8_linears(m, recipe, [], fmt, delayed=delayed)
            turbo.allocate_fp8_states(m)
        comp = torch.compile(comp, fullgraph=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(2):  # delayed: the first call's own amax, then the history
                y_eager, y_comp = eager(x), comp(x)
        key = "" if recipe == "tensorwise" else f"_{recipe}"
        out[f"fp8{key}_rel_compiled_vs_eager"] = rel(y_comp, y_eager)
        out[f"fp8{key}_rel_vs_bf16"] = rel(y_eager, y_bf16)
    # grouped experts
    g = GroupedExperts(dim=2048, hidden_dim=1408, num_experts=8, use_grouped_mm=True).to(dev)
    for w in (g.w1, g.w2, g.w3):
        torch.nn.init.normal_(w, std=0.02)
    xs = torch.randn(4096, 2048, device=dev)
    n = torch.tensor([600, 0, 1000, 300, 700, 496, 500, 500], device=dev)
    want = g(xs, n)
    root = torch.nn.Module()
    root.e = g
    turbo.swap_grouped_experts(root)
    got = g(xs, n)
    out["grouped_gemm_provider"] = g.turbo_provider
    out["grouped_gemm_rel_vs_stock"] = rel(got, want)
    fp8_ok = all(v < (0.05 if "compiled" in k else 0.1) for k, v in out.items() if k.startswith("fp8"))
    ok = (out["attention_swapped"] == 1 and out["attention_rel_vs_stock"] < 2e-2 and fp8_ok
          and out["grouped_gemm_rel_vs_stock"] < 1e-2)
    out["ok"] = ok
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checks-only", action="store_true")
    ap.add_argument("--steps", type=int, default=20, help="training.train_iters per point (bench preset: 20)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--points", default=None, help="comma-separated point names (default: all)")
    ap.add_argument("--ref", default="tt bf16 compile", help="the ratio column's baseline point")
    args = ap.parse_args()
    points = POINTS
    if args.points:
        want = args.points.split(",")
        unknown = sorted(set(want) - {n for n, _ in POINTS})
        if unknown:
            ap.error(f"unknown --points {unknown}; known: {[n for n, _ in POINTS]}")
        points = [p for p in POINTS if p[0] in want]
    res = {"checks": checks()}
    print(json.dumps(res["checks"], indent=2), flush=True)
    if not args.checks_only:
        import e2e

        base = ["train.py", "backend=torchtitan", "training.compile=true", *e2e.BENCH,
                f"training.train_iters={args.steps}"]
        rows = []
        for name, extra in points:
            print(f"[smoke] {name} ...", flush=True)
            rows.append(e2e.run_point(name, base + extra, args.timeout, os.environ.get("OUT")))
            r = rows[-1]
            print(f"  -> {r.get('status')} tokens/s={r.get('tokens_per_s')} "
                  f"turbo={(r.get('backend_info') or {}).get('turbo_providers')}", flush=True)
        res["rows"] = rows
        print(e2e.table(rows, args.ref))
        fp8 = {r["name"]: r.get("tokens_per_s") for r in rows}
        if fp8.get("tt fp8 compile") and fp8.get("tt fp8 compile turbo"):
            print(f"turbo fp8 vs torchao fp8: {fp8['tt fp8 compile turbo'] / fp8['tt fp8 compile']:.3f}x")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "torchtitan_turbo_smoke.json"), "w") as f:
            json.dump(res, f, indent=2, default=str)
    return 0 if res["checks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
