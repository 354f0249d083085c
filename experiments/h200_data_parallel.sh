#!/usr/bin/env bash
# Issue 8 on two H200s (device tool, kind nvidia-h200-x2): gpt2-small tokens/s data-parallel on
# 1 and 2 GPUs with the collectives of each compiled step (04_data_parallel_scaling.py), then the
# instability experiment's anchor recipe run data-parallel (--data-parallel: both GPUs, batch 32
# split 16 + 16) for VARIANTS (default paper,paper+comp) and SEEDS (default 0), capped at STEPS
# (default 4000), to compare with the single-GPU outcome; everything within BUDGET seconds
# (default 540); SCALING=0 skips the scaling part. Carry .data (the corpus).
# Usage (repo root, on the device):
#   bash experiments/h200_data_parallel.sh "$OUT" [extra experiment options]
set -u
OUT=${1:-runs/h200}; shift || true; STEPS=${STEPS:-4000}; BUDGET=${BUDGET:-540}
VARIANTS=${VARIANTS:-paper,paper+comp}; SEEDS=${SEEDS:-0}; SCALING=${SCALING:-1}
R=/tmp/instability-dp
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
T0=$(date +%s)                                    # BUDGET counts from here, scaling included
nvidia-smi -L
python3 -c "import jax; print(jax.devices())"
(( SCALING )) && timeout $(( BUDGET / 2 )) python3 experiments/04_data_parallel_scaling.py --out "$OUT" 2>&1 \
  | grep -v "^WARNING" | tail -25
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
python3 -m jax_flashstable.cli experiment instability --recipe anchor --data .data \
  --attention "$VARIANTS" --seeds "$SEEDS" --data-parallel --steps "$STEPS" --time-budget "$LEFT" \
  --no-progress --out $R "$@" 2>&1 | tail -14
cp $R/report.md "$OUT/dp_report.md"; cp $R/curves.png "$OUT/dp_curves.png" 2>/dev/null
tar czf "$OUT/dp_runs.tgz" --exclude=checkpoints -C $R .
