#!/usr/bin/env bash
# Issue 6 on the H200s (device tool): `flashstable experiment instability` on the anchor recipe
# with the carried corpus (.data/, carry it). QUEUES holds one queue per GPU, separated by "|"
# (queue i runs on GPU i mod the GPUs present: two queues on one H200 share it, concurrently,
# which anchor-b128 runs do not fit: each asks for one 49.6 GiB buffer, 2026-12-04);
# a queue is a space-separated list of variant:seeds[:steps[:recipe]] items (the variant may carry
# :FIELD=VALUE overrides) run one after another
# on its GPU (CUDA_VISIBLE_DEVICES), all within BUDGET seconds from the start (steps: a cap, the
# cosine schedule keeps the recipe's length; recipe: one of experiment.RECIPES, default anchor);
# an item naming a check script (speed, mgpu, tune, ratio, profile) runs h200_{item}_check.sh on
# that GPU if the script's declared "device seconds" are left. Runs land in /tmp/instability/RECIPE
# (resumable while the machine stays warm), one report per recipe; the runs come back packed
# (`experiment.pack_runs`: runs-RECIPE.jsonl.xz, no checkpoints; `--runs FILE` reports them).
# TAG names runs whose extra arguments change them (e.g. TAG=tiles128 with --tiles 128): they
# go to /tmp/instability/RECIPE+TAG, so they never resume or skip as runs made without them.
# (the device returns at most 8 files). Extra arguments go to every run (e.g. --steps 4500).
# Usage (repo root, on the device):
#   QUEUES="paper:2,3:4000 paper@layer:0:3600|paper:0,1:4000:anchor-lr0.004" BUDGET=540 \
#     bash experiments/h200_instability.sh "$OUT" --checkpoint-interval 500
set -u
OUT=${1:-runs/h200}; shift || true
BUDGET=${BUDGET:-540}; QUEUES=${QUEUES:-"paper:0|paper+comp:0"}
R=${RUNS:-/tmp/instability}
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
T0=$(date +%s)
run_queue() {  # gpu items...
  local gpu=$1; shift
  for item in "$@"; do
    local left=$(( BUDGET - ($(date +%s) - T0) ))
    if (( left < 60 )); then echo "GPU $gpu: $item not started, $left s left"; continue; fi
    local script=experiments/h200_${item}_check.sh
    if [[ -f $script ]]; then   # a check script: its declared device seconds, plus a margin
      local need=$(( $(sed -n 's/^# device seconds: \([0-9]*\).*/\1/p' $script) + 10 ))
      if (( left < need )); then echo "GPU $gpu: $item not started, $left s left"; continue; fi
      echo "GPU $gpu: $item with $left s left ($(date +%T))"
      CUDA_VISIBLE_DEVICES=$gpu LEFT=$left bash $script "$OUT"; continue  # LEFT: a bound it may use
    fi
    echo "GPU $gpu: $item with $left s left ($(date +%T))"
    # the variant may hold ":FIELD=VALUE" itself (e.g. paper+comp+guard:max_shift=6:28::anchor-b128):
    # its segments after the first start with a letter, the seeds with a digit (a greedy variant
    # took "paper:2,3:4000" as variant paper:2,3 and seeds 4000 until 2026-12-04)
    if [[ ! $item =~ ^([^:]+(:[A-Za-z_][^:]*)*):([0-9][0-9,]*)(:([0-9]*)(:([A-Za-z0-9_.-]+))?)?$ ]]; then
      echo "GPU $gpu: $item is not VARIANT:SEEDS[:STEPS[:RECIPE]]"; continue
    fi
    variant=${BASH_REMATCH[1]} seeds=${BASH_REMATCH[3]} steps=${BASH_REMATCH[5]} recipe=${BASH_REMATCH[7]}
    recipe=${recipe:-anchor}
    CUDA_VISIBLE_DEVICES=$gpu python3 -m jax_flashstable.cli experiment instability --recipe $recipe \
      --data .data --attention "$variant" --seeds "$seeds" ${steps:+--steps "$steps"} \
      --time-budget "$left" --no-progress --out $R/$recipe${TAG:++$TAG} "${EXTRA[@]}" 2>&1 \
      | grep --line-buffered -v "^|\|^{\|^[Rr]ecipe\|^Command: \|^date: \|^$\|^#" | sed "s/^/[GPU $gpu] /"
  done
}
EXTRA=("$@")
IFS='|' read -ra QS <<< "$QUEUES"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); NGPU=$(( NGPU > 0 ? NGPU : 1 ))
for i in "${!QS[@]}"; do
  read -ra ITEMS <<< "${QS[$i]}"
  run_queue "$(( i % NGPU ))" "${ITEMS[@]}" > "$R/queue$i.log" 2>&1 &
done
wait
cat $R/queue*.log
shopt -s nullglob
for dir in $R/*/; do
  name=$(basename $dir); recipe=${name%%+*}
  python3 -m jax_flashstable.cli experiment instability --recipe $recipe --data .data --report-only \
    --out $dir --pack "$OUT/runs-${name//+/_}.jsonl.xz" "$@" | tail -30
  cp $dir/report.md "$OUT/report-${name//+/_}.md" 2>/dev/null; cp $dir/curves.png "$OUT/curves-${name//+/_}.png" 2>/dev/null  # the device returns plain names only
done
cp $R/queue*.log "$OUT"/
