"""Is there a faster cuBLASLt algorithm than torch's pick for the blockwise fp8 GEMMs? (H200)

torch.nn.functional.scaled_mm asks cuBLASLt's heuristic for one algorithm and runs it. This probe records the
blockwise linear's three GEMMs (fprop 1x128 x 128x128, dgrad 1x128 x 128x128, wgrad 1x128 x 1x128) at Llama-3-8B
shapes, rebuilds each as a cuBLASLt problem through tuning/lt_bindings (the block scale modes), and times the
CUDA tuner's candidates (heuristic list, split-k / swizzle variants, enumerated tiles and stages) against
torch's own call on the same operands. Every candidate's output is compared with torch's first.

    python bench/lt_blockwise_probe.py [--tokens 8192] [--max-candidates 48]
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from primus.turbo import fp8_linear as fl  # noqa: E402
from tuning.cuda_tuner import CudaLtTuner, rel_err  # noqa: E402
from tuning.gemm_problem import problem_from_matmul  # noqa: E402

LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def header_constants():
    """The scale-mode enums as this machine's cublasLt.h spells them (the bindings' values are checked here)."""
    import site
    for d in site.getsitepackages():
        for h in glob.glob(os.path.join(d, "nvidia", "*", "include", "cublasLt.h")):
            lines = [ln.strip() for ln in open(h, errors="replace")
                     if "_SCALE_MODE =" in ln or "MATRIX_SCALE_VEC128_32F =" in ln or "BLK128x128_32F =" in ln]
            return h, lines
    return None, []


def record_gemms(N, K, M, dev):
    """The blockwise_mm calls of one fp8 blockwise linear's forward and backward."""
    calls = []
    orig = fl.blockwise_mm

    def rec(a, sa, b, sb, b_tile, out_dtype, gemm):
        calls.append((a, sa, b, sb, b_tile, out_dtype, gemm))
        return orig(a, sa, b, sb, b_tile, out_dtype, gemm)

    fl.blockwise_mm = rec
    try:
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
        y, st = fl.fp8_forward(x, w, None, "blockwise")
        fl.fp8_backward(st, dy)
    finally:
        fl.blockwise_mm = orig
    return dict(zip(("fprop", "dgrad", "wgrad"), calls))


def probe_one(tuner: CudaLtTuner, call, max_candidates: int):
    a, sa, b, sb, b_tile, out_dtype, gemm = call
    lt, h = tuner.lt, tuner.handle
    ref = fl.blockwise_mm(a, sa, b, sb, b_tile, out_dtype, gemm)
    torch_us = tuner._time(lambda i: fl.blockwise_mm(a, sa, b, sb, b_tile, out_dtype, gemm), 1)
    p = problem_from_matmul(a, b, out_dtype=out_dtype, scale_a=sa, scale_b=sb, block_a="1x128",
                            block_b="128x128" if b_tile else "1x128")
    descs = lt.create_descs(p)
    lt.set_scale_pointers(descs, sb.data_ptr(), sa.data_ptr())
    out = torch.empty_like(ref)
    stream = torch.cuda.current_stream().cuda_stream

    def run(algo):
        lt.matmul(h, descs, algo, b.data_ptr(), a.data_ptr(), out.data_ptr(), out.data_ptr(), tuner.ws.data_ptr(),
                  tuner.ws_bytes, stream)

    pref = lt.create_preference(tuner.ws_bytes, min_alignment=256)
    heuristic = lt.heuristics(h, descs, pref, 32)
    lt.destroy_preference(pref)
    rows = []
    for n, cand in enumerate(tuner._candidates(p, descs, heuristic)):
        if n >= max_candidates:
            break
        try:
            run(cand.algo)
            err = rel_err(out, ref)
            us = tuner._time(lambda i, c=cand.algo: run(c), 1, iters=20, warmup=3) if err < 2e-2 else math.inf
        except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, not fatal
            err, us = float("nan"), math.inf
            cand.source += f" ({type(e).__name__})"
        rows.append((us, err, cand.source, cand.config))
    lt.destroy_descs(descs)
    # re-time torch and the best two after the search (clocks settle)
    torch_us = min(torch_us, tuner._time(lambda i: fl.blockwise_mm(a, sa, b, sb, b_tile, out_dtype, gemm), 1))
    return p, torch_us, len(heuristic), rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--max-candidates", type=int, default=48)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    hdr, lines = header_constants()
    print(f"cublasLt.h: {hdr}")
    for ln in lines:
        print("   ", ln)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    tuner = CudaLtTuner(0, max_candidates=args.max_candidates)
    print(f"cuBLASLt {tuner.lib_version}; blockwise GEMM provider {fl.blockwise_gemm_provider(dev)}")
    total = {"torch": 0.0, "heur0": 0.0, "best": 0.0}
    print("| linear | GEMM | problem | torch us | heuristic[0] us | best us | best / torch | best from | candidates |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for name, (N, K) in LINEARS.items():
        if args.only and name not in args.only.split(","):
            continue
        for gname, call in record_gemms(N, K, args.tokens, dev).items():
            p, torch_us, nheur, rows = probe_one(tuner, call, args.max_candidates)
            ok = [r for r in rows if math.isfinite(r[0])]
            heur0 = rows[0][0] if rows else math.inf
            best = min(ok, key=lambda r: r[0]) if ok else (math.inf, 0, "-", {})
            total["torch"] += torch_us
            total["heur0"] += heur0
            total["best"] += min(best[0], torch_us)
            cfg = best[3]
            desc = ", ".join(f"{k}={cfg[k]}" for k in ("algo_id", "tile_id", "stages_id", "splitk_num",
                                                        "cta_swizzling") if k in cfg)
            bad = sum(1 for r in rows if not math.isfinite(r[0]))
            print(f"| {name} | {gname} | {p.label()} | {torch_us:.1f} | {heur0:.1f} | {best[0]:.1f} | "
                  f"{torch_us / best[0]:.3f}x | {best[2]} ({desc}) | {len(rows)} ({bad} failed/wrong; "
                  f"{nheur} heuristic) |", flush=True)
    print(f"\nsum: torch {total['torch']:.1f} us, heuristic[0] {total['heur0']:.1f} us, "
          f"best-per-GEMM {total['best']:.1f} us = {total['torch'] / max(total['best'], 1e-9):.3f}x torch")


if __name__ == "__main__":
    main()
