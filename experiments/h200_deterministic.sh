#!/usr/bin/env bash
# `flashstable train --deterministic` on the GPU (device tool, one H100 or H200, one call of at
# most 10 min), after experiments/results/h200-2026-12-07h-targets-step-kernels: (1) the
# option's tests and the training tests on the GPU; (2) two runs of gpt2-small (the corpus in
# .data, batch 16, 40 steps, compensation on) with --deterministic, their losses compared bit
# for bit, and two without it, to show what the flag changes; (3) the step's cost, experiment
# 02 with and without the flag, fa2+comp alone, 20 rounds each (separate processes: the flag
# is read once a process).
# Usage (repo root, on the device, carry .data): bash experiments/h200_deterministic.sh "$OUT"
# TESTS=0, RUNS=0 or STEP=0 leave a part out; all three exceed one call (10 min): the first run
# of each flag compiles (gpt2-small fa2+comp, H100 2026-12-07: 160 s with the flag, about the
# same without; the second 79 s), so the tests (~120 s) and the runs (440 s) fill one call and
# the step's cost (2 × 110 s) needs another: `TESTS=0 RUNS=0 bash ...`. Done on an H100
# 2026-12-07 (experiments/results/h100-2026-12-07i-deterministic): the tests and the runs with
# the flag; the runs without it in an ad-hoc call; the step's cost on an H100 the same day
# (experiments/results/h100-2026-12-07j-stalls: +24.5%).
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
[[ ${TESTS:-1} == 0 ]] || gpu_tests 90 -n 4 -vv --tb=short tests/test_train.py \
  tests/test_cli.py::test_train_with_a_layer_override \
  tests/test_experiment.py::test_the_main_jobs_gpu_runs_show_the_explosion_and_the_runaway
if [[ ${RUNS:-1} != 0 ]]; then
runs=/tmp/det-runs
rm -rf $runs
start=$(date +%s)
for name in det1 det2 plain1 plain2; do
  flag=$([[ $name == det* ]] && echo --deterministic || echo --no-deterministic)
  left=$(( 440 - ($(date +%s) - start) ))
  (( left > 20 )) || { echo "train $name: not run (the runs' 440 s are spent)"; continue; }
  timeout $left python3 -m jax_flashstable.cli train $flag --model gpt2-small --data .data \
    --attention fa2+comp --batch-size 16 --steps 40 --eval-interval 0 --checkpoint-interval 0 \
    --no-progress --out-dir $runs/$name > $runs.$name.log 2>&1
  echo "train $name ($flag): exit $? after $(( $(date +%s) - start )) s"
  grep -v Warning $runs.$name.log | tail -3
done > "$OUT/train.log"
cat "$OUT/train.log"
python3 - $runs > "$OUT/repeat.md" <<'PY'
import json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
loss = {}
for p in sorted(runs.iterdir()):
  metrics = p / "metrics.jsonl"
  rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
  loss[p.name] = [r["loss"] for r in rows if "loss" in r]
  config = p / "config.json"
  if config.exists():
    print(f"- {p.name}: config.json deterministic_ops = {json.loads(config.read_text()).get('deterministic_ops')}")
for a, b in (("det1", "det2"), ("plain1", "plain2")):
  la, lb = loss.get(a, []), loss.get(b, [])
  same = [repr(x) == repr(y) for x, y in zip(la, lb)]  # NaN == NaN by its bits' spelling
  parted = None if all(same) else same.index(False) + 1
  verdict = ("not compared (a run has no steps)" if not same
             else "the same losses bit for bit" if parted is None else f"parted at step {parted}")
  print(f"- {a} vs {b}: {len(la)} and {len(lb)} steps; {verdict}")
print("- the last step's losses:", {k: v[-1] if v else None for k, v in loss.items()})
PY
cat "$OUT/repeat.md"
fi
[[ ${STEP:-1} == 0 ]] || for flag in "" "--xla_gpu_deterministic_ops=true"; do
  XLA_FLAGS=$flag timeout 110 python3 experiments/02_gpt2_step_time.py --steps 20 \
    --attention fa2+comp --out /tmp/step${flag:+-det} > /tmp/step${flag:+-det}.log 2>&1
  echo "step (XLA_FLAGS=$flag): exit $?"; grep "^| fa2" /tmp/step${flag:+-det}.log
done | tee "$OUT/step-cost.md"
true
