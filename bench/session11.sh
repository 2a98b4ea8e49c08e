#!/usr/bin/env bash
# Session 11's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl).
#   bash bench/session11.sh 1   # the casts without their clamp (bench/cast_sat_probe.py), then the delayed cast's
#                               # recording variants (bench/delayed_record_probe.py)
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
case "${1:-}" in
  1) timeout 300 python bench/cast_sat_probe.py > "$OUT/sat_probe.log" 2>&1
     grep -E "^\||copy|PTX|Error|error" "$OUT/sat_probe.log" | tail -40
     timeout $((590 - SECONDS)) python bench/delayed_record_probe.py > "$OUT/record_probe.log" 2>&1
     grep -E "^\||copy|Error|error" "$OUT/record_probe.log" | tail -40 ;;
  *) echo "usage: bash bench/session11.sh 1" >&2; exit 2 ;;
esac
