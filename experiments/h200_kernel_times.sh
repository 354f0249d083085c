#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): kernel times from the
# profiler (`bench.timing.kernel_seconds`, 4e15b09) beside the wall-clock pairs, after the
# H100 run of 2026-12-07 (h100-2026-12-07-bwd-stages) found the gpt2-small step's remaining gap
# in the forward kernel (112.5 against cuDNN's 81.0 µs a layer) where experiment 11's pairs
# had said 0.963× cuDNN at that shape; and the forward's `MosaicGPUOptions.wide_step` (128
# keys a loop step, two 64-key tiles of the numerics; ptxas on the CPU: 678 SASS instructions
# a step against 2 × 369 at gpt2-small's d64 causal, 816 against 2 × 439 at d128):
# and `unit_alpha` (α·acc skipped by a warp whose rows all kept their max: exact, GPU only);
# 0. the wide step's GPU tests (the same bits as the 64-key step, out, m and log l) and the
#    schedules' (unit_alpha's bits among them);
# 1. experiment 11 at gpt2-small's attention (16 × 1024 × 12 × d64 causal) and at the headline
#    d128 shape: ours (the default, wide_step, unit_alpha, both, the default without the
#    compensation; experiment 11 checks each against the default's bits) and
#    JAX's own kernel at block_kv 64 and 128, each against cuDNN, paired and by kernel time
#    (at d128 wide_step runs a CTA an item: two Q tiles and O's buffer beside 2 slots of 128
#    keys do not fit);
# The gpt2-small step (experiment 02) waits for the next call, with wide_step's verdict.
# Usage (repo root, on the device):  bash experiments/h200_kernel_times.sh "$OUT"
# device seconds: at most 450 (its timeouts added up)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
FWD=experiments/11_mgpu_forward_ab.py
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py -k "wide_step or schedules" \
  > "$OUT/gpu_tests.log" 2>&1
echo "wide_step's GPU tests: exit $?"; grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/gpu_tests.log" | head -20
timeout 150 python3 $FWD --causal --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab11_d64_causal.txt" \
  bk=64 wide_step=1 unit_alpha=1 wide_step=1,unit_alpha=1 bk=64,comp=0 jax=1,bk=64 jax=1,bk=128 \
  > "$OUT/ab.log" 2>&1
echo "11, d64 causal: exit $?"; cat "$OUT/ab11_d64_causal.txt"
timeout 150 python3 $FWD --pairs 20 --out "$OUT/ab11_d128_full.txt" \
  bk=64 wide_step=1 persistent=0 unit_alpha=1 bk=64,comp=0 jax=1,bk=64 >> "$OUT/ab.log" 2>&1
echo "11, d128 full: exit $?"; cat "$OUT/ab11_d128_full.txt"
true
