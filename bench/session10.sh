#!/usr/bin/env bash
# Session 10's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
# Calls 1-3 (cases 1-2 and `python bench/side_casts_probe.py`) ran on commit 477901c, the side-stream experiment,
# reverted after them (docs/benchmarks.md, session 10); run them from that commit.
#   bash bench/session10.sh 1   # the fp8 linear's wgrad casts on a side stream vs in line (bench/side_casts_probe.py),
#                               # then test_turbo_fp8.py on the GPU (side-stream bytes == in-line bytes)
#   bash bench/session10.sh 2   # the same probe with the side casts' outputs from the caller's pool, each variant
#                               # timed twice; the side-stream tests
#   bash bench/session10.sh 3 BASE   # the delayed cast vs BASE's fp8_linear.py (bench/delayed_cast_probe.py), then
#                               # the delayed / tensorwise GPU tests. Call 4 ran it on an uncommitted intermediate
#                               # (the scale computed in the amax pass's last program); call 5 was the probe alone
#   bash bench/session10.sh 4 BASE   # the same with each cast's kernels (--parts 1024): calls 6 and 8 (this tree),
#                               # call 7 (the since-reverted count before the stores)
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
  3|4) BASE=${2:?usage: session10.sh 3|4 BASELINE_DIR}
     PARTS=(); [ "$1" = 4 ] && PARTS=(--parts 1024)
     timeout 200 python bench/delayed_cast_probe.py --baseline "$BASE/fp8_linear.py" "${PARTS[@]}" \
       > "$OUT/delayed_probe$1.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/delayed_probe$1.log" | tail -30
     timeout $((590 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py tests/test_torchtitan_turbo.py -k "delayed or recompute or tensorwise or custom_ops" \
       > "$OUT/pytest_gpu$1.log" 2>&1
     tail -3 "$OUT/pytest_gpu$1.log" ;;
  *) echo "usage: bash bench/session10.sh 1|2|3|4 [BASELINE_DIR]" >&2; exit 2 ;;
esac
