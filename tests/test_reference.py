"""The references themselves, against an independent NumPy float64 computation."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_flashstable import reference_attention, reference_attention_vjp


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


@pytest.mark.parametrize("causal", [False, True])
def test_fp64_reference_at_huge_scales_is_the_hard_max(causal):
  """At softmax_scale 1e18–1e300 (a float64 scale; unit scores) softmax is the hard max: each
  row's output is the value of its top key, wherever that key leads the runner-up by more
  than the dot's float64 rounding. Until the reference kept one S for the row max and the
  subtraction (XLA CPU computed the fused dot twice, in different orders, so a score could
  pass its max by an ulp: e^ulp overflowed) it gave NaN: 96 of 1,024 outputs at 1e18, all
  from 1e20 (jax 0.11.2)."""
  rng = np.random.default_rng(1)
  q, k, v = (rng.standard_normal((1, 32, 2, 16)).astype(np.float32) for _ in range(3))
  s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64))
  if causal:
    s = np.where(np.tril(np.ones((32, 32), bool)), s, -np.inf)
  top2 = np.sort(s, axis=-1)[..., -2:]
  clear = top2[..., 1] - top2[..., 0] > 1e-9 * np.abs(top2[..., 1])  # [b, h, q]
  hard = np.take_along_axis(v.transpose(0, 2, 1, 3), s.argmax(-1)[..., None], axis=2)
  hard = hard.transpose(0, 2, 1, 3)  # [b, q, h, d]: the top key's value
  for scale in (1e18, 1e20, 1e300):
    out = reference_attention(q, k, v, causal=causal, softmax_scale=scale, dtype=jnp.float64)
    assert not np.isnan(out).any(), scale
    rows = clear.transpose(0, 2, 1)  # [b, q, h]
    assert rows.sum() > 40
    np.testing.assert_array_equal(out[rows], hard[rows].astype(np.float64))


def test_references_refuse_what_they_cannot_compute():
  """The low-precision references scale in float32: a softmax_scale outside its normal numbers
  is refused, as the kernels refuse it; the float64 one takes it. A dtype that is not one of
  the four (None included, which NumPy reads as float64) and a causal that is not a bool are
  refused, each in one line naming the value."""
  q = np.ones((1, 8, 2, 16), np.float32)
  for dtype in (jnp.float32, jnp.bfloat16):
    for scale in (1e-40, 1e39):
      match = f"normal float32 number.*softmax_scale={re.escape(repr(scale))}$"
      with pytest.raises(ValueError, match=match):
        reference_attention(q, q, q, softmax_scale=scale, dtype=dtype)
  assert np.isfinite(reference_attention(q, q, q, softmax_scale=1e39, dtype=jnp.float64)).all()
  for dtype in (None, "abc", jnp.int32):
    with pytest.raises(
      TypeError, match=f"^reference dtype must be .*, got dtype={re.escape(repr(dtype))}$"
    ):
      reference_attention(q, q, q, dtype=dtype)
  for causal in ("no", 1, None):
    with pytest.raises(TypeError, match=f"^causal must be a bool, got causal={causal!r}$"):
      reference_attention(q, q, q, causal=causal)


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


def test_low_precision_references_are_op_by_op():
  """The low-precision references run as one program with every operation kept apart
  (`reference._apart`: an optimization barrier after each): the bits of evaluating the same
  function op by op (eager dispatch), forward and gradients, in bfloat16, float16 and
  float32; inside a jit the reference is traced into the caller's program. The same function
  jitted without the barriers gives other bits (XLA fuses and contracts float32 arithmetic;
  measured on this project's CPUs in float32 and float16), so the comparison can fail."""
  from jax_flashstable.lab.shapes import Shape, make_inputs
  from pallas_kernels import reference
  from pallas_kernels.reference import reference_attention_vjp

  bits = lambda tree: [np.asarray(x).view(np.uint8) for x in jax.tree.leaves(tree)]
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(bits(a), bits(b)))
  fused = jax.jit(reference._attention_vjp, static_argnums=(4, 5, 6))
  differ = []
  for shape, dtype in (
    (Shape(2, 17, 17, 2, 2, 32, causal=True), jnp.bfloat16),
    (Shape(1, 40, 70, 2, 2, 64), jnp.float16),
    (Shape(1, 64, 64, 2, 1, 32, causal=True), jnp.float32),
  ):
    q, k, v, do = make_inputs(shape, dtype, 0)
    args = (q, k, v, do, shape.causal, shape.head_dim**-0.5, dtype)
    op_by_op = reference._attention_vjp(*args)  # eager: one dispatch per operation
    assert same(reference_attention_vjp(q, k, v, do, causal=shape.causal, dtype=dtype), op_by_op)
    differ.append(not same(fused(*args), op_by_op))
  assert any(differ) or jax.default_backend() != "cpu", differ
  fwd = lambda q, k, v: reference_attention(q, k, v, causal=True, dtype=jnp.float32)
  assert same(fwd(q, k, v), reference._attention(q, k, v, True, shape.head_dim**-0.5, dtype))
  assert "optimization_barrier" not in str(jax.make_jaxpr(jax.jit(fwd))(q, k, v))


def test_vjp_names_a_cotangent_of_the_wrong_shape():
  """reference_attention_vjp refuses a d_out that is not the output's shape in one line naming
  it, for every dtype (JAX's own message about the VJP function names no argument)."""
  q = jnp.ones((1, 4, 2, 8), jnp.float32)
  for dtype in (jnp.float64, jnp.float32, jnp.bfloat16):
    for bad in (q[:, :2], q[0]):
      with pytest.raises(ValueError, match=r"^d_out must have the output's shape .*d_out.shape="):
        reference_attention_vjp(q, q, q, bad, dtype=dtype)
