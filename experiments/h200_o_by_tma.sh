#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): `MosaicGPUOptions.o_by_tma`
# (the dQ kernel's rows of O by TMA with Q and dO, instead of from global memory at each work
# item's start, where Nsight Compute put 9% of the dQ kernel's compute warps' stall samples at
# gpt2-small's attention, H100, 2026-12-07: experiments/results/h100-2026-12-07j-stalls).
# 1. its GPU tests (the delta_in_dq gradients both ways, the lowerings, the backward against
#    Triton's);
# 2. the backward alone, paired (experiment 18, the same bits): o_by_tma on (the default)
#    against off, and against delta_in_dq off, at gpt2-small's 16 × 1024 × 12 × d64 causal
#    (30 pairs) and at 4 × 4096 × 16 × d128 causal (15 pairs);
# 3. the gpt2-small step against cuDNN's (experiment 02, 30 interleaved rounds).
# Usage (repo root, on the device): bash experiments/h200_o_by_tma.sh "$OUT"
# TESTS=0, AB=0 or STEP=0 leave a part out; device seconds: at most 560 (the timeouts).
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
[[ ${TESTS:-1} == 0 ]] || gpu_tests 170 -n 4 tests/test_mosaic_gpu.py tests/test_lowering.py \
  -k "delta_in_dq or o_by_tma or backward_matches_triton"
if [[ ${AB:-1} != 0 ]]; then
  AB18="python3 experiments/18_mgpu_backward_stages_ab.py --causal"
  timeout 110 $AB18 --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab.txt" \
    2,2 2,2,o_by_tma=0 2,2,delta_in_dq=0 > /dev/null 2>&1
  echo "A/B d64: exit $?"
  timeout 90 $AB18 --shape 4,4096,16,16,128 --pairs 15 --out "$OUT/ab.txt" \
    2,2 2,2,o_by_tma=0 > /dev/null 2>&1
  echo "A/B d128: exit $?"; cat "$OUT/ab.txt"
fi
[[ ${STEP:-1} == 0 ]] || step_vs_cudnn "$OUT/step" 30 190
true
