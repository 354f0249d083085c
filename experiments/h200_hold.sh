#!/usr/bin/env bash
# One device hold used whole (device tool): `start` launches h200_instability.sh in a process
# session of its own (setsid), so its queues outlive the call and run on while the machine stays
# held; `wait` follows them for up to S seconds, then brings back under $OUT what exists so far
# (the queue logs and every run, packed without checkpoints; the reports once all is done).
# Call `wait` again at once (the machine goes back 30 s after a call) until it prints "done".
# A machine that went back between calls takes its queues with it (`wait` on the fresh one says
# so): start and wait in one call, so that a late next call loses only what runs after it
# (2026-12-01: two machines went back so, each between a start and its wait). Every 120 s
# `wait` also leaves a snapshot of the runs under $OUT, so that a call killed at its limit (the
# session's device time left may be less than the wait: 2026-12-02, 551 s lost) still brings
# back what ran. The device brings back at most 8 files of $OUT: a finished hold leaves the queue
# logs (one per queue), the runs' pack, report, curves and cpu_hashes.json (and
# cpu_hashes.err when not empty): another script's files in the same call can push the pack out
# (2026-12-03: fetched again from the warm machine in the next call).
# PREVIOUS="PACK ..." (files in the working tree, which travels to the device) puts the packs'
# finished runs under $RUNS/${PREVIOUS_DIR:-anchor-b128} first, so the queues skip them: after a
# machine went back with its queues, the next call starts them again from the last call's
# snapshot (its unfinished runs start over: checkpoints do not come back). A call that does not
# know whether its machine is the last one runs `start ...; wait ...` (";", not "&&"): on the
# warm machine start refuses (its queues run on) and wait follows them; on a fresh one it starts.
# On 2026-12-04 (twenty-first session) the next call came ~60 s after the last twice, past the
# 30 s a machine waits, and each time the queue went with the machine: so every call is
# `start; wait` with PREVIOUS naming every pack copied so far.
# A queue item that runs a check script (e.g. "ab", h200_ab_check.sh; "compare") writes into
# the queues' folder: its files come back as one checks.tar.gz, its packed runs
# (runs-compare.jsonl.xz; partial-compare.jsonl.xz while it runs) as they are, in each
# snapshot and at the end. PREVIOUS must not name compare's packs (they would join the
# study's runs): PREVIOUS_COMPARE does, and the compare then skips its finished runs.
# Copy each call's files into the tree before the next call: a new session numbers its calls
# from 1 again and writes over the last session's files (2026-12-04: a finished run lost so).
# Usage (repo root, on the device; carry .data):
#   QUEUES="paper+comp:24,25|paper:24,25" BUDGET=1480 bash experiments/h200_hold.sh start "$OUT" \
#     && bash experiments/h200_hold.sh wait "$OUT" 500
#   bash experiments/h200_hold.sh wait "$OUT" 570
set -u
cmd=$1; OUT=$2; shift 2
H=/tmp/hold; R=${RUNS:-/tmp/instability}
source "$(dirname "$0")/h200_env.sh"  # the environment, and pack_runs
case $cmd in
start)
  : "${QUEUES:?set QUEUES, the queues of h200_instability.sh}"
  if [[ -f $H/pid ]] && kill -0 "$(cat $H/pid)" 2>/dev/null; then
    echo "queues are already running here (pid $(cat $H/pid)); call wait" >&2; exit 2
  fi
  rm -rf $H/out  # a last hold's files came back with its "done"; its runs stay under $R
  mkdir -p $H/out $R
  nvidia-smi -L
  if [[ -n ${PREVIOUS:-} ]]; then  # packs of earlier calls: their finished runs are skipped
    python3 experiments/unpack_finished.py "$R/${PREVIOUS_DIR:-anchor-b128}" $PREVIOUS
  fi
  setsid nohup env QUEUES="$QUEUES" BUDGET="${BUDGET:-1480}" RUNS=$R \
    bash experiments/h200_instability.sh $H/out "$@" > $H/log 2>&1 < /dev/null &
  echo $! > $H/pid
  # the host CPU's class of XLA code generation and its golden hashes (tests/golden_hashes.json
  # keys CPU records by it), beside the queues, on a few of its cores, under the suite's flags
  JAX_PLATFORMS=cpu PJRT_NPROC=4 XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= nice \
    timeout 300 python3 -c 'import json; from jax_flashstable import bench
print(json.dumps({bench.hash_key(): bench.golden_hashes()}))' > $H/cpu_hashes.json 2> $H/cpu_hashes.err &
  sleep 45
  tail -n 5 $R/queue*.log
  ;;
wait)
  if [[ ! -f $H/pid ]]; then  # a fresh machine: the one that ran the queues has gone back
    echo "no queues were started on this machine (a fresh one?): start them again" >&2; exit 2
  fi
  checks() {  # a check item's files (e.g. "ab": ab.txt, ptxas.txt, tests.log) in one archive,
    # since the device brings back at most 8 files; compile.log is a check's scratch file
    local files
    mapfile -t files < <(cd $H/out && ls | grep -vE '^(report-.*[.]md|curves-.*[.]png|runs-.*[.]jsonl[.]xz|queue[0-9]*[.]log|compile[.]log)$')
    (( ${#files[@]} )) || return 0
    tar -czf "$OUT/checks.tar.gz" -C $H/out -- "${files[@]}" 2>/dev/null  # a growing log: a warning
    return 0
  }
  snapshot() {  # what exists so far, under $OUT: a call killed at its limit still brings it back
    cp $R/queue*.log "$OUT"/ 2>/dev/null
    for dir in $R/*/; do
      [[ -d $dir ]] && pack_runs $dir "$OUT/partial-$(basename $dir | tr + _).jsonl.xz"
    done
    cp $H/out/runs-*.jsonl.xz "$OUT"/ 2>/dev/null  # a finished check's runs (runs-compare)
    [[ -d $COMPARE_RUNS ]] && pack_runs $COMPARE_RUNS "$OUT/partial-compare.jsonl.xz"  # item "compare"
    checks
  }
  t0=$(date +%s); last=$t0
  while kill -0 "$(cat $H/pid)" 2>/dev/null && (( $(date +%s) - t0 < ${1:-570} )); do
    sleep 5
    if (( $(date +%s) - last >= 120 )); then snapshot; last=$(date +%s); fi
  done
  if kill -0 "$(cat $H/pid)" 2>/dev/null; then
    tail -n 8 $R/queue*.log
    snapshot
    echo "running; call wait again"
  else
    cat $H/log
    cp $H/cpu_hashes.json "$OUT"/; [[ -s $H/cpu_hashes.err ]] && cp $H/cpu_hashes.err "$OUT"/
    rm -f "$OUT"/partial-*.jsonl.xz  # the final packs below hold every run
    checks
    cp $H/out/report-*.md $H/out/curves-*.png $H/out/runs-*.jsonl.xz $H/out/queue*.log "$OUT"/ \
      2>/dev/null
    if [[ -s $H/log ]]; then echo done; else echo "the queues left no log: see above" >&2; exit 1; fi
  fi
  ;;
*) echo "usage: h200_hold.sh start|wait OUT [...]" >&2; exit 2 ;;
esac
