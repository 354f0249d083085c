#!/usr/bin/env bash
# Issue 19 on the device (one H100 or H200): gpt2-small's training step (batch 16 × 1024) kernel
# by kernel with our attention and with cuDNN's (experiments/21_step_kernels.py: JAX's profiler,
# 5 steps each after 3 warm-up steps). Files: summary.md, kernels.json.
# Usage (repo root, on the device):  bash experiments/h200_step_kernels.sh "$OUT"
# device seconds: 300 at most
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
timeout 300 python3 experiments/21_step_kernels.py --attention "${OURS:-fa2+comp}" --attention cudnn \
  --out "$OUT" > "$OUT/step_kernels.log" 2>&1
echo "exit $?"
grep -v "^ *$" "$OUT/step_kernels.log" | grep -v Warning | tail -45
