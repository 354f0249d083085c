"""Where does a training step's time go, kernel by kernel? (issue 19: gpt2-small's step against cuDNN's)

For each `--attention` spec: builds the training step of `--model` (gpt2-small) at `--batch`
(16), runs `--warmup` steps, then `--steps` steps under JAX's profiler (CUPTI: each kernel's
start and end on the GPU, the kernels overlapping as they do in training, nothing serialised);
reads the trace back (`jax.profiler.ProfileData`) and prints, per spec, the kernel time a step
by group (attention: our Mosaic GPU or Triton kernels, cuDNN's; matrix products; XLA fusions;
other) and the kernels whose time a step differs most between the first spec and the others.
The kernels' (name, ns) per step go to `--out`/kernels.json. `--fusions NAME,...` (profiler
names, e.g. input_concatenate_fusion_11) also prints those fusions' HLO from each compiled
step (XLA's dump, after optimisations), to say what a kernel that differs computes.
Command (device, one H100 or H200):
  python3 experiments/21_step_kernels.py --attention fa2+comp --attention cudnn --out runs/k
CPU smoke: python experiments/21_step_kernels.py --model tiny --batch 2 --attention fa2 --steps 1
(a CPU trace holds no GPU kernels: the table says so).
Expected runtime: about a minute a spec on the GPU (compilation, then the steps).
"""

import argparse
import collections
import json
import os
import pathlib
import tempfile


def fusions_in_dump(dump_dir, names) -> str:
  """The HLO of the fusions `names` (the profiler's spelling, `_` before the number) in every
  training-step module XLA dumped after optimisations under `dump_dir`: the fusion's line
  and the computation it calls, in the order the modules were compiled."""
  import re

  out = []
  for path in sorted(pathlib.Path(dump_dir).glob("*train_step*after_optimizations.txt")):
    text = path.read_text()
    out.append(f"== {path.name}")
    for name in names:
      hlo_name = re.sub(r"_(\d+)$", r".\1", name)
      line = next((x for x in text.splitlines() if f"%{hlo_name} = " in x), None)
      if line is None:
        out.append(f"{name}: not in this module")
        continue
      out.append(line.strip())
      called = re.search(r"calls=%([\w.\-]+)", line)
      if called:
        body = re.search(rf"^%{re.escape(called.group(1))} .*?^}}", text, re.M | re.S)
        out.append(body.group(0) if body else f"(computation {called.group(1)} not found)")
  return "\n".join(out)


def profile(attention, model, batch, warmup, steps) -> dict:
  """{"kernels": [(name, ns), ...] over `steps` profiled steps, "steps", "step_ms" (median
  wall time of the profiled steps), "lines"} for one attention spec."""
  import jax

  from jax_flashstable.bench.step_table import gpt2_step_table

  from jax_flashstable.bench.timing import kernels_of_trace

  with tempfile.TemporaryDirectory() as d:
    rows = gpt2_step_table(
      model,
      (attention,),
      batch,
      steps=steps,
      warmup=warmup,
      around=(lambda: jax.profiler.start_trace(d), jax.profiler.stop_trace),
    )
    lines = kernels_of_trace(d)
  kernels = [k for events in lines.values() for k in events]
  return dict(
    attention=attention,
    steps=steps,
    step_ms=rows[0]["step_ms"],
    lines={name: len(ev) for name, ev in lines.items()},
    kernels=kernels,
  )


GROUPS = (  # first match wins; kernel names as the profiler reports them ("flash": our Triton
  # kernels, flashstable_forward_* and flashstable_backward_*)
  ("attention", ("mosaic_gpu", "sdpa", "fmha", "flash", "cudnn")),
  ("matrix products", ("gemm", "nvjet", "cutlass", "xmma", "wgmma", "triton_")),
  ("XLA fusions", ("fusion", "wrapped_", "copy", "transpose", "reduce", "concatenate")),
)


def group_of(name: str) -> str:
  low = name.lower()
  for group, keys in GROUPS:
    if any(k in low for k in keys):
      return group
  return "other"


def summarize(runs: list[dict], top: int = 12) -> str:
  """The per-step kernel time by group of each run, then the kernels whose per-step time
  differs most between the first run and each other (`profile`'s dicts)."""
  names = [r["attention"] for r in runs]
  per_step = []
  for r in runs:
    c = collections.Counter()
    for k, ns in r["kernels"]:
      c[k[:90]] += ns / 1e3 / r["steps"]
    per_step.append(c)
  out = [f"| a step's kernels (µs) | {' | '.join(names)} |", f"|---|{'---:|' * len(names)}"]
  for g in [g for g, _ in GROUPS] + ["other"]:
    cells = [sum(us for k, us in c.items() if group_of(k) == g) for c in per_step]
    out.append(f"| {g} | " + " | ".join(f"{x:,.0f}" for x in cells) + " |")
  out.append("| all kernels | " + " | ".join(f"{sum(c.values()):,.0f}" for c in per_step) + " |")
  out.append(
    "| kernel launches a step | "
    + " | ".join(f"{len(r['kernels']) / r['steps']:.0f}" for r in runs)
    + " |"
  )
  out.append(
    "| step wall time (ms, median) | " + " | ".join(f"{r['step_ms']:.1f}" for r in runs) + " |"
  )
  if not any(r["kernels"] for r in runs):
    out.append("\n(no GPU kernels in the trace: not a GPU)")
  for r, c in zip(runs[1:], per_step[1:]):
    first = per_step[0]
    keys = sorted(set(first) | set(c), key=lambda k: -abs(first[k] - c[k]))[:top]
    out.append(f"\nkernels whose time a step differs most, {names[0]} | {r['attention']} (µs):")
    out += [f"  {first[k]:9.1f} {c[k]:9.1f}  {k}" for k in keys]
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--attention", action="append", required=True, help="a spec (repeatable)")
  ap.add_argument("--model", default="gpt2-small")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--steps", type=int, default=5, help="profiled steps a spec")
  ap.add_argument("--top", type=int, default=12)
  ap.add_argument("--out", default="runs/step_kernels")
  ap.add_argument("--fusions", default="", help="comma-separated fusion names whose HLO to print")
  a = ap.parse_args()
  from jax_flashstable.checks import integer
  from jax_flashstable.training.config import TrainConfig

  dump = tempfile.mkdtemp() if a.fusions else None
  if dump:  # before JAX starts its backend (TrainConfig.validate starts it: below)
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
    )
  try:  # every input checked before anything compiles, one line naming a bad one: the model,
    # each spec and whether this device runs it (`TrainConfig.validate`), the counts
    integer("--steps", a.steps, 1), integer("--warmup", a.warmup, 0), integer("--batch", a.batch, 1)
    for spec in a.attention:
      TrainConfig(model=a.model, attention=spec, batch_size=a.batch, progress=False).validate()
  except ValueError as e:
    raise SystemExit(f"21_step_kernels: {e}") from None
  runs = [profile(s, a.model, a.batch, a.warmup, a.steps) for s in a.attention]
  text = summarize(runs, a.top)
  print(text)
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "summary.md").write_text(text + "\n")
  (out / "kernels.json").write_text(json.dumps(runs))
  if dump:
    hlo = fusions_in_dump(dump, a.fusions.split(","))
    (out / "fusions.txt").write_text(hlo + "\n")
    print(hlo)
  print(f"files: {out}/summary.md, {out}/kernels.json" + (f", {out}/fusions.txt" if dump else ""))


if __name__ == "__main__":
  main()
