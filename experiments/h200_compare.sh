#!/usr/bin/env bash
# The main job on one H200 (device tool; carry .data): `flashstable compare --data .data`, whose
# GPU setting trains the key pair at anchor-b128 (paper and paper+comp, seed 25; 702 s on
# 2026-12-04, experiments/results/h200-2026-12-04d-b128), in a process session of its own
# (setsid) so that it outlives the 10-minute call.
# `wait` follows it for up to S seconds; once it has finished it brings back the report, the
# PNG, the log and the runs (packed, no checkpoints: `experiment instability --runs` reads
# them). Call `wait` again at once (the machine goes back 30 s after a call) until "done".
# `run` does the same in the foreground, for h200_instability.sh's queues (the item "compare",
# h200_compare_check.sh), which h200_hold.sh holds across calls.
# Usage (repo root, on the device):
#   bash experiments/h200_compare.sh start "$OUT"
#   bash experiments/h200_compare.sh wait "$OUT" 560
#   bash experiments/h200_compare.sh run "$OUT"
set -u
cmd=${1:-}; OUT=${2:-runs/h200}
source "$(dirname "$0")/h200_env.sh"  # and COMPARE_RUNS
H=/tmp/compare-hold; R=$COMPARE_RUNS
finish() {  # $1: compare's exit status → its report, PNG and runs under $OUT (the log: the caller)
  tail -n 40 $H/log
  if [[ $1 != 0 ]]; then
    pack_runs $R "$OUT/partial-compare.jsonl.xz"
    echo "failed (exit status $1): see compare.log" >&2; return 1
  fi
  pack_runs $R "$OUT/runs-compare.jsonl.xz"
  cp $R/report.md $R/curves.png "$OUT"/ && echo done
}
case $cmd in
run)  # PREVIOUS_COMPARE: packs of an earlier machine's compare, whose finished runs it skips;
  # LEFT: seconds it may take (h200_instability.sh's budget left), so finish still packs
  mkdir -p $H "$OUT"
  if [[ -n ${PREVIOUS_COMPARE:-} ]]; then
    python3 experiments/unpack_finished.py $R $PREVIOUS_COMPARE
  fi
  # the log into $OUT as it goes: h200_hold.sh's snapshots bring it back in checks.tar.gz
  timeout ${LEFT:-86400} python3 -m jax_flashstable.cli compare --data .data --out-dir $R \
    --no-progress 2>&1 | tee "$OUT/compare.log" > $H/log
  finish ${PIPESTATUS[0]}
  ;;
start)
  if [[ -f $H/pid ]] && kill -0 "$(cat $H/pid)" 2>/dev/null; then
    echo "a compare is already running here (pid $(cat $H/pid)); call wait" >&2; exit 2
  fi
  mkdir -p $H "$OUT"; rm -f $H/rc
  nvidia-smi -L
  setsid nohup bash -c "python3 -m jax_flashstable.cli compare --data .data --out-dir $R; \
    echo \$? > $H/rc" > $H/log 2>&1 < /dev/null &
  echo $! > $H/pid
  sleep 45
  tail -n 5 $H/log
  ;;
wait)
  if [[ ! -f $H/pid ]]; then  # a fresh machine: the one that ran it has gone back
    echo "no compare was started on this machine (a fresh one?): start it again" >&2; exit 2
  fi
  t0=$(date +%s)
  while kill -0 "$(cat $H/pid)" 2>/dev/null && (( $(date +%s) - t0 < ${3:-560} )); do sleep 5; done
  if kill -0 "$(cat $H/pid)" 2>/dev/null; then
    cp $H/log "$OUT/compare.log"
    tail -n 8 $H/log
    pack_runs $R "$OUT/partial-compare.jsonl.xz"
    echo "running; call wait again"
  else
    cp $H/log "$OUT/compare.log"
    finish "$(cat $H/rc 2>/dev/null || echo unknown)" || exit 1
  fi
  ;;
*) echo "usage: h200_compare.sh start|wait|run OUT [S]" >&2; exit 2 ;;
esac
