"""Training diagnostics for the BF16 instability (Qiu & Yao 2025, §4), computed under jit.

Per layer and head, on one batch: the rate of rows whose key tiles had tied maxima (read from
the kernel's own statistics: the compensation's trigger), the max attention logit and the
attention entropy (sampled rows), the signed error of O and of delta = rowsum(dO∘O) of the
layer's attention against an FP32 recomputation (sampled rows, dO from the real loss), the
error of the layer's own dQ against FP32 attention's on rows sampled from the batch's first
`DQ_SEQUENCES` sequences (`dq_rows`, `dq_error`: the bias mechanism of Qiu & Yao 2025, §4 —
its size, the share of it along one direction, the rank-one error that accumulates in W_Q,
and its part along each row's keys' mean away from its exact dQ: `dq_error_along`), and the
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
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.models.gpt2 import loss_fn
from pallas_kernels.policy import get_numerics

HIGHEST = jax.lax.Precision.HIGHEST
DQ_SEQUENCES = 8  # the sequences of a batch whose rows `dq_rows` samples


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


def dq_rows(config, q, k, v, d_o, rows, softmax_scale, rng_key=None):
  """dQ of sampled rows from the layer's own attention (`attend`: its kernels, layout and
  backward options, or XLA's or cuDNN's backward), and exact.

  q, k, v, d_o: one layer's [batch, seq, heads, head_dim], causal; d_o is the cotangent of the
  attention's output, taken in the output's dtype as the training step has it; rows: (batch
  index, position) arrays [R]. The exact dQ is FP32 attention's: P, dP = dO·Vᵀ and delta =
  rowsum(dO∘O) from the FP32 O, dQ = scale·Σ_j P_j (dP_j − delta) k_j. Their difference holds
  the bias mechanism of Qiu & Yao 2025 (§4): a rounding that unbalances a row of dS adds
  (rowsum dS)·c to dQ, c the keys' common component. Returns (dQ of the attention, exact dQ),
  float32 [R, heads, head_dim]. Keys and values with as many heads as the queries (the model's
  attention; no grouped heads)."""
  b_idx, t_idx = rows
  y, vjp = jax.vjp(
    lambda q: attend(q, k, v, config, causal=True, softmax_scale=softmax_scale, rng_key=rng_key),
    q,
  )
  d_y = d_o.astype(y.dtype)
  dq = vjp(d_y)[0][b_idx, t_idx].astype(jnp.float32)
  _, p, o32 = _attention_rows(q, k, v, rows, softmax_scale)
  do_r = d_y[b_idx, t_idx].astype(jnp.float32)  # [R, h, d]
  kr, vr = k[b_idx].astype(jnp.float32), v[b_idx].astype(jnp.float32)  # [R, T, h, d]
  dp = jnp.einsum("rhd,rkhd->rhk", do_r, vr, precision=HIGHEST)
  ds = p * (dp - jnp.sum(do_r * o32, -1)[..., None])
  # Σ_j dS_j k_j taken as Σ_j dS_j (k_j − Σ_j P_j k_j): the same in exact arithmetic (each row
  # of dS sums to 0), without float32's cancellation along a large common key component
  k_mean = jnp.einsum("rhk,rkhd->rhd", p, kr, precision=HIGHEST)
  exact = softmax_scale * jnp.einsum("rhk,rkhd->rhd", ds, kr - k_mean[:, None], precision=HIGHEST)
  return dq, exact


def rms_row_norm(x):
  """The root mean square over rows of x [R, heads, head_dim]'s row norms, per head [h]: the
  exact dQ's size, which `dq_error` and `dq_error_along` divide by."""
  return jnp.sqrt(jnp.mean(jnp.sum(x**2, -1), axis=0))


def dq_error(formed, exact):
  """Per head, from dQ rows [R, heads, head_dim]: (the error's root mean square row norm
  relative to the exact dQ's, the share of the error's squared norm along its one leading
  direction in head_dim space). The bias mechanism gives an error (rowsum dS)_i·c on row i, c
  the keys' common component: rank one, a share near 1 whatever the signs of the rows' sums,
  and what accumulates in W_Q as a rank-one error (Qiu & Yao 2025, §4); rounding noise spreads
  over the head_dim directions (a share near 1/head_dim for many rows). NaN where a head's
  exact dQ or error is 0."""
  err = jnp.swapaxes(formed - exact, 0, 1)  # [h, R, d]
  size = rms_row_norm(exact)  # [h]
  energy = jnp.sum(err**2, axis=(1, 2))
  top = jnp.linalg.svd(err, compute_uv=False)[:, 0] ** 2
  rms = jnp.sqrt(energy / err.shape[1])
  return (
    jnp.where(size > 0, rms / size, jnp.nan),
    jnp.where(energy > 0, top / energy, jnp.nan),
  )


def row_key_mean(k, rows):
  """The keys' common component of sampled causal rows: the mean of the keys each row sees.

  k: [batch, seq, heads, head_dim] (any float dtype); rows: (batch index, position) arrays [R].
  Returns float32 [R, heads, head_dim], row (b, t)'s mean over keys 0..t. The bias mechanism's
  term (rowsum dS)·c (Qiu & Yao 2025, §4) lies along it: a shift common to a row's keys leaves
  its softmax and exact dQ unchanged, so only an unbalanced row of dS sees it."""
  b_idx, t_idx = rows
  prefix = jnp.cumsum(k.astype(jnp.float32), axis=1)[b_idx, t_idx]  # [R, h, d]
  return prefix / (t_idx.astype(jnp.float32) + 1.0)[:, None, None]


def _norm(x):
  """The norm of x [..., d] along the last axis, kept as [..., 1]."""
  return jnp.sqrt(jnp.sum(x**2, -1, keepdims=True))


def _unit(x):
  """x [..., d] over its norm along the last axis; 0 where that norm is 0."""
  norm = _norm(x)
  return jnp.where(norm > 0, x / jnp.where(norm > 0, norm, 1.0), 0.0)


def dq_error_along(formed, exact, direction):
  """Per head, from dQ rows [R, heads, head_dim] and a direction per row (same shape, e.g.
  `row_key_mean`): the rms over rows of the error's component along the row's direction less
  its part along the row's exact dQ (unit length), relative to the exact dQ's rms row norm (no
  unit; as `dq_error`'s size, so the two compare).

  Along the keys' mean it reads the (rowsum dS)·c term of the bias mechanism (Qiu & Yao 2025,
  §4), c the keys' common component (exactly: c = Σ_j P_j k_j, which the plain mean of the
  row's keys approaches when c dominates them), less the term's part along the exact dQ, so
  the term counts at sin θ of its size, θ its angle to the exact dQ (0.35–0.40 for keys that
  vary along c by ±2 at −480, `tests/test_diagnostics.py`). What is left out: an error that
  scales a row's dQ (a row whose output the kernel scaled toward 0, the paper layout's literal
  compensation, docs/numerics.md, errs by −(1 − s)·dQ). Any other error counts by its part
  along that direction: about its size/√head_dim for rounding noise. A row whose direction is
  0, or within 10⁻⁴ (relative) of its exact dQ's, contributes 0 (taken out twice, for
  float32); a row whose error is not finite makes the head's value inf; NaN where a head's
  exact dQ is 0."""
  e = _unit(exact)
  across = direction - jnp.sum(direction * e, -1, keepdims=True) * e
  across = across - jnp.sum(across * e, -1, keepdims=True) * e  # again: float32 leaves residue
  unit = jnp.where(_norm(across) > 1e-4 * _norm(direction), _unit(across), 0.0)
  err = formed - exact
  along = jnp.where(jnp.all(jnp.isfinite(err), -1), jnp.sum(err * unit, -1), jnp.inf)  # [R, h]
  size = rms_row_norm(exact)  # [h]
  rms = jnp.sqrt(jnp.mean(along**2, axis=0))
  return jnp.where(size > 0, rms / size, jnp.nan)


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
  # dQ's rows from the first DQ_SEQUENCES sequences only: a sequence's dQ depends on it alone,
  # and the backward of the whole batch would hold its residuals (+7.4 GiB for XLA's attention
  # at anchor-b128, compiled on a CPU)
  n_seq = min(b, DQ_SEQUENCES)
  dq_at = (
    jax.random.randint(jax.random.fold_in(key, 5), (n_rows,), 0, n_seq),
    jax.random.randint(jax.random.fold_in(key, 6), (n_rows,), 0, t),
  )
  out = {
    k: []
    for k in (
      "tie_rate",
      "max_logit",
      "entropy",
      "o_err",
      "delta_err",
      "dq_err",
      "dq_rank1",
      "dq_common",
    )
  }
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
    delta = numerics.delta(do_rows, o_rows)  # as an FA2 backward forms it from this O
    delta32 = jnp.sum(do_rows * o32, axis=-1)
    out["o_err"].append(jnp.mean(o_rows.astype(jnp.float32) - o32, axis=(0, 2)))
    out["delta_err"].append(jnp.mean(delta - delta32, axis=0))
    rng = jax.random.fold_in(key, 4) if att.numerics == "stochastic" else None
    dq, exact = dq_rows(att, q[:n_seq], k[:n_seq], v[:n_seq], d_o[:n_seq], dq_at, scale, rng)
    dq_err, dq_rank1 = dq_error(dq, exact)
    out["dq_err"].append(dq_err)
    out["dq_rank1"].append(dq_rank1)
    out["dq_common"].append(dq_error_along(dq, exact, row_key_mean(k[:n_seq], dq_at)))
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
