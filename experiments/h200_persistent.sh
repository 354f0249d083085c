#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): the persistent Mosaic GPU
# forward (`MosaicGPUOptions.persistent`, built 2026-12-06 on a CPU) on the GPU:
# 1. the Mosaic GPU tests it touches (the schedules' same bits, persistent cases included: the
#    fused paths interpret mode does not run; the refusals; the backward against the Triton
#    backward and the jitted forward+backward, after `finish_stores`);
# 2. experiments/11_mgpu_forward_ab.py: the default forward against the persistent one, each
#    against cuDNN in interleaved pairs, at gpt2-small's attention (16 × 1024 × 12 × d64,
#    causal and full, with and without the compensation) and at the headline shape
#    (4 × 4096 × 16 × d128, full and causal).
# Usage (repo root, on the device):  bash experiments/h200_persistent.sh "$OUT"
# device seconds: 520 (its timeouts added up)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
timeout 200 python3 -m pytest -v -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
  -k "schedules or jitted or backward_matches_triton or refusals_name" > "$OUT/tests.log" 2>&1
echo "tests: exit $?"; grep -E "FAILED|ERROR" "$OUT/tests.log" | cut -c1-150; tail -2 "$OUT/tests.log"
AB=experiments/11_mgpu_forward_ab.py
timeout 100 python3 $AB --causal --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab_d64_causal.txt" \
  bk=64 bk=64,persistent=1 bk=64,comp=0 bk=64,comp=0,persistent=1 >> "$OUT/ab.log" 2>&1
echo "d64 causal: exit $?"; tail -3 "$OUT/ab.log"; cat "$OUT/ab_d64_causal.txt"
timeout 70 python3 $AB --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab_d64_full.txt" \
  bk=64 bk=64,persistent=1 >> "$OUT/ab.log" 2>&1
echo "d64 full: exit $?"; cat "$OUT/ab_d64_full.txt"
timeout 75 python3 $AB --pairs 20 --out "$OUT/ab_d128_full.txt" bk=64 bk=64,persistent=1 >> "$OUT/ab.log" 2>&1
echo "d128 full: exit $?"; cat "$OUT/ab_d128_full.txt"
timeout 75 python3 $AB --causal --pairs 20 --out "$OUT/ab_d128_causal.txt" bk=64 bk=64,persistent=1 >> "$OUT/ab.log" 2>&1
echo "d128 causal: exit $?"; cat "$OUT/ab_d128_causal.txt"
