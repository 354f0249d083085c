#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): what the wide step's
# default (on for a GPU wherever it runs, f0df4fc) and the forward's 226 KiB (834e192) changed
# that no GPU has run yet:
# 1. the Mosaic GPU tests, the golden hashes and the backend choice on the GPU, now with the
#    wide step in every default forward;
# 2. experiment 11 at b4 × 4096 × 16 × d128 full (20 pairs): the default (the wide step,
#    persistent); with 3 K/V slots, where the default keeps the 64-key step persistent and the
#    wide step would run a CTA an item (`resolve_wide_step`: that pairing is not timed), both;
#    block_k 128 (other numerics), persistent by default since its 2 slots fit the 226 KiB,
#    and not;
# 3. the gpt2-small step, ours against cuDNN's, 30 interleaved rounds (a sixth run).
# Usage (repo root, on the device):
#   [TEST_TIMEOUT=seconds, 0: none] [STEPS=rounds, 0: no step] bash experiments/h200_next19.sh "$OUT"
# device seconds: at most ~490 (timeouts 200 + 130 + 160, less where it ends sooner)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests ${TEST_TIMEOUT:-200} tests/test_mosaic_gpu.py tests/test_golden.py tests/test_backend_choice.py
timeout 130 python3 experiments/11_mgpu_forward_ab.py --pairs 20 --out "$OUT/ab11_d128_full.txt" \
  bk=64 bk=64,st=3 bk=64,st=3,wide_step=1,persistent=0 bk=128 bk=128,persistent=0 > "$OUT/ab.log" 2>&1
echo "11, d128 full: exit $?"; cat "$OUT/ab11_d128_full.txt"
step_vs_cudnn "$OUT/step" ${STEPS:-30} 160
true
