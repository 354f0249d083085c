#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): `flashstable bench` on its default GPU sweep (our kernel
# with and without the compensation, every layout at the headline shape, cuDNN, XLA, torch
# SDPA flash/cuDNN), the compensation overhead from interleaved pairs, and the GPU golden hashes.
# Usage (repo root, on the device): bash experiments/h200_bench.sh "$OUT"
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
L=fa2,paper,fp32_out,stochastic
IMPLS=$(for l in ${L//,/ }; do printf "flash:%s,flash:%s+stabilize," $l $l; done)cudnn,xla,torch-flash,torch-cudnn
timeout ${HEAD_TIMEOUT:-200} python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,0;4,4096,16,16,128,1" \
  --impls "$IMPLS" --overhead-pairs 30 --out "$OUT/headline" 2>&1 | grep -v "^ " | tail -40
timeout ${SWEEP_TIMEOUT:-300} python3 -m jax_flashstable.cli bench --reps 10 --overhead-pairs 0 --no-hashes \
  --out "$OUT/sweep" 2>&1 | grep -v "^ " | tail -3
