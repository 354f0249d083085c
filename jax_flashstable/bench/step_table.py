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
  steps=30,
  warmup=3,
  mesh=None,
  around=None,
):
  """Training-step time, tokens/s and MFU of GPT-2 per attention choice, in one process.

  Every choice is compiled first; then its `warmup` untimed and `steps` timed steps are
  interleaved: round r runs step r of each choice on the same batch, the order rotating from
  round to round, so drifts in clock or temperature fall on every choice alike (the step's
  spread from run to run, 46–50 ms for gpt2-small on an H100 on 2026-12-06, exceeds the gaps
  being judged). Each row gives the median `step_ms` and the per-round times `step_ms_rounds`
  (`paired_step_ratio` compares two rows round by round).

  `batch_size` is the global batch; with a `mesh` (`parallel.data_mesh`) it is split over the
  mesh's devices (`train.make_steps`). MFU = (6·N + 12·n_layer·n_head·head_dim·T)·tokens/s /
  (devices · peak) (`train.peak_flops`; 989 TFLOP/s on H100/H200; NaN on other devices). Each
  row also counts the all-gathers and all-reduces in the compiled step's HLO. `around`: None
  or (start, stop), called before the first timed round and after the last (a profiler's
  switch: `experiments/21_step_kernels.py`).
  """
  from jax_flashstable.training.data import Dataset
  from jax_flashstable.models.gpt2 import count_params, flops_per_token
  from jax_flashstable.training.parallel import collective_counts, replicate, shard_batch
  from jax_flashstable.training.train import TrainConfig, init_state, make_steps, peak_flops

  devices = 1 if mesh is None else mesh.size
  place = (lambda a: a[None]) if mesh is None else (lambda a: shard_batch(mesh, a[None], 1))
  runs = []
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
    run = dict(
      attention=attention,
      mcfg=mcfg,
      t=t,
      n=n,
      state=state,
      key=key,
      batches=batches,
      compiled=compiled,
      collectives=collective_counts(compiled.as_text()),
      times=[],
      loss=float("nan"),
    )
    runs.append(run)

  def round_(r):  # step r of every choice, the order rotating; timed after the warm-up
    for i in range(len(runs)):
      run = runs[(i + r) % len(runs)]
      seconds = _step(run, r, place)
      if r >= warmup:
        run["times"].append(seconds)

  start, stop = around or (lambda: None, lambda: None)
  for r in range(warmup):  # the warm-up rounds interleaved too, untimed
    round_(r)
  start()
  try:
    for r in range(warmup, warmup + steps):
      round_(r)
  finally:  # a step that raises leaves no profiler running
    stop()
  rows = []
  for run in runs:
    dt = statistics.median(run["times"])
    tok_s = batch_size * run["t"] / dt
    rows.append(
      dict(
        attention=run["attention"],
        model=model,
        batch=batch_size,
        seq_len=run["t"],
        n_params=run["n"],
        devices=devices,
        step_ms=1e3 * dt,
        step_ms_rounds=[1e3 * x for x in run["times"]],
        tokens_per_s=tok_s,
        last_loss=run["loss"],
        **run["collectives"],
        mfu=flops_per_token(run["mcfg"], run["n"], run["t"])
        * tok_s
        / (devices * (peak_flops() or float("nan"))),
      )
    )
  return rows


def _step(run: dict, step: int, place) -> float:
  """One training step of `run` on its batch `step`, waited for (the loss read back); its
  seconds."""
  x, y = (place(a) for a in run["batches"][step])
  t0 = time.perf_counter()
  run["state"], m = run["compiled"](run["state"], x, y, jax.random.fold_in(run["key"], step))
  run["loss"] = float(m["loss"])
  return time.perf_counter() - t0


def paired_step_ratio(ours: dict, theirs: dict) -> float:
  """The median over rounds of ours' step time / theirs' in the same round (two rows of one
  `gpt2_step_table`): below 1, ours is the faster. ValueError if the rows' rounds differ in
  number."""
  a, b = ours["step_ms_rounds"], theirs["step_ms_rounds"]
  if len(a) != len(b) or not a:
    raise ValueError(f"rows of {len(a)} and {len(b)} rounds: not one interleaved table")
  return statistics.median(x / y for x, y in zip(a, b))
