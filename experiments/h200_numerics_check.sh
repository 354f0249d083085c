#!/usr/bin/env bash
# Issue 4 on the H200 (device tool): layout tests without interpret mode, the deviation sweep
# (one process per dtype, each with its own time limit) and the bias benchmark.
# Usage (repo root, on the device): bash experiments/h200_numerics_check.sh "$OUT"
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -rfE tests/test_rounding.py tests/test_layouts.py tests/test_numerics_lab.py tests/test_api.py tests/test_compensation.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | head -30 | tee "$OUT/gpu_layout_tests.log"
L=128,512,2048,8192,16384
timeout 170 python3 -m jax_flashstable.cli deviation --seq-lens $L --head-dims 64,128 --dtypes bfloat16 --block-ks 64,128 --layouts fa2,paper --out "$OUT/bf16" 2>&1 | tail -2
timeout 80 python3 -m jax_flashstable.cli deviation --seq-lens $L --head-dims 64,128 --dtypes float16 --out "$OUT/fp16" 2>&1 | tail -1
# fp32 in two processes (one did not finish 128…16384 in 80 s)
timeout 100 python3 -m jax_flashstable.cli deviation --seq-lens 128,512,2048 --head-dims 64,128 --dtypes float32 --out "$OUT/fp32_a" 2>&1 | tail -1
timeout 150 python3 -m jax_flashstable.cli deviation --seq-lens 8192,16384 --head-dims 64,128 --dtypes float32 --out "$OUT/fp32_b" 2>&1 | tail -1
timeout 60 python3 -m jax_flashstable.cli bias --rows 4096 --out "$OUT" 2>&1 | tail -18
