"""Issue 19: why `flashstable bench`'s table and its `--targets` disagree on ours against cuDNN
in the same run (H200 2026-12-01: forward 0.75× in the table, 0.705× paired; H100 2026-12-05:
0.78× and 0.715×, forward+backward 0.81× and 0.767×, where the target is 0.80×). The table
times each implementation alone (`timing.seconds_per_call`: ~10 calls back to back per timing,
the median of 20); the targets time interleaved pairs (`timing.paired_overhead`: each side 10
calls, the median of the pairs' ratios). Here, for the forward and forward+backward of ATTENTION
against REFERENCE on one problem, every method on the same compiled functions, time(ref) /
time(ours) (ours as a fraction of the reference's speed):

- blocks: each side timed alone (as the table), in the order A B A B, each block's ratio;
- paired: `paired_overhead` with 10 calls a side (as the targets);
- primed: the same pairs, each side called once and waited for before its timing (is the
  first call after the other implementation slow?);
- long: pairs of 50 calls a side (does the switch cost a fixed time per timing?).

    python3 experiments/19_timing_methods.py [--causal] [--shape B,N,H,HK,D] [--pairs 20] \
      [--attention fa2+comp] [--reference cudnn] [--out FILE]

Default shape b4 × 4096 × 16 × d128 bf16 (the targets'). ~1 minute on one H100. On a CPU
only with a reference that runs there (e.g. --reference xla, a small shape): a check of the
script, not a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def primed_pairs(run_a, run_b, pairs, inner=10):
  """time(b)/time(a) per pair as `timing.paired_overhead` (the order alternating), each side
  called once and waited for just before its timing."""
  ratios = []
  for i in range(pairs):
    t = {}
    for which, run in (("a", run_a), ("b", run_b)) if i % 2 == 0 else (("b", run_b), ("a", run_a)):
      run(1)
      t0 = time.perf_counter()
      run(inner)
      t[which] = time.perf_counter() - t0
    ratios.append(t["b"] / t["a"])
  return ratios


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--pairs", type=int, default=20)
  ap.add_argument("--shape", default="4,4096,16,16,128", help="batch,len,heads,kv_heads,head_dim")
  ap.add_argument("--attention", default="fa2+comp")
  ap.add_argument("--reference", default="cudnn")
  ap.add_argument("--out", default=None, help="also append every line to this file")
  a = ap.parse_args(argv)
  name = "19_timing_methods"
  from jax_flashstable.bench.runners import attention_config
  from jax_flashstable.lab.shapes import Shape

  try:
    shape = Shape.parse(a.shape, causal=a.causal)  # the bench's shape grammar and checks
    for spec in (a.attention, a.reference):
      attention_config(spec)  # the bench's names
  except ValueError as e:
    sys.exit(f"{name}: {e}")
  if a.pairs < 1:
    sys.exit(f"{name}: --pairs {a.pairs} (at least 1)")
  run(a, shape)


def run(a, shape):
  import jax
  import jax.numpy as jnp

  from jax_flashstable.bench.runners import runs
  from jax_flashstable.bench.timing import (
    calls_per_timing,
    line_printer,
    median_seconds,
    paired_overhead,
  )
  from jax_flashstable.lab.shapes import make_inputs

  say = line_printer(a.out)
  say(
    f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {shape.name}; time(ref)/time(ours)"
  )
  q, k, v, do = make_inputs(shape, jnp.bfloat16, 0)
  ours, ref = runs(a.attention, shape, q, k, v, do), runs(a.reference, shape, q, k, v, do)
  for part, i in (("fwd", 0), ("fwdbwd", 1)):
    a_run, b_run = ours[i], ref[i]
    for r in (a_run, b_run):
      median_seconds(r, warmup=2, reps=1)  # compiled and warm
    calls = calls_per_timing(a_run)
    blocks = []
    for _ in range(2):  # A B A B
      ta = median_seconds(a_run, warmup=1, reps=20, calls=calls)
      tb = median_seconds(b_run, warmup=1, reps=20, calls=calls)
      blocks.append((ta, tb))
    say(
      f"{part} blocks ({calls} calls a timing): "
      + ", ".join(f"{tb / ta:.3f} ({ta * 1e3:.3f} / {tb * 1e3:.3f} ms)" for ta, tb in blocks)
    )
    say(f"{part} paired (10 calls a side): {1 + paired_overhead(a_run, b_run, a.pairs):.3f}")
    primed = primed_pairs(a_run, b_run, a.pairs)
    q1, q3 = statistics.quantiles(primed, n=4)[::2] if len(primed) > 1 else (primed[0],) * 2
    say(f"{part} primed pairs: {statistics.median(primed):.3f} (quartiles {q1:.3f}–{q3:.3f})")
    say(
      f"{part} long pairs (50 calls a side): {1 + paired_overhead(a_run, b_run, a.pairs, 50):.3f}"
    )


if __name__ == "__main__":
  main()
