"""The numerics of the flash-attention kernels, in one place.

Every rounding point of the kernels is a call to a method of `Numerics` (or to
`compensated_tile_max`), so `grep -n "numerics\\." pallas_kernels/` finds all of them. The
layouts are described on `Numerics`; the default "fa2" is:

  forward  (FlashAttention-2, Dao 2023, Alg. 1)
    S      = softmax_scale · QKᵀ           float32 (dot accumulated in float32, HIGHEST)
    m      = running row max               float32   (compensation may shift it, see below)
    P̄      = exp(S − m)                    float32
    P̄ → `Numerics.round_p`                 input dtype, before the P̄V dot
    l      = α·l + rowsum(P̄)               float32 (from the float32 P̄, as FA2 does;
                                            sum_rounded_p: of P̄ as the dot takes it)
    acc    = α·acc + P̄V                    float32
    O      = acc / l → `Numerics.round_out` input dtype, rounded once
    m, log l                               float32, natural log, kept for the backward
                                           (lse = m + log l is a statistic only; JAX's
                                           own Pallas kernel stores base-2 lse)
  backward (FlashAttention-2, Alg. 2)
    delta  = rowsum(dO ∘ O)                float32, from the rounded O
    P      = exp((S − m) − log l)          float32, m and log l kept apart (`Numerics.probs`)
    P → `Numerics.round_p`                 before the dV = Pᵀ dO dot
    dS     = P ∘ (dP − delta)              float32
    dS → `Numerics.round_ds`               before the dQ = dS K and dK = dSᵀ Q dots
    dQ, dK, dV accumulated in float32 and rounded once to the input dtype (`round_grad`);
    grouped query heads' dK, dV partials summed in float32, then rounded (`sum_group`).

Backward options of any layout (each removes one piece of the bias mechanism of Qiu & Yao 2025,
§4: a rounded O makes delta ≠ rowsum(P∘dP), so the rows of dS no longer sum to 0 and dQ picks
up (rowsum dS)·c for keys sharing a component c):
    delta_float32   delta = rowsum(dO ∘ O) from the float32 O before its rounding (the forward
                    keeps it as a residual), no other rounding
    center_keys     dQ = dS (K − c), c = the mean of the real keys per (batch, kv head),
                    K − c rounded to the input dtype (`dq_keys`); exact in exact arithmetic,
                    because each row of dS sums to 0
and one that gives the production kernels' kind of backward P (their error class; they form
it in base 2, so not their bits):
    single_lse      P = exp(S − lse) from one float32 lse = m + log l per row, as
                    FlashAttention-2 and -3, cuDNN and JAX's Pallas mha form it (and this
                    library did before 2026-12-01); see `probs`

This module is the one table of the layouts: `flash_attention`'s docstring and the kernels
point here. The Mosaic GPU forward's float32 differences (`exp_scores` with base2) are here too.

Compensation (Qiu & Yao 2025, arXiv 2510.04212, Alg. 1) is `compensated_tile_max`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp
import numpy as np
from jax import lax

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
MAX_HEAD_DIM = 256


BF16_MAX = float(jnp.finfo(jnp.bfloat16).max)  # 3.3895e38
LOG2E = float(np.log2(np.e))


def round_bf16(x):
  """Round-to-nearest-even of float32 `x` to bfloat16, kept in float32.

  Done on the bits (add 0x7FFF + lsb, clear the low 16 bits) rather than by a convert pair,
  which XLA may drop when it allows excess precision. Exact for finite values, ±inf and NaN.
  """
  bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  bits = bits + (jnp.uint32(0x7FFF) + ((bits >> 16) & jnp.uint32(1)))
  return lax.bitcast_convert_type(bits & jnp.uint32(0xFFFF0000), jnp.float32)


def stochastic_round_bf16(x, random_bits):
  """Unbiased stochastic rounding of float32 `x` to bfloat16 (kept in float32).

  Adds uniform 16-bit noise below the bf16 mantissa and truncates: a value between two bf16
  neighbours rounds away from zero with probability equal to its distance from the lower one
  (in ulps), so E[round(x)] = x. `random_bits` are uint32, only the low 16 bits used.
  """
  bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  bits = bits + (random_bits & jnp.uint32(0xFFFF))
  return lax.bitcast_convert_type(bits & jnp.uint32(0xFFFF0000), jnp.float32)


def hash_u32(x):
  """A counter-based 32-bit mixer (lowbias32, C. Wellons): position -> pseudo-random bits.

  Triton has no PRNG; hashing (key, position) gives reproducible, independent noise."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


@dataclasses.dataclass(frozen=True)
class Numerics:
  """A precision layout: where the kernels round, and to what.

  fa2 (default): FP32 accumulators; P̄ (and P, dS in the backward) rounded to the input dtype
    only for the dots; O rounded once. Compensation with the guarded shift.
  paper: the rounding points of Qiu & Yao's pure-PyTorch FA2 under CUDA BF16 autocast, per
    (query tile, key tile) — every `paper_*` step below rounds to bfloat16:
      forward  S = bf16(bf16(QKᵀ)·scale); masked scores −BF16_MAX (not −inf); tile max in bf16
               with the paper's literal compensation (ties: entries ≥ bf16(max − tol), masked
               ones included; m' = bf16(β·max) if max > 0, 0 if max < 0, unchanged at 0);
               m_new = max(m', m_old) in bf16; P̄ = exp(bf16(S − m_new)) in fp32; tile row sum
               in fp32 clamped at ≥ 1e−10; P̄V = bf16(dot(bf16(P̄), V)) (fp32 accumulation);
               α = exp(bf16(m_old − m_new)); l = bf16(α·l_old + tile sum);
               O = bf16(bf16(O_old·α) + P̄V); finally O = bf16(O / l), lse = log(l) + m (fp32).
      backward S recomputed as above but masked with −inf; P = exp(S − lse) fp32 (here
               from m and log l kept apart, `probs`; single_lse is the paper's own);
               dV_tile = bf16(bf16(P)ᵀ·dO); dP = bf16(dO·Vᵀ); delta = fp32 sum of bf16(dO∘O);
               dS = (P·scale)·(dP − delta) fp32; dQ_tile = bf16(bf16(dS)·K);
               dK_tile = bf16(bf16(dS)ᵀ·Q); dQ, dK, dV accumulated tile by tile in bf16.
    The backward tiles equal the forward tiles (block_q × block_k), because the bf16 buffers
    make the tiling part of the numerics.
  fp32_out: fa2 whose output is float32 (the paper's "FP32 O" mitigation); `delta` then uses
    the float32 O.
  stochastic: fa2 whose final rounding of O to bfloat16 is stochastic (unbiased), from a
    counter-based hash of (rng_key, position) — the unbiased cure for this bias.
  """

  name: str
  paper: bool = False  # all paper_* rounding points, fwd and bwd
  out_float32: bool = False  # fp32_out
  stochastic: bool = False  # stochastic final rounding of O
  delta_float32: bool = False  # backward option: delta from the float32 O
  center_keys: bool = False  # backward option: dQ from the keys less their mean
  single_lse: bool = False  # backward option: P from one float32 lse, as production kernels
  sum_rounded_p: bool = False  # forward option: l sums the P̄ the P̄V dot takes (`row_sum_terms`)

  def with_options(
    self, *, delta_float32=False, center_keys=False, single_lse=False, sum_rounded_p=False
  ) -> "Numerics":
    """This layout with the backward options and the forward's sum_rounded_p (module
    docstring); TypeError (one line, `boolean`) for an option that is not a bool."""
    return dataclasses.replace(
      self,
      delta_float32=boolean("delta_float32", delta_float32),
      center_keys=boolean("center_keys", center_keys),
      single_lse=boolean("single_lse", single_lse),
      sum_rounded_p=boolean("sum_rounded_p", sum_rounded_p),
    )

  # --- forward -------------------------------------------------------------------------
  @property
  def mask_value(self):
    return -BF16_MAX if self.paper else -jnp.inf

  def scores(self, qk, softmax_scale):
    """S from the float32 QKᵀ dot."""
    if self.paper:
      return round_bf16(round_bf16(qk) * softmax_scale)  # paper: bf16(bf16(QKᵀ)·scale)
    return qk * softmax_scale

  def exp_arg(self, x):
    return round_bf16(x) if self.paper else x  # paper: exp(bf16(·))

  def exp_scores(self, s, m, base2=False, scale=1.0, rounded=False):
    """P̄ = exp(S − m) in float32, m broadcast to s. base2 (the Mosaic GPU forward's option, fa2
    and fp32_out only): 2^((S − m)·log₂e), the difference first (0 at the max, so its P̄ is 1
    exactly, as the backward's P takes it: `probs`; `max_gap`, with `rounded` as there: S a
    product rounded on its own, or the unscaled QKᵀ of scale), then one multiply before ex2.
    scale (base2 only; `MosaicGPUOptions.scale_in_exp2`): s and m are the unscaled QKᵀ and its
    (shifted) max and the softmax scale c enters here, 2^((s − m)·k) with k = c·log₂e one
    float32 constant, without S = QKᵀ·c rounded on its own.
    Not FlashAttention-2's one FMA 2^(s·k − m·k) (Dao 2023, its CUDA kernel's
    `scale_softmax_log2`): its exponent at the max is the rounding error of m·k, ½ ulp(m·k), so
    the max's P̄ is off 1 by ln 2·½ ulp(m·k), in proportion to |m|: at logits 4·10⁶ l came out
    2^δ·4 and dV 8% off (the backward's P took the max's as 1), at 10¹² P̄ overflowed to NaN
    (H100, 2026-12-07, tests/test_mechanism.py::test_large_logits_keep_the_backward_exact)."""
    if base2:
      assert not self.paper, "base2 skips the paper layout's exp_arg rounding"
      return jnp.exp2(self.max_gap(s, m, rounded) * (scale * LOG2E))
    assert scale == 1.0, "scale is base2's"
    return jnp.exp(self.exp_arg(s - m))

  def rescale(self, m_old, m_new, base2=False, scale=1.0):
    """α = exp(m_old − m_new), the running sums' rescale factor: 0 on the first tile (m_old =
    −inf), exactly 1 while the max stays (also with base2: 2^((m_old − m_new)·log₂e), and
    with scale, on the unscaled maxima, 2^((m_old − m_new)·c·log₂e): `exp_scores`)."""
    if base2:
      assert not self.paper, "base2 skips the paper layout's exp_arg rounding"
      return jnp.exp2((m_old - m_new) * (scale * LOG2E))
    assert scale == 1.0, "scale is base2's"
    return jnp.exp(self.exp_arg(m_old - m_new))

  def clamp_sum(self, tile_sum):
    return jnp.maximum(tile_sum, 1e-10) if self.paper else tile_sum  # paper: clamp ≥ 1e−10

  def round_p(self, p, input_dtype):
    """P̄ (forward) and P (backward) before their dots."""
    return p.astype(jnp.bfloat16 if self.paper else input_dtype)

  def row_sum_terms(self, p, input_dtype):
    """The P̄ (float32) whose sum over a tile the row sum l adds: P̄ itself (FlashAttention-2's
    and the paper kernel's design, though the P̄V dot takes `round_p`(P̄)), or with
    sum_rounded_p the P̄ the dot takes, so that O = Σ r(P̄)·v / Σ r(P̄). A relative rounding
    error that a row's large P̄ share, such as the compensation's tied P̄ = e^−d (the same d on
    every tie beyond the shift's cap), then cancels in O instead of scaling it
    (docs/numerics.md#the-compensation). The rounding is `round_bf16`'s, on the bits: a convert
    pair here is dropped by XLA (CPU, 2026-12-02). The backward's P follows (`probs`)."""
    return round_bf16(p) if self.rounds_row_sum(input_dtype) else p

  def rounds_row_sum(self, input_dtype) -> bool:
    """Whether sum_rounded_p rounds anything: P̄'s dot takes bf16 (the paper layout, or bf16
    inputs); float32 inputs outside the paper layout keep P̄ as it is. Raises ValueError for
    float16 inputs outside the paper layout (no bit-level float16 rounding here)."""
    if not self.sum_rounded_p:
      return False
    dtype = jnp.dtype(input_dtype)
    if dtype == jnp.float16 and not self.paper:
      raise ValueError("sum_rounded_p=True takes bfloat16 or float32 inputs, got float16")
    return self.paper or dtype == jnp.bfloat16

  def pv(self, pv):
    return round_bf16(pv) if self.paper else pv  # paper: bf16(P̄V)

  def state(self, x):
    """The running m, l and O buffers after each tile."""
    return round_bf16(x) if self.paper else x

  def output_dtype(self, input_dtype):
    return jnp.dtype(jnp.float32) if self.out_float32 else jnp.dtype(input_dtype)

  def round_out(self, o, input_dtype, random_bits=None):
    if self.stochastic:
      return stochastic_round_bf16(o, random_bits).astype(jnp.bfloat16)
    if self.paper:
      return round_bf16(o).astype(self.output_dtype(input_dtype))
    return o.astype(self.output_dtype(input_dtype))

  def random_bits(self, seeds, head, pos):
    """The stochastic layout's uint32 noise for O: a counter-based hash of (seeds [2], head
    index = batch·heads + head, pos = row·head_dim_padded + column), arrays broadcast."""
    seed0, seed1 = seeds
    return hash_u32(hash_u32(pos ^ seed0) ^ hash_u32(head + seed1))

  # --- backward ------------------------------------------------------------------------
  def probs(self, s, m, log_l, input_dtype=None, rounded=False):
    """P = exp(S − m − log l) in float32, every layout. FlashAttention-2 (and FA3, cuDNN)
    store lse = m + log l and form exp(S − lse); in float32 that sum rounds log l away once
    |m| is large (ulp(lse) ≈ |m|·2^−23: at m ≈ 10^5, 0.008), so P and every gradient err in
    proportion — at the logits of an exploding run. Subtracting m first keeps S − m exact
    near the row max (Sterbenz) and P's relative error at a float32 ulp. Where S equals m bit
    for bit the difference is written as 0: a compiler may contract S = QKᵀ·scale into this
    subtraction (an FMA: XLA on CPU does), which skips the rounding of S that m had, and the
    max's P would be off by up to ½ ulp(S) (2e-6 at S ≈ 70 in float32); the comparison gives S
    a second use, so it is rounded as in the forward.

    single_lse: the production kernels' P = exp(S − lse), lse = m + log l rounded to float32
    once per row (FlashAttention-2's `softmax_lse`). It scales every P of row i by one factor
    f_i = exp(m + log l − lse), |f_i − 1| ≤ about ½ ulp(lse) ≈ |m|·2⁻²⁴, and with them the
    row's dS, its dQ row and its share of dV and dK; f_i = l_i ≥ 1 on rows where log l < ½ ulp(m) (lse
    rounds to m). Σ_j dS_ij becomes f_i·(rowsum(P∘dP) − delta_i): the rows' sums are scaled,
    not made non-zero, so it adds no (rowsum dS)·c term of its own.

    sum_rounded_p (with the input dtype, `rounds_row_sum`): P = r(P̄)·exp(−log l), P̄ formed as
    the forward forms it (`exp_scores`) against the row's final m: the weights O took on the
    tile that set that m (l summed the rounded P̄, `row_sum_terms`), where with the float32 P̄
    a row of ties past a shift capped at 6 would get P summing to ΣP̄/Σr(P̄) = 1.0028 and its
    gradients 0.28% high. A tile before the max moved took r(P̄_then)·α, which r(P̄_then·α)
    does not reproduce: noise of up to 2⁻⁹ relative per entry, and on capped ties (the same
    r(e^−cap) on every row) a bias of up to the same 0.28% times that tile's share of the
    row (m alone per row cannot undo it; docs/numerics.md#the-compensation).

    rounded: S is a product rounded on its own, so S − m needs no select (`max_gap`)."""
    if input_dtype is not None and self.rounds_row_sum(input_dtype):
      p_bar = round_bf16(jnp.exp(self.exp_arg(self.max_gap(s, m, rounded))))
      return p_bar * jnp.exp(m - (m + log_l) if self.single_lse else -log_l)
    if self.single_lse:
      return jnp.exp(s - (m + log_l))
    return jnp.exp(self.max_gap(s, m, rounded) - log_l)

  def max_gap(self, s, m, rounded=False):
    """S − m, exactly 0 where S equals m (`probs`): written so, unless the caller formed S as a
    product rounded on its own that no compiler can contract into the subtraction (rounded:
    the Mosaic GPU kernels' PTX `mul.rn.f32`, `forward_mgpu.rounded_scores`, or the unscaled
    QKᵀ of `scale_in_exp2`), where S − m is that 0 already (S = m = ±inf aside: NaN there, and
    with the select P̄ = 1 and a finite log l, a row whose scores overflowed either way) and
    the compare and select are two instructions a score saved."""
    return s - m if rounded else jnp.where(s == m, 0.0, s - m)

  def d_out(self, d_out, input_dtype):
    """dO as the backward's dots and delta take it: in the input dtype (fp32_out's cotangent is
    float32), so that Σ_j dS_ij = 0 holds for the program the kernels differentiate."""
    return d_out.astype(input_dtype)

  def delta(self, d_out, out):
    """rowsum(dO∘O) in float32 over [..., head_dim]; paper: of bf16(dO∘O). With delta_float32
    `out` is the float32 O before its rounding and nothing is rounded. Also the Mosaic GPU dQ
    kernel's sum over one [rows, head_dim] tile (`MosaicGPUOptions.delta_in_dq`), in its order."""
    prod = d_out.astype(jnp.float32) * out.astype(jnp.float32)
    return jnp.sum(round_bf16(prod) if self.paper and not self.delta_float32 else prod, axis=-1)

  def delta_by_head(self, d_out, out, d_lse=None):
    """The backwards' delta, [batch, heads, q_len] float32: `delta` of [batch, q_len, heads,
    head_dim] d_out and out, reduced in their order and only then transposed, minus the lse
    cotangent `d_lse` ([batch, heads, q_len]) if given. The optimization_barrier keeps XLA
    from fusing the transpose (and what follows, e.g. the Mosaic GPU backward's stack of the
    rows) into the reduction: fused, XLA's kernel took 106 µs a gpt2-small layer on an H100
    (16 × 1024 × 12 × d64, 2026-12-06, `experiments/21_step_kernels.py`) for 50 MB read."""
    delta = lax.optimization_barrier(self.delta(d_out, out)).transpose(0, 2, 1)
    return delta if d_lse is None else delta - d_lse

  def dq_keys(self, k, kv_len):
    """The keys of the dQ = dS K product, [batch, kv_len_p, kv_heads, d]: K itself, or
    (center_keys) K − mean of the first kv_len keys per (batch, kv head), computed in float32
    and rounded to the input dtype."""
    return centered_keys(k, kv_len) if self.center_keys else k

  def dp(self, dp):
    return round_bf16(dp) if self.paper else dp  # paper: bf16(dO·Vᵀ)

  def dscores(self, p, dp, delta, softmax_scale):
    """dS; the paper folds the softmax scale in here, fa2 applies it to dQ, dK at the end."""
    if self.paper:
      return (p * softmax_scale) * (dp - delta)
    return p * (dp - delta)

  def round_ds(self, ds, input_dtype):
    return ds.astype(jnp.bfloat16 if self.paper else input_dtype)

  def grad_scale(self, softmax_scale):
    return 1.0 if self.paper else softmax_scale

  def round_grad(self, acc, softmax_scale, dtype, scaled=True):
    """A dQ or dK (scaled) or dV float32 accumulator → the output dtype: fa2 multiplies by
    the softmax scale here (the paper folded it into dS), then one rounding."""
    return ((acc * self.grad_scale(softmax_scale)) if scaled else acc).astype(dtype)

  def sum_group(self, partials, dtype):
    """dK or dV of grouped-query heads: float32 partials [batch, len, kv_heads, group, d]
    summed over the group in a fixed order (bitwise repeatable), then rounded once."""
    return partials.sum(axis=3).astype(dtype)

  def accumulate(self, acc, tile):
    """dQ/dK/dV buffers: paper rounds each tile product and the running sum to bf16."""
    if self.paper:
      return round_bf16(acc + round_bf16(tile))
    return acc + tile


NUMERICS = {
  "fa2": Numerics("fa2"),
  "paper": Numerics("paper", paper=True),
  "fp32_out": Numerics("fp32_out", out_float32=True),
  "stochastic": Numerics("stochastic", stochastic=True),
}


# The kernel choices of `flash_attention(backend=)`: "auto" (the default: the Mosaic GPU kernels
# on a Hopper GPU wherever they support the call, else Triton; `attention.choose_backend`), and
# the two kernel families; the layouts and key tiles the Mosaic GPU forward
# (`pallas_kernels.forward_mgpu`) implements.
BACKENDS = ("auto", "triton", "mosaic_gpu")
MOSAIC_GPU_NUMERICS = ("fa2", "fp32_out")
# How the forwards decide the compensation's tie rule (speed only: the same decisions,
# `compensated_tile_max`): from a top-2 summary, or by counting.
TIE_METHODS = ("top2", "count")
MOSAIC_GPU_BLOCK_K = (64, 128)


def get_numerics(name: str) -> Numerics:
  """The layout named `name`; ValueError naming anything else (a list or a number too)."""
  if not isinstance(name, str) or name not in NUMERICS:
    raise ValueError(f"numerics={shown(name)} is not supported; choose one of {sorted(NUMERICS)}")
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
  The paper layout keeps the literal rule (`shifted_max`), as the paper's kernel does, unless
  `guard_paper`. There, with the kernel's clamp of each tile's sum at ≥ 1e−10
  (`Numerics.clamp_sum`), a tied tile whose max exceeds ln(2·10¹⁰) ≈ 23.7 has its P̄ summed to
  2e^−max < 1e−10 and clamped up: the row's O is scaled by 2e^−max/1e−10 (0.19% of its value
  at max 30), toward 0 (tests/test_compensation.py).
  guard_paper: the paper layout shifts by the clipped d above, as the other layouts do (its tie
    rule and rounding points stay the paper's; m' = max + d in float32). The same clamp then
    raises any tile whose P̄ sums below 1e−10 to 1e−10, against a tied P̄ of e^−max_shift. With
    two ties at max_shift 20 (2·2.1e−9) each such tile (a fully masked one, or one whose scores
    sit more than about 3 + ln(its count) below the tied max) adds 2.4% to the row's l, so O is
    scaled by 2e^−d / (2e^−d + n·1e−10) for n such tiles: 0.976 for one, 0.87 for seven; at
    max_shift 6 (2.5e−3) each adds about 4e−8.
  shift_above: the rule shifts only tied tiles whose |max| (after softmax_scale) is at least
    this (0: every tied tile, the paper's rule); every other tile is as without the
    compensation. In the paper layout with its literal shift, n ties at max M > 0 leave the
    tile a sum of about n·e^−M; below 1e−10 the clamp raises it in l and not in O's numerator,
    so a row whose weight is that tile has its O scaled by n·e^−M·10¹⁰: 1 at ln(n·10¹⁰) (23.7
    for two ties, 24.1 for three), then 0.755 at 24, 0.28 at 25, 0.002 at 30 for two ties. The
    switch-off starts at 23.7 and is gradual. 23.7 keeps the literal rule on every tied tile
    from there (3-tie tiles up to 24.1, which the clamp does not scale yet, included) and
    drops it below, its partial effects there included: tiles after the tied one that sum
    below 1e−10 against the raised max are clamped up too (two keys at 20 in the first of eight
    tiles of 64, the other 510 at 10, v = 1: O = 0.871 under the literal rule, 1 under 23.7;
    a tie in the last tile leaves the earlier tiles alone). A fully masked tile of the paper
    layout's causal loop (every score −BF16_MAX, all tied) passes any threshold and is shifted
    to 0 as by the literal rule: a causal row whose scores are all negative, in a query tile
    that has a fully masked key tile, gets row_max 0 either way. A test variant, not a fix:
    does the literal rule's switch-off alone hold at anchor-b128
    (docs/studies/instability-anchor-b128.md)?
  """

  beta: float = 2.0
  tie_tolerance: float = 1e-3
  min_shift: float = 2.0**-7  # exp(−2^−7) = 0.99222 → bf16 0.99219 < 1
  max_shift: float = 20.0  # exp(−20) = 2.1e−9, far from float32's smallest normal;
  # 6 for float16 inputs (`for_dtype`)
  guard_paper: bool = False
  shift_above: float = 0.0

  @classmethod
  def for_dtype(
    cls, dtype, beta=2.0, tie_tolerance=1e-3, guard_paper=False, max_shift=None, shift_above=0.0
  ) -> "Compensation":
    """The settings `flash_attention` uses for inputs of `dtype`: float16 (5 exponent bits)
    caps the shift at 6 so that the tied P̄ = e^−d ≥ e^−6 stays a normal float16 number after
    `round_p` (scores more than ≈3.7 below the tied max then become float16 subnormals)."""
    if max_shift is None:
      max_shift = 6.0 if jnp.dtype(dtype) == jnp.float16 else cls.max_shift
    return cls(
      beta=beta,
      tie_tolerance=tie_tolerance,
      max_shift=max_shift,
      guard_paper=guard_paper,
      shift_above=shift_above,
    )

  def unscaled(self, softmax_scale: float) -> "Compensation":
    """The same rule for the unscaled scores QKᵀ (S = QKᵀ·c, c = softmax_scale > 0): the
    absolute thresholds (tie_tolerance, min_shift, max_shift, shift_above) divided by c; β is
    a ratio and stays. Used where the max is taken before the scale
    (`MosaicGPUOptions.scale_in_exp2`): the decisions are those on S except for a score within
    about a float32 ulp of a threshold (S = fl(QKᵀ·c) and t/c are rounded), and exact ties,
    the case the rule exists for, stay ties."""
    c = float(softmax_scale)
    return dataclasses.replace(
      self,
      tie_tolerance=self.tie_tolerance / c,
      min_shift=self.min_shift / c,
      max_shift=self.max_shift / c,
      shift_above=self.shift_above / c,
    )

  def __post_init__(self):
    for name in ("beta", "tie_tolerance", "min_shift", "max_shift", "shift_above"):
      object.__setattr__(self, name, real_number(name, getattr(self, name)))
    for name, low, strict in (
      ("beta", 1, True),
      ("tie_tolerance", 0, False),
      ("shift_above", 0, False),
      ("min_shift", 0, True),  # each named alone where it is the one out of range
      ("max_shift", 0, True),
    ):
      value = getattr(self, name)
      if not (math.isfinite(value) and (value > low if strict else value >= low)):
        raise ValueError(
          f"{name} must be a finite number {'>' if strict else '>='} {low}, got {name}={value!r}"
        )
      if value > FLOAT32_MAX:  # the kernels compare and shift in float32: inf there
        raise ValueError(
          f"{name}={value!r} overflows float32, the kernels' arithmetic (at most {FLOAT32_MAX:.4g})"
        )
    boolean("guard_paper", self.guard_paper)
    if not self.min_shift <= self.max_shift:
      raise ValueError(
        f"need min_shift <= max_shift, got min_shift={self.min_shift!r}, "
        f"max_shift={self.max_shift!r}"
      )


def boolean(name, value, none: bool = False) -> bool | None:
  """A Python bool from a Python or NumPy bool (or None, where `none` allows it); a one-line
  TypeError naming the value for anything else (an int, a string, an array: these settings
  are static and read as flags, not as truthy values)."""
  if none and value is None:
    return None
  if not isinstance(value, (bool, np.bool_)):
    allowed = "a bool or None" if none else "a bool"
    raise TypeError(f"{name} must be {allowed}, got {name}={value!r}")
  return bool(value)


def real_number(name, value) -> float:
  """A Python float from a Python/NumPy real number or a concrete 0-d integer or floating array;
  a one-line TypeError naming the value for anything else (bool, str, bytes, None, complex, an
  array of another shape or dtype, a tracer: these settings are static), and for an integer too
  large for a float."""
  dtype = getattr(value, "dtype", None)
  if isinstance(value, bool) or not (
    isinstance(value, numbers.Real)
    if dtype is None
    else np.dtype(dtype).kind in "iu" or jnp.issubdtype(dtype, jnp.floating)  # not m8, b1
  ):
    raise TypeError(f"{name} must be a real number, got {name}={shown(value)}")
  if np.ndim(value) != 0:
    raise TypeError(f"{name} must be a single number, got {name}={shown(value)}")
  try:
    return float(value)
  except (TypeError, ValueError, OverflowError):  # a tracer: jax's ConcretizationTypeError
    raise TypeError(f"{name} must be a concrete real number, got {name}={shown(value)}") from None


def shown(value) -> str:
  """repr on one short line: an array's (anything with a dtype) type, shape and dtype; else its
  repr (a list, a ragged list), cut if long."""
  try:
    if hasattr(value, "dtype") and np.ndim(value):
      shape, dtype = np.shape(value), getattr(value, "dtype", None)
      return f"{type(value).__name__}(shape={shape}, dtype={dtype})"
  except (ValueError, TypeError):
    pass
  text = repr(value)
  return text if len(text) <= 80 else text[:60] + "…"


FLOAT32_MAX = float(np.finfo(np.float32).max)
# The largest max_shift outside float16: a tied P̄ = e^−40 = 4.2e−18 times a value |v| falls below
# float32's smallest normal (1.2e−38), where the CPU and the GPU flush it to 0, only for |v| <
# 2.8e−21. At 80 (e^−80 = 1.8e−35) that was |v| < 6.5e−4: values scaled by 1e−3 lost half of
# O (a review's measurement, 2026-12-06); at 87 the tied P̄ itself nears it, at 88 O is NaN.
MAX_SHIFT = 40.0
# The paper layout's (with guard_shift): its kernel clamps each tile's P̄ sum at ≥ 1e−10, and
# two ties' 2e^−d fall below that past d = ln(2·10¹⁰) = 23.7 (O → 0: 0.996 of it lost at 30).
MAX_SHIFT_PAPER = 23.0


def check_shift_options(numerics, stabilize, guard_shift, max_shift, dtype=None, shift_above=0.0):
  """The checks of `flash_attention`'s and `AttentionConfig`'s guard_shift and max_shift (one
  line naming the value): guard_shift a bool, only with numerics="paper" and the compensation
  (the other layouts always clip the shift); max_shift a real number, only with the compensation
  and a clipped shift (the paper layout's literal shift has no cap: there it needs
  guard_shift), at most `MAX_SHIFT` (40: P̄·v flushed to 0 only for |v| < 2.8e−21; 23 in the
  paper layout, `MAX_SHIFT_PAPER`: its 1e−10 clamp), at most 6 for float16 inputs outside the
  paper layout (`Compensation.for_dtype`:
  e^−6 is about the smallest P̄ that stays a normal float16 number); shift_above a real number,
  not 0 only with the compensation. Returns max_shift as a float or None; the ranges are
  `Compensation`'s check."""
  shift_above = real_number("shift_above", shift_above)
  if not (math.isfinite(shift_above) and shift_above >= 0):
    raise ValueError(f"shift_above must be a finite number >= 0, got shift_above={shift_above!r}")
  if shift_above and not stabilize:
    raise ValueError(f"shift_above={shift_above!r} needs stabilize=True")
  boolean("guard_shift", guard_shift)
  if guard_shift and not (stabilize and numerics == "paper"):
    raise ValueError(
      f"guard_shift=True needs numerics='paper' and stabilize=True (the other layouts always "
      f"clip the shift), got numerics={numerics!r}, stabilize={stabilize!r}"
    )
  if max_shift is None:
    return None
  max_shift = real_number("max_shift", max_shift)
  if not stabilize:
    raise ValueError(f"max_shift={max_shift!r} needs stabilize=True")
  if numerics == "paper" and not guard_shift:
    raise ValueError(
      f"max_shift={max_shift!r} caps the clipped shift; the paper layout's literal shift has "
      "none: add guard_shift=True (+guard)"
    )
  if max_shift < Compensation.min_shift:
    raise ValueError(
      f"max_shift={max_shift!r} is below the shift's floor 2⁻⁷ = {Compensation.min_shift} (a "
      "smaller shift leaves the tied P̄ = 1 in bf16)"
    )
  if numerics == "paper" and max_shift > MAX_SHIFT_PAPER:
    raise ValueError(
      f"max_shift={max_shift!r} > {MAX_SHIFT_PAPER:g} in the paper layout: two tied P̄ = "
      "e^−max_shift sum below its kernel's 1e−10 clamp per tile, and O goes to 0"
    )
  if max_shift > MAX_SHIFT:
    raise ValueError(
      f"max_shift={max_shift!r} > {MAX_SHIFT:g}: the tied P̄ = e^−max_shift times a small value "
      "falls below float32's smallest normal and is flushed to 0 (wrong O; NaN from 88)"
    )
  if dtype is not None and jnp.dtype(dtype) == jnp.float16 and numerics != "paper":
    if max_shift > 6.0:
      raise ValueError(f"max_shift={max_shift!r} > 6 flushes the tied P̄ of float16 inputs")
  return max_shift


def tie_count(s, tile_max, comp: Compensation, paper: bool = False, in_range=None):
  """Per row, how many scores of the tile are tied with its max (float32 count): the rule, by
  counting (a second pass over the tile; `compensated_tile_max` decides the same from a top-2
  summary instead, `tied_by_top2`).

  fa2: unmasked scores ≥ max − tie_tolerance (masked scores are −inf, so on a row with a
  finite max none of them counts; a row masked in the whole tile, max −inf, counts 0 — one
  check per row instead of a mask per score). paper: every entry of a real key (`in_range`,
  [block_k] bool; padding is ours, not the paper's) ≥ bf16(max − tol), causally masked ones
  (−BF16_MAX) included, as the paper's kernel counts them.
  """
  if paper:
    near = s >= round_bf16(tile_max - comp.tie_tolerance)[:, None]
    if in_range is not None:
      near = jnp.logical_and(near, in_range[None, :])
    return jnp.sum(near.astype(jnp.float32), axis=-1)
  near = s >= lax.broadcast_in_dim(tile_max - comp.tie_tolerance, s.shape, [0])  # (Mosaic GPU
  n = jnp.sum(near.astype(jnp.float32), axis=-1)  # has no [:, None])
  return jnp.where(tile_max > -jnp.inf, n, 0.0)


def top2_merge(a, b):
  """The top-2 summary (first, second) of the union of two sets of scores from theirs —
  second counts a duplicate of first — with max and min only: exact, associative and
  commutative, so any reduction tree gives the same pair (`pallas_kernels.top2`)."""
  (a1, a2), (b1, b2) = a, b
  return jnp.maximum(a1, b1), jnp.maximum(jnp.minimum(a1, b1), jnp.maximum(a2, b2))


def tile_top2(s, top2, paper: bool = False, in_range=None):
  """The summary of one score tile [rows, block_k] the top-2 tie rule needs:
  (tile_max [rows], first, second, n_real). `top2` maps scores to (first, second), either
  [rows] each (`top2.row_top2`, whose first is the row max bit for bit) or [rows, g] for g
  column groups (`top2.column_top2`). fa2: tile_max comes from `first`, n_real is None.
  paper: first/second of the real keys only (`in_range`; padded keys −inf), the tile max of
  every entry (jnp.max, as the count rule takes it) and n_real = the number of real keys."""
  if not paper:
    first, second = top2(s)
    tile_max = first if first.ndim == 1 else jnp.max(first, axis=-1)
    return tile_max, first, second, None
  real = s if in_range is None else jnp.where(in_range[None, :], s, -jnp.inf)
  first, second = top2(real)
  n_real = jnp.float32(s.shape[-1]) if in_range is None else jnp.sum(in_range.astype(jnp.float32))
  return jnp.max(s, axis=-1), first, second, n_real


def tile_top2_merge(a, b):
  """`tile_top2` of two key sub-tiles of one logical tile → that of the tile (the paper
  layout's wide tiles, processed in sub-tiles: one pass over them, not two)."""
  (mx_a, *fs_a, n_a), (mx_b, *fs_b, n_b) = a, b
  first, second = top2_merge(fs_a, fs_b)
  return jnp.maximum(mx_a, mx_b), first, second, None if n_a is None else n_a + n_b


def tied_by_top2(tile_max, first, second, n_real, comp: Compensation, paper: bool = False):
  """`tie_count(...) > 1`, decided from a `tile_top2` summary (bool [rows]): identical for every
  tile without NaN scores — exact ties, ties at tol ± an ulp, masked entries, fully masked
  rows, ±inf, any tol — and with NaN scores on the CPU where XLA's max propagates NaN (both say
  untied; a jitted max over a wide tile may drop it, `top2.row_top2`) and for fa2 on the GPU (`top2.row_top2`); the paper rule on a GPU could differ only
  on a row with a NaN score where also bf16(max − tol) = −inf, whose outputs are NaN anyway.

  "two scores ≥ t" ⇔ second ≥ t (one summary per row), or Σ_c [first_c ≥ t] + [second_c ≥ t]
  ≥ 2 over column groups c (each group adds min(its count, 2)).
  fa2: t = max − tol in float32, counted only on rows with max > −inf (as `tie_count`); a NaN
    max compares false, as there.
  paper: t = bf16(max − tol) over the real keys' summary; masked real keys (−BF16_MAX) count
    as in the paper's kernel; padded keys are −inf in the summary and count only if t = −inf,
    where every real key counts in the rule: then the decision is n_real ≥ 2.
  """
  thr = round_bf16(tile_max - comp.tie_tolerance) if paper else tile_max - comp.tie_tolerance
  if first.ndim == thr.ndim:
    two = second >= thr
  else:
    t = lax.broadcast_in_dim(thr, first.shape, [0])  # (Mosaic GPU has no [:, None])
    n = jnp.sum((first >= t).astype(jnp.float32) + (second >= t).astype(jnp.float32), axis=-1)
    two = n >= 2.0
  if paper:
    return jnp.where(thr == -jnp.inf, n_real >= 2.0, two)
  return jnp.logical_and(tile_max > -jnp.inf, two)


def shifted_max(tile_max, tied, comp: Compensation, paper: bool = False):
  """(m_tile, tied as float32) from the tile max and its tie decision (bool [rows]; the count
  rule's is `tie_count(...) > 1`).

  paper: the literal rule, m' = bf16(β·max) for max > 0, 0 for max < 0, unchanged at 0
    (unless `comp.guard_paper`).
  fa2: the paper's shift d = m' − max clipped to [min_shift, max_shift] (`Compensation`).
  Only tiles whose |max| ≥ comp.shift_above are shifted (and counted as tied).
  """
  if comp.shift_above > 0:
    tied = tied & (jnp.abs(tile_max) >= comp.shift_above)
  if paper and not comp.guard_paper:
    shifted = jnp.where(
      tile_max > 0, round_bf16(comp.beta * tile_max), jnp.where(tile_max < 0, 0.0, tile_max)
    )
  else:
    paper_shift = jnp.where(tile_max > 0, (comp.beta - 1.0) * tile_max, -tile_max)
    shifted = tile_max + jnp.clip(paper_shift, comp.min_shift, comp.max_shift)
  return jnp.where(tied, shifted, tile_max), tied.astype(jnp.float32)


def compensated_tile_max(
  s, comp: Compensation | None, paper: bool = False, in_range=None, top2=None
):
  """Row max of one score tile, shifted on tied rows (Qiu & Yao 2025, Alg. 1).

  Args:
    s: [rows, block_k] float32 scores, masked entries already set to the mask value (−inf
      outside the paper layout, which is what the fa2 tie count relies on).
    comp: the compensation settings, or None for plain FA2.
    paper: the literal rule of the paper's kernel (see `tie_count`, `shifted_max`).
    in_range: [block_k] bool, True for real (not padded) keys; used by the paper rule.
    top2: None: the max, then the tie count (a second pass over the tile, `tie_count`);
      else a map scores → top-2 summary (`pallas_kernels.top2.row_top2` in the Triton kernel,
      `lane_top2` or `column_top2` in the Mosaic GPU one) and the rule decided from it (`tied_by_top2`):
      the same decisions and the same max, one pass.
  Returns:
    (m_tile [rows] float32, tied [rows] float32 with 1.0 where the rule fired).
  """
  if comp is None:
    tile_max = jnp.max(s, axis=-1)
    return tile_max, jnp.zeros_like(tile_max)
  if top2 is None:
    tile_max = jnp.max(s, axis=-1)
    return shifted_max(tile_max, tie_count(s, tile_max, comp, paper, in_range) > 1.0, comp, paper)
  summary = tile_top2(s, top2, paper, in_range)
  return shifted_max(summary[0], tied_by_top2(*summary, comp, paper), comp, paper)


def check_tile(name: str, b) -> None:
  """Raises ValueError unless the tile size `b` is an int power of two >= 16 (every tile)."""
  if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 16 or b & (b - 1):
    raise ValueError(f"{name} must be a power of two >= 16, got {name}={b!r}")


def next_power_of_2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def pad_axis(x, axis: int, size: int):
  """x zero-padded at the end of `axis` to length `size` (x itself where it has that length;
  the kernels' sequence and head_dim padding). ValueError where `size` is below the axis's
  length (a caller's bug: padding never cuts)."""
  pad = size - x.shape[axis]
  if pad < 0:
    raise ValueError(f"pad_axis: size={size} is below axis {axis}'s length {x.shape[axis]}")
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


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
  # Compute sub-tile of the paper layout, whose logical tiles (up to 512×512, the paper's) are
  # too large for a GPU program: each logical tile is processed in sub-tiles and rounded once
  # per logical tile, so `sub` changes float32 summation order only.
  sub: int = 64

  def __post_init__(self):
    for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd", "sub"):
      check_tile(name, getattr(self, name))

  @classmethod
  def default(cls, head_dim: int, block_q: int | None = None, block_k: int | None = None):
    big = head_dim > 128
    return cls(
      block_q=block_q if block_q is not None else (64 if big else 128),
      block_k=block_k if block_k is not None else 64,
      block_q_bwd=32 if big else 64,
      block_k_bwd=32 if big else 64,
      sub=32 if big else 64,
    )

  def for_numerics(self, numerics: "Numerics") -> "BlockSizes":
    """The paper layout's bf16 gradient buffers make the backward tiling part of the
    numerics: it uses the forward tiles there."""
    if numerics.paper:
      return dataclasses.replace(self, block_q_bwd=self.block_q, block_k_bwd=self.block_k)
    return self

  def fit(self, q_len: int, kv_len: int) -> "BlockSizes":
    """Shrinks tiles that are longer than the padded sequence (same numerics)."""
    lq, lk = max(16, next_power_of_2(q_len)), max(16, next_power_of_2(kv_len))
    return BlockSizes(
      min(self.block_q, lq),
      min(self.block_k, lk),
      min(self.block_q_bwd, lq),
      min(self.block_k_bwd, lk),
      self.sub,
    )

  def compute(self, numerics: "Numerics"):
    """(q tile, key sub-tile) a forward program works on, and (q tile, k tile) of the two
    backward kernels' programs and inner loops: the logical tiles, except in the paper
    layout, where they are cut to `sub`."""
    if not numerics.paper:
      return self.block_q, self.block_k, self.block_q_bwd, self.block_k_bwd
    return (
      min(self.block_q, self.sub),
      min(self.block_k, self.sub),
      min(self.block_q_bwd, self.sub),
      min(self.block_k_bwd, self.sub),
    )


def centered_keys(k, kv_len=None):
  """K − c, c the mean of the first kv_len keys (all: None) per (batch, kv head), computed in
  float32 (float64 keys: float64) and rounded to k's dtype; k: [..., kv_len_p, kv_heads,
  head_dim]. Each row of the exact softmax(QKᵀ) is unchanged by a key shift common to the keys
  it sees, and each row of dS sums to 0, so dQ = dS·(K − c) is exact; with rounding it drops
  the (rowsum dS)·c term a large common component c leaves in dQ (Qiu & Yao 2025, §4;
  docs/numerics.md). c takes every key, later ones too: use it in a backward only, where a
  causal row's gradient may depend on later keys at rounding level, never in a causal forward."""
  wide = jnp.promote_types(k.dtype, jnp.float32)
  kw = k.astype(wide)
  c = jnp.mean(kw if kv_len is None else kw[..., :kv_len, :, :], axis=-3, keepdims=True)
  return (kw - c).astype(k.dtype)
