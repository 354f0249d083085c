"""The numerics of the flash-attention kernels, in one place.

Every rounding point of the kernels is a call to a method of `Numerics` or to
`compensated_tile_max`, so `grep -n "numerics\\." pallas_kernels/` finds all of them:

  forward  (FlashAttention-2, Dao 2023, Alg. 1)
    S      = softmax_scale · QKᵀ           float32 (dot accumulated in float32, HIGHEST)
    m      = running row max               float32   (compensation may shift it, see below)
    P̄      = exp(S − m)                    float32
    P̄ → `Numerics.round_p`                 input dtype, before the P̄V dot
    l      = α·l + rowsum(P̄)               float32 (from the float32 P̄, as FA2 does)
    acc    = α·acc + P̄V                    float32
    O      = acc / l → `Numerics.round_out` input dtype, rounded once
    lse    = m + log(l)                    float32, natural log (JAX's own Pallas
                                           kernel stores base 2: do not mix them)
  backward (FlashAttention-2, Alg. 2)
    delta  = rowsum(dO ∘ O)                float32, from the rounded O
    P      = exp(S − lse)                  float32
    P → `Numerics.round_p`                 before the dV = Pᵀ dO dot
    dS     = P ∘ (dP − delta)              float32
    dS → `Numerics.round_ds`               before the dQ = dS K and dK = dSᵀ Q dots
    dQ, dK, dV accumulated in float32 and rounded once to the input dtype.

Compensation (Qiu & Yao 2025, arXiv 2510.04212, Alg. 1) is `compensated_tile_max`.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class Numerics:
  """A precision layout: which dtype each kernel buffer is rounded into.

  `None` means "the input dtype" (bfloat16 inputs round to bfloat16, float32 inputs are not
  rounded at all).
  """
  name: str
  p_dtype: str | None = None    # P̄ (forward) and P (backward) before their dots
  ds_dtype: str | None = None   # dS before the dQ and dK dots
  out_dtype: str | None = None  # the output O

  def _cast(self, x, dtype, input_dtype):
    return x.astype(jnp.dtype(dtype) if dtype is not None else input_dtype)

  def round_p(self, p, input_dtype):
    return self._cast(p, self.p_dtype, input_dtype)

  def round_ds(self, ds, input_dtype):
    return self._cast(ds, self.ds_dtype, input_dtype)

  def output_dtype(self, input_dtype):
    return jnp.dtype(self.out_dtype) if self.out_dtype is not None else jnp.dtype(input_dtype)

  def round_out(self, o, input_dtype):
    return o.astype(self.output_dtype(input_dtype))


# The layouts. Issue 2 builds "fa2"; the precision-layout issue adds the others here.
NUMERICS = {
    "fa2": Numerics("fa2"),
}


def get_numerics(name: str) -> Numerics:
  if name not in NUMERICS:
    raise ValueError(f"numerics={name!r} is not supported; choose one of {sorted(NUMERICS)}")
  return NUMERICS[name]


@dataclasses.dataclass(frozen=True)
class Compensation:
  """Qiu & Yao 2025 (arXiv 2510.04212), Alg. 1, with a guard on the size of the shift.

  Per key/value tile and query row: if more than one unmasked score lies within
  `tie_tolerance` (absolute) of the tile's row max, the max used for that tile is shifted.
  The paper uses m' = beta·max (max > 0) or m' = 0 (max < 0), i.e. a shift
  d = m' − max = (beta − 1)·max or |max|. Taken literally that rule
  - underflows whole rows when |max| is large (ties at −120 → exp(−120) ≈ 8e−53 → 0 in
    float32; two ties at +100, beta = 2 → exp(−100) is a float32 denormal, flushed on GPU), and
  - leaves a tied max of exactly 0 unshifted (P̄ = 1 stays).
  Here d is clipped to [min_shift, max_shift]: on a tied row 0 < m' − max ≤ max_shift, so the
  tied P̄ = exp(−d) lies in [e^−max_shift, e^−min_shift] ⊂ [2.1e−9, 0.9922] and rounds below 1 in
  bfloat16. Whenever the paper's shift lies inside the bounds it is used unchanged.
  (For |max| ≥ 2^17 the float32 sum max + min_shift can round back to max; scores that large
  are outside what this guard promises.)
  Ties split across two tiles are not detected, as in the paper.
  """
  beta: float = 2.0
  tie_tolerance: float = 1e-3
  min_shift: float = 2.0 ** -7   # exp(−2^−7) = 0.99222 → bf16 0.99219 < 1
  max_shift: float = 20.0        # exp(−20) = 2.1e−9, far from float32's smallest normal

  def __post_init__(self):
    if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 1):
      raise ValueError(f"beta must be a finite number > 1, got beta={self.beta!r}")
    if not (isinstance(self.tie_tolerance, (int, float)) and math.isfinite(self.tie_tolerance)
            and self.tie_tolerance >= 0):
      raise ValueError(
          f"tie_tolerance must be a finite number >= 0, got tie_tolerance={self.tie_tolerance!r}")
    if not 0 < self.min_shift <= self.max_shift:
      raise ValueError(f"need 0 < min_shift <= max_shift, got {self.min_shift=}, {self.max_shift=}")


def compensated_tile_max(s, valid, comp: Compensation | None):
  """Row max of one score tile, shifted on tied rows (`Compensation`).

  Args:
    s: [rows, block_k] float32 scores, masked entries already −inf.
    valid: [rows, block_k] bool, True where the score is not masked.
    comp: the compensation settings, or None for plain FA2.
  Returns:
    (m_tile [rows] float32, tied [rows] float32 with 1.0 where the rule fired).
  """
  tile_max = jnp.max(s, axis=-1)
  if comp is None:
    return tile_max, jnp.zeros_like(tile_max)
  near = jnp.logical_and(valid, s >= (tile_max - comp.tie_tolerance)[:, None])
  n_ties = jnp.sum(near.astype(jnp.float32), axis=-1)
  tied = n_ties > 1.0
  paper_shift = jnp.where(tile_max > 0, (comp.beta - 1.0) * tile_max, -tile_max)
  shift = jnp.clip(paper_shift, comp.min_shift, comp.max_shift)
  return jnp.where(tied, tile_max + shift, tile_max), tied.astype(jnp.float32)


def next_power_of_2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes. They are part of the numerics: ties and roundings happen per tile.

  Defaults (the same on CPU and GPU): forward block_k = 64 (the tile the compensation sees),
  block_q = 128 (64 for head_dim > 128); backward 64×64 (32×32 for head_dim > 128). block_q
  and the backward tiles only change float32 summation order, not where bf16 rounding
  happens. A tile larger than the (power-of-two rounded) sequence is shrunk to it, which
  changes nothing: masked padding adds no score and no tie.
  """
  block_q: int
  block_k: int
  block_q_bwd: int
  block_k_bwd: int

  def __post_init__(self):
    for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
      b = getattr(self, name)
      if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 16 or b & (b - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {name}={b!r}")

  @classmethod
  def default(cls, head_dim: int, block_q: int | None = None, block_k: int | None = None):
    big = head_dim > 128
    return cls(block_q=block_q if block_q is not None else (64 if big else 128),
               block_k=block_k if block_k is not None else 64,
               block_q_bwd=32 if big else 64,
               block_k_bwd=32 if big else 64)

  def fit(self, q_len: int, kv_len: int) -> "BlockSizes":
    """Shrinks tiles that are longer than the padded sequence (same numerics)."""
    lq, lk = max(16, next_power_of_2(q_len)), max(16, next_power_of_2(kv_len))
    return BlockSizes(min(self.block_q, lq), min(self.block_k, lk),
                      min(self.block_q_bwd, lq), min(self.block_k_bwd, lk))
