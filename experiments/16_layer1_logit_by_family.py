"""Does a run's layer 1 climb as the paper layout's runs do, or stay as the float32-score
kernels' do? Layer 1's max logit (the largest scaled score q·k/√head_dim over the diagnostics
rows, the largest head; `training.diagnostics`, every 100 steps) of every anchor-b128 run kept
in git, by family: JAX's paper layout (every `paper*` variant: with and without the
compensation, centring, delta32, the guards), JAX's kernels with float32 scores (fa2, cudnn,
xla, reference-fp32, fp32_out, stochastic and their fixes), PyTorch's twins of the other
attentions (SDPA, reference-fp32), and each PyTorch paper-layout twin on its own, with how
many of JAX's paper-layout runs sit below it at each step. Issue 18: the twin's paper 29 of
2026-12-04 stayed calm where every JAX paper run climbed.

    PYTHONPATH=. python3 experiments/16_layer1_logit_by_family.py [STEP ...]   # CPU, ~10 s

Packs: experiments/results/*b128/runs*.jsonl.xz (JAX) and twin-*.jsonl.xz (their `torch/`
runs; their `jax/` runs are copies of the former). A run in several packs counts once
(`instability.read_packs` with `twin.rounding_rank`, as `crosscheck-train --runs`: a twin
whose compiler kept its roundings before one whose compiler dropped them, then the copy that
trained the most steps; so since 2026-12-05 the paper 29 here is the twin that rounds on the
bits, which exploded at 1,465, not the calm one of 2026-12-04).
"""

import json
import pathlib
import statistics
import sys

from jax_flashstable.experiment import instability, twin

STEPS = [int(a) for a in sys.argv[1:]] or [300, 600, 900, 1200, 1500, 1800, 2100]
RESULTS = pathlib.Path("experiments/results")


def layer1_logit(records):
  """{step: layer 1's max logit, the largest head} of a run's diagnostics rows."""
  rows = [r for rec in records if rec["file"] == "diagnostics.jsonl" for r in rec["rows"]]
  return {r["step"]: max(r["max_logit"][1]) for r in rows if r.get("max_logit")}


def family(side, variant):
  if side == "torch":
    return "PyTorch paper layout (twin)" if variant.startswith("paper") else "PyTorch other twins"
  return "JAX paper layout" if variant.startswith("paper") else "JAX float32 scores"


def main():
  runs = {}  # (side, variant, seed) → {step: logit}
  jax_packs = sorted(RESULTS.glob("*b128/runs*.jsonl.xz"))
  twin_packs = sorted(RESULTS.glob("*b128/twin-*.jsonl.xz"))
  for side, packs in (("jax", jax_packs), ("torch", twin_packs)):
    for name, run in instability.read_packs(packs, rank=twin.rounding_rank).items():
      if side == "torch" and not name.startswith("torch/"):
        continue  # a twin pack's copy of a JAX run
      variant, seed = name.removeprefix("torch/").rsplit("/seed", 1)
      logit = layer1_logit(run["records"])
      if logit:
        runs[(side, variant, int(seed))] = logit
  print(
    f"# layer 1's max logit (largest head), anchor-b128; {len(jax_packs)} JAX packs, "
    f"{len(twin_packs)} twin packs\n"
  )
  print("| family | runs | " + " | ".join(f"step {s}" for s in STEPS) + " |")
  print("|---|---:|" + "---|" * len(STEPS))
  names = ["JAX paper layout", "JAX float32 scores", "PyTorch other twins"]
  for name in names:
    logits = [d for (side, v, _), d in runs.items() if family(side, v) == name]
    cells = []
    for s in STEPS:
      v = sorted(d[s] for d in logits if s in d)
      cells.append(
        f"{v[0]:.1f} / {statistics.median(v):.1f} / {v[-1]:.4g} ({len(v)})" if v else "–"
      )
    print(
      f"| {name}: min / median / max (runs at the step) | {len(logits)} | "
      + " | ".join(cells)
      + " |"
    )
  paper = [d for (side, v, _), d in runs.items() if family(side, v) == "JAX paper layout"]
  for (side, variant, seed), d in sorted(runs.items()):
    if family(side, variant) != "PyTorch paper layout (twin)":
      continue
    cells = []
    for s in STEPS:
      if s not in d:
        cells.append("–")
        continue
      below = sum(1 for p in paper if s in p and p[s] < d[s])
      cells.append(f"{d[s]:.1f} ({below} of {sum(1 for p in paper if s in p)} below)")
    print(f"| twin {variant} {seed} | 1 | " + " | ".join(cells) + " |")
  seeds = {seed for (side, v, seed) in runs if family(side, v) == "PyTorch paper layout (twin)"}
  print("\n# every run at the paper twins' seeds\n")
  for (side, variant, seed), d in sorted(runs.items(), key=lambda kv: (kv[0][2], kv[0])):
    if seed in seeds:
      print(
        json.dumps(
          dict(
            run=f"{side}/{variant}/seed{seed}", **{str(s): round(d[s], 1) for s in STEPS if s in d}
          )
        )
      )


if __name__ == "__main__":
  main()
