"""Forward flash-attention kernel: tiled online softmax (FlashAttention-2, Dao 2023, Alg. 1).

One program per (query tile, batch, head); the loop over key/value tiles runs inside it.
Inputs arrive padded by the wrapper (`pallas_kernels.attention`): sequence lengths to a
multiple of the tiles and head_dim to a power of two, because jax 0.11.2's Triton lowering
does not mask partial blocks. Padded keys are masked here (−inf score); padded query rows are
computed and sliced off by the wrapper. Every rounding point is a `numerics.` call
(`pallas_kernels.policy`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.policy import (
  compensated_tile_max,
  shifted_max,
  tie_count,
  tied_by_top2,
  tile_top2,
  tile_top2_merge,
)
from pallas_kernels.top2 import row_top2

HIGHEST = lax.Precision.HIGHEST


def dot_nt(a, b):
  """a @ bᵀ accumulated in float32 (HIGHEST: float32 operands must not become TF32)."""
  return lax.dot_general(
    a, b, (((1,), (1,)), ((), ())), precision=HIGHEST, preferred_element_type=jnp.float32
  )


def dot_nn(a, b):
  return lax.dot_general(
    a, b, (((1,), (0,)), ((), ())), precision=HIGHEST, preferred_element_type=jnp.float32
  )


def dot_tn(a, b):
  """aᵀ @ b accumulated in float32."""
  return lax.dot_general(
    a, b, (((0,), (0,)), ((), ())), precision=HIGHEST, preferred_element_type=jnp.float32
  )


def score_mask(q_pos, k_pos, *, causal, kv_len, q_len=None):
  """True where a score is kept: real key, (q_len given) real query, (causal) key ≤ query.

  Causal masks are top-left aligned, as in `jax.nn.dot_product_attention`. The forward pass
  leaves padded query rows unmasked so that their (discarded) outputs stay finite.
  """
  valid = jnp.broadcast_to((k_pos < kv_len)[None, :], (q_pos.shape[0], k_pos.shape[0]))
  if q_len is not None:
    valid = jnp.logical_and(valid, (q_pos < q_len)[:, None])
  if causal:
    valid = jnp.logical_and(valid, q_pos[:, None] >= k_pos[None, :])
  return valid


def num_key_tiles(q_tile, *, block_q, block_k, kv_len, causal):
  """How many key tiles query tile `q_tile` visits (causal: none past the diagonal).

  Pass causal=False to visit all of them (the paper layout does: its kernel processes fully
  masked tiles, which its tie rule sees as tied at −BF16_MAX and shifts to 0).
  """
  n = pl.cdiv(kv_len, block_k)
  if causal:
    n = jnp.minimum(n, lax.div(block_q * (q_tile + 1) + block_k - 1, jnp.int32(block_k)))
  return n


def sub_tile_loop(n, body, init):
  """fori_loop over sub-tiles; inlined when there is only one."""
  return body(0, init) if n == 1 else lax.fori_loop(0, n, body, init)


def forward_kernel(q_ref, k_ref, v_ref, *refs, cfg):
  numerics, dtype, comp = cfg.numerics, q_ref.dtype, cfg.compensation
  block_q, sub_k = cfg.blocks.compute(numerics)[:2]  # program rows; key sub-tile
  block_k = cfg.blocks.block_k  # logical key tile (numerics)
  n_sub = block_k // sub_k
  seed_ref = refs[0] if numerics.stochastic else None
  o_ref, m_ref, log_l_ref, *refs = refs[1:] if numerics.stochastic else refs
  o32_ref = refs.pop(0) if numerics.delta_float32 else None  # the float32 O for delta
  stats_refs = refs  # max_p, tied_tiles
  q_tile = pl.program_id(0)
  q = q_ref[...]  # [block_q, d]
  q_pos = q_tile * block_q + jnp.arange(block_q)

  def scores(j, c):
    """Masked scores of sub-tile c of key tile j: ([block_q, sub_k] f32, real key [sub_k])."""
    start = j * block_k + c * sub_k
    k = k_ref[pl.ds(start, sub_k), :]  # [sub_k, d]
    s = numerics.scores(dot_nt(q, k), cfg.softmax_scale)
    k_pos = start + jnp.arange(sub_k)
    valid = score_mask(q_pos, k_pos, causal=cfg.causal, kv_len=cfg.kv_len)
    # fa2 masks with −inf, safe because key 0 is visible to every row (m is finite after
    # the first tile); the paper's kernel uses −BF16_MAX.
    return jnp.where(valid, s, numerics.mask_value), k_pos < cfg.kv_len

  # the tie rule from the row's top-2 in one reduction (`pallas_kernels.top2`), or by counting
  top2 = row_top2 if cfg.tie_method == "top2" else None

  def body(j, carry):
    acc, m_i, l_i, max_p, tied_tiles = carry
    if n_sub == 1:
      s0, real0 = scores(j, 0)
      m_tile, tied = compensated_tile_max(s0, comp, numerics.paper, real0, top2)
    else:  # paper layout, logical tile larger than a program can hold: sub-tile passes
      row = jnp.full((block_q,), -jnp.inf, jnp.float32)
      if comp is None:
        tile_max = lax.fori_loop(
          0, n_sub, lambda c, mx: jnp.maximum(mx, jnp.max(scores(j, c)[0], axis=-1)), row
        )
        m_tile, tied = tile_max, jnp.zeros_like(tile_max)
      elif top2 is not None:  # one pass: the sub-tiles' top-2 summaries merged

        def summarise(c, summary):
          s, real = scores(j, c)
          return tile_top2_merge(summary, tile_top2(s, top2, True, real))

        summary = lax.fori_loop(0, n_sub, summarise, (row, row, row, jnp.float32(0.0)))
        m_tile, tied = shifted_max(summary[0], tied_by_top2(*summary, comp, True), comp, True)
      else:  # two passes: the max, then the tie count
        tile_max = lax.fori_loop(
          0, n_sub, lambda c, mx: jnp.maximum(mx, jnp.max(scores(j, c)[0], axis=-1)), row
        )

        def count(c, n):
          s, real = scores(j, c)
          return n + tie_count(s, tile_max, comp, True, real)

        n_ties = lax.fori_loop(0, n_sub, count, jnp.zeros_like(tile_max))
        m_tile, tied = shifted_max(tile_max, n_ties > 1.0, comp, True)
    m_new = jnp.maximum(m_i, m_tile)
    alpha = numerics.rescale(m_i, m_new)  # 0 on the first tile

    def accumulate(c, sums):
      tile_sum, pv, mp = sums
      s = s0 if n_sub == 1 else scores(j, c)[0]
      v = v_ref[pl.ds(j * block_k + c * sub_k, sub_k), :]
      p = numerics.exp_scores(s, m_new[:, None])  # P̄, float32
      if cfg.return_stats:  # max_p: a stat only
        mp = jnp.maximum(mp, jnp.max(p, axis=-1))
      p_dot = numerics.round_p(p, dtype)
      return (
        tile_sum + jnp.sum(numerics.row_sum_terms(p, dtype), axis=-1),
        pv + dot_nn(p_dot, v),
        mp,
      )

    zeros = jnp.zeros_like(m_new)
    tile_sum, pv, max_p = sub_tile_loop(n_sub, accumulate, (zeros, jnp.zeros_like(acc), max_p))
    # l from the float32 P̄, or from P̄ as the dot takes it (`Numerics.row_sum_terms`)
    l_new = numerics.state(alpha * l_i + numerics.clamp_sum(tile_sum))
    acc = numerics.state(numerics.state(alpha[:, None] * acc) + numerics.pv(pv))
    return acc, m_new, l_new, max_p, (tied_tiles + tied) if cfg.return_stats else tied_tiles

  zeros = jnp.zeros((block_q,), jnp.float32)
  init = (jnp.zeros(q.shape, jnp.float32), zeros - jnp.inf, zeros, zeros, zeros)
  n_tiles = num_key_tiles(
    q_tile,
    block_q=block_q,
    block_k=block_k,
    kv_len=cfg.kv_len,
    causal=cfg.causal and not numerics.paper,
  )
  acc, m_i, l_i, max_p, tied_tiles = lax.fori_loop(0, n_tiles, body, init)
  # Final rescale once, after the loop (FlashAttention-2 §3.1.1).
  o = acc / l_i[:, None]
  random_bits = None
  if numerics.stochastic:
    seeds = seed_ref[...]  # two scalars, read without scalar indexing
    seed0 = jnp.sum(jnp.where(jnp.arange(2) == 0, seeds, jnp.uint32(0)), dtype=jnp.uint32)
    seed1 = jnp.sum(jnp.where(jnp.arange(2) == 1, seeds, jnp.uint32(0)), dtype=jnp.uint32)
    head = (pl.program_id(1) * pl.num_programs(2) + pl.program_id(2)).astype(jnp.uint32)
    pos = (q_pos[:, None] * o.shape[1] + jnp.arange(o.shape[1])[None, :]).astype(jnp.uint32)
    random_bits = numerics.random_bits((seed0, seed1), head, pos)
  o_ref[...] = numerics.round_out(o, dtype, random_bits)
  if o32_ref is not None:
    o32_ref[...] = o
  # m and log(l), not their sum: lse = m + log(l) in float32 loses log(l) when |m| is large
  # (`Numerics.probs`); natural log
  m_ref[...] = m_i
  log_l_ref[...] = jnp.log(l_i)
  if stats_refs:
    max_p_ref, tied_ref = stats_refs
    max_p_ref[...] = max_p
    tied_ref[...] = tied_tiles


def flash_forward(q, k, v, cfg, seeds=None):
  """Runs the forward kernel on padded [batch, len, heads, head_dim] arrays.

  `seeds`: uint32 [2], needed by the stochastic layout.
  Returns (out [batch, q_len_p, heads, d_p] in the layout's output dtype,
           row_max and log(row_sum), each [batch, heads, q_len_p] float32 (natural log),
           (max_p, tied_tiles) with return_stats else (),
           the float32 O before its rounding (numerics.delta_float32) or None).
  """
  batch, q_len_p, num_heads, d = q.shape
  kv_len_p, num_kv_heads = k.shape[1], k.shape[2]
  group = num_heads // num_kv_heads
  block_q = cfg.blocks.compute(cfg.numerics)[0]
  grid = (q_len_p // block_q, batch, num_heads)
  q_spec = pl.BlockSpec((None, block_q, None, d), lambda i, b, h: (b, i, h, 0))
  kv_spec = pl.BlockSpec((None, kv_len_p, None, d), lambda i, b, h: (b, 0, h // group, 0))
  row_spec = pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))
  row_shape = jax.ShapeDtypeStruct((batch, num_heads, q_len_p), jnp.float32)
  n_stats = 2 if cfg.return_stats else 0
  out_shape = [
    jax.ShapeDtypeStruct(q.shape, cfg.numerics.output_dtype(q.dtype)),
    row_shape,
    row_shape,
  ]
  out_specs = [q_spec, row_spec, row_spec]
  if cfg.numerics.delta_float32:
    out_shape.append(jax.ShapeDtypeStruct(q.shape, jnp.float32))
    out_specs.append(q_spec)
  out_shape += [row_shape] * n_stats
  out_specs += [row_spec] * n_stats
  in_specs, args = [q_spec, kv_spec, kv_spec], [q, k, v]
  if cfg.numerics.stochastic:
    in_specs.append(pl.BlockSpec((2,), lambda i, b, h: (0,)))
    args.append(seeds)
  outs = list(
    pl.pallas_call(
      functools.partial(forward_kernel, cfg=cfg),
      grid=grid,
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name=f"flashstable_forward_{cfg.numerics.name}",
    )(*args)
  )
  o32 = outs.pop(3) if cfg.numerics.delta_float32 else None
  return outs[0], outs[1], outs[2], tuple(outs[3:]), o32
