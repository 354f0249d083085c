"""How does a GPT-2 training step scale over the local devices? (issue 8)

Question: tokens/s of gpt2-small (context 1024, BF16, our flash kernel) at a fixed per-device
batch on 1, 2, … N devices, data-parallel through `jax.shard_map` (`train.make_steps(mesh=…)`);
scaling efficiency = tokens/s(N) / (N · tokens/s(1)); and the collectives in each compiled
step: the shard_map step must all-reduce gradients and gather nothing, while the same step under
a plain sharded jit (no shard_map) is compiled too, to show what XLA does with the kernel's
custom call there.
Command (2 H200s): python3 experiments/04_data_parallel_scaling.py --out runs/scaling
CPU smoke (simulated devices share 2 cores, so the efficiency there means nothing):
    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu .venv/bin/python \
    experiments/04_data_parallel_scaling.py --model tiny --per-device-batch 2 --steps 2
Expected runtime: ~2 min on two H200s.
"""

import argparse

import jax

from jax_flashstable.bench import format_step_table, gpt2_step_table
from jax_flashstable.training.parallel import collective_counts, data_mesh, replicate, shard_batch
from jax_flashstable.results import run_meta, write_results


def plain_jit_collectives(model, attention, batch_size, mesh):
  """Collectives of the single-device step compiled with its inputs sharded over `mesh`."""
  from jax_flashstable.training.data import Dataset
  from jax_flashstable.training.train import TrainConfig, init_state, make_steps

  cfg = TrainConfig(model=model, attention=attention, batch_size=batch_size, progress=False)
  _, graphdef, params, tx, opt_state = init_state(cfg)
  step, _ = make_steps(graphdef, tx)  # no mesh: no shard_map
  x, y = Dataset(None, cfg.model_config().vocab_size).batch(
    "train", 0, 0, batch_size, cfg.model_config().block_size
  )
  lowered = step.lower(
    replicate(mesh, (params, opt_state)),
    shard_batch(mesh, x[None], 1),
    shard_batch(mesh, y[None], 1),
    jax.random.key(0),
  )
  return collective_counts(lowered.compile().as_text())


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="runs/scaling")
  ap.add_argument("--model", default="gpt2-small")
  ap.add_argument("--attention", default="fa2")
  ap.add_argument("--per-device-batch", type=int, default=16)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument(
    "--devices",
    default=None,
    help="comma-separated device counts (default: 1, 2, 4, … up to all devices)",
  )
  a = ap.parse_args()
  total = jax.device_count()
  try:
    counts = (
      [int(c) for c in a.devices.split(",")]
      if a.devices
      else [n for n in (1, 2, 4, 8, 16, 32, 64) if n < total] + [total]
    )
  except ValueError:
    raise SystemExit(
      f"--devices {a.devices!r}: expected comma-separated device counts, e.g. 1,2"
    ) from None
  for n in counts:
    if not 1 <= n <= total:
      raise SystemExit(f"--devices: {n} is not between 1 and the {total} devices here")
  if counts[0] != 1:
    raise SystemExit(f"--devices {a.devices}: start with 1, the baseline of the scaling efficiency")
  rows = []
  for n in counts:
    mesh = data_mesh(jax.devices()[:n])
    rows += gpt2_step_table(
      a.model, (a.attention,), a.per_device_batch * n, steps=a.steps, mesh=mesh
    )
  base = rows[0]["tokens_per_s"] / rows[0]["devices"]
  for r in rows:
    r["efficiency"] = r["tokens_per_s"] / (r["devices"] * base)
  plain = plain_jit_collectives(a.model, a.attention, a.per_device_batch * total, data_mesh())
  table = (
    format_step_table(rows)
    + "\n\n| devices | tokens/s | scaling efficiency |\n|---:|---:|---:|\n"
    + "\n".join(
      f"| {r['devices']} | {r['tokens_per_s']:,.0f} | {100 * r['efficiency']:.1f}% |" for r in rows
    )
    + f"\n\nThe same step without shard_map, inputs sharded over {total} devices (plain jit): "
    f"{plain['all_gathers']} all-gathers, {plain['all_reduces']} all-reduces."
  )
  write_results(
    a.out,
    "scaling",
    rows,
    table,
    run_meta(
      model=a.model,
      attention=a.attention,
      per_device_batch=a.per_device_batch,
      device_count=total,
      plain_jit=plain,
    ),
  )


if __name__ == "__main__":
  main()
