"""A NumPy, bit-level emulation of the kernels' rounding points (float32 arithmetic, exact dots).

Used to check that every intended rounding survives `jit` (XLA may keep excess precision) on
CPU and GPU: the kernels should match this emulation bit for bit except where float32
accumulation order inside a dot moves a value across a rounding boundary, and should be
clearly farther from the same emulation with the intermediate roundings switched off.
Dots are computed exactly (float64) and rounded to float32, which is what an float32
accumulator gives up to its summation-order error. Arrays are NumPy, layout
[batch, seq, heads, head_dim]; the tiling of the forward pass over keys follows the kernel
(`block_k`), because the running max, and so every rounding of P̄, depends on it.
"""
from __future__ import annotations

import numpy as np

from pallas_kernels.policy import Compensation

F32 = np.float32


def _heads_first(x, group=1):
  x = np.asarray(x, np.float64).transpose(0, 2, 1, 3)            # [b, h, len, d]
  return np.repeat(x, group, axis=1) if group > 1 else x


def _dot(a, b):
  return (a.astype(np.float64) @ b.astype(np.float64)).astype(F32)


def _mask(q_len, kv_len, causal):
  valid = np.ones((q_len, kv_len), bool)
  return np.tril(valid) if causal else valid


def emulate_forward(query, key, value, *, causal, softmax_scale, block_k, compensation=None,
                    dtype, round_p=True):
  """Returns (out [b, q_len, h, d] as float32 values of `dtype`, lse [b, h, q_len] float32).

  `dtype` is the input dtype (an ml_dtypes / NumPy dtype); `round_p=False` skips the rounding
  of P̄ before the P̄V dot (to show that the test can tell the difference).
  """
  comp: Compensation | None = compensation
  group = query.shape[2] // key.shape[2]
  q, k, v = _heads_first(query), _heads_first(key, group), _heads_first(value, group)
  b, h, q_len, d = q.shape
  kv_len = k.shape[2]
  valid_all = _mask(q_len, kv_len, causal)
  m = np.full((b, h, q_len), -np.inf, F32)
  l = np.zeros((b, h, q_len), F32)
  acc = np.zeros((b, h, q_len, d), F32)
  for start in range(0, kv_len, block_k):
    sl = slice(start, min(start + block_k, kv_len))
    valid = valid_all[:, sl]
    if not valid.any():
      break
    s = _dot(q, k[:, :, sl].swapaxes(-1, -2)) * F32(softmax_scale)
    s = np.where(valid, s, F32(-np.inf)).astype(F32)
    tile_max = s.max(-1)
    m_tile = tile_max
    if comp is not None:
      n_ties = (valid & (s >= (tile_max - F32(comp.tie_tolerance))[..., None])).sum(-1)
      paper = np.where(tile_max > 0, F32(comp.beta - 1.0) * tile_max, -tile_max).astype(F32)
      shift = np.clip(paper, F32(comp.min_shift), F32(comp.max_shift)).astype(F32)
      m_tile = np.where(n_ties > 1, tile_max + shift, tile_max).astype(F32)
    with np.errstate(invalid="ignore"):
      m_new = np.maximum(m, m_tile)
      alpha = np.exp(m - m_new).astype(F32)
      p = np.exp(s - m_new[..., None]).astype(F32)
    l = (alpha * l + p.sum(-1, dtype=F32)).astype(F32)
    p_dot = p.astype(dtype).astype(F32) if round_p else p
    acc = (alpha[..., None] * acc + _dot(p_dot, v[:, :, sl])).astype(F32)
    m = m_new
  out = (acc / l[..., None]).astype(dtype).astype(F32)
  lse = (m + np.log(l)).astype(F32)
  return out.transpose(0, 2, 1, 3), lse


def emulate_backward(query, key, value, out, lse, d_out, *, causal, softmax_scale, dtype,
                     round_p=True, round_ds=True):
  """Returns (dq, dk, dv) as float32 values of `dtype` for the fa2 layout."""
  group = query.shape[2] // key.shape[2]
  q, k, v = _heads_first(query), _heads_first(key, group), _heads_first(value, group)
  o, do = _heads_first(out), _heads_first(d_out)
  valid = _mask(q.shape[2], k.shape[2], causal)
  delta = (do * o).astype(F32).sum(-1, dtype=F32)
  s = _dot(q, k.swapaxes(-1, -2)) * F32(softmax_scale)
  p = np.where(valid, np.exp(s - lse[..., None]), 0).astype(F32)
  dp = _dot(do, v.swapaxes(-1, -2))
  ds = np.where(valid, p * (dp - delta[..., None]), 0).astype(F32)
  p_r = p.astype(dtype).astype(F32) if round_p else p
  ds_r = ds.astype(dtype).astype(F32) if round_ds else ds
  dq = _dot(ds_r, k) * F32(softmax_scale)
  dk = (ds_r.swapaxes(-1, -2).astype(np.float64) @ q) * softmax_scale
  dv = p_r.swapaxes(-1, -2).astype(np.float64) @ do

  def back(x, grouped):
    if grouped and group > 1:
      b, h, n, d = x.shape
      x = x.reshape(b, h // group, group, n, d).sum(2)
    return x.astype(F32).astype(dtype).astype(F32).transpose(0, 2, 1, 3)

  return back(dq, False), back(dk, True), back(dv, True)
