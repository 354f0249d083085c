#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 9 min): `MosaicGPUOptions.items_early`
# (the persistent kernels' producers issue an item's own tiles one item early; with o_by_tma
# the dQ kernel's compute warps still waited 3.6% of their stall samples for them at
# gpt2-small's attention, the forward's 2.8% for its Q, H100, 2026-12-07:
# experiments/results/h100-2026-12-07k-o-by-tma, h100-2026-12-07j-stalls).
# 1. its GPU tests (the persistent backward the same function as a CTA an item, both orders;
#    the forward's schedules with it; delta_in_dq; the backward against Triton's);
# 2. at gpt2-small's 16 × 1024 × 12 × d64 causal, 30 pairs, items_early off (the default)
#    against on, the same bits: the backward alone (experiment 18) and the forward (experiment
#    11, which also prints each side's kernel time);
# 3. the gpt2-small step, 30 interleaved rounds (experiment 02): ours at the defaults, cuDNN's
#    and ours with items_early (the spec's Mosaic GPU option `fa2+comp:items_early=true`), each
#    paired against the defaults' (cuDNN's ratio is the step target's, inverted).
# 4. TARGETS=1, on an H200 (the issue's device): `flashstable bench --targets` at the defaults
#    (at most 290 s: a second call, `TESTS=0 AB=0 STEP=0 TARGETS=1`, on the warm machine).
# Usage (repo root, on the device): bash experiments/h200_items_early.sh "$OUT"
# TESTS=0, AB=0 or STEP=0 leave a part out; device seconds: at most 140 + 150 + 200 (the
# timeouts, the tests' with its 30 s grace).
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
[[ ${TESTS:-1} == 0 ]] || gpu_tests 110 -n 4 tests/test_mosaic_gpu.py \
  -k "persistent_is_the_same or delta_in_dq or backward_matches_triton or items_early"
if [[ ${AB:-1} != 0 ]]; then
  timeout 70 python3 experiments/18_mgpu_backward_stages_ab.py --causal --shape 16,1024,12,12,64 \
    --pairs 30 --out "$OUT/ab.txt" 2,2 2,2,items_early=1 > /dev/null 2>&1
  echo "A/B backward d64: exit $?"
  timeout 80 python3 experiments/11_mgpu_forward_ab.py --causal --shape 16,1024,12,12,64 \
    --pairs 30 --out "$OUT/ab.txt" bk=64 bk=64,items_early=1 > /dev/null 2>&1
  echo "A/B forward d64: exit $?"; cat "$OUT/ab.txt"
fi
if [[ ${STEP:-1} != 0 ]]; then
  timeout 200 python3 experiments/02_gpt2_step_time.py --steps 30 --attention fa2+comp \
    --attention cudnn --attention fa2+comp:items_early=true --out "$OUT/step" \
    > "$OUT/step.log" 2>&1
  echo "step: exit $?"; grep -v "^ *$" "$OUT/step.log" | grep -v Warning | tail -9
fi
if [[ ${TARGETS:-0} != 0 ]] && nvidia-smi -L | grep -q H200; then
  targets_verdicts "$OUT/targets" "$OUT/targets.log"
fi
true
