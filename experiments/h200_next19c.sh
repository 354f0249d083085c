#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min), for a session with one
# call's device time: the timing of `MosaicGPUOptions.delta_in_dq` (h200_delta_in_dq.sh's
# experiment 18: the backward alone, it on paired against it off, gpt2-small's 16 × 1024 × 12 ×
# d64 causal, 30 pairs, and b4 × 4096 × 16 × d128 causal, 15 pairs), then the GPU tests of
# h200_next19b.sh with delta_in_dq's own (tests/test_mosaic_gpu.py's delta_in_dq cases) in one
# pytest run of 6 processes, each test named as it ends (a timeout still leaves the passed ones).
# Usage (repo root, on the device): [TEST_TIMEOUT=seconds] bash experiments/h200_next19c.sh "$OUT"
# device seconds: at most ~520 (timeouts 80 + 60 + 370)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
BW="python3 experiments/18_mgpu_backward_stages_ab.py --causal --out $OUT/ab18.txt"
timeout 80 $BW --pairs 30 --shape 16,1024,12,12,64 2,2,delta_in_dq=0 2,2,delta_in_dq=1 > "$OUT/ab18.log" 2>&1
echo "18, d64 causal: exit $?"
timeout 60 $BW --pairs 15 --shape 4,4096,16,16,128 2,2,delta_in_dq=0 2,2,delta_in_dq=1 >> "$OUT/ab18.log" 2>&1
echo "18, d128 causal: exit $?"; cat "$OUT/ab18.txt"
gpu_tests ${TEST_TIMEOUT:-370} -n 6 -vv --durations=30 \
  tests/test_mosaic_gpu.py::test_mosaic_gpu_backward_delta_in_dq tests/test_bench.py \
  tests/test_cli.py tests/test_crosscheck.py tests/test_data.py tests/test_diagnostics.py \
  tests/test_experiment.py tests/test_flax.py tests/test_interrupts.py tests/test_lowering.py \
  tests/test_model.py tests/test_numerics_lab.py tests/test_parallel.py tests/test_reference.py \
  tests/test_rounding.py tests/test_top2.py tests/test_torch_compile.py tests/test_torch_twin.py \
  tests/test_train.py tests/test_twin_queue.py
grep -cE " PASSED" "$OUT/gpu_tests.log" | sed 's/^/tests passed so far: /'
true
