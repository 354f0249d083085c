"""The compensation (Qiu & Yao 2025, Alg. 1) and its guard, read from the kernel itself."""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_flashstable import flash_attention, reference_attention_vjp
from jax_flashstable.lab.accuracy import compare, flash_vjp, ulp_at_scale
from pallas_kernels.policy import Compensation


def tied_inputs(tie_value, dtype, n_ties=2, kv_len=40, head_dim=32, seed=0):
  """Rows whose scores (softmax_scale=1) are exactly `tie_value` at `n_ties` keys and
  tie_value − r (r ∈ [0.5, 6]) elsewhere: q = [t, 1, 0…], tied keys [1, 0, …], others [1, −r, …]."""
  rng = np.random.default_rng(seed)
  q = np.zeros((1, 8, 2, head_dim))
  q[..., 0] = tie_value
  q[..., 1] = 1.0
  k = np.zeros((1, kv_len, 1, head_dim))
  k[..., 0] = 1.0
  k[0, :, 0, 1] = -np.round(rng.uniform(0.5, 6.0, kv_len) * 8) / 8
  tied_at = rng.choice(kv_len, n_ties, replace=False)
  k[0, tied_at, 0, 1] = 0.0
  v = rng.standard_normal((1, kv_len, 1, head_dim))
  do = rng.standard_normal(q.shape)
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v, do))


def test_no_effect_without_ties_and_small_effect_with_ties_fp32():
  q, k, v, do = tied_inputs(3.0, jnp.float32)
  plain = flash_attention(q, k, v, softmax_scale=1.0)
  stable, stats = flash_attention(q, k, v, softmax_scale=1.0, stabilize=True, return_stats=True)
  assert float(stats.tied_tiles.min()) >= 1  # the rule fired on every row
  assert np.abs(np.asarray(stable) - np.asarray(plain)).max() <= 1e-6
  # random inputs (no ties): bit-identical to plain FA2
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(rng.standard_normal((1, 70, 2, 64)), jnp.float32) for _ in range(3))
  a = flash_attention(q, k, v, causal=True)
  b, st = flash_attention(q, k, v, causal=True, stabilize=True, return_stats=True)
  assert float(st.tied_tiles.max()) == 0 and np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_tied_p_bar_below_one(dtype):
  q, k, v, _ = tied_inputs(5.0, dtype, n_ties=3)
  _, plain = flash_attention(q, k, v, softmax_scale=1.0, return_stats=True)
  _, stable = flash_attention(q, k, v, softmax_scale=1.0, stabilize=True, return_stats=True)
  assert np.all(np.asarray(plain.max_p) == 1.0)  # the biased case: P̄ exactly 1
  assert np.all(np.asarray(stable.max_p) < 1.0)
  # paper's shift (beta−1)·max = 5 lies inside the guard: P̄ = e^−5
  np.testing.assert_allclose(np.asarray(stable.max_p), math.exp(-5.0), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(stable.row_max), 10.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(stable.lse), np.asarray(plain.lse), atol=1e-5)


TIES = [-120.0, -30.0, 0.0, 30.0, 100.0, 120.0]


@pytest.mark.parametrize("tie_value", TIES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_large_and_zero_ties_stay_accurate(tie_value, dtype):
  comp = Compensation(max_shift=6.0 if dtype == jnp.float16 else 20.0)  # as flash_attention
  q, k, v, do = tied_inputs(tie_value, dtype)
  (out, stats) = flash_attention(q, k, v, softmax_scale=1.0, stabilize=True, return_stats=True)
  out2, grads = flash_vjp(q, k, v, do, softmax_scale=1.0, stabilize=True)
  gold, gold_grads = reference_attention_vjp(q, k, v, do, softmax_scale=1.0, dtype=jnp.float64)
  # the guard: every tied row shifted by d ∈ [min_shift, max_shift], so P̄ ∈ [e^−20, e^−2^−7]
  max_p = np.asarray(stats.max_p)
  assert np.all(max_p < 1.0) and np.all(max_p >= math.exp(-comp.max_shift) * (1 - 1e-5))
  assert np.all(max_p <= math.exp(-comp.min_shift) * (1 + 1e-6))
  for x, g in zip((out2,) + tuple(grads), (gold,) + tuple(gold_grads)):
    x = np.asarray(x, np.float64)
    assert np.isfinite(x).all()
    # Absolute bounds at each tensor's scale (dK reaches ~480 for ties at ±120; the float32
    # scores themselves carry ~|S|·2^−24 of rounding at that size).
    top = max(1.0, float(np.abs(g).max()))
    bound = 1e-5 * top if dtype == jnp.float32 else 2 * ulp_at_scale(g) + 2.0**-8
    if dtype == jnp.float16:  # 3 more mantissa bits than bf16, scores ~|t|·2^−11 apart
      bound = max(2 * ulp_at_scale(g) / 8, 2e-3 * top)
    assert np.abs(x - g).max() <= bound, (np.abs(x - g).max(), bound)
  assert np.array_equal(np.asarray(out), np.asarray(out2))


def test_literal_paper_rule_underflows_in_the_paper_layout():
  """Why the guard exists: the paper's own rule (numerics="paper") at ties of −120 sets
  m' = 0, exp(−120) underflows and the row's output is lost; the guarded fa2 rule keeps it."""
  q, k, v, _ = tied_inputs(-120.0, jnp.bfloat16)
  gold = reference_attention_vjp(q, k, v, q, softmax_scale=1.0, dtype=jnp.float64)[0]
  paper = np.asarray(
    flash_attention(q, k, v, softmax_scale=1.0, stabilize=True, numerics="paper"), np.float64
  )
  guarded = np.asarray(flash_attention(q, k, v, softmax_scale=1.0, stabilize=True), np.float64)
  assert not np.all(np.isfinite(paper)) or np.abs(paper - gold).max() > 0.1
  assert np.abs(guarded - gold).max() < 0.02


def two_ties(top, length=64, seed=0):
  """bf16, head_dim 64, softmax_scale 1: every query row's scores are `top` at keys 0 and 1
  and 0 elsewhere."""
  q = np.zeros((1, length, 1, 64))
  q[..., 0] = 1.0
  k = np.zeros((1, length, 1, 64))
  k[0, :2, 0, 0] = top
  v = np.random.default_rng(seed).standard_normal((1, length, 1, 64))
  return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


@pytest.mark.parametrize("top", [10.0, 24.0, 30.0, 60.0])
def test_literal_paper_shift_scales_large_tied_rows_toward_zero(top):
  """The paper layout's literal shift m' = 2·max at two ties at `top`: the tile's P̄ sums to
  2e^−top (+ 62e^−2·top), which the kernel's clamp (≥ 1e−10) raises once top > ln(2·10¹⁰) ≈
  23.7, so O = gold · (2e^−top / 1e−10): 1 at 10, 0.755 at 24, 1.87e−3 at 30, 1.75e−16 at 60
  (from the definition). With guard_shift the same layout keeps O within the FP64 rule."""
  q, k, v = two_ties(top)
  kw = dict(softmax_scale=1.0, stabilize=True, numerics="paper", block_q=64, block_k=64)
  gold = np.asarray(reference_attention_vjp(q, k, v, q, softmax_scale=1.0, dtype=jnp.float64)[0])
  literal = np.asarray(flash_attention(q, k, v, **kw), np.float64)
  total = 2 * math.exp(-top) + 62 * math.exp(-2 * top)
  np.testing.assert_allclose(literal, gold * min(1.0, total / 1e-10), rtol=2e-2, atol=1e-30)
  guarded = np.asarray(flash_attention(q, k, v, guard_shift=True, **kw), np.float64)
  assert np.abs(guarded - gold).max() <= 2 * ulp_at_scale(gold), np.abs(guarded - gold).max()


def test_guarded_paper_shift_and_the_clamp():
  """numerics="paper", guard_shift, causal, two 64-key tiles; two ties at 30 (key 0 and 1),
  every other score 0. A tied row's shift is clipped to max_shift, so its tied P̄ sums to
  2e^−max_shift, and its other tile (fully masked, or real keys at e^−(30+max_shift)) sums
  below 1e−10 and is clamped up to it: O = gold · 2e^−d / (2e^−d + 1e−10) (from the
  definition): 0.976 at max_shift 20, 1 − 2e−8 at 6, within the FP64 rule."""
  q, k, v = two_ties(30.0, length=128)
  gold = np.asarray(
    reference_attention_vjp(q, k, v, q, causal=True, softmax_scale=1.0, dtype=jnp.float64)[0]
  )
  kw = dict(causal=True, softmax_scale=1.0, stabilize=True, numerics="paper", guard_shift=True)
  for cap in (20.0, 6.0):
    out = np.asarray(
      flash_attention(q, k, v, max_shift=cap, block_q=64, block_k=64, **kw), np.float64
    )
    factor = 2 * math.exp(-cap) / (2 * math.exp(-cap) + 1e-10)
    big = np.abs(gold[0, 1:]) > 0.1  # rows 1…: ratios of O to gold away from 0
    ratio = np.median(out[0, 1:][big] / gold[0, 1:][big])
    # the bf16 roundings of l, P̄ (dot only) and O: a few 2^−9 apart from the definition
    assert ratio == pytest.approx(factor, abs=6e-3), (cap, ratio, factor)
  assert np.abs(out - gold).max() <= 2 * ulp_at_scale(gold)  # the cap of 6


LN2_CAPS = (8 * math.log(2), 28 * math.log(2))  # 5.5452, 19.4081: e^−cap = 2⁻⁸, 2⁻²⁸


@pytest.mark.parametrize("cap", [6.0, 20.0, *LN2_CAPS])
def test_capped_shift_scales_tied_rows_by_its_rounding(cap):
  """Two ties at 30 or 50 (one batch element each) > cap, every other score 0, float32 O
  (fp32_out, so no final rounding):
  the clipped shift gives every such row the same d = cap, and the P̄V dot takes the tied
  P̄ = e^−cap rounded to bf16 while the row sum l adds the float32 one, so O = gold ·
  r(e^−cap)/e^−cap on every row: 0.99725 at cap 6, 1.00253 at 20 (from the definition), a
  bias common to all tied rows past the cap. With sum_rounded_p, l adds the rounded P̄ and
  O = gold to float32 accuracy. A cap at a multiple of ln 2 (8 ln 2, 28 ln 2) makes the
  capped P̄ a power of two, which bf16 holds: r(P̄)/P̄ = 1 to within the float32 rounding of
  m′ = max + cap and O = gold without sum_rounded_p: through the Triton kernels' exp(S − m′)
  and through the Mosaic GPU forward's 2^((S − m′)·log₂e) (interpret mode: exact exp2
  where the GPU runs ex2.approx; it has no sum_rounded_p). Not in the paper layout, which
  rounds S − m′ to bf16 (docs/numerics.md)."""
  q, k, v = (jnp.concatenate(x) for x in zip(two_ties(30.0), two_ties(50.0)))
  gold = np.asarray(reference_attention_vjp(q, k, v, q, softmax_scale=1.0, dtype=jnp.float64)[0])
  tied_p = np.exp(np.float32(-cap))
  factor = float(tied_p.astype(ml_dtypes.bfloat16)) / float(tied_p)
  expected = {6.0: 0.99725, 20.0: 1.00253}.get(cap, 1.0)  # as the docs say
  assert factor == pytest.approx(expected, abs=1e-5 if cap in (6.0, 20.0) else 1e-6)
  big = np.abs(gold) > 0.1
  kw = dict(softmax_scale=1.0, stabilize=True, numerics="fp32_out", max_shift=cap)
  for rsum, expected in ((False, factor), (True, 1.0)):
    out = np.asarray(flash_attention(q, k, v, sum_rounded_p=rsum, **kw), np.float64)
    np.testing.assert_allclose(out[big] / gold[big], expected, rtol=1e-5)
  out = np.asarray(flash_attention(q, k, v, backend="mosaic_gpu", **kw), np.float64)
  np.testing.assert_allclose(out[big] / gold[big], factor, rtol=1e-5)


def test_rounded_row_sum_backward_takes_the_forwards_weights():
  """sum_rounded_p: l sums the rounded P̄, so the backward's P is r(P̄)/l, the weights O took,
  and each row's P sums to 1. With the float32 P̄ over that l it would sum to
  e^−6/r(e^−6) = 1.00276 on rows whose two ties (at 30, past the cap of 6) carry the row, and
  dV of the tied keys (Σ_i P_i,tie·dO_i, dO > 0) would come out 0.28% high. A third key at
  30 − 2…6, different per row, spreads P_tie over 0.47–0.50 so that the bf16 rounding of P
  for the dV dot averages out. Against FP64, mean over the 128 tied entries of dV."""
  rng = np.random.default_rng(1)
  q, k, v = (np.asarray(x, np.float32) for x in two_ties(30.0))
  q[0, :, 0, 1] = rng.uniform(-1, 1, q.shape[1])
  k[0, 2, 0, :2] = (26.0, 2.0)  # key 2 scores 26 + 2·q₁ ∈ [24, 28]
  do = rng.uniform(0.5, 1.5, q.shape)
  q, k, v, do = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do))
  kw = dict(softmax_scale=1.0, stabilize=True, numerics="fp32_out", max_shift=6.0)
  dv = np.asarray(flash_vjp(q, k, v, do, sum_rounded_p=True, **kw)[1][2], np.float64)
  gold = reference_attention_vjp(q, k, v, do, softmax_scale=1.0, dtype=jnp.float64)[1][2]
  ratio = np.mean(dv[0, :2] / np.asarray(gold)[0, :2])  # the two tied keys
  assert ratio == pytest.approx(1.0, abs=7e-4), ratio


def test_literal_and_guarded_shift_differ_only_past_the_cap():
  """The paper layout's literal compensation and paper+comp+guard:max_shift=6 shift a tied
  tile by the same d = |max| whenever 2⁻⁷ ≤ |max| ≤ 6 (the cap; β = 2), so O and the gradients
  are the same bits there; past the cap they part (at 30 the literal rule's row is switched
  off). So at anchor-b128 the two differ only on tied tiles whose max exceeds 6 in size
  (docs/studies/instability-anchor-b128.md). One batch element per tie value."""
  ties = (-6.0, 0.5, 3.0, 7.0, 30.0)
  q, k, v, do = (jnp.concatenate(x) for x in zip(*(tied_inputs(t, jnp.bfloat16) for t in ties)))
  kw = dict(softmax_scale=1.0, stabilize=True, numerics="paper")
  literal = jax.tree.leaves(flash_vjp(q, k, v, do, **kw))
  guarded = jax.tree.leaves(flash_vjp(q, k, v, do, guard_shift=True, max_shift=6.0, **kw))
  for b, t in enumerate(ties):
    same = [np.array_equal(np.asarray(x[b]), np.asarray(y[b])) for x, y in zip(literal, guarded)]
    assert all(same) == (abs(t) <= 6.0), (t, same)


@pytest.mark.parametrize("numerics, above", [("paper", 24.0), ("fa2", 5.0)])
def test_shift_above_shifts_only_the_large_ties(numerics, above):
  """`shift_above`: a tied tile is shifted only when its |max| ≥ shift_above, |max| after the
  softmax scale (here 0.5 on doubled scores). Per batch element one tie value, two of them on
  the threshold itself: below it the bits (O, the gradients, the tie count) are those without
  the compensation, at or above it those with the compensation as it is (in the paper layout
  the literal shift, whose rows past ≈ 23.7 the clamp switches off: the training variant
  `paper+comp:shift_above=23.7`). The NumPy emulation follows the kernel's O bit for bit."""
  from pallas_kernels.emulation import emulate_forward
  from pallas_kernels.policy import BlockSizes, get_numerics

  ties = (-30.0, -above, 3.0, above, 10.0, 30.0)
  q, k, v, do = (jnp.concatenate(x) for x in zip(*(tied_inputs(t, jnp.bfloat16) for t in ties)))
  q = q * 2  # exact in bfloat16: the scores double, softmax_scale halves them back
  kw = dict(softmax_scale=0.5, numerics=numerics, return_stats=True)

  def run(**more):
    (out, stats), vjp = jax.vjp(lambda *a: flash_attention(*a, **kw, **more), q, k, v)
    return [out, stats.tied_tiles, *vjp((do, jax.tree.map(jnp.zeros_like, stats)))]

  plain, full, some = run(), run(stabilize=True), run(stabilize=True, shift_above=above)
  for b, t in enumerate(ties):
    want = full if abs(t) >= above else plain
    for got, x in zip(some, want):
      np.testing.assert_array_equal(np.asarray(got[b], np.float32), np.asarray(x[b], np.float32))
    assert (float(np.asarray(some[1][b]).min()) >= 1) == (abs(t) >= above)  # the rule fired
  layout = get_numerics(numerics)
  blocks = BlockSizes.default(32).for_numerics(layout).fit(q.shape[1], k.shape[1])
  eo = emulate_forward(
    *(np.asarray(x).astype(ml_dtypes.bfloat16) for x in (q, k, v)),
    causal=False,
    softmax_scale=0.5,
    block_k=blocks.block_k,
    dtype=ml_dtypes.bfloat16,
    numerics=layout,
    compensation=Compensation(shift_above=above),
    intermediate=True,
    seeds=None,
    head_dim_padded=32,
  )[0]
  np.testing.assert_array_equal(np.asarray(some[0], np.float32), np.asarray(eo, np.float32))


def test_shift_above_keeps_the_masked_tiles_shift():
  """The paper layout's causal loop visits every key tile; a fully masked one (every score
  −BF16_MAX, so all tied) has |max| above any threshold and is shifted to 0 as by the literal
  rule. So with `shift_above` as without it, a causal row whose scores are all negative and
  whose query tile has a masked key tile ends with row_max 0 (its scores then count from 0:
  past ≈ −23.7 the clamp switches it off, as in `paper+comp`), while the rows of the last
  query tile, which have no masked tile, keep their own max. Distinct scores (−5.5 − j/16,
  no ties among real keys): the bits with shift_above are the literal rule's everywhere and
  the plain kernel's on the last query tile; O stays within 1e−2 of FP64."""
  n, d = 64, 32
  q = np.zeros((1, n, 1, d))
  q[..., 0], q[..., 1] = -5.0, 1.0
  k = np.zeros((1, n, 1, d))
  k[..., 0], k[0, :, 0, 1] = 1.0, -(0.5 + np.arange(n) / 16)
  v = np.random.default_rng(0).standard_normal((1, n, 1, d))
  q, k, v, do = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, v[:, ::-1]))
  kw = dict(causal=True, softmax_scale=1.0, numerics="paper", block_q=32, block_k=32)

  def run(**more):
    f = lambda *a: flash_attention(*a, return_stats=True, **kw, **more)  # noqa: E731
    (out, stats), vjp = jax.vjp(f, q, k, v)
    return [out, stats.row_max, *vjp((do, jax.tree.map(jnp.zeros_like, stats)))]

  plain, full, some = run(), run(stabilize=True), run(stabilize=True, shift_above=23.7)
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  for got, x, y in zip(some, full, plain):
    np.testing.assert_array_equal(f32(got), f32(x))
    np.testing.assert_array_equal(f32(got)[:, 32:], f32(y)[:, 32:])
  assert (f32(some[1])[:, :32] == 0).all() and (f32(plain[1])[:, :32] < -5).all()
  gold = reference_attention_vjp(q, k, v, do, causal=True, softmax_scale=1.0, dtype=jnp.float64)
  np.testing.assert_allclose(f32(some[0]), np.asarray(gold[0]), atol=1e-2)


def test_shift_above_drops_the_partial_switch_off():
  """Below 23.7 the literal rule still scales O: a tie at 20 in the first tile raises the paper
  layout's row max to 40, and each of the seven later tiles (64 scores at 10) then sums to
  64·e^−30 < 1e−10 and is clamped up to 1e−10 in l but not in O's numerator. With v = 1 (O = 1 exactly): 0.871
  under the literal rule (0.864 in exact arithmetic; the paper layout rounds l to bfloat16 per
  tile), 1 under shift_above=23.7 and without the compensation."""
  n, d = 8 * 64, 32
  q = np.zeros((1, 1, 1, d))
  q[..., 0] = 1.0
  k = np.zeros((1, n, 1, d))
  k[0, :, 0, 0] = 10.0
  k[0, :2, 0, 0] = 20.0
  q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, np.ones((1, n, 1, d))))
  kw = dict(softmax_scale=1.0, numerics="paper", block_k=64)
  o = lambda **more: float(np.asarray(flash_attention(q, k, v, **kw, **more), np.float32).max())  # noqa: E731
  assert o() == 1.0 and o(stabilize=True, shift_above=23.7) == 1.0
  # exact arithmetic: Σ P̄ over Σ max(tile sum, 1e−10), P̄ against the row max 40: 0.8637
  tied, low = 2 * math.exp(-20), math.exp(-30)
  literal = (tied + 510 * low) / (tied + 62 * low + 7 * 1e-10)
  assert abs(o(stabilize=True) - literal) < 0.01, (o(stabilize=True), literal)  # 0.8711: l in bf16
  # the tie in the last tile: the earlier tiles' sums were taken against their own max (10)
  # and are only rescaled, never clamped: O = 1 under the literal rule too
  k = jnp.roll(k, -2, axis=1)
  assert o(stabilize=True) == 1.0


@pytest.mark.parametrize(
  "value, error, message",
  [
    (1.0, ValueError, "shift_above=1.0 needs stabilize"),  # without the compensation
    (-1.0, ValueError, "shift_above must be a finite number >= 0, got shift_above=-1.0"),
    (float("nan"), ValueError, "got shift_above=nan"),
    ("1", TypeError, "shift_above must be a real number, got shift_above='1'"),
    (None, TypeError, "got shift_above=None"),
    (np.array([1.0, 2.0]), TypeError, r"single number, got shift_above=ndarray\(shape=\(2,\)"),
  ],
)
def test_bad_shift_above(value, error, message):
  q = jnp.zeros((1, 8, 1, 32), jnp.bfloat16)
  with pytest.raises(error, match=message):
    flash_attention(q, q, q, stabilize=not message.endswith("needs stabilize"), shift_above=value)


def test_settings_take_numpy_numbers():
  """beta, tie_tolerance, max_shift and shift_above take NumPy integers and 0-d arrays as
  Python numbers (the same bits)."""
  q, k, v, _ = tied_inputs(30.0, jnp.bfloat16)
  py = dict(beta=3, tie_tolerance=0.0, max_shift=6, shift_above=24)
  want = flash_attention(q, k, v, stabilize=True, numerics="fa2", **py)
  for wrap in (np.int64, np.float32, np.asarray):
    got = flash_attention(q, k, v, stabilize=True, numerics="fa2", **jax.tree.map(wrap, py))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  assert Compensation(shift_above=np.int64(24)) == Compensation(shift_above=24.0)
  defaults = flash_attention(q, k, v, stabilize=True, numerics="fa2")  # the settings count
  assert not np.array_equal(np.asarray(want, np.float32), np.asarray(defaults, np.float32))


@pytest.mark.parametrize(
  "value, message",
  [
    (True, "must be a real number, got x=True"),
    (np.asarray(True), "must be a real number, got x=array(True)"),
    (b"1", "must be a real number, got x=b'1'"),
    (1 + 2j, "must be a real number, got x=(1+2j)"),
    (np.timedelta64(1, "s"), "must be a real number"),
    (np.ones((2, 2)), "must be a single number, got x=ndarray(shape=(2, 2), dtype=float64)"),
    (10**400, "must be a concrete real number, got x=1000000000"),
  ],
)
def test_real_number_names_the_value_in_one_line(value, message):
  """Every static number of the kernels (softmax_scale, the compensation's settings) goes
  through `policy.real_number`: a one-line TypeError naming the value; a tracer too."""
  from pallas_kernels.policy import real_number

  with pytest.raises(TypeError) as e:
    real_number("x", value)
  assert message in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(TypeError, match=r"concrete real number, got x=JitTracer"):
    jax.jit(lambda s: real_number("x", s))(1.0)


@pytest.mark.parametrize("tie_value", TIES)
def test_guarded_paper_shift_stays_accurate(tie_value):
  """numerics="paper" with guard_shift at ties from −120 to 120: O and the gradients within the
  FP64 rule (error ≤ 2·error(naive bf16) + one bf16 ulp at scale), as the literal rule is
  not at −120 (`test_literal_paper_rule_underflows_in_the_paper_layout`) or above ≈ 24."""
  q, k, v, do = tied_inputs(tie_value, jnp.bfloat16)
  c = compare(
    q,
    k,
    v,
    do,
    causal=False,
    softmax_scale=1.0,
    stabilize=True,
    numerics="paper",
    guard_shift=True,
  )
  assert all(c.passes().values()), {n: (c.flash[n].max, c.standard[n].max) for n in c.flash}


@pytest.mark.parametrize(
  "kw",
  [
    dict(numerics="fa2", stabilize=True),
    dict(numerics="paper"),
    dict(numerics="paper", stabilize=True, guard_shift=1),
  ],
)
def test_guard_shift_needs_the_paper_layout_with_the_compensation(kw):
  q = jnp.zeros((1, 4, 1, 32), jnp.bfloat16)
  with pytest.raises((ValueError, TypeError), match="guard_shift"):
    flash_attention(q, q, q, **{"guard_shift": True, **kw})


@pytest.mark.parametrize(
  "kw, dtype",
  [
    (dict(max_shift=6.0), jnp.bfloat16),  # no compensation
    (dict(stabilize=True, max_shift=float("inf")), jnp.bfloat16),
    (dict(stabilize=True, max_shift=1e-3), jnp.bfloat16),  # below min_shift 2^-7
    (dict(stabilize=True, max_shift="6"), jnp.bfloat16),
    (dict(stabilize=True, max_shift=True), jnp.bfloat16),
    (dict(stabilize=True, numerics="paper", max_shift=6.0), jnp.bfloat16),  # literal: no cap
    (dict(stabilize=True, max_shift=20.0), jnp.float16),  # e^-20 flushes in float16
    (dict(stabilize=True, max_shift=41.0), jnp.bfloat16),  # P̄·v flushed: wrong O; NaN at 88
    (dict(stabilize=True, numerics="paper", guard_shift=True, max_shift=24.0), jnp.bfloat16),
  ],
)
def test_bad_max_shift(kw, dtype):
  """max_shift is refused, naming it, wherever it would not act as asked: without the
  compensation, outside [2^-7, 40] (`policy.MAX_SHIFT`; 23 in the paper layout, whose kernel
  clamps a tile's P̄ sum at 1e−10), not a number, with the paper layout's literal shift (which
  has no cap; bit-identical outputs otherwise), above 6 for float16."""
  q = jnp.zeros((1, 4, 1, 32), dtype)
  with pytest.raises((ValueError, TypeError), match="max_shift"):
    flash_attention(q, q, q, **kw)
  from jax_flashstable import AttentionConfig

  if dtype == jnp.bfloat16:  # the config refuses the same before any call
    with pytest.raises((ValueError, TypeError), match="max_shift"):
      AttentionConfig(**kw)


@pytest.mark.parametrize(
  "kw,message",
  [
    (dict(max_shift=float("nan")), r"^max_shift must be a finite number > 0, got max_shift=nan$"),
    (dict(min_shift=float("nan")), r"^min_shift must be a finite number > 0, got min_shift=nan$"),
    (dict(max_shift=float("inf")), r"^max_shift must be a finite number > 0, got max_shift=inf$"),
    (dict(min_shift=0.0), r"^min_shift must be a finite number > 0, got min_shift=0.0$"),
    (dict(min_shift=5.0, max_shift=2.0), r"^need min_shift <= max_shift, got min_shift=5.0, "),
  ],
)
def test_compensation_names_the_shift_bound_out_of_range(kw, message):
  """`Compensation`'s min_shift and max_shift: the one out of range is named alone (a NaN
  max_shift is not reported as min_shift's fault); the pair out of order names both."""
  from pallas_kernels.policy import Compensation

  with pytest.raises(ValueError, match=message):
    Compensation(**kw)


@pytest.mark.parametrize(
  "kw, dtype, error",
  [
    (dict(sum_rounded_p=True), jnp.float16, ValueError),  # no bit-level float16 rounding
    (dict(sum_rounded_p=True, backend="mosaic_gpu"), jnp.bfloat16, ValueError),
    (dict(sum_rounded_p=1), jnp.bfloat16, TypeError),
  ],
)
def test_bad_sum_rounded_p(kw, dtype, error):
  q = jnp.zeros((1, 16, 1, 16), dtype)
  with pytest.raises(error, match="sum_rounded_p"):
    flash_attention(q, q, q, stabilize=True, **kw)


def test_guard_and_max_shift_specs_round_trip():
  from jax_flashstable import AttentionConfig

  c = AttentionConfig.parse("paper+comp+guard:max_shift=6,block_q=512,block_k=512")
  assert (c.guard_shift, c.max_shift, c.numerics, c.stabilize) == (True, 6.0, "paper", True)
  assert c.name == "paper+comp+guard:max_shift=6.0,block_q=512,block_k=512"
  assert AttentionConfig.parse(c.name) == c
  assert AttentionConfig.parse("fa2+comp:max_shift=none") == AttentionConfig.parse("fa2+comp")
  c = AttentionConfig.parse("paper+comp+guard+rsum:max_shift=6")
  assert c.sum_rounded_p and AttentionConfig.parse(c.name) == c
  with pytest.raises(ValueError, match="sum_rounded_p"):  # the Mosaic GPU forward has no +rsum
    AttentionConfig.parse("fa2+rsum+mgpu")


def test_float16_with_large_ties_is_not_flushed():
  """A float16 tie at +30 shifted by 20 would give P̄ = e^−20 = 0 in float16 (reviewer's case)."""
  q = np.zeros((1, 1, 1, 16))
  q[..., 0] = 1
  k = np.zeros((1, 4, 1, 16))
  k[0, :, 0, 0] = [30, 30, 0, -5]
  v = np.random.default_rng(0).standard_normal((1, 4, 1, 16))
  q, k, v = (jnp.asarray(x, jnp.float16) for x in (q, k, v))
  out = np.asarray(flash_attention(q, k, v, softmax_scale=1.0, stabilize=True), np.float64)
  gold = reference_attention_vjp(q, k, v, q, softmax_scale=1.0, dtype=jnp.float64)[0]
  assert np.abs(out - gold).max() < 2e-3


@pytest.mark.parametrize(
  "dtype, numerics, cap",  # the paper layout rounds its buffers to bf16: bfloat16 inputs
  [(jnp.float32, "fa2", 40.0), (jnp.bfloat16, "fa2", 40.0), (jnp.bfloat16, "paper", 23.0)],
)
def test_the_largest_max_shift_keeps_tied_rows_right(dtype, numerics, cap):
  """At the largest max_shift (`policy.MAX_SHIFT`, 40; the paper layout's 23 with guard_shift)
  a row of four keys tied at 100 still gives the definition's output, the mean of the four
  values (FP64), within the layout's rounding, for values of size 1, 1e−3 and 1e−6: at 80 the
  tied P̄ = e^−80 times values of 1e−3 fell below float32's smallest normal and half of O was
  flushed (a review's measurement), at 88 O was NaN; in the paper layout past 23.7 two ties sum
  below its kernel's 1e−10 clamp and O goes to 0 (`test_bad_max_shift` refuses those)."""
  q = np.zeros((1, 1, 1, 16), np.float32)
  q[..., 0] = 100.0
  k = np.zeros((1, 4, 1, 16), np.float32)
  k[..., 0] = 1.0
  v0 = np.random.default_rng(0).standard_normal((1, 4, 1, 16)).astype(np.float32)
  kw = dict(softmax_scale=1.0, stabilize=True, numerics=numerics, max_shift=cap)
  if numerics == "paper":
    kw["guard_shift"] = True
  for size in (1.0, 1e-3, 1e-6):
    q_, k_, v = (jnp.asarray(x, dtype) for x in (q, k, v0 * size))
    out = np.asarray(flash_attention(q_, k_, v, **kw), np.float64)[:, 0]
    gold = np.asarray(v, np.float64).mean(axis=1)
    err = np.abs(out - gold).max() / np.abs(gold).max()
    assert err < (1e-6 if dtype == jnp.float32 else 1e-2), (size, err)


@pytest.mark.parametrize(
  "bad",
  [
    dict(beta=1.0),
    dict(beta=0.5),
    dict(beta=float("nan")),
    dict(tie_tolerance=-1e-3),
    dict(tie_tolerance=float("inf")),
    dict(beta=1e300),  # finite, but inf in the kernels' float32: inf · 0 = NaN at a max of 0
    dict(tie_tolerance=1e39),
  ],
)
def test_bad_compensation_settings(bad):
  q = jnp.zeros((1, 4, 1, 32), jnp.bfloat16)
  name = next(iter(bad))
  with pytest.raises(ValueError, match=name):
    flash_attention(q, q, q, stabilize=True, **bad)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_unscaled_compensation_decides_as_on_the_scaled_scores(head_dim):
  """`Compensation.unscaled(c)` on QKᵀ (the Mosaic GPU forward's scale_in_exp2) against the
  rule on S = fl(QKᵀ·c): rows of 64 scores built around the thresholds in S's units (ties,
  near-ties at ½·tol and 2·tol, maxima where the shift's clip to [min_shift, max_shift]
  binds, negative maxima, maxima below shift_above, a fully masked row). At c = 1/8 (head_dim
  64, a power of two: every product is exact) the shifted maxima are equal bit for bit, m·c
  against the rule's m; at c = 128^−½ the tie decisions are equal and m·c is within two
  float32 ulps of the larger of the row's max and max_shift (m·c is rounded once, the rule
  adds the shift to a rounded S). Fails if a threshold is left in S's units (the shift's clip
  at 20 would bind at 20 of QKᵀ, 2.5 of S at head_dim 64; each of the four thresholds
  undivided, checked)."""
  from pallas_kernels.policy import compensated_tile_max

  c = head_dim**-0.5
  rng = np.random.default_rng(head_dim)
  rows = []
  for top in (-30.0, -2.0, 1e-4, 0.5, 3.0, 15.0, 40.0):  # in S's units
    for gap in (0.0, 0.5e-3, 2e-3, 1.0):  # tie_tolerance 1e-3
      s = top - np.abs(rng.normal(3.0, 2.0, 64))
      s[[5, 40]] = top, top - gap
      rows.append(s)
  rows.append(np.full(64, -np.inf))
  raw = (np.asarray(rows) / c).astype(np.float32)  # QKᵀ; S = fl(QKᵀ·c) as the kernel forms it
  scaled = (raw * np.float32(c)).astype(np.float32)
  # shift_above 1: rows with |max| < 1 (of S) left alone
  for comp in (Compensation(), Compensation(shift_above=1.0)):
    m_rule, tied_rule = compensated_tile_max(jnp.asarray(scaled), comp)
    m_raw, tied = compensated_tile_max(jnp.asarray(raw), comp.unscaled(c))
    m_rule, m = np.asarray(m_rule), np.asarray(m_raw) * np.float32(c)
    np.testing.assert_array_equal(np.asarray(tied), np.asarray(tied_rule))
    assert 0 < np.asarray(tied).sum() < len(rows)  # the rule fired on some rows, not on all
    if head_dim == 64:
      np.testing.assert_array_equal(m, m_rule)
      continue
    finite = np.isfinite(m_rule)
    assert np.array_equal(m[~finite], m_rule[~finite])
    bound = 2 * np.spacing(np.maximum(np.abs(scaled.max(-1)), comp.max_shift)[finite])
    assert np.all(np.abs(m[finite] - m_rule[finite]) <= bound), (m, m_rule)
