#!/usr/bin/env bash
# Session 3, last call: the tensorwise cast fix on the H200 (fp8 GPU tests, the cast probe, TorchTitan + turbo fp8
# linear compiled, 6 steps) and the megatron bf16 preset as shipped (micro batch 16) for 8 steps.
set -u
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
timeout 70 python -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_turbo_fp8.py \
  > "$OUT/pytest_fp8.log" 2>&1; tail -2 "$OUT/pytest_fp8.log"
timeout 40 python bench/fp8_cast_probe.py 2>&1 | tee "$OUT/cast_probe.log"
timeout 80 python train.py experiment=llama3_2_1b_torchtitan_fp8 turbo=torchtitan_fp8 training.train_iters=6 \
  training.lr_warmup_iters=0 logging.tensorboard=false hydra.run.dir=outputs/bench/tt_fp8_turbo > "$OUT/tt_fp8.log" 2>&1
echo "torchtitan turbo fp8 compiled: rc=$?"; grep -E "^step +[1-6]/" "$OUT/tt_fp8.log" | cut -c1-100
timeout 90 python train.py experiment=llama3_2_1b_megatron_bf16 training.train_iters=8 training.lr_warmup_iters=2 \
  hydra.run.dir=outputs/bench/meg_bf16_preset > "$OUT/meg_bf16_preset.log" 2>&1
echo "megatron bf16 preset: rc=$?"; grep -E "^step +[5-8]/|FITS|verdict" "$OUT/meg_bf16_preset.log" | cut -c1-150
