#!/usr/bin/env bash
# Issue 19 (device tool, one H100 or H200, one call of at most 10 min): the Mosaic GPU backward's
# tiles in flight on the tree of 2026-12-06, after the H100 run of 22:53 UTC
# (h100-2026-12-06j-persistent-bwd) found dK/dV 2 faster than the default 3 at head_dim 128
# (0.935× the backward's time, full, 10 pairs) where an H200 had found 3 faster on 2026-12-05
# (0.975×, the kernel before the ring's restructure), and the persistent backward slower:
# 1. experiments/18_mgpu_backward_stages_ab.py (the backward alone, interleaved pairs, same
#    bits): d128 full and causal (3,2 against 2,2, 2,3, 1,2), gpt2-small's attention
#    (16 × 1024 × 12 × d64 causal: 2,2 against 1,2, 2,1, 3,3 and persistent with causal's
#    items dealt tiles outermost, `backward_mgpu.item_order`, 30 pairs);
# 2. `flashstable bench --targets` at the defaults, which since c7daa8c take dK/dV 2 at
#    head_dim 128 too (`STAGES_BY_HEAD_DIM` empty: (2, 2) everywhere);
# 3. where the call has time left: gpt2-small's step kernel by kernel (experiment 21);
# 4. with PROBE=1 and time left: Nsight Compute's duration of each kernel at gpt2-small's
#    attention with persistent_bwd False and then True as the default in the device's copy
#    (`set_line`): which kernel the persistent loop slows.
# D128_VARIANTS and D64_VARIANTS replace the A/B's variants (the first is the reference), e.g.
# D128_VARIANTS="3,2 2,2" D64_VARIANTS="2,2 2,2,persistent_bwd=0" where device time is short
# (since 753d69b a variant that names no persistent_bwd takes the default None: persistent at
# head_dim 64, not at 128).
# Usage (repo root, on the device):  [PROBE=1] bash experiments/h200_bwd_stages.sh "$OUT"
# device seconds: at most 540 (step 3 takes what 1 and 2 leave of it), 720 with PROBE=1: not in
# one call (the bench took ~150 s of its 290)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
AB=experiments/18_mgpu_backward_stages_ab.py
timeout 70 python3 $AB --shape 4,4096,16,16,128 --pairs 10 --out "$OUT/ab18_d128_full.txt" \
  ${D128_VARIANTS:-3,2 2,2 2,3 1,2} > "$OUT/ab18.log" 2>&1
echo "d128 full: exit $?"; tail -5 "$OUT/ab18_d128_full.txt"
timeout 60 python3 $AB --causal --shape 4,4096,16,16,128 --pairs 10 --out "$OUT/ab18_d128_causal.txt" \
  ${D128_VARIANTS:-3,2 2,2 2,3} >> "$OUT/ab18.log" 2>&1
echo "d128 causal: exit $?"; tail -4 "$OUT/ab18_d128_causal.txt"
timeout 60 python3 $AB --causal --shape 16,1024,12,12,64 --pairs 30 --out "$OUT/ab18_d64_causal.txt" \
  ${D64_VARIANTS:-2,2 2,2,persistent_bwd=0 1,2 2,1 3,3} >> "$OUT/ab18.log" 2>&1
echo "d64 causal: exit $?"; tail -6 "$OUT/ab18_d64_causal.txt"
bench_targets "$OUT/targets" "$OUT/targets.log"
echo "bench --targets (the defaults: dK/dV 2 at head_dim 128): exit $?"
grep -v "^ \|^$" "$OUT/targets.log" | tail -16
# 3. with time left in the call (at most 540 s in all): gpt2-small's step kernel by kernel
#    (experiments/21_step_kernels.py, ours and cuDNN's), what is left of its 1.008x
if (( SECONDS < 400 )); then
  timeout $(( 540 - SECONDS )) python3 experiments/21_step_kernels.py --attention fa2+comp \
    --attention cudnn --steps 3 --warmup 2 --out "$OUT/step-kernels" > "$OUT/step_kernels.log" 2>&1
  echo "step kernels: exit $?"; grep -v "^ *$" "$OUT/step_kernels.log" | grep -v Warning | tail -30
fi
if [[ ${PROBE:-0} == 1 ]]; then
  F=pallas_kernels/forward_mgpu.py
  default="  persistent_bwd: bool | None = None"
  for persistent in False True; do
    set_line $F "$default" "  persistent_bwd: bool | None = $persistent"
    default="  persistent_bwd: bool | None = $persistent"
    XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 90 ncu --clock-control none \
      -k regex:entry_mosaic_gpu_kernel -c 3 --section SpeedOfLight --section WarpStateStats \
      --section LaunchStats python3 experiments/05_profile_attention.py --which auto \
      --shape 16,1024,12,12,64 --causal --calls 1 > "$OUT/ncu_persistent_$persistent.txt" 2>&1
    echo "ncu (persistent_bwd=$persistent): exit $?"
    grep -E "^  [^ ]|Duration|Grid Size|Registers Per|Issued Warp" "$OUT/ncu_persistent_$persistent.txt" | head -24
  done
fi
true
