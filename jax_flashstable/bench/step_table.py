"""GPT-2 training-step time, tokens/s and MFU per attention choice (`gpt2_step_table`)."""

from __future__ import annotations

import statistics
import time

import jax


def gpt2_step_table(
  model="gpt2-small",
  attentions=("fa2", "fa2+comp", "cudnn"),
  batch_size=16,
  seq_len=None,
  steps=10,
  warmup=3,
  mesh=None,
):
  """Training-step time, tokens/s and MFU of GPT-2 per attention choice, in one process.

  `batch_size` is the global batch; with a `mesh` (`parallel.data_mesh`) it is split over the
  mesh's devices (`train.make_steps`). MFU = (6·N + 12·n_layer·n_head·head_dim·T)·tokens/s /
  (devices · peak) (`train.peak_flops`; 989 TFLOP/s on H100/H200; NaN on other devices). Each
  row also counts the all-gathers and all-reduces in the compiled step's HLO.
  """
  from jax_flashstable.training.data import Dataset
  from jax_flashstable.models.gpt2 import count_params, flops_per_token
  from jax_flashstable.training.parallel import collective_counts, replicate, shard_batch
  from jax_flashstable.training.train import TrainConfig, init_state, make_steps, peak_flops

  devices = 1 if mesh is None else mesh.size
  place = (lambda a: a[None]) if mesh is None else (lambda a: shard_batch(mesh, a[None], 1))
  rows = []
  for attention in attentions:
    cfg = TrainConfig(
      model=model,
      attention=attention,
      batch_size=batch_size,
      seq_len=seq_len,
      steps=warmup + steps,
      progress=False,
    )
    mcfg = cfg.model_config()
    t = cfg.seq_len or mcfg.block_size
    data = Dataset(None, mcfg.vocab_size)
    _, graphdef, params, tx, opt_state = init_state(cfg)
    n = count_params(params)
    state, key = (params, opt_state), jax.random.key(0)  # key: numerics="stochastic"
    if mesh is not None:
      state = replicate(mesh, state)
    batches = [data.batch("train", 0, step, batch_size, t) for step in range(warmup + steps)]
    train_step, _ = make_steps(graphdef, tx, mesh)
    x0, y0 = (place(a) for a in batches[0])
    compiled = train_step.lower(state, x0, y0, key).compile()
    collectives = collective_counts(compiled.as_text())
    times = []
    for step, (x, y) in enumerate(batches):
      x, y = place(x), place(y)
      t0 = time.perf_counter()
      state, m = compiled(state, x, y, jax.random.fold_in(key, step))
      loss = float(m["loss"])
      if step >= warmup:
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    tok_s = batch_size * t / dt
    rows.append(
      dict(
        attention=attention,
        model=model,
        batch=batch_size,
        seq_len=t,
        n_params=n,
        devices=devices,
        step_ms=1e3 * dt,
        tokens_per_s=tok_s,
        last_loss=loss,
        **collectives,
        mfu=flops_per_token(mcfg, n, t) * tok_s / (devices * (peak_flops() or float("nan"))),
      )
    )
  return rows
