#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): `MosaicGPUOptions.delta_in_dq`
# (the backward's delta from the dQ kernel, which runs first; on by default on a GPU up to
# head_dim 128 since it was timed, experiments/results/h100-2026-12-07f-gpu-tests-delta-in-dq):
# 1. its GPU tests (gradients within an ulp of XLA's delta's; the persistent dQ kernel);
# 2. experiment 18, the backward alone, it on paired against it off: gpt2-small's 16 × 1024 ×
#    12 × d64 causal (30 pairs) and b4 × 4096 × 16 × d128 causal (15 pairs);
# 3. where its tests passed: `flashstable bench --targets` at the defaults (it on), whose step
#    row is the gpt2-small step against cuDNN's in interleaved rounds (to set beside the runs
#    with it off: 0.999–1.011×, median 1.001×); where they failed, the step with it off
#    (`set_line` in the device's copy of the tree: nothing committed).
# Usage (repo root, on the device): bash experiments/h200_delta_in_dq.sh "$OUT"
# device seconds: at most ~620 (timeouts 110 + 80 + 70 + 290, and gpu_tests' 30 s grace)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests 110 -n 3 tests/test_mosaic_gpu.py -k delta_in_dq
BW="python3 experiments/18_mgpu_backward_stages_ab.py --causal --out $OUT/ab18.txt"
timeout 80 $BW --pairs 30 --shape 16,1024,12,12,64 2,2,delta_in_dq=0 2,2,delta_in_dq=1 > "$OUT/ab18.log" 2>&1
echo "18, d64 causal: exit $?"
timeout 70 $BW --pairs 15 --shape 4,4096,16,16,128 2,2,delta_in_dq=0 2,2,delta_in_dq=1 >> "$OUT/ab18.log" 2>&1
echo "18, d128 causal: exit $?"; cat "$OUT/ab18.txt"
if grep -q " passed" "$OUT/gpu_tests.log" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/gpu_tests.log"; then
  bench_targets "$OUT/targets" "$OUT/targets.log"  # delta_in_dq on: the default on a GPU since 2026-12-07
  echo "bench --targets (delta_in_dq on): exit $?"; tail -25 "$OUT/targets.log"
else
  echo "delta_in_dq's GPU tests did not all pass: the step with it off instead"
  set_line pallas_kernels/forward_mgpu.py '  delta_in_dq: bool | None = None' \
    '  delta_in_dq: bool | None = False'
  step_vs_cudnn "$OUT/step_off" 20 110 "delta from XLA"
fi
true
