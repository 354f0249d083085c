#!/usr/bin/env bash
# Issue 3 on the H200 (device tool): gpt2-small step time / tokens/s / MFU for flash,
# fa2+comp and cudnn attention, then the main job unchanged on the GPU.
# Usage (repo root, on the device): bash experiments/h200_training_check.sh "$OUT"
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
timeout ${STEP_TIMEOUT:-240} python3 experiments/02_gpt2_step_time.py --out "$OUT" 2>&1 | tee "$OUT/step_time.log"
timeout ${COMPARE_TIMEOUT:-200} python3 -m jax_flashstable.cli compare --no-progress --out-dir "$OUT/compare" 2>&1 | tail -20 | tee "$OUT/compare.log"
cp "$OUT/compare/report.md" "$OUT/compare_report.md" 2>/dev/null; cp "$OUT/compare/curves.png" "$OUT/compare_curves.png" 2>/dev/null
rm -rf "$OUT/compare"
