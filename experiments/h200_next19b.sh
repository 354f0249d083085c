#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): the test files that have
# not run on a GPU since the exact forward (ab9bee7: P̄ = 2^((S − m)·log₂e), S rounded on its
# own) and the accuracy rule's CPU references (72d3c34). This session's GPU calls ran
# test_mosaic_gpu, test_golden, test_backend_choice, test_mechanism, test_compensation,
# test_layouts and test_api (h100-2026-12-07e-exact-max); this runs the rest in 6 processes
# (compiles are most of the time; the GPU has room for six), each test named as it ends (a
# timeout still leaves the passed ones), the slowest 30 timed.
# Usage (repo root, on the device): [TEST_TIMEOUT=seconds] bash experiments/h200_next19b.sh "$OUT"
# device seconds: at most ~520
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests ${TEST_TIMEOUT:-480} -n 6 -v --durations=30 tests/test_bench.py tests/test_cli.py \
  tests/test_crosscheck.py tests/test_data.py tests/test_diagnostics.py tests/test_experiment.py \
  tests/test_flax.py tests/test_interrupts.py tests/test_lowering.py tests/test_model.py \
  tests/test_numerics_lab.py tests/test_parallel.py tests/test_reference.py tests/test_rounding.py \
  tests/test_top2.py tests/test_torch_compile.py tests/test_torch_twin.py tests/test_train.py \
  tests/test_twin_queue.py
true
