#!/usr/bin/env bash
# The main job (`flashstable compare --data .data`: the anchor-b128 key pair, paper and
# paper+comp at seed 25) as an item of h200_instability.sh's queues ("compare"), in the
# foreground on that queue's GPU, so h200_hold.sh holds it across calls with the queue's other
# runs; its report, PNG and log come back in h200_hold.sh's checks.tar.gz, its runs as
# runs-compare.jsonl.xz (partial-compare.jsonl.xz while it runs). It is bounded by the queue's
# budget left (LEFT); PREVIOUS_COMPARE (packs of a machine that went back) skips its finished
# runs. (h200_compare.sh start/wait holds it alone.)
# Usage (repo root, on the device): bash experiments/h200_compare_check.sh "$OUT"
# device seconds: 780 (paper 25 to its explosion + 300 steps, ~1,840 at 9.1 steps/s, and
# paper+comp 25 to 3,000 at 8.7, each with its compilation and diagnostics: an estimate from the
# instability runs of 2026-11-30, not yet measured)
exec bash "$(dirname "$0")/h200_compare.sh" run "${1:-runs/h200}"
