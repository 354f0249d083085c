#!/usr/bin/env bash
# The main job (`flashstable compare --data .data`: the anchor-b128 key pair, paper and
# paper+comp at seed 25) as an item of h200_instability.sh's queues ("compare"), in the
# foreground on that queue's GPU, so h200_hold.sh holds it across calls with the queue's other
# runs; its report, PNG and log come back in h200_hold.sh's checks.tar.gz, its runs as
# runs-compare.jsonl.xz (partial-compare.jsonl.xz while it runs). It is bounded by the queue's
# budget left (LEFT); PREVIOUS_COMPARE (packs of a machine that went back) skips its finished
# runs. (h200_compare.sh start/wait holds it alone.)
# Usage (repo root, on the device): bash experiments/h200_compare_check.sh "$OUT"
# device seconds: 780 (measured 2026-12-04 on one H200: 702 s, paper 25 to 1,704 steps and
# paper+comp 25 to 3,000, each with its compilation and diagnostics; the rest a margin, as the
# explosion step of a seed moves between builds: 1,540 on 2026-11-30)
exec bash "$(dirname "$0")/h200_compare.sh" run "${1:-runs/h200}"
