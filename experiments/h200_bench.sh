#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): `flashstable bench` at the headline shape with every layout
# ± compensation, cuDNN, XLA and torch SDPA flash/cuDNN, the compensation overhead from 30
# interleaved pairs, the golden-hash test on the GPU, then the default sweep (1k–16k, d64/128,
# causal and not, GQA; partial results kept if the time limit cuts it). One tarball back.
# Usage (repo root, on the device): bash experiments/h200_bench.sh "$OUT"
set -u
OUT=${1:-runs/h200}
R=/tmp/bench
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
L=fa2,paper,fp32_out,stochastic
IMPLS=$(for l in ${L//,/ }; do printf "%s,%s+comp," $l $l; done)cudnn,xla,torch-flash,torch-cudnn
timeout ${HEAD_TIMEOUT:-240} python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,0;4,4096,16,16,128,1" \
  --attention "$IMPLS" --overhead-pairs 30 --no-hashes --out $R/headline 2>&1 | grep -v "^ " | tail -32
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_bench.py -k golden 2>&1 | tail -2
timeout ${SWEEP_TIMEOUT:-200} python3 -m jax_flashstable.cli bench --reps 10 --overhead-pairs 0 --no-hashes \
  --out $R/sweep 2>&1 | grep -v "^ " | tail -3
tar czf "$OUT/bench.tgz" -C $R .
