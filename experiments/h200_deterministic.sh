#!/usr/bin/env bash
# `flashstable train --deterministic` on the GPU (device tool, one H100 or H200, one call of at
# most 10 min), after experiments/results/h200-2026-12-07h-targets-step-kernels: (1) the
# option's tests and the training tests on the GPU; (2) two runs of gpt2-small (the corpus in
# .data, batch 16, 40 steps, compensation on) with --deterministic, their losses compared bit
# for bit, and two without it, to show what the flag changes; (3) the step's cost, experiment
# 02 with and without the flag, fa2+comp alone, 20 rounds each (separate processes: the flag
# is read once a process).
# Usage (repo root, on the device, carry .data): bash experiments/h200_deterministic.sh "$OUT"
# device seconds: at most ~520 (timeouts 120 + 30 s grace + 4 × 60 + 2 × 70)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
nvidia-smi -L
gpu_tests 120 -n 4 -vv --tb=short tests/test_train.py \
  tests/test_cli.py::test_train_with_a_layer_override \
  tests/test_experiment.py::test_the_main_jobs_gpu_runs_show_the_explosion_and_the_runaway
runs=/tmp/det-runs
rm -rf $runs
for name in det1 det2 plain1 plain2; do
  flag=$([[ $name == det* ]] && echo --deterministic || echo --no-deterministic)
  timeout 60 python3 -m jax_flashstable.cli train $flag --model gpt2-small --data .data \
    --attention fa2+comp --batch-size 16 --steps 40 --eval-interval 0 --checkpoint-interval 0 \
    --no-progress --out-dir $runs/$name > $runs.$name.log 2>&1
  echo "train $name ($flag): exit $?"
done
python3 - $runs > "$OUT/repeat.md" <<'PY'
import json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
loss = {p.name: [json.loads(x)["loss"] for x in (p / "metrics.jsonl").read_text().splitlines()
                 if "loss" in json.loads(x)] for p in sorted(runs.iterdir())}
for a, b in (("det1", "det2"), ("plain1", "plain2")):
  la, lb = loss.get(a, []), loss.get(b, [])
  parted = next((i + 1 for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
  print(f"- {a} vs {b}: {len(la)} and {len(lb)} steps; "
        + ("the same losses bit for bit" if parted is None and la == lb else f"parted at step {parted}"))
print("- the last step's losses:", {k: v[-1] if v else None for k, v in loss.items()})
PY
cat "$OUT/repeat.md"
for flag in "" "--xla_gpu_deterministic_ops=true"; do
  XLA_FLAGS=$flag timeout 70 python3 experiments/02_gpt2_step_time.py --steps 20 \
    --attention fa2+comp --out /tmp/step${flag:+-det} > /tmp/step${flag:+-det}.log 2>&1
  echo "step (XLA_FLAGS=$flag): exit $?"; grep "^| fa2" /tmp/step${flag:+-det}.log
done | tee "$OUT/step-cost.md"
true
