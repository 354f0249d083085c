"""How large are layer 1's attention errors in training, per variant, before any run leaves its
calm phase? From the diagnostics rows every anchor-b128 run kept in git logged (every 100
steps, 64 rows of the batch; `training.diagnostics`), over steps FIRST–LAST (default 300–900,
after warmup and before the earliest runaway but two): per run the medians over those rows and
layer 1's heads of |delta − delta32| (delta from the layer's own O against the float32 O's),
its mean sign (a bias keeps one sign), |O − O32|, dQ's error relative to the exact dQ
(`diagnostics.dq_error`) and the share of that error along its leading direction (the
(rowsum dS)·c term is rank one), and the run's outcome at the measured runaway threshold.

    PYTHONPATH=. python3 experiments/13_layer1_errors_by_variant.py [FIRST LAST]   # CPU, ~15 s
"""

import collections
import pathlib
import sys
import tempfile

import numpy as np

from jax_flashstable.experiment import instability
from jax_flashstable.training.train import TrainConfig, read_diagnostics

FIRST, LAST = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (300, 900)
PACKS = sorted(str(p) for p in pathlib.Path("experiments/results").glob("*b128/runs*.jsonl.xz"))


def layer1(rows, name):
  """[rows, heads] of a logged quantity in layer 1, or None when the runs did not log it."""
  if not rows or not rows[0].get(name):
    return None
  return np.array([r[name][1] for r in rows], float)


def main():
  base = TrainConfig(**instability.RECIPES["anchor-b128"])
  with tempfile.TemporaryDirectory() as tmp:
    instability.unpack_runs(PACKS, tmp)
    outcomes = {
      (r["variant"], r["seed"]): instability.outcome(r)
      for r in instability.collect(pathlib.Path(tmp), base)
    }
    per_variant = collections.defaultdict(list)
    for run in sorted(pathlib.Path(tmp).glob("*/seed*")):
      rows = [r for r in read_diagnostics(run) if FIRST <= r["step"] <= LAST]
      delta = layer1(rows, "delta_err")
      if delta is None:
        continue
      seed = int(run.name.removeprefix("seed"))
      dq, rank1 = layer1(rows, "dq_err"), layer1(rows, "dq_rank1")
      per_variant[run.parent.name].append(
        (
          seed,
          np.nanmedian(np.abs(delta)),
          np.nanmean(np.sign(delta)),
          np.nanmedian(np.abs(layer1(rows, "o_err"))),
          None if dq is None else np.nanmedian(dq),
          None if rank1 is None else np.nanmedian(rank1),
          outcomes.get((run.parent.name, seed), "?"),
        )
      )
  print(
    f"# layer 1, diagnostics rows at steps {FIRST}–{LAST}, medians over rows and heads; "
    f"{len(PACKS)} packs\n"
  )
  print(
    "| variant | seed | \\|delta err\\| | mean sign | \\|O err\\| | dQ err | rank-1 share | outcome |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---|")
  g = lambda x, f: "–" if x is None else format(x, f)  # noqa: E731
  for variant, runs in sorted(per_variant.items()):
    for seed, d, sign, o, dq, r1, out in runs:
      print(
        f"| {variant} | {seed} | {d:.2e} | {sign:+.2f} | {o:.2e} | {g(dq, '.4f')} | "
        f"{g(r1, '.2f')} | {out} |"
      )


if __name__ == "__main__":
  main()
