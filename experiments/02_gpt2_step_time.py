"""What does our kernel cost inside a GPT-2 training step? (issue 3's H200 measurement)

Question: step time, tokens/s and MFU of gpt2-small at context 1024 in BF16 with `flash`,
`fa2+comp` and `cudnn` attention, in one run, their steps interleaved (each row's step time
against the first row's: the median of the rounds' ratios).
Command (H200): python3 experiments/02_gpt2_step_time.py --out runs/step
CPU smoke: python experiments/02_gpt2_step_time.py --model tiny --batch 2 --steps 2 \
    --attention fa2 --attention paper+comp
Expected runtime: ~2 min on one H200.
"""

import argparse

import jax

from jax_flashstable.results import run_meta, write_results
from jax_flashstable.bench import format_step_table, gpt2_step_table
from jax_flashstable.bench.step_table import paired_step_ratio


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="runs/step")
  ap.add_argument("--model", default="gpt2-small")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--steps", type=int, default=30, help="interleaved timed rounds")
  ap.add_argument(
    "--attention",
    action="append",
    help="an attention spec (repeatable), e.g. paper+comp; default fa2, fa2+comp, cudnn (GPU)",
  )
  a = ap.parse_args()
  attentions = a.attention or (
    ["fa2", "fa2+comp", "cudnn"] if jax.default_backend() == "gpu" else ["fa2", "xla"]
  )
  rows = gpt2_step_table(a.model, tuple(attentions), a.batch, steps=a.steps)
  paired = "\n".join(
    f"- {r['attention']}: {paired_step_ratio(r, rows[0]):.3f}× {rows[0]['attention']}'s step "
    f"time (median of {a.steps} interleaved rounds)"
    for r in rows[1:]
  )
  write_results(
    a.out,
    "step_time",
    rows,
    format_step_table(rows) + ("\n\n" + paired if paired else ""),
    run_meta(model=a.model, batch=a.batch),
  )


if __name__ == "__main__":
  main()
