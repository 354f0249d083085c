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
