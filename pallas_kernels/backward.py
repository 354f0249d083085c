"""Backward flash-attention kernels (FlashAttention-2, Dao 2023, Alg. 2), deterministic.

Two kernels and no atomics: dK/dV with one program per (key tile, batch, query head) looping
over query tiles, and dQ with one program per (query tile, batch, query head) looping over key
tiles. `delta` = rowsum(dO ∘ O) is computed in float32 by XLA from the rounded output O (or,
with the delta_float32 option, from the float32 O the forward kept). For grouped-query
attention each query head writes its own float32 dK/dV partial and XLA sums the group in a
fixed order, so results are bitwise repeatable. P is recomputed from the forward's row max m
and log(row_sum) kept apart (`Numerics.probs`: their float32 sum, the usual lse, would lose
log(l) at large |m|), so the forward pass's compensation does not enter here. Every rounding point is a `numerics.`
call (`pallas_kernels.policy`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.forward import sub_tile_loop, dot_nn, dot_nt, dot_tn, score_mask


def _probs_and_dscores(q, k, v, do, m, log_l, delta, q_pos, k_pos, cfg):
  """P = exp(S − m − log l) and dS for one tile pair, float32, 0 where masked."""
  numerics = cfg.numerics
  valid = score_mask(q_pos, k_pos, causal=cfg.causal, kv_len=cfg.kv_len, q_len=cfg.q_len)
  s = numerics.scores(dot_nt(q, k), cfg.softmax_scale)  # [bq, bk]
  p = jnp.where(valid, numerics.probs(s, m[:, None], log_l[:, None], q.dtype), 0.0)
  dp = numerics.dp(dot_nt(do, v))  # dO Vᵀ, [bq, bk]
  ds = jnp.where(valid, numerics.dscores(p, dp, delta[:, None], cfg.softmax_scale), 0.0)
  return p, ds


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, log_l_ref, delta_ref, dk_ref, dv_ref, *, cfg):
  numerics, dtype = cfg.numerics, q_ref.dtype
  _, _, sub_q, bk = cfg.blocks.compute(numerics)  # query sub-tile; this program's key rows
  bq = cfg.blocks.block_q_bwd  # logical query tile (paper: numerics)
  k_tile = pl.program_id(0)
  k, v = k_ref[...], v_ref[...]  # [bk, d]
  k_pos = k_tile * bk + jnp.arange(bk)

  def body(i, carry):
    dk, dv = carry

    def sub(c, sums):
      dk_t, dv_t = sums
      rows = pl.ds(i * bq + c * sub_q, sub_q)
      q, do = q_ref[rows, :], do_ref[rows, :]
      p, ds = _probs_and_dscores(
        q,
        k,
        v,
        do,
        m_ref[rows],
        log_l_ref[rows],
        delta_ref[rows],
        i * bq + c * sub_q + jnp.arange(sub_q),
        k_pos,
        cfg,
      )
      return (
        dk_t + dot_tn(numerics.round_ds(ds, dtype), q),  # dSᵀ Q
        dv_t + dot_tn(numerics.round_p(p, dtype), do),
      )  # Pᵀ dO

    zeros = jnp.zeros_like(dk)
    dk_t, dv_t = sub_tile_loop(bq // sub_q, sub, (zeros, zeros))
    return numerics.accumulate(dk, dk_t), numerics.accumulate(dv, dv_t)

  # Causal: query tiles that end before this key tile starts see none of it.
  first = lax.div(k_tile * bk, jnp.int32(bq)) if cfg.causal else 0
  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = lax.fori_loop(first, pl.cdiv(cfg.q_len, bq), body, (zeros, zeros))
  dk_ref[...] = numerics.round_grad(dk, cfg.softmax_scale, dk_ref.dtype)
  dv_ref[...] = numerics.round_grad(dv, cfg.softmax_scale, dv_ref.dtype, scaled=False)


def dq_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, log_l_ref, delta_ref, *refs, cfg):
  numerics, dtype = cfg.numerics, q_ref.dtype
  kd_ref, dq_ref = refs if numerics.center_keys else (k_ref, refs[0])  # keys of dS K
  _, _, bq, sub_k = cfg.blocks.compute(numerics)  # this program's query rows; key sub-tile
  bk = cfg.blocks.block_k_bwd  # logical key tile (paper: numerics)
  q_tile = pl.program_id(0)
  q, do, m, log_l, delta = q_ref[...], do_ref[...], m_ref[...], log_l_ref[...], delta_ref[...]
  q_pos = q_tile * bq + jnp.arange(bq)

  def body(j, dq):
    def sub(c, dq_t):
      start = j * bk + c * sub_k
      k, v = k_ref[pl.ds(start, sub_k), :], v_ref[pl.ds(start, sub_k), :]
      _, ds = _probs_and_dscores(
        q, k, v, do, m, log_l, delta, q_pos, start + jnp.arange(sub_k), cfg
      )
      kd = kd_ref[pl.ds(start, sub_k), :] if numerics.center_keys else k
      return dq_t + dot_nn(numerics.round_ds(ds, dtype), kd)  # dS K

    return numerics.accumulate(dq, sub_tile_loop(bk // sub_k, sub, jnp.zeros_like(dq)))

  n = pl.cdiv(cfg.kv_len, bk)
  if cfg.causal:
    n = jnp.minimum(n, lax.div(bq * (q_tile + 1) + bk - 1, jnp.int32(bk)))
  dq = lax.fori_loop(0, n, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = numerics.round_grad(dq, cfg.softmax_scale, dq_ref.dtype)


def flash_backward(q, k, v, o, m, log_l, do, cfg, d_lse=None):
  """Gradients for padded [batch, len, heads, head_dim] arrays; returns (dq, dk, dv).

  `o`: the output as returned, or the float32 O before its rounding (delta_float32).
  `m`, `log_l` [batch, heads, q_len_p]: the forward's row max and log(row_sum).
  `d_lse` [batch, heads, q_len_p]: the cotangent of the returned lse, if any.
  """
  batch, q_len_p, num_heads, d = q.shape
  kv_len_p, num_kv_heads = k.shape[1], k.shape[2]
  group = num_heads // num_kv_heads
  _, _, bq, bk = cfg.blocks.compute(cfg.numerics)  # program tiles of the two kernels
  do = cfg.numerics.d_out(do, q.dtype)
  delta = cfg.numerics.delta_by_head(do, o, d_lse)  # [batch, heads, q_len_p]
  row_all = pl.BlockSpec((None, None, q_len_p), lambda t, b, h: (b, h, 0))
  q_all = pl.BlockSpec((None, q_len_p, None, d), lambda t, b, h: (b, 0, h, 0))
  kv_all = pl.BlockSpec((None, kv_len_p, None, d), lambda t, b, h: (b, 0, h // group, 0))

  # dK, dV: per query head; float32 partials when a group of heads shares one KV head.
  partial_dtype = q.dtype if group == 1 else jnp.float32
  kv_tile = pl.BlockSpec((None, bk, None, d), lambda t, b, h: (b, t, h // group, 0))
  out_tile = pl.BlockSpec((None, bk, None, d), lambda t, b, h: (b, t, h, 0))
  dk, dv = pl.pallas_call(
    functools.partial(dkv_kernel, cfg=cfg),
    grid=(kv_len_p // bk, batch, num_heads),
    in_specs=[q_all, kv_tile, kv_tile, q_all, row_all, row_all, row_all],
    out_specs=[out_tile, out_tile],
    out_shape=[jax.ShapeDtypeStruct((batch, kv_len_p, num_heads, d), partial_dtype)] * 2,
    compiler_params=cfg.compiler_params(backward=True),
    interpret=cfg.interpret,
    name=f"flashstable_backward_dkv_{cfg.numerics.name}",
  )(q, k, v, do, m, log_l, delta)
  if group > 1:
    dk = cfg.numerics.sum_group(dk.reshape(batch, kv_len_p, num_kv_heads, group, d), q.dtype)
    dv = cfg.numerics.sum_group(dv.reshape(batch, kv_len_p, num_kv_heads, group, d), q.dtype)

  q_tile = pl.BlockSpec((None, bq, None, d), lambda t, b, h: (b, t, h, 0))
  row_tile = pl.BlockSpec((None, None, bq), lambda t, b, h: (b, h, t))
  extra = [cfg.numerics.dq_keys(k, cfg.kv_len)] if cfg.numerics.center_keys else []
  dq = pl.pallas_call(
    functools.partial(dq_kernel, cfg=cfg),
    grid=(q_len_p // bq, batch, num_heads),
    in_specs=[q_tile, kv_all, kv_all, q_tile, row_tile, row_tile, row_tile] + [kv_all] * len(extra),
    out_specs=q_tile,
    out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    compiler_params=cfg.compiler_params(backward=True),
    interpret=cfg.interpret,
    name=f"flashstable_backward_dq_{cfg.numerics.name}",
  )(q, k, v, do, m, log_l, delta, *extra)
  return dq, dk, dv
