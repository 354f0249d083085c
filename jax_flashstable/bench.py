"""Kernel timing: FLOP counts (FlashAttention convention) and a side-by-side speed table."""
from __future__ import annotations

import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention import flash_attention


def attention_flops(batch, q_len, kv_len, num_heads, head_dim, causal, backward=False):
  """4·B·H·Lq·Lk·D for the forward (two matmuls); causal counts half; backward is 2.5× the
  forward, so forward+backward is 3.5× (FlashAttention-2's convention)."""
  f = 4.0 * batch * num_heads * q_len * kv_len * head_dim * (0.5 if causal else 1.0)
  return f * 3.5 if backward else f


def median_seconds(fn, *args, warmup=3, reps=20):
  """Median wall time of fn(*args) with a device sync, after `warmup` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def implementations(causal):
  """name -> attention function of (q, k, v); cuDNN only where a GPU is present."""
  impls = {
      "flash": lambda q, k, v: flash_attention(q, k, v, causal=causal),
      "flash+stabilize": lambda q, k, v: flash_attention(q, k, v, causal=causal, stabilize=True),
      "xla": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                          implementation="xla"),
  }
  if jax.default_backend() == "gpu":
    impls["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation="cudnn")
  return impls


def speed_table(batch=4, seq_len=4096, num_heads=16, head_dim=128, dtype=jnp.bfloat16,
                causals=(False, True), reps=20):
  """Forward and forward+backward TFLOP/s of every implementation, checked before timing.

  Returns a list of dict rows (impl, causal, fwd/fwdbwd ms and TFLOP/s, max |out − xla|).
  """
  rng = np.random.default_rng(0)
  shape = (batch, seq_len, num_heads, head_dim)
  q, k, v, do = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(4))
  rows = []
  for causal in causals:
    impls = implementations(causal)
    check = jax.jit(impls["xla"])(q, k, v).astype(jnp.float32)
    for name, f in impls.items():
      fwd = jax.jit(f)
      err = float(jnp.max(jnp.abs(fwd(q, k, v).astype(jnp.float32) - check)))

      def fwd_bwd(q, k, v, do, f=f):
        out, vjp = jax.vjp(f, q, k, v)
        return vjp(do)

      fb = jax.jit(fwd_bwd)
      t_f = median_seconds(fwd, q, k, v, reps=reps)
      t_fb = median_seconds(fb, q, k, v, do, reps=reps)
      flops = attention_flops(batch, seq_len, seq_len, num_heads, head_dim, causal)
      rows.append(dict(impl=name, causal=causal, fwd_ms=1e3 * t_f, fwdbwd_ms=1e3 * t_fb,
                       fwd_tflops=flops / t_f / 1e12, fwdbwd_tflops=3.5 * flops / t_fb / 1e12,
                       max_abs_diff_vs_xla=err))
  return rows


def format_table(rows):
  lines = ["| implementation | causal | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max abs diff vs xla |",
           "|---|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['impl']} | {r['causal']} | {r['fwd_ms']:.2f} | {r['fwd_tflops']:.0f} | "
                 f"{r['fwdbwd_ms']:.2f} | {r['fwdbwd_tflops']:.0f} | {r['max_abs_diff_vs_xla']:.2e} |")
  return "\n".join(lines)


def gpt2_step_table(model="gpt2-small", attentions=("flash", "flash-stable", "cudnn"),
                    batch_size=16, seq_len=None, steps=10, warmup=3):
  """Training-step time, tokens/s and MFU of GPT-2 per attention choice, in one process.

  MFU = (6·N + 12·n_layer·n_head·head_dim·T)·tokens/s / peak (`train.peak_flops`; 989 TFLOP/s
  on H100/H200; NaN on other devices).
  """
  from jax_flashstable.data import Dataset
  from jax_flashstable.gpt2 import flops_per_token
  from jax_flashstable.train import TrainConfig, init_state, make_steps, peak_flops
  from jax_flashstable.gpt2 import count_params
  rows = []
  for attention in attentions:
    cfg = TrainConfig(model=model, attention=attention, batch_size=batch_size, seq_len=seq_len,
                      steps=warmup + steps, progress=False)
    mcfg = cfg.model_config()
    t = cfg.seq_len or mcfg.block_size
    data = Dataset(None, mcfg.vocab_size)
    _, graphdef, params, tx, opt_state = init_state(cfg)
    n = count_params(params)
    train_step, _ = make_steps(graphdef, tx)
    state = (params, opt_state)
    times = []
    for step in range(warmup + steps):
      x, y = data.batch("train", 0, step, batch_size, t)
      t0 = time.perf_counter()
      state, m = train_step(state, x[None], y[None])
      loss = float(m["loss"])
      if step >= warmup:
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    tok_s = batch_size * t / dt
    rows.append(dict(attention=attention, model=model, batch=batch_size, seq_len=t, n_params=n,
                     step_ms=1e3 * dt, tokens_per_s=tok_s, last_loss=loss,
                     mfu=flops_per_token(mcfg, n, t) * tok_s / (peak_flops() or float("nan"))))
  return rows


def format_step_table(rows):
  out = ["| attention | model | batch × seq | step ms | tokens/s | MFU |", "|---|---|---|---:|---:|---:|"]
  for r in rows:
    mfu = "n/a" if math.isnan(r["mfu"]) else f"{100 * r['mfu']:.1f}%"
    out.append(f"| {r['attention']} | {r['model']} | {r['batch']}×{r['seq_len']} | {r['step_ms']:.1f} | "
               f"{r['tokens_per_s']:,.0f} | {mfu} |")
  return "\n".join(out)
