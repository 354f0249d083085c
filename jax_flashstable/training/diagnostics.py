"""Training diagnostics for the BF16 instability (Qiu & Yao 2025, §4), computed under jit.

Per layer and head, on one batch: the rate of rows whose key tiles had tied maxima (read from
the kernel's own statistics: the compensation's trigger), the max attention logit and the
attention entropy (sampled rows), the signed error of O and of delta = rowsum(dO∘O) of the
layer's attention against an FP32 recomputation (sampled rows, dO from the real loss), and the
spectral norm of W_Q and W_K per head and of the whole W_Q (power iteration, one step per call,
with the vectors carried between calls; at every (re)start of a run they start from random
vectors and take 50 steps on the current weights first, `converge_power_state`).
`train_and_evaluate` runs it every `diag_interval` steps and appends a row to
`diagnostics.jsonl`; `flashstable plot RUN_DIR` draws it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_flashstable.attention.api import flash_attention
from jax_flashstable.models.gpt2 import loss_fn
from pallas_kernels.policy import get_numerics

HIGHEST = jax.lax.Precision.HIGHEST


@functools.partial(jax.jit, static_argnums=0)
def init_power_state(cfg, key):
  """Unit vectors for the power iterations: q/k per head [L, H, D] and whole W_Q [L, C]."""
  kq, kk, kf = jax.random.split(key, 3)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  shape = (cfg.n_layer, cfg.n_head, cfg.head_dim)
  return dict(
    q=unit(jax.random.normal(kq, shape)),
    k=unit(jax.random.normal(kk, shape)),
    q_full=unit(jax.random.normal(kf, (cfg.n_layer, cfg.n_embd))),
  )


def _power_step(w, v):
  """One power-iteration step for σ_max(w); w [..., m, n], v [..., n] → (σ, new v)."""
  u = jnp.einsum("...mn,...n->...m", w, v, precision=HIGHEST)
  v = jnp.einsum("...mn,...m->...n", w, u, precision=HIGHEST)
  v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-30)
  sigma = jnp.linalg.norm(jnp.einsum("...mn,...n->...m", w, v, precision=HIGHEST), axis=-1)
  return sigma, v


def _attention_rows(q, k, v, rows, scale):
  """FP32 attention for sampled (batch, position) rows: logits [R, h, T], O [R, h, d]."""
  b_idx, t_idx = rows
  qr = q[b_idx, t_idx].astype(jnp.float32)  # [R, h, d]
  kr, vr = k[b_idx].astype(jnp.float32), v[b_idx].astype(jnp.float32)  # [R, T, h, d]
  s = jnp.einsum("rhd,rkhd->rhk", qr, kr, precision=HIGHEST) * scale
  visible = jnp.arange(k.shape[1])[None, None, :] <= t_idx[:, None, None]
  s = jnp.where(visible, s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("rhk,rkhd->rhd", p, vr, precision=HIGHEST)
  return s, p, o


@functools.partial(jax.jit, static_argnums=(0, 5))
def diagnose(graphdef, params, x, y, power, n_rows=64, key=None):
  """Diagnostics of one batch (x, y [batch, t] int32). Returns (metrics dict of arrays, power)."""
  model = nnx.merge(graphdef, params)
  cfg = model.config
  b, t = x.shape
  shape = (b, t, cfg.n_head, cfg.head_dim)
  zeros = [jnp.zeros(shape, jnp.float32) for _ in range(cfg.n_layer)]

  def loss_of(zs):
    records = [[] for _ in range(cfg.n_layer)]
    loss = loss_fn(model, x, y, list(zip(zs, records)), jax.random.fold_in(key, 2))
    return loss, [r[0] for r in records]

  key = jax.random.key(0) if key is None else key
  _, vjp, records = jax.vjp(loss_of, zeros, has_aux=True)
  d_outs = vjp(jnp.ones((), jnp.float32))[0]  # dO per layer
  rows = (
    jax.random.randint(key, (n_rows,), 0, b),
    jax.random.randint(jax.random.fold_in(key, 1), (n_rows,), 0, t),
  )
  scale = cfg.head_dim**-0.5
  out = {k: [] for k in ("tie_rate", "max_logit", "entropy", "o_err", "delta_err")}
  for layer, ((q, k, v, o), d_o) in enumerate(zip(records, d_outs)):
    att = cfg.attention_for(layer)
    if att.implementation == "flash":  # the kernel's own tie detection, on every row
      # the layer's own layout and tiles, with the tie rule switched on to count its trigger
      _, st = flash_attention(
        q,
        k,
        v,
        causal=True,
        softmax_scale=scale,
        stabilize=True,
        beta=att.beta,
        tie_tolerance=att.tie_tolerance,
        numerics=att.numerics,
        block_q=att.block_q,
        block_k=att.block_k,
        return_stats=True,
        rng_key=jax.random.fold_in(key, 3) if att.numerics == "stochastic" else None,
      )
      out["tie_rate"].append(jnp.mean(st.tied_tiles > 0, axis=(0, 1)))
    else:
      out["tie_rate"].append(jnp.full((cfg.n_head,), jnp.nan))
    s, p, o32 = _attention_rows(q, k, v, rows, scale)
    out["max_logit"].append(jnp.max(jnp.where(jnp.isfinite(s), s, -jnp.inf), axis=(0, 2)))
    out["entropy"].append(-jnp.mean(jnp.sum(jnp.where(p > 0, p * jnp.log(p), 0.0), -1), axis=0))
    o_rows, do_rows = o[rows[0], rows[1]], d_o[rows[0], rows[1]]  # [R, h, d]
    numerics = get_numerics(att.numerics if att.implementation == "flash" else "fa2")
    delta = numerics.delta(do_rows, o_rows)  # as the backward forms it
    delta32 = jnp.sum(do_rows * o32, axis=-1)
    out["o_err"].append(jnp.mean(o_rows.astype(jnp.float32) - o32, axis=(0, 2)))
    out["delta_err"].append(jnp.mean(delta - delta32, axis=0))
  metrics = {k: jnp.stack(v) for k, v in out.items()}  # [L, H]
  sigma, power = _power_steps(model, power)
  return metrics | sigma, power


def _power_steps(model, power):
  """One power-iteration step for W_Q and W_K per head and the whole W_Q of every layer."""
  cfg = model.config
  w = jnp.stack([blk.attn.c_attn.kernel[...] for blk in model.h])  # [L, C, 3C]
  c, d = cfg.n_embd, cfg.head_dim
  wq, wk = w[:, :, :c], w[:, :, c : 2 * c]
  per_head = lambda m: m.reshape(cfg.n_layer, c, cfg.n_head, d).transpose(0, 2, 1, 3)  # [L,H,C,D]
  sigma, new = {}, {}
  sigma["sn_q"], new["q"] = _power_step(per_head(wq), power["q"])
  sigma["sn_k"], new["k"] = _power_step(per_head(wk), power["k"])
  sigma["sn_q_full"], new["q_full"] = _power_step(wq, power["q_full"])
  return sigma, new


@functools.partial(jax.jit, static_argnums=(0, 3))
def converge_power_state(graphdef, params, power, iters=50):
  """`iters` power-iteration steps on the current weights: run once when a run (re)starts, so
  that the first diagnostics rows do not underestimate σ_max."""
  model = nnx.merge(graphdef, params)
  return jax.lax.fori_loop(0, iters, lambda _, p: _power_steps(model, p)[1], power)


def to_row(step, metrics) -> dict:
  """A JSON-ready diagnostics row: {step, name: nested lists [layer][head]}."""
  return dict(step=step, **{k: jax.device_get(v).tolist() for k, v in metrics.items()})
