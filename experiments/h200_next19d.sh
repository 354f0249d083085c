#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min), after
# experiments/results/h100-2026-12-07f-gpu-tests-delta-in-dq: (1) the 13 GPU tests that failed
# there (each had assumed the CPU; fixed on the CPU, not yet run on a GPU: the two training
# tests check that tests/conftest.py's --xla_gpu_deterministic_ops=true makes runs repeat), the
# two test_top2 tests that run did not reach, delta_in_dq's default resolution and
# tests/test_mosaic_gpu.py (the backward with delta_in_dq on by default, every case); (2)
# `flashstable bench --targets` at the defaults, delta_in_dq now on (the step against cuDNN's
# beside the earlier eight runs at 0.999–1.011×, median 1.001×).
# Usage (repo root, on the device): [TEST_TIMEOUT=seconds] bash experiments/h200_next19d.sh "$OUT"
# device seconds: at most ~590 (timeouts 240 + 30 s grace + 290); 8 test processes
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests ${TEST_TIMEOUT:-240} -n 8 -vv --tb=short --durations=10 tests/test_mosaic_gpu.py \
  tests/test_bench.py::test_kernel_seconds_sums_the_gpu_streams_events_per_call \
  tests/test_bench.py::test_bench_cli_at_toy_size tests/test_bench.py::test_bench_targets_on_cpu \
  tests/test_cli.py::test_compare_writes_report_and_png_and_resumes \
  tests/test_diagnostics.py::test_dq_rows_measure_the_bias_mechanism \
  tests/test_diagnostics.py::test_rounding_ds_alone_puts_the_dq_error_along_the_keys_mean \
  tests/test_flax.py::test_attend_takes_a_spec_and_checks_inputs_for_every_implementation \
  tests/test_flax.py::test_linen_multihead_attention_with_partial_causal \
  tests/test_flax.py::test_nnx_multihead_attention \
  tests/test_numerics_lab.py::test_cli_deviation_and_bias \
  tests/test_rounding.py::test_backward_p_matches_its_emulation_at_large_logits \
  tests/test_train.py::test_interrupt_saves_a_checkpoint_and_resumes_exactly \
  tests/test_train.py::test_loss_decreases_determinism_and_resume \
  tests/test_top2.py::test_mosaic_gpu_forward_is_the_same_function_either_way \
  "tests/test_top2.py::test_lane_top2_merges_a_rows_lanes_to_its_two_largest[64-64]" \
  tests/test_lowering.py::test_delta_in_dq_is_on_by_default_for_a_gpu_where_timed_and_off_in_interpret_mode
grep -E "^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|FAILED|SKIPPED|ERROR)" "$OUT/gpu_tests.log" \
  | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort | uniq -c | sort -rn | head -20
bench_targets "$OUT/targets" "$OUT/targets.log"
echo "bench --targets (delta_in_dq on by default): exit $?"; tail -25 "$OUT/targets.log"
true
