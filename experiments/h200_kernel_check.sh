#!/usr/bin/env bash
# Issue 2 on the H200 (device tool): the kernel tests without interpret mode, then the speed
# table. Usage (repo root, on the device): bash experiments/h200_kernel_check.sh "$OUT"
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import jax, flax, optax, chex; print(jax.__version__, flax.__version__, optax.__version__, chex.__version__, jax.devices())" | tee -a "$OUT/device.txt"
timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -rfE --durations=10 tests/ 2>&1 | tee "$OUT/gpu_tests.log"
timeout ${BENCH_TIMEOUT:-400} bash experiments/h200_bench.sh "$OUT" 2>&1 | tee "$OUT/bench.log"
