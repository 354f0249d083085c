"""A NumPy, bit-level emulation of every precision layout's rounding points.

Used to check that every intended rounding survives `jit` (XLA may keep excess precision) on
CPU and GPU: the kernels should match this emulation bit for bit except where float32
accumulation order inside a dot moves a value across a rounding boundary, and be clearly
farther from the same emulation with the intermediate roundings switched off
(`intermediate=False`). Dots are computed exactly (float64) and rounded to float32, which is
what a float32 accumulator gives up to its summation-order error; everything else is float32
arithmetic in the kernel's order. Arrays are NumPy, layout [batch, seq, heads, head_dim]. The
tiling over keys (forward, dQ) and queries (dK, dV in the paper layout) follows the kernel,
because the running max and the bf16 buffers depend on it. See `pallas_kernels.policy.Numerics`
for the layouts.
"""

from __future__ import annotations

import numpy as np

from pallas_kernels.policy import BF16_MAX, Compensation, Numerics

F32 = np.float32
U32 = np.uint32


def round_bf16(x):
  """Round-to-nearest-even to bfloat16 on the bits, kept in float32 (as `policy.round_bf16`)."""
  bits = np.asarray(x, F32).view(U32)
  bits = bits + (U32(0x7FFF) + ((bits >> U32(16)) & U32(1)))
  return (bits & U32(0xFFFF0000)).view(F32)


def stochastic_bits(numerics, seeds, batch, heads, q_len, head_dim_padded):
  """The kernel's random bits for O, [batch, heads, q_len, head_dim_padded] uint32: the policy's
  own hash (`Numerics.random_bits`; a stream to reproduce, not a rounding to check)."""
  seeds = tuple(np.uint32(s) for s in np.asarray(seeds, U32))
  head = (np.arange(batch)[:, None] * heads + np.arange(heads)[None, :]).astype(U32)
  pos = (np.arange(q_len)[:, None] * head_dim_padded + np.arange(head_dim_padded)[None, :]).astype(
    U32
  )
  return np.asarray(numerics.random_bits(seeds, head[:, :, None, None], pos[None, None]), U32)


def _heads_first(x, group=1):
  x = np.asarray(x, np.float64).transpose(0, 2, 1, 3)  # [b, h, len, d]
  return np.repeat(x, group, axis=1) if group > 1 else x


def _dot(a, b):
  return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)


def _mask(q_len, kv_len, causal):
  valid = np.ones((q_len, kv_len), bool)
  return np.tril(valid) if causal else valid


def _cast(x, dtype):
  return np.asarray(x, F32).astype(dtype).astype(F32)


def _scores(q, k, numerics, scale, intermediate):
  qk = _dot(q, k.swapaxes(-1, -2))
  if numerics.paper and intermediate:
    return round_bf16(round_bf16(qk) * F32(scale))
  return (qk * F32(scale)).astype(F32)


def emulate_forward(
  query,
  key,
  value,
  *,
  causal,
  softmax_scale,
  block_k,
  dtype,
  numerics: Numerics = Numerics("fa2"),
  compensation: Compensation | None = None,
  intermediate=True,
  seeds=None,
  head_dim_padded=None,
):
  """Returns (out [b, q_len, h, d] float32 holding the output dtype's values,
  row_max and log(row_sum) [b, h, q_len] float32; lse = row_max + log(row_sum)).

  `dtype` is the input dtype (ml_dtypes / NumPy). `intermediate=False` skips every rounding
  before the final one (to show that the test can tell the difference). The stochastic layout
  needs the kernel's `seeds` and padded head_dim.
  """
  comp = compensation
  paper = numerics.paper and intermediate
  rb = round_bf16 if paper else (lambda x: np.asarray(x, F32))
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
    if not valid.any() and not numerics.paper:
      break  # fa2 skips tiles past the causal diagonal
    s = _scores(q, k[:, :, sl], numerics, softmax_scale, intermediate)
    s = np.where(valid, s, F32(-BF16_MAX) if numerics.paper else F32(-np.inf)).astype(F32)
    tile_max = s.max(-1)
    m_tile = tile_max
    if comp is not None:
      if numerics.paper:  # the paper's tie rule: masked scores count, the threshold in bf16
        n_ties = (s >= round_bf16(tile_max - F32(comp.tie_tolerance))[..., None]).sum(-1)
      else:
        n_ties = (valid & (s >= (tile_max - F32(comp.tie_tolerance))[..., None])).sum(-1)
      if numerics.paper and not comp.guard_paper:  # the literal shift
        with np.errstate(over="ignore"):  # β·max of a fully masked tile (−BF16_MAX): unused
          shifted = np.where(
            tile_max > 0,
            round_bf16(F32(comp.beta) * tile_max),
            np.where(tile_max < 0, F32(0), tile_max),
          ).astype(F32)
      else:  # the clipped shift
        paper_shift = np.where(tile_max > 0, F32(comp.beta - 1.0) * tile_max, -tile_max)
        shift = np.clip(paper_shift.astype(F32), F32(comp.min_shift), F32(comp.max_shift))
        shifted = (tile_max + shift.astype(F32)).astype(F32)
      fired = (n_ties > 1) & (np.abs(tile_max) >= F32(comp.shift_above))
      m_tile = np.where(fired, shifted, tile_max).astype(F32)
    with np.errstate(invalid="ignore"):
      m_new = np.maximum(m, m_tile)
      alpha = np.exp(rb(m - m_new)).astype(F32)
      p = np.exp(rb(s - m_new[..., None])).astype(F32)
    p_dot = _cast(p, "bfloat16" if numerics.paper else dtype) if intermediate else p
    tile_sum = (p_dot.astype(F32) if numerics.rounds_row_sum(dtype) else p).sum(-1, dtype=F32)
    if numerics.paper:
      tile_sum = np.maximum(tile_sum, F32(1e-10))
    l = rb(alpha * l + tile_sum)
    acc = rb(rb(alpha[..., None] * acc) + rb(_dot(p_dot, v[:, :, sl])))
    m = m_new
  o = (acc / l[..., None]).astype(F32)
  if numerics.stochastic:
    d_p = head_dim_padded or d
    bits = stochastic_bits(numerics, seeds, b, h, q_len, d_p)[..., :d]
    ob = o.view(U32) + (bits & U32(0xFFFF))
    out = (ob & U32(0xFFFF0000)).view(F32)
  elif numerics.out_float32:
    out = o
  elif numerics.paper:
    out = _cast(round_bf16(o), dtype)
  else:
    out = _cast(o, dtype)
  return out.transpose(0, 2, 1, 3), m, np.log(l).astype(F32)


def emulate_backward(
  query,
  key,
  value,
  out,
  row_max,
  log_l,
  d_out,
  *,
  causal,
  softmax_scale,
  dtype,
  numerics: Numerics = Numerics("fa2"),
  block_q=None,
  block_k=None,
  intermediate=True,
):
  """Returns (dq, dk, dv) as float32 holding values of `dtype`.

  The paper layout accumulates dK, dV per query tile of `block_q` and dQ per key tile of
  `block_k` in bf16 buffers; fa2 needs no tiling (float32 accumulation, one rounding).
  """
  if numerics.delta_float32 or numerics.center_keys:
    raise ValueError(
      f"the emulation covers the layouts' rounding points, not the backward "
      f"options (delta_float32={numerics.delta_float32}, "
      f"center_keys={numerics.center_keys}); FP64 tests check those"
    )
  paper = numerics.paper and intermediate
  group = query.shape[2] // key.shape[2]
  q, k, v = _heads_first(query), _heads_first(key, group), _heads_first(value, group)
  o = _heads_first(out)
  do = _heads_first(_cast(np.asarray(d_out, F32), dtype))
  valid = _mask(q.shape[2], k.shape[2], causal)
  prod = (do * o).astype(F32)
  delta = (round_bf16(prod) if paper else prod).sum(-1, dtype=F32)
  s = _scores(q, k, numerics, softmax_scale, intermediate)
  if (
    numerics.rounds_row_sum(dtype) and intermediate
  ):  # the forward's weights r(P̄)/l (`Numerics.probs`)
    lse = (row_max + log_l).astype(F32)
    scale_l = np.exp(row_max - lse) if numerics.single_lse else np.exp(-log_l)
    arg = (s - row_max[..., None]).astype(F32)  # exp's argument as the forward's (`exp_arg`)
    p_bar = round_bf16(np.exp(round_bf16(arg) if paper else arg).astype(F32))
    p = np.where(valid, p_bar * scale_l[..., None], 0).astype(F32)
  elif numerics.single_lse:  # one float32 lse per row, as production kernels (`Numerics.probs`)
    lse = (row_max + log_l).astype(F32)
    p = np.where(valid, np.exp(s - lse[..., None]), 0).astype(F32)
  else:
    p = np.where(valid, np.exp((s - row_max[..., None]) - log_l[..., None]), 0).astype(F32)
  dp = _dot(do, v.swapaxes(-1, -2))
  if paper:
    dp = round_bf16(dp)
    ds = np.where(valid, (p * F32(softmax_scale)) * (dp - delta[..., None]), 0).astype(F32)
  else:
    ds = np.where(valid, p * (dp - delta[..., None]), 0).astype(F32)
  low = "bfloat16" if numerics.paper else dtype
  p_r = _cast(p, low) if intermediate else p
  ds_r = _cast(ds, low) if intermediate else ds
  scale = 1.0 if numerics.paper else softmax_scale

  def tiled(a, b, axis_len, block):
    """Σ over tiles of a[..., tile] @ b[..., tile, :] with paper's bf16 buffers."""
    if not paper:
      return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)
    acc = np.zeros(a.shape[:-1] + (b.shape[-1],), F32)
    for start in range(0, axis_len, block):
      sl = slice(start, start + block)
      acc = round_bf16(acc + round_bf16(_dot(a[..., sl], b[..., sl, :])))
    return acc

  dq = tiled(ds_r, k, k.shape[2], block_k) * F32(scale)
  dk = tiled(ds_r.swapaxes(-1, -2), q, q.shape[2], block_q) * F32(scale)
  dv = tiled(p_r.swapaxes(-1, -2), do, q.shape[2], block_q)

  def back(x, grouped):
    x = np.asarray(x, np.float64)
    if grouped and group > 1:
      bb, hh, n, dd = x.shape
      x = x.reshape(bb, hh // group, group, n, dd).sum(2)
    return _cast(x.astype(F32), dtype).transpose(0, 2, 1, 3)

  return back(dq, False), back(dk, True), back(dv, True)
