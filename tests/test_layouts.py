"""Every precision layout × stabilize, forward and backward, against FP64; layout-specific
properties (fp32_out dtype, stochastic unbiasedness and key dependence, paper tiles)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flashstable import flash_attention, reference_attention
from jax_flashstable.lab.accuracy import TENSORS, bf16_ulp, compare_to_golden
from jax_flashstable.lab.shapes import Shape, make_inputs

LAYOUTS = ["fa2", "paper", "fp32_out", "stochastic"]


@pytest.mark.parametrize("stabilize", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_against_fp64(layout, stabilize):
  kw = dict(rng_key=jax.random.key(0)) if layout == "stochastic" else {}
  c = compare_to_golden(
    Shape(1, 150, 150, 4, 2, 64, causal=True),
    jnp.bfloat16,
    seed=1,
    numerics=layout,
    stabilize=stabilize,
    **kw,
  )
  assert all(c.flash[t].finite for t in TENSORS)
  assert all(c.passes().values()), {t: (c.flash[t], c.standard[t]) for t in TENSORS}


def test_fp32_out_returns_float32_and_is_more_accurate():
  q, k, v, _ = make_inputs(Shape(1, 70, 70, 2, 2, 32), jnp.bfloat16, 2)
  o32 = flash_attention(q, k, v, numerics="fp32_out")
  o16 = flash_attention(q, k, v)
  assert o32.dtype == jnp.float32 and o16.dtype == jnp.bfloat16
  assert np.array_equal(np.asarray(o32.astype(jnp.bfloat16)), np.asarray(o16))
  gold = reference_attention(q, k, v, dtype=jnp.float64)
  (max32, mean32), (max16, mean16) = (
    (
      np.abs(np.asarray(o, np.float64) - gold).max(),
      np.abs(np.asarray(o, np.float64) - gold).mean(),
    )
    for o in (o32, o16)
  )
  # no final rounding: closer to FP64 (what remains is the rounding of P̄ for the P̄V dot)
  assert max32 < max16 and mean32 < 0.75 * mean16, (max32, max16, mean32, mean16)


def test_stochastic_rounding_is_unbiased_and_keyed():
  """One value between two bf16 neighbours: the mean over keys converges to it."""
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 32), jnp.bfloat16, 3)
  exact = np.asarray(flash_attention(q, k, v, numerics="fp32_out"), np.float64)
  f = jax.jit(lambda key: flash_attention(q, k, v, numerics="stochastic", rng_key=key))
  outs = np.stack([np.asarray(f(jax.random.key(i)), np.float64) for i in range(64)])
  assert not np.array_equal(outs[0], outs[1])
  assert np.array_equal(np.asarray(f(jax.random.key(5))), np.asarray(f(jax.random.key(5))))
  ulp = bf16_ulp(exact)
  # each draw is one of the two neighbours; the mean error is far below nearest rounding's
  assert np.all(np.abs(outs - exact) < ulp * 1.0001)
  mean_err = np.mean((outs.mean(0) - exact) / ulp)
  nearest = np.asarray(flash_attention(q, k, v), np.float64)
  assert abs(mean_err) < 0.02 and np.mean(np.abs(outs.mean(0) - exact) / ulp) < np.mean(
    np.abs(nearest - exact) / ulp
  )


def test_layout_errors():
  q = jnp.zeros((1, 8, 1, 32), jnp.bfloat16)
  with pytest.raises(ValueError, match="rng_key"):
    flash_attention(q, q, q, numerics="stochastic")
  with pytest.raises(ValueError, match="numerics='fa2'"):
    flash_attention(q, q, q, rng_key=jax.random.key(0))
  with pytest.raises(TypeError, match="float32"):
    flash_attention(
      q.astype(jnp.float32),
      q.astype(jnp.float32),
      q.astype(jnp.float32),
      numerics="stochastic",
      rng_key=jax.random.key(0),
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_row_of_minus_inf_scores_is_nan_but_not_in_the_paper_layout(causal):
  """A query row whose scores are all −inf (a −inf query component against positive keys) has
  no softmax: the definition gives 0/0, NaN, as fa2 does. The paper layout reproduces the
  paper's kernel, which masks with bf16's lowest (−3.39e38, above −inf) and clamps each
  tile's P̄ sum at ≥ 1e−10 (docs/api.md, softmax_scale): without causal that row comes out 0;
  with causal its masked keys (2–7 for row 1) outrank the −inf scores and it comes out finite,
  a mix of their values (its weights the paper kernel's rescaling of the masked tiles). The
  other rows are finite and equal the float32 reference either way."""
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 4, 1, 16)), jnp.bfloat16)
  k = jnp.abs(jnp.asarray(rng.standard_normal((1, 8, 1, 16)), jnp.bfloat16)) + 0.1
  v = jnp.asarray(rng.standard_normal((1, 8, 1, 16)), jnp.bfloat16)
  q = q.at[0, 1, 0, 0].set(-jnp.inf)
  ref = np.asarray(reference_attention(q, k, v, causal=causal), np.float64)
  fa2, paper = (
    np.asarray(flash_attention(q, k, v, causal=causal, numerics=n), np.float64)
    for n in ("fa2", "paper")
  )
  assert np.isnan(fa2[0, 1]).all()
  if causal:  # the masked keys' values weigh in: finite, and within their range
    masked = np.asarray(v, np.float64)[0, 2:]
    row = paper[0, 1]
    assert np.isfinite(row).all() and np.abs(row).max() > 0
    assert (row >= masked.min(axis=0) - 1e-6).all() and (row <= masked.max(axis=0) + 1e-6).all()
  else:
    assert (paper[0, 1] == 0).all()
  for out in (fa2, paper):
    rest = np.delete(out, 1, axis=1)
    assert np.isfinite(rest).all() and np.abs(rest - np.delete(ref, 1, axis=1)).max() < 0.05
