"""How much memory does a training step ask for, before it runs? (issue 16: the FP32 reference
of anchor-b128 ran out of an H200's 140 GiB, alone on it, asking one 84.29 GiB buffer.)

Question: the compiled train step's temporary, argument and output bytes
(`jax.stages.Compiled.memory_analysis`) for a recipe and an attention, without running it —
on the device the step would run on, or on a CPU (XLA's CPU buffer assignment differs from the
GPU's: compare attentions with each other on one backend, not bytes across backends).
Command: python experiments/06_step_memory.py --recipe anchor-b128 \
    --attention reference-fp32 --attention xla
Measured (this project's 2-core CPU, 2026-12-01, JAX_PLATFORMS=cpu, the command above and
--attention reference-fp32 before and after the reference's backward recomputed its scores):
temp 127.33 GiB → 71.62 GiB; xla 117.77 GiB.
Expected runtime: ~10 s per attention (compiling only).
"""

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from jax_flashstable.experiment.instability import RECIPES, variant_attention
from jax_flashstable.training import train
from jax_flashstable.training.config import TrainConfig


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--recipe", default="anchor-b128", choices=sorted(RECIPES))
  ap.add_argument("--attention", action="append", help="a variant (repeatable); default fa2")
  ap.add_argument("--batch-size", type=int, help="default: the recipe's")
  a = ap.parse_args()
  fields = {f.name for f in dataclasses.fields(TrainConfig)}
  base = TrainConfig(**{k: v for k, v in RECIPES[a.recipe].items() if k in fields})
  if a.batch_size:
    base = dataclasses.replace(base, batch_size=a.batch_size)
  for variant in a.attention or ["fa2"]:
    attention, overrides = variant_attention(variant)
    cfg = dataclasses.replace(base, attention=attention, attention_overrides=overrides)
    _, graphdef, params, tx, opt = train.init_state(cfg)
    step, _ = train.make_steps(graphdef, tx)
    tokens = jax.ShapeDtypeStruct(
      (cfg.grad_accum, cfg.batch_size, cfg.seq_len or cfg.model_config().block_size), jnp.int32
    )
    m = step.lower((params, opt), tokens, tokens).compile().memory_analysis()
    gib = lambda n: f"{n / 2**30:.2f} GiB"
    print(
      f"{a.recipe} {variant} batch {cfg.batch_size} on {jax.devices()[0].platform}: "
      f"temp {gib(m.temp_size_in_bytes)}, arguments {gib(m.argument_size_in_bytes)}, "
      f"outputs {gib(m.output_size_in_bytes)}"
    )


if __name__ == "__main__":
  main()
