#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): the targets at the
# defaults after experiment 11 timed `MosaicGPUOptions.wide_step` (h200_wide_step.sh):
# 1. `flashstable bench --targets` (20 interleaved pairs at b4 × 4096 × 16 × d128, the
#    compensation's overheads, the gpt2-small step against cuDNN's);
# 2. the gpt2-small step once more, ours against cuDNN's, 30 interleaved rounds (experiment
#    02): the target is within a run's spread (1.001× on 2026-12-07), so two runs.
# Usage (repo root, on the device):  bash experiments/h200_wide_targets.sh "$OUT"
# (STEP_ROUNDS=0: the bench alone)
# device seconds: at most 530 (its timeouts added up)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
targets_verdicts "$OUT/targets" "$OUT/targets.log"
step_vs_cudnn "$OUT/step" "${STEP_ROUNDS:-30}" 240
true
