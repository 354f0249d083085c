#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min), after
# experiments/results/h100-2026-12-07g-gpu-suite-targets: (1) the 6 tests that failed there
# (each had assumed a CPU; fixed by kind on the CPU: test_rounding's Mosaic GPU pass with
# delta_in_dq is reached for the first time), (2) gpt2-small's training step kernel by kernel
# (experiment 21, JAX's profiler) with delta_in_dq on, against cuDNN's: where the step, level
# with cuDNN's (1.000–1.009× in three runs), still loses; (3) the step again, 30 rounds.
# Usage (repo root, on the device): bash experiments/h200_next19e.sh "$OUT"
# device seconds: at most ~560 (timeouts 170 + 30 s grace + 200 + 160)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests 170 -n 6 -vv --tb=short tests/test_bench.py::test_bench_cli_at_toy_size \
  tests/test_cli.py::test_compare_writes_report_and_png_and_resumes \
  tests/test_flax.py::test_reference_backward_recomputes_the_scores_same_values_less_memory \
  tests/test_rounding.py::test_backward_p_matches_its_emulation_at_large_logits
grep -E "(PASSED|FAILED) tests" "$OUT/gpu_tests.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //'
timeout 200 python3 experiments/21_step_kernels.py --attention fa2+comp --attention cudnn \
  --steps 3 --warmup 2 --out "$OUT/kernels" > "$OUT/kernels.log" 2>&1
echo "step kernels: exit $?"; tail -30 "$OUT/kernels/summary.md" 2>/dev/null
step_vs_cudnn "$OUT/step" 30 160 "delta_in_dq on"
true
