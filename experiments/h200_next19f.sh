#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min), the call after
# h200_next19e.sh on the same machine: (1) `flashstable bench --targets` at today's defaults
# (the issue's targets are the H200's: on an H200 this is their first run since the wide step
# and delta_in_dq); (2) what `--deterministic` (XLA's deterministic GPU ops,
# `TrainConfig.deterministic`) costs the gpt2-small step: experiment 02 with the flag, 20
# interleaved rounds, its fa2+comp and cudnn steps against next19e's without it.
# Usage (repo root, on the device): bash experiments/h200_next19f.sh "$OUT"
# device seconds: at most ~450 (timeouts 290 + 150)
set -u
OUT=${1:-runs/h200}
STEP_ROUNDS=0 bash "$(dirname "$0")/h200_wide_targets.sh" "$OUT"  # nvidia-smi, the bench's verdicts
source "$(dirname "$0")/h200_env.sh"
XLA_FLAGS=--xla_gpu_deterministic_ops=true step_vs_cudnn "$OUT/step-deterministic" 20 150 \
  "--xla_gpu_deterministic_ops=true"
true
