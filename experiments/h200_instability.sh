#!/usr/bin/env bash
# Issue 6 on the H200 (device tool): `flashstable experiment instability` on the anchor recipe
# with the carried corpus (.data/, carry it), one process per variant running side by side
# on the GPU, each within BUDGET seconds; then one report over all runs. The device returns at
# most 8 files, so the run folders come back as one tarball.
# Usage (repo root, on the device): VARIANTS=paper,paper+comp SEEDS=0 BUDGET=520 \
#   bash experiments/h200_instability.sh "$OUT" [extra experiment options]
set -u
OUT=${1:-runs/h200}; shift || true
BUDGET=${BUDGET:-520}; VARIANTS=${VARIANTS:-paper,paper+comp}; SEEDS=${SEEDS:-0}
R=/tmp/instability
mkdir -p "$OUT" $R
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache FLASHSTABLE_CACHE=/tmp/fscache
for v in ${VARIANTS//,/ }; do
  python3 -m jax_flashstable.cli experiment instability --recipe anchor --data .data --variants "$v" \
    --seeds "$SEEDS" --time-budget "$BUDGET" --no-progress --out $R "$@" > "$OUT/log_$v.txt" 2>&1 &
done
wait
python3 -m jax_flashstable.cli experiment instability --recipe anchor --data .data --report-only --out $R "$@" | tail -25
cp $R/report.md $R/curves.png "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tgz" -C $R .
