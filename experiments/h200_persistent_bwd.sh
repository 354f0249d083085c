#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): the persistent Mosaic GPU
# backward (`MosaicGPUOptions.persistent_bwd`: the dK/dV and dQ kernels, built 2026-12-06 on a CPU):
# 1. experiments/18_mgpu_backward_stages_ab.py: the backward alone, persistent against not, at
#    gpt2-small's attention (16 × 1024 × 12 × d64 causal, 30 pairs) and at the headline shape
#    (4 × 4096 × 16 × d128 full, 10 pairs: the default (3, 2) tiles in flight, (2, 2), and
#    (2, 2) persistent, dK/dV's 3 not fitting beside two items' K and V): first, so that a
#    call cut short still says the most (its "same bits" is also a GPU check, with many items
#    a CTA);
# 2. the GPU tests it touches (the backward's persistent same bits with every item in one CTA;
#    the forward's persistent schedules; the backward against the Triton backward; the jitted
#    forward+backward; persistent_bwd=True's tiles and refusal).
# 3. with TARGETS=1: `flashstable bench --targets` (h200_speed19.sh's second part) at the
#    defaults (persistent_bwd=None since 753d69b: on where its tiles fit up to head_dim 64;
#    the A/B's variants name persistent_bwd, so that they compare the same kernels whatever
#    the default).
# Usage (repo root, on the device):  [TARGETS=1] bash experiments/h200_persistent_bwd.sh "$OUT"
# device seconds: 270 (its timeouts added up), 560 with TARGETS=1
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
AB=experiments/18_mgpu_backward_stages_ab.py
timeout 70 python3 $AB --causal --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab18_d64_causal.txt" \
  2,2,persistent_bwd=0 2,2,persistent_bwd=1 > "$OUT/ab18.log" 2>&1
echo "d64 causal: exit $?"; tail -8 "$OUT/ab18_d64_causal.txt"
timeout 70 python3 $AB --shape 4,4096,16,16,128 --pairs 10 --out "$OUT/ab18_d128_full.txt" \
  3,2 2,2 2,2,persistent_bwd=1 >> "$OUT/ab18.log" 2>&1
echo "d128 full: exit $?"; tail -8 "$OUT/ab18_d128_full.txt"
timeout 130 python3 -m pytest -v -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
  -k "persistent or jitted or backward_matches_triton" > "$OUT/tests.log" 2>&1
echo "tests: exit $?"; grep -E "FAILED|ERROR" "$OUT/tests.log" | cut -c1-150; tail -2 "$OUT/tests.log"
if [[ ${TARGETS:-0} == 1 ]]; then  # None is the default since 753d69b
  bench_targets "$OUT/targets" "$OUT/targets.log"
  echo "bench --targets (persistent_bwd=None): exit $?"; grep -v "^ \|^$" "$OUT/targets.log" | tail -45
fi
true
