"""Standalone offline GEMM tuner: a shape dump in, a results file out (no training).

    python -m tuning.offline_tune_gemm output/tune/gemm_shape              # -> output/tune/gemm_tune/...
    python -m tuning.offline_tune_gemm dump_hipblaslt_gemm_shape_0.txt -o results.txt --devices 0,1
    python -m tuning.offline_tune_gemm gemm_shapes_rank0.jsonl --list      # show the problems only

Input: a folder or file of `gemm_shapes_rank*.jsonl` (tuning.shapes.record_gemms) and/or hipBLASLt shape logs
(HIPBLASLT_LOG_MASK=32). Output: hipBLASLt's override-file format (on CUDA with the cuBLASLt algorithm columns).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuning.shapes import SHAPE_SUBDIR, load_shapes  # noqa: E402
from tuning.tune import RESULTS_NAME, tune  # noqa: E402


def default_results_path(inp: Path) -> Path:
    root = inp if inp.is_dir() else inp.parent
    if root.name == SHAPE_SUBDIR:
        root = root.parent
    return root / "gemm_tune" / RESULTS_NAME


def _devices(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices takes GPU indices like 0,1,2 (got {text!r})") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="offline_tune_gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", type=Path, help="shape dump folder or file (jsonl or hipBLASLt log)")
    ap.add_argument("-o", "--output", type=Path, help=f"results file (default: <root>/gemm_tune/{RESULTS_NAME})")
    ap.add_argument("--backend", choices=("auto", "cuda", "rocm"), default="auto")
    ap.add_argument("--devices", type=_devices, help="GPU indices, one worker each (default: all visible)")
    ap.add_argument("--max-candidates", type=int, help="CUDA: algorithms timed per problem (default 64)")
    ap.add_argument("--iters", type=int, help="CUDA: timed calls per candidate, at most (default 20)")
    ap.add_argument("--warmup", type=int, help="CUDA: warm-up calls per candidate, at most (default 5)")
    ap.add_argument("--rotating-mb", type=int, help="CUDA: rotating buffer size in MB (default 512)")
    ap.add_argument("--min-gain", type=float, help="CUDA: keep an algorithm only if this much faster (0.01)")
    ap.add_argument("--bench", help="ROCm: path to hipblaslt-bench")
    ap.add_argument("--retry-failed", action="store_true", help="re-tune problems that failed in an earlier run")
    ap.add_argument("--list", action="store_true", help="print the problems and exit")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.input.exists():
        ap.error(f"input {args.input} does not exist")
    for name in ("max_candidates", "iters", "rotating_mb"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        if args.list:
            problems = load_shapes(args.input)
            for p in problems:
                print(f"{p.count:10g}  {p.label()}  [{p.source}]")
            print(f"{len(problems)} distinct GEMM problems")
            return 0
        out = args.output or default_results_path(args.input)
        rep = tune(args.input, out, backend=args.backend, devices=args.devices, max_candidates=args.max_candidates,
                   warmup=args.warmup, iters=args.iters, rotating_mb=args.rotating_mb, min_gain=args.min_gain,
                   bench=args.bench, retry_failed=args.retry_failed, progress=not args.no_progress)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"offline_tune_gemm: error: {e}", file=sys.stderr)
        return 1
    print(f"results: {out}")
    return 0 if rep.counts().get("failed", 0) < len(rep.lines) else 1


if __name__ == "__main__":
    sys.exit(main())
