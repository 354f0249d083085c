"""The references themselves, against an independent NumPy float64 computation."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_flashstable import reference_attention


def numpy_attention(q, k, v, causal, scale):
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, 2), np.repeat(v, group, 2)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
  if causal:
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("causal", [False, True])
def test_fp64_reference_matches_numpy(causal):
  rng = np.random.default_rng(0)
  q, k, v = (
    rng.standard_normal((2, 9, 4, 8)),
    rng.standard_normal((2, 11, 2, 8)),
    rng.standard_normal((2, 11, 2, 8)),
  )
  out = reference_attention(
    q.astype(np.float32),
    k.astype(np.float32),
    v.astype(np.float32),
    causal=causal,
    dtype=jnp.float64,
  )
  assert out.dtype == np.float64 and not jax.config.jax_enable_x64  # x64 stayed local
  want = numpy_attention(
    *(x.astype(np.float32).astype(np.float64) for x in (q, k, v)), causal, 8**-0.5
  )
  np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)


def test_bf16_reference_rounds_three_times():
  """Emulated in NumPy: S, P and O each rounded to bf16 after float32 work."""
  bf = ml_dtypes.bfloat16
  rng = np.random.default_rng(1)
  q, k, v = (
    rng.standard_normal(s).astype(bf) for s in [(1, 5, 1, 16), (1, 7, 1, 16), (1, 7, 1, 16)]
  )
  out = reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), dtype=jnp.bfloat16)
  assert out.dtype == jnp.bfloat16
  f = lambda x: x.astype(np.float64)
  s = (
    np.einsum("qd,kd->qk", f(q[0, :, 0]), f(k[0, :, 0])).astype(np.float32) * np.float32(0.25)
  ).astype(bf)
  s32 = s.astype(np.float32)
  p = np.exp(s32 - s32.max(-1, keepdims=True))
  p = (p / p.sum(-1, keepdims=True)).astype(bf)
  o = (f(p) @ f(v[0, :, 0])).astype(np.float32).astype(bf)
  got = np.asarray(out[0, :, 0]).astype(np.float32)
  assert np.mean(got == o.astype(np.float32)) >= 0.95
  # and it differs from the unrounded float32 result, so the roundings are really there
  o32 = reference_attention(
    jnp.asarray(q, jnp.float32),
    jnp.asarray(k, jnp.float32),
    jnp.asarray(v, jnp.float32),
    dtype=jnp.float32,
  )
  assert np.abs(np.asarray(o32[0, :, 0]) - got).max() > 0
