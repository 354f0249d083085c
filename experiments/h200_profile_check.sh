#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): what limits our kernels, read from Nsight Compute's hardware
# counters (the device's runtime is Firecracker, where ncu reads them; clocks left alone).
# Profiles experiments/05_profile_attention.py --which mgpu,bwd: our Mosaic GPU forward at
# block_k 128 with compensation off and on, our Triton forward+backward with compensation
# (forward, dQ and dK/dV kernels) and cuDNN's forward+backward, one call each. The Mosaic GPU
# kernel has no name of ours, so the first 80 kernels are read (q, k, v's random fill comes first)
# with autotuning off (it would launch kernels of its own). ~1 min.
# PROFILE_ARGS replaces the launcher's arguments (default "--which mgpu,bwd"), e.g. gpt2-small's
# attention at the defaults against cuDNN (issue 19: where the training step loses):
#   PROFILE_ARGS="--which auto --shape 16,1024,12,12,64 --causal" bash experiments/h200_profile_check.sh "$OUT"
# NCU_EXTRA adds ncu options, e.g. the instruction counts and the stalls by source line that
# say why the Mosaic GPU backward's dQ kernel takes 1.26× its dK/dV kernel's time at gpt2-small's
# shape with fewer instructions a tile (issue 19, 2026-12-06):
#   NCU_EXTRA="--section InstructionStats --section SourceCounters" PROFILE_ARGS="--which auto \
#     --shape 16,1024,12,12,64 --causal" bash experiments/h200_profile_check.sh "$OUT"
# Usage (repo root, on the device):  CUDA_VISIBLE_DEVICES=0 bash experiments/h200_profile_check.sh "$OUT"
# device seconds: 300 (its timeouts added up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 300 ncu --clock-control none -c 80 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats ${NCU_EXTRA:-} \
  python3 experiments/05_profile_attention.py ${PROFILE_ARGS:---which mgpu,bwd} --calls 1 > "$OUT/ncu.txt" 2>&1
echo "ncu: exit $?, $(grep -c '^  [^ ]' "$OUT/ncu.txt") kernel reports"; tail -3 "$OUT/ncu.txt"
