#!/usr/bin/env bash
# Session 10's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
# Calls 1-3 (cases 1-2 and `python bench/side_casts_probe.py`) ran on commit 477901c, the side-stream experiment,
# reverted after them (docs/benchmarks.md, session 10); run them from that commit.
#   bash bench/session10.sh 1   # the fp8 linear's wgrad casts on a side stream vs in line (bench/side_casts_probe.py),
#                               # then test_turbo_fp8.py on the GPU (side-stream bytes == in-line bytes)
#   bash bench/session10.sh 2   # the same probe with the side casts' outputs from the caller's pool, each variant
#                               # timed twice; the side-stream tests
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 240 python bench/side_casts_probe.py > "$OUT/side_probe.log" 2>&1
     grep -E "^\||Error|error" "$OUT/side_probe.log" | tail -40
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py > "$OUT/pytest_gpu1.log" 2>&1
     tail -5 "$OUT/pytest_gpu1.log" ;;
  2) timeout 400 python bench/side_casts_probe.py > "$OUT/side_probe2.log" 2>&1
     grep -E "^\||Error|error" "$OUT/side_probe2.log" | tail -60
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k side > "$OUT/pytest_gpu2.log" 2>&1
     tail -3 "$OUT/pytest_gpu2.log" ;;
  *) echo "usage: bash bench/session10.sh 1" >&2; exit 2 ;;
esac
