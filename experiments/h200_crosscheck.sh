#!/usr/bin/env bash
# Issue 5 on the H200 (device tool; its python3 has torch + CUDA and JAX side by side):
# the PyTorch paper kernel and torch SDPA (math, flash, efficient, cuDNN) on CUDA dump the same
# seeded inputs; `flashstable crosscheck` recomputes them with our kernels on the same GPU.
# Usage (repo root, on the device): bash experiments/h200_crosscheck.sh "$OUT"
set -u
OUT=${1:-runs/h200}
D=/tmp/dumps
mkdir -p "$OUT" $D
source "$(dirname "$0")/h200_env.sh"
SHAPE="--batch 2 --heads 4 --len 1024 --head-dim 64 --causal --device cuda"
# the paper's own kernel (--single-lse: P = exp(S − lse)); crosscheck reads that from the dump
# and runs our paper+lse against it (drop it for the m/log l port against our paper)
python3 torch_crosscheck/paper_fa2.py $D/paper_512.npz $SHAPE --block-q 512 --block-k 512 --stabilize --single-lse
python3 torch_crosscheck/paper_fa2.py $D/paper_64.npz $SHAPE --block-q 64 --block-k 64 --single-lse
python3 torch_crosscheck/sdpa_dump.py $D $SHAPE
for f in paper_512 paper_64; do
  python3 -m jax_flashstable.cli crosscheck $D/$f.npz --numerics paper --out "$OUT/$f" | grep "^|"
done
for b in math flash efficient cudnn; do
  [ -f $D/sdpa_$b.npz ] || continue
  echo "torch sdpa $b vs our fa2"
  python3 -m jax_flashstable.cli crosscheck $D/sdpa_$b.npz --numerics fa2 --out "$OUT/sdpa_$b" | grep "^|"
done
