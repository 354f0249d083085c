#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): why the Mosaic GPU
# backward's dQ kernel takes 1.26× its dK/dV kernel's time at gpt2-small's attention
# (16 × 1024 × 12 × d64, causal: 155.7 against 123.2 µs, H100, 2026-12-06) with fewer
# instructions a key tile (318 against 395 SASS) and the same issue rate.
# 1. Nsight Compute on the three Mosaic GPU kernels of one forward+backward at the defaults
#    (forward, dK/dV, dQ, in that order): speed of light, warp states, instruction counts and
#    the stall samples per SASS instruction (SourceCounters), kept as dq.ncu-rep and printed
#    twice: the details page (ncu.txt) and the SASS source page with its per-instruction
#    counters (sass.csv, compressed);
# 2. the backward's tiles in flight at that shape (experiments/18_mgpu_backward_stages_ab.py,
#    15 interleaved pairs, the backward alone, same bits): whether dQ waits on its ring.
# Usage (repo root, on the device):  bash experiments/h200_dq_probe.sh "$OUT"
# SHAPE=b,t,h,kv,d sets the shape; AB=0 leaves out part 2 (the backward's stages, 200 s), for
# the forward's stall samples alone.
# device seconds: 420 (its timeouts added up)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
SHAPE=${SHAPE:-16,1024,12,12,64}
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 200 ncu --clock-control none \
  -k regex:entry_mosaic_gpu_kernel -c 3 --import-source no \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section SourceCounters \
  -o "$OUT/dq" -f \
  python3 experiments/05_profile_attention.py --which auto --shape "$SHAPE" --causal --calls 1 \
  > "$OUT/ncu_run.log" 2>&1
echo "ncu: exit $?"; tail -3 "$OUT/ncu_run.log"
ncu --import "$OUT/dq.ncu-rep" > "$OUT/ncu.txt" 2>&1
echo "details: $(grep -c 'Duration' "$OUT/ncu.txt") kernels"; grep -E "^  [^ ]|Duration|Issued Warp|Executed Instructions  " "$OUT/ncu.txt"
ncu --import "$OUT/dq.ncu-rep" --page source --print-source sass --csv > "$OUT/sass.csv" 2>&1
echo "sass page: exit $?, $(wc -l < "$OUT/sass.csv") lines"; head -c 600 "$OUT/sass.csv"; echo
xz -T0 -6 "$OUT/sass.csv"
if [[ ${AB:-1} != 0 ]]; then
  timeout 200 python3 experiments/18_mgpu_backward_stages_ab.py --causal --shape "$SHAPE" --pairs 15 \
    2,2 2,3 2,4 3,3 2,3,bk_dq=128 > "$OUT/ab18.log" 2>&1
  echo "stages A/B: exit $?"; tail -12 "$OUT/ab18.log"
fi
