#!/usr/bin/env bash
# The training cross-check on an nvidia-h200-x2 machine (device tool; carry .data): `flashstable
# crosscheck-train` with its two sides in parallel — JAX on GPU 0, the PyTorch twin on GPU 1
# (CUDA_VISIBLE_DEVICES; the twin runs in this image's python3, which has torch beside JAX) —
# each side working through the same QUEUE in order, within BUDGET seconds from the start. On a
# one-GPU machine (nvidia-h200) the sides take turns, item by item, the twin's runs of an item
# first (both sides resume a cut run from its checkpoint while the machine stays warm; the twin
# stops itself with one 30 s before the budget ends): two training processes at once share
# the GPU's time (two JAX runs together made 8.7 steps/s against 8.9 alone,
# docs/studies/instability-anchor-b128.md), and the
# references' steps would not fit its memory together (the twin's reference alone: about 116
# GiB at anchor-b128, docs/studies/training-twin.md).
# An item is PAIRS:SEEDS:STEPS[:NULL] (PAIRS: crosscheck-train's pairs, comma-separated, A or
# A=SPEC, e.g. paper=paper+triton for the JAX runs of that spelling;
# NULL: --null-steps, the JAX run again with each batch as two halves). Items with the same
# STEPS share the folder $R/RECIPE-sSTEPS, so their report reads every pair of that cap (and
# its reference-fp32 runs give the runaway thresholds). Runs resume while the machine stays
# warm (both sides from their checkpoints, which the packs leave out); PREVIOUS=FILES (packs brought
# back by an earlier session, e.g. experiments/results/…/twin-*.jsonl.xz, made with the same
# RUNS folder: a JAX run's out_dir is part of its configuration) are unpacked first, so their
# finished runs are skipped. JAX_PREVIOUS=PACKS (the instability experiment's packs,
# experiments/results/h200-*-b128/runs*.jsonl.xz, spaces or commas between them) runs the torch
# side only (workers taking the items in order, below): each item's JAX runs are taken
# from the packs (`crosscheck-train --jax-runs`; an item whose runs are not there, unfinished
# or made with other settings fails in one line and the queue goes on), and its default QUEUE
# is the pairs those packs hold at anchor-b128 (below); a worker per GPU takes the queue's
# items in order, one twin run at a time, and with TWINS_PER_GPU=2 a second worker joins on a
# GPU once its first twin's step line shows room for two (peak memory × 2 + 8 GiB below the
# GPU's; while two share a GPU, a twin that runs out of memory puts its item back and the GPU
# is down to one twin: the second stops, after its item when the first ran out).
# A twin out of GPU memory: no later item whose twins' attentions all ran out is started
# ($R/twin-oom; crosscheck-train itself starts no later twin of that attention).
# TORCH_ARGS go to every twin run (e.g. "--compile off"). TORCH_ARGS=check runs
# experiments/15_twin_paper_bits.py (anchor-b128's shape) on the queue's paper layouts beside
# the first runs (on the last GPU; a few minutes, at most 480 s; once per machine: a later
# start reuses its paper-bits.md, which comes back, and applies its verdict from the first item
# on) and trains the items of paper layouts that start after its verdict with --compile off if
# it finds that compiling loses bits eager keeps, compiled otherwise (also when the check fails
# or times out); an item that starts before the verdict trains compiled (and, cut, does not
# resume under --compile off: its checkpoint is of a compiled run). The other items get no
# TORCH_ARGS; the verdict goes to queues.log. What
# comes back under $OUT (at most 8 files): per folder its runs packed (twin-NAME.jsonl.xz, no
# checkpoints; `crosscheck-train --runs FILE` reports them), report-NAME.md, twin-NAME.png,
# the queue logs (queues.log) and, where that leaves room, torch.compile's cache
# (torchinductor.tar.xz: copied to .devcache/ and carried, the next machine compiles the same
# twins from it; h200_env.sh).
#   run    the queues in the foreground, then the reports (one call: BUDGET ≤ 540)
#   start  the same in a session of its own (setsid), so it outlives the call
#   wait   follows it for up to S seconds, then brings back what exists so far (logs, packs);
#          call it again at once (the machine goes back 30 s after a call) until "done"
# Usage (repo root, on the device):
#   BUDGET=1450 bash experiments/h200_twin.sh start "$OUT"
#   bash experiments/h200_twin.sh wait "$OUT" 570
# Plan (the default QUEUE): the agreement checks first (reference-fp32 and paper, seed 24, 300
# steps, with their JAX nulls), then the explosion pairs seed by seed (paper and paper+comp on
# seed 24, 25, 26: to 3,000 steps or 300 past an explosion), a full reference-fp32 run (the
# runaway thresholds), then SDPA flash and cuDNN beside fa2 and cudnn on seeds 24–26. At ~9 JAX
# steps/s (anchor-b128, one run per GPU; 2026-11-30) the agreement items take ~5 min with
# compilation, a 3,000-step run ~6 min, an exploding paper run 3–5 min (JAX exploded at
# 1,521–2,304 on these seeds on 2026-11-30): one 25-minute session reaches about seed 25's
# pair on the JAX side, two or three more finish the queue (PREVIOUS=the packs of the last).
# The twin's speed (torch.compile, bf16 cuBLAS) is unmeasured: each run prints its steps/s, and
# a slower twin only makes the torch queue lag (the report pairs whatever both sides finished).
# With JAX_PREVIOUS (one H200 is enough; on nvidia-h200-x2 two twin runs go at once) the
# default QUEUE is the anchor-b128 runs the packs hold with today's settings: paper 29, 30,
# 31 (JAX exploded at steps 1,452, 2,935, 1,306), paper+comp 27, 28, fa2 21, 24 (sdpa-flash)
# and cudnn 24 (sdpa-cudnn); paper 24–28 and paper+comp 24–26 of 2026-11-30 are refused (stored before the
# experiment named its backend, with the backward of before 2026-12-01;
# docs/studies/training-twin.md):
#   JAX_PREVIOUS="experiments/results/h200-2026-11-30-b128/runs.jsonl.xz
#     experiments/results/h200-2026-12-01-b128/runs.jsonl.xz
#     experiments/results/h200-2026-12-01c-b128/runs-1.jsonl.xz
#     experiments/results/h200-2026-12-01c-b128/runs-2.jsonl.xz" BUDGET=1450 \
#     bash experiments/h200_twin.sh start "$OUT"
set -u
cmd=${1:-run}; OUT=${2:-runs/h200}
RECIPE=${RECIPE:-anchor-b128}; BUDGET=${BUDGET:-540}
JAX_PREVIOUS=$(tr ' \n' ',,' <<< "${JAX_PREVIOUS:-}" | tr -s , | sed 's/^,//; s/,$//')
if [[ -n $JAX_PREVIOUS ]]; then
  QUEUE=${QUEUE:-"paper:29:3000 paper+comp:27:3000 paper:31:3000 sdpa-flash:21:3000
    paper:30:3000 paper+comp:28:3000 sdpa-flash:24:3000 sdpa-cudnn:24:3000"}
fi
QUEUE=${QUEUE:-"reference-fp32,paper:24:300:300 paper,paper+comp:24:3000 paper,paper+comp:25:3000
  paper,paper+comp:26:3000 reference-fp32:24:3000 sdpa-flash,sdpa-cudnn:24,25,26:3000"}
R=${RUNS:-/tmp/twin}; H=/tmp/twin-hold
mkdir -p "$OUT" $R
shopt -s nullglob
source "$(dirname "$0")/h200_env.sh"
read -ra ITEMS <<< "$(tr '\n' ' ' <<< "$QUEUE")"
ALLPAIRS=$(printf "%s\n" "${ITEMS[@]}" | cut -d: -f1 | tr , '\n' | awk '!seen[$0]++' | paste -sd,)
cli() { python3 -m jax_flashstable.cli crosscheck-train --recipe $RECIPE --data .data "$@"; }
unpack() { python3 -c "import sys; import jax_flashstable.experiment.instability as i
i.unpack_runs(*sys.argv[1:])" "$@"; }
held_pairs() { python3 -c "import sys; import jax_flashstable.experiment.twin as t
print(t.pairs_held(*sys.argv[1:]))" "$@"; }
pack() { python3 -c "import sys; import jax_flashstable.experiment.twin as t
t.pack(*sys.argv[1:])" "$@"; }

T0=$(date +%s)  # the budget counts from here
run_side() {  # side[N] gpu items...: the items' runs of that side, in order (sideN: a label)
  local label=$1 side=${1%%[0-9]*} gpu=$2; shift 2
  for item in "$@"; do
    local left=$(( BUDGET - ($(date +%s) - T0) ))
    if (( left < 60 )); then echo "[$label] $item not started, $left s left"; continue; fi
    IFS=: read -r pairs seeds steps null <<< "$item"
    if [[ $side == torch && -s $R/twin-oom ]] && ! tr , '\n' <<< "$pairs" | cut -d= -f1 \
        | grep -vqxFf $R/twin-oom; then  # every twin of the item ran out of GPU memory before
      echo "[$label] $item not started: its twins ran out of GPU memory ($(sort -u $R/twin-oom | paste -sd,))"
      continue
    fi
    local targs=${TORCH_ARGS:-}
    if [[ $targs == check ]]; then  # the check's verdict, for an item of paper layouts only
      targs=""
      if ! tr , '\n' <<< "$pairs" | cut -d= -f1 | grep -vqE "$PAPER_KINDS"; then
        if [[ -f $R/paper-args ]]; then targs=$(cat $R/paper-args)
        else echo "[$label] $item: the paper check has no verdict yet, trained compiled"; fi
      fi
    fi
    echo "[$label] $item with $left s left ($(date +%T))"
    CUDA_VISIBLE_DEVICES=$gpu cli --side $side --pairs "$pairs" --seeds "$seeds" --steps "$steps" \
      --null-steps "${null:-0}" --time-budget "$left" --torch-python python3 --no-progress \
      --torch-args "$targs" ${JAX_PREVIOUS:+--jax-runs "$JAX_PREVIOUS"} \
      --out $R/$RECIPE-s$steps 2>&1 | sed -u "s/^/[$label] /" | tee $R/item-$label.log
    if [[ $side == torch ]] && grep -q "gpt_twin.py ran out of GPU memory" $R/item-$label.log; then
      if [[ -f $R/pair-$gpu ]]; then  # two twins on the GPU: the item goes back, one stays
        echo "[$label] out of GPU memory beside another twin: $item back to the queue, one twin on GPU $gpu from now on"
        ( flock 9; { echo "$item"; cat $R/items; } > $R/items.tmp && mv $R/items.tmp $R/items ) 9> $R/items.lock
        touch $R/single-$gpu
        if [[ -n ${SECOND:-} ]]; then return 75; fi
        while [[ -f $R/pair-$gpu ]]; do sleep ${POLL_S:-10}; done  # until the second has stopped
        continue
      fi  # "torch KIND seed N: gpt_twin.py ran out of GPU memory …" → KIND
      sed -n 's/^\[[^]]*\] torch \([^ ]*\) seed [0-9]*: gpt_twin.py ran out of GPU memory.*/\1/p' \
        $R/item-$label.log >> $R/twin-oom
    fi
  done
}

# With JAX_PREVIOUS the twin side's workers take the items in order from one queue ($R/items):
# one per GPU, and a second on a GPU (TWINS_PER_GPU=2) once its first twin's step line says
# there is room for two (its peak memory × 2 + 8 GiB below the GPU's).
next_item() {  # the queue's next item, taken from it (empty: none left)
  ( flock 9; head -n 1 $R/items; sed -i 1d $R/items ) 9> $R/items.lock
}
worker() {  # label gpu: the queue's items, one at a time, until none is left (a second: or
  local item  # until its GPU is down to one twin, $R/single-GPU)
  while [[ -z ${SECOND:-} || ! -f $R/single-$2 ]] && item=$(next_item) && [[ -n $item ]]; do
    run_side $1 $2 "$item" || [[ $? != 75 ]] || return 0
  done
}
second_worker() {  # label gpu: a second worker on the GPU of worker `label`, if there is room
  local t0 peak total
  t0=$(date +%s)
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i $2)  # MiB
  while (( $(date +%s) - t0 < 900 )); do
    peak=$(grep -o 'peak memory [0-9.]* GiB' $R/queue-$1.log 2>/dev/null | tail -n 1 | cut -d' ' -f3)
    if [[ -n $peak ]]; then
      if awk -v p=$peak -v t=$total 'BEGIN { exit !(2 * p * 1024 + 8192 < t) }'; then
        echo "[$1b] room for a second twin: the first's peak $peak GiB of $(( total / 1024 )) GiB"
        touch $R/pair-$2
        SECOND=1 worker $1b $2
        rm -f $R/pair-$2
        echo "[$1b] the second twin's worker stopped"
      else
        echo "[$1b] no room for a second twin: the first's peak $peak GiB of $(( total / 1024 )) GiB"
      fi
      return 0
    fi
    if [[ ! -s $R/items ]]; then echo "[$1b] no item left for a second twin"; return 0; fi
    sleep ${POLL_S:-10}
  done
  echo "[$1b] no step line with a peak memory in 900 s: no second twin"
}

PAPER_KINDS='^paper(\+comp)?(\+lse)?$'  # the twin's paper layouts (15_twin_paper_bits' kinds)
check_compile() {  # TORCH_ARGS=check → $R/paper-args, "" or "--compile off" by 15_twin_paper_bits
  local kinds rc=0 args=""
  kinds=$(tr , '\n' <<< "$ALLPAIRS" | cut -d= -f1 | grep -E "$PAPER_KINDS" | sort -u | paste -sd, || true)
  if [[ -z $kinds ]]; then echo "no paper layouts in the queue: no check"; echo -n > $R/paper-args; return 0; fi
  if ! grep -q '^verdict:' $R/paper-bits.md 2>/dev/null; then  # once per machine
    timeout 480 python3 experiments/15_twin_paper_bits.py --kinds "$kinds" > $R/paper-bits.md
    rc=$?
  fi
  if grep -q '^verdict:.*--compile off$' $R/paper-bits.md; then args="--compile off"; fi
  echo "paper bits (exit status $rc): $(grep '^verdict:' $R/paper-bits.md || echo 'no verdict')"
  echo "the paper layouts' TORCH_ARGS from now on: \"$args\""
  echo -n "$args" > $R/paper-args.tmp && mv $R/paper-args.tmp $R/paper-args
}

queues() {
  rm -f $R/queue-*.log $R/paper-args $R/twin-oom $R/pair-* $R/single-*  # this run's only (an earlier run's on a warm machine)
  nvidia-smi -L
  local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  local check_pid=""
  if [[ ${TORCH_ARGS:-} == check ]] && grep -q '^verdict:' $R/paper-bits.md 2>/dev/null; then
    check_compile > $R/queue-check.log 2>&1  # this machine's verdict, before any item
  elif [[ ${TORCH_ARGS:-} == check ]]; then  # beside the first runs, on the last GPU
    CUDA_VISIBLE_DEVICES=$(( ngpu > 1 ? ngpu - 1 : 0 )) check_compile > $R/queue-check.log 2>&1 &
    check_pid=$!
  fi
  for f in ${PREVIOUS:-}; do    # twin-NAME.jsonl.xz → $R/NAME
    name=$(basename $f .jsonl.xz); name=${name#twin-}; name=${name#partial-}
    unpack $f $R/$name && echo "unpacked $f into $R/$name"
  done
  if [[ -n $JAX_PREVIOUS ]]; then  # the JAX side from the packs: the twin alone, a queue
    printf "%s\n" "${ITEMS[@]}" > $R/items
    local g pids=()
    for (( g = 0; g < ngpu; g++ )); do
      worker torch$g $g > $R/queue-torch$g.log 2>&1 &
      pids+=($!)
      if (( ${TWINS_PER_GPU:-1} > 1 )); then
        second_worker torch$g $g > $R/queue-torch${g}b.log 2>&1 &
        pids+=($!)
      fi
    done
    wait "${pids[@]}"
  elif (( ngpu > 1 )); then         # a GPU each, in parallel
    run_side jax 0 "${ITEMS[@]}" > $R/queue-jax.log 2>&1 &
    local jax_pid=$!
    run_side torch 1 "${ITEMS[@]}" > $R/queue-torch.log 2>&1 &
    wait $jax_pid $!
  else                              # one GPU: the sides take turns, item by item, the twin first
    for item in "${ITEMS[@]}"; do
      run_side torch 0 "$item" >> $R/queue-torch.log 2>&1
      run_side jax 0 "$item" >> $R/queue-jax.log 2>&1
    done
  fi
  if [[ -n $check_pid ]]; then wait $check_pid; fi  # (its timeout: 480 s)
  for dir in $R/$RECIPE-s*/; do
    name=$(basename $dir)
    # the queue's pairs with a run in this folder (an item the budget left unstarted has
    # none, and a report naming it refuses; crosscheck-train packs the runs even then)
    held=$(held_pairs "$ALLPAIRS" $dir)
    if [[ -z $held ]]; then pack $dir "$OUT/twin-$name.jsonl.xz"; continue; fi
    rm -f $dir/report.md $dir/twin.png  # (the last item's, not this folder's report)
    cli --report-only --pairs "$held" --steps ${name##*-s} --out $dir \
      --pack "$OUT/twin-$name.jsonl.xz" 2>&1 | grep -v "^{" | tail -30
    if [[ -f $dir/report.md ]]; then cp $dir/report.md "$OUT/report-$name.md"; fi
    if [[ -f $dir/twin.png ]]; then cp $dir/twin.png "$OUT/twin-$name.png"; fi
  done
  cat $R/queue-*.log < /dev/null > "$OUT/queues.log"
  cp $R/paper-bits.md "$OUT"/ 2>/dev/null || true
  pack_inductor_cache "$OUT/torchinductor.tar.xz"  # for the next machine (h200_env.sh)
}

case $cmd in
run) queues ;;
start)
  mkdir -p $H/out
  setsid nohup env QUEUE="$QUEUE" BUDGET="$BUDGET" RECIPE=$RECIPE RUNS=$R PREVIOUS="${PREVIOUS:-}" \
    JAX_PREVIOUS="$JAX_PREVIOUS" TORCH_ARGS="${TORCH_ARGS:-}" TWINS_PER_GPU="${TWINS_PER_GPU:-1}" \
    bash "$0" run $H/out > $H/log 2>&1 \
    < /dev/null &
  echo $! > $H/pid
  sleep 60
  tail -n 5 $R/queue-*.log < /dev/null  # (none yet: nothing, not stdin)
  ;;
wait)
  t0=$(date +%s)
  while kill -0 "$(cat $H/pid)" 2>/dev/null && (( $(date +%s) - t0 < ${3:-570} )); do sleep 5; done
  if kill -0 "$(cat $H/pid)" 2>/dev/null; then
    tail -n 12 $R/queue-*.log < /dev/null
    cat $R/queue-*.log < /dev/null > "$OUT/queues.log"
    cp $R/paper-bits.md "$OUT"/ 2>/dev/null || true
    for dir in $R/*-s*/; do
      pack $dir "$OUT/partial-$(basename $dir).jsonl.xz"
    done
    echo "running; call wait again"
  else
    cat $H/log | tail -60
    cp $H/out/* "$OUT"/ && echo done
  fi
  ;;
*) echo "usage: h200_twin.sh run|start|wait OUT [S]" >&2; exit 2 ;;
esac
