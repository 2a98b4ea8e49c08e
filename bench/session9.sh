#!/usr/bin/env bash
# Session 9's H200 calls (<= 600 s each), each after `. bench/device_setup.sh` (carry .whl):
#   bash bench/session9.sh 1   # GPU tests of the delayed recompute replay and the TorchTitan turbo fp8 recipes,
#                              # the tensorwise cast's L2 probe (tile order), TorchTitan fp8 end to end: torchao
#                              # tensorwise vs the turbo linear's tensorwise / blockwise / delayed
#   bash bench/session9.sh 2 BASE   # the L2 probe in GPU time, every tile; the TorchTitan custom-op test; the delayed
#                              # preset under recompute=full with this tree's fp8_linear.py vs BASE's (histories
#                              # updated twice by the replayed forwards)
#   bash bench/session9.sh 3 BASE   # the casts in reversed tile order (tensorwise, rowwise transposed): GPU tests,
#                              # casts + fp8 linear per recipe with this tree's fp8_linear.py, then BASE's casts
#   bash bench/session9.sh 4 BASE   # every test of test_turbo_fp8.py on the GPU; casts + fp8 linear per recipe, this
#                              # tree's fp8_linear.py (delayed cast back in column-strip order) vs BASE's, same call
#   bash bench/session9.sh 5 BASE   # the casts again, the delayed cast back on its 2-D grid, vs BASE's, same call
#   bash bench/session9.sh 6 BASE   # the Triton blockwise GEMM (grouped grid, tuned tiles) vs BASE's fixed-tile
#                              # kernel and cuBLASLt, then its every-config test on the GPU
# $OUT: logs
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
F=primus/turbo/fp8_linear.py

kernels() {  # $1: log tag, $2: --only list, $3: seconds; turbo_kernels.py in GPU time with the fp8_linear.py in place
  timeout "$3" python bench/turbo_kernels.py --no-tests --gpu-time --budget $(($3 - 10)) --only "$2" \
    > "$OUT/kernels_$1.log" 2>&1
  echo "== $1"; grep -E "^\| (fp8|linear)" "$OUT/kernels_$1.log" | grep -v "gemm=triton" | cut -c1-150
}
use() {  # $1: after | BASE dir: put that fp8_linear.py in place (this tree's is kept in /tmp first)
  [ -f /tmp/fp8_linear_after.py ] || cp $F /tmp/fp8_linear_after.py
  if [ "$1" = after ]; then cp /tmp/fp8_linear_after.py $F; else cp "$1/fp8_linear.py" $F; fi
}
case "${1:-}" in
  1) timeout 170 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       tests/test_torchtitan_turbo.py -k "delayed or recompute or custom_ops_match or portable_recipe" \
       > "$OUT/pytest_gpu1.log" 2>&1
     tail -4 "$OUT/pytest_gpu1.log"
     timeout 90 python bench/tensorwise_l2_probe.py > "$OUT/l2_probe.log" 2>&1
     grep -E "^\||copy bandwidth|Error|error" "$OUT/l2_probe.log" | head -20
     timeout $((590 - SECONDS)) python bench/torchtitan_turbo_smoke.py --steps 12 --timeout 95 --ref "tt fp8 compile" \
       --points "tt fp8 compile,tt fp8 compile turbo,tt fp8 blockwise compile turbo,tt fp8 delayed compile turbo" \
       > "$OUT/tt_smoke.log" 2>&1
     grep -E "^\| |rel_|\"ok\"|turbo fp8 vs|->" "$OUT/tt_smoke.log" ;;
  2) BASE=${2:?usage: session9.sh 2 BASELINE_DIR}
     timeout 100 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_torchtitan_turbo.py \
       -k "custom_ops_match" > "$OUT/pytest_gpu2.log" 2>&1
     tail -2 "$OUT/pytest_gpu2.log"
     timeout 150 python bench/tensorwise_l2_probe.py --configs > "$OUT/l2_probe.log" 2>&1
     grep -vE "^\s*$" "$OUT/l2_probe.log" | grep -v Warning | head -120
     B="experiment=llama3_2_1b_megatron_fp8_delayed recompute=full training.train_iters=14"
     timeout 170 python bench/e2e.py --suite none --tag rc_after --timeout 150 --log-dir /tmp/bench_logs \
       --ref "delayed full recompute after" --extra "delayed full recompute after=$B" > "$OUT/rc_after.log" 2>&1
     grep -E "^\| " "$OUT/rc_after.log"
     use "$BASE"
     timeout $((590 - SECONDS)) python bench/e2e.py --suite none --tag rc_before --timeout 150 \
       --log-dir /tmp/bench_logs --ref "delayed full recompute before" \
       --extra "delayed full recompute before=$B" > "$OUT/rc_before.log" 2>&1
     grep -E "^\| " "$OUT/rc_before.log"
     use after ;;
  3) BASE=${2:?usage: session9.sh 3 BASELINE_DIR}
     timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       > "$OUT/pytest_gpu3.log" 2>&1
     tail -3 "$OUT/pytest_gpu3.log"
     timeout 150 python bench/tensorwise_l2_probe.py --shapes 8192x4096,4096x4096,14336x4096 > "$OUT/l2_probe3.log" 2>&1
     grep -E "^\|" "$OUT/l2_probe3.log"
     kernels 3_after fp8_casts,fp8_linear $((500 - SECONDS))
     use "$BASE"; kernels 3_before fp8_casts $((590 - SECONDS)); use after ;;
  4) BASE=${2:?usage: session9.sh 4 BASELINE_DIR}
     timeout 250 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
       > "$OUT/pytest_gpu4.log" 2>&1
     tail -3 "$OUT/pytest_gpu4.log"
     kernels 4_after fp8_casts,fp8_linear $(((590 - SECONDS) / 2))
     use "$BASE"; kernels 4_before fp8_casts,fp8_linear $((590 - SECONDS)); use after ;;
  5) BASE=${2:?usage: session9.sh 5 BASELINE_DIR}
     for tag in after before after2 before2; do
       case $tag in before*) use "$BASE" ;; *) use after ;; esac
       kernels "5_$tag" fp8_casts 100
     done
     use after ;;
  6) BASE=${2:?usage: session9.sh 6 BASELINE_DIR}
     timeout 200 python bench/blockwise_gemm_probe.py --baseline "$BASE/fp8_linear.py" --linears gate+up,down \
       > "$OUT/gemm_probe.log" 2>&1
     grep -E "^\||total|Error" "$OUT/gemm_probe.log"
     timeout $((270 - SECONDS)) python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf \
       tests/test_turbo_fp8.py -k "tuned_blockwise_gemm or blockwise_gemms_match" > "$OUT/pytest_gpu6.log" 2>&1
     tail -3 "$OUT/pytest_gpu6.log" ;;
  *) echo "usage: bash bench/session9.sh 1..6 [BASELINE_DIR]" >&2; exit 2 ;;
esac
