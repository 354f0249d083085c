"""Determinism, jit/vmap, statistics layout and every invalid input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flashstable import flash_attention, reference_attention, resolved_backend
from jax_flashstable.lab.accuracy import flash_vjp
from jax_flashstable.lab.shapes import Shape, make_inputs


def test_bitwise_deterministic():
  q, k, v, do = make_inputs(Shape(2, 150, 150, 4, 2, 64, causal=True), jnp.bfloat16, seed=7)
  runs = [flash_vjp(q, k, v, do, causal=True, stabilize=True) for _ in range(2)]
  for a, b in zip(jax.tree.leaves(runs[0]), jax.tree.leaves(runs[1])):
    assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_x64_mode_changes_no_bit():
  """With jax_enable_x64 on (as a user comparing against FP64 has it), Python ints and unsigned
  sums default to 64 bits: the causal tile count's division and the stochastic seeds' sum
  failed there (2026-12-02). Every layout's outputs and gradients, causal and not, with the
  options, are the same bits as without it."""
  q, k, v, do = make_inputs(Shape(1, 100, 100, 2, 2, 32, causal=True), jnp.bfloat16, seed=3)
  calls = [
    dict(causal=True),
    dict(causal=True, numerics="paper", stabilize=True, sum_rounded_p=True, block_q=64, block_k=32),
    dict(causal=False, stabilize=True, center_keys=True, delta_float32=True, single_lse=True),
    dict(causal=True, numerics="stochastic", rng_key=jax.random.key(0)),
  ]
  for kw in calls:
    want = jax.tree.leaves(flash_vjp(q, k, v, do, **kw))
    with jax.enable_x64(True):
      got = jax.tree.leaves(flash_vjp(q, k, v, do, **kw))
    for a, b in zip(got, want):
      assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16)), kw


def test_float64_reference_refuses_a_trace():
  """The FP64 reference returns NumPy, computed outside the trace: under grad or jit it says so
  in one line instead of a TracerArrayConversionError."""
  q = jnp.ones((1, 4, 1, 8), jnp.float32)
  with pytest.raises(TypeError, match="float64 reference runs on concrete arrays"):
    jax.grad(lambda q: reference_attention(q, q, q, dtype=jnp.float64).sum())(q)
  assert reference_attention(q, q, q, dtype=jnp.float64).dtype == np.float64


def test_jit_and_vmap_over_a_leading_axis():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((3, 1, 33, 2, 32)), jnp.float32) for _ in range(3))
  f = lambda q, k, v: flash_attention(q, k, v, causal=True)
  batched = jax.jit(jax.vmap(f))(q, k, v)
  looped = jnp.stack([f(q[i], k[i], v[i]) for i in range(3)])
  np.testing.assert_allclose(np.asarray(batched), np.asarray(looped), atol=1e-6)
  grad = jax.jit(jax.grad(lambda q: jax.vmap(f)(q, k, v).sum()))(q)
  assert grad.shape == q.shape and bool(jnp.isfinite(grad).all())


def test_output_dtype_shape_and_stats_layout():
  q, k, v, _ = make_inputs(Shape(2, 19, 23, 6, 3, 64), jnp.bfloat16)
  out, st = flash_attention(q, k, v, return_stats=True)
  assert out.shape == q.shape and out.dtype == jnp.bfloat16
  for x in st:
    assert x.shape == (2, 19, 6) and x.dtype == jnp.float32
  # lse is natural-log: compare with float64 logsumexp of the scaled scores
  qf, kf = np.asarray(q, np.float64), np.repeat(np.asarray(k, np.float64), 2, axis=2)
  s = np.einsum("bqhd,bkhd->bqhk", qf, kf) / 8.0
  lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
  np.testing.assert_allclose(np.asarray(st.lse), lse, atol=1e-4)


def test_lse_is_differentiable():
  q, k, v, _ = make_inputs(Shape(1, 40, 40, 2, 1, 32, causal=True), jnp.float32, 4)
  f = lambda q, k, v: flash_attention(q, k, v, causal=True, return_stats=True)[1].lse.sum()

  def ref(q, k, v):
    s = jnp.einsum(
      "bqhd,bkhd->bqhk", q, jnp.repeat(k, 2, axis=2), precision=jax.lax.Precision.HIGHEST
    ) / np.sqrt(32)  # no TF32 on GPU
    s = jnp.where(jnp.tril(jnp.ones((40, 40), bool))[None, :, None, :], s, -jnp.inf)
    return jax.nn.logsumexp(s, axis=-1).sum()

  for g, r in zip(jax.grad(f, (0, 1, 2))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5)


def test_second_derivatives_are_refused_in_one_line():
  """A grad of a grad, `jax.hessian` and a jvp of a grad: one NotImplementedError naming
  flash_attention and what it lacks, instead of a ValueError from inside Pallas' batching or
  linearisation rules; the first derivative beside them is unchanged."""
  q, k, v, _ = make_inputs(Shape(1, 5, 5, 1, 1, 16), jnp.float32, 2)
  f = lambda q: flash_attention(q, k, v).sum()  # noqa: E731
  grad = jax.grad(f)
  second = {
    "hessian": lambda: jax.hessian(f)(q),
    "grad of grad": lambda: jax.grad(lambda x: grad(x).sum())(q),
    "jvp of grad": lambda: jax.jvp(grad, (q,), (q,)),
  }
  for name, call in second.items():
    with pytest.raises(NotImplementedError, match=r"^flash_attention has first derivatives only"):
      call()

  # the first derivative beside them: float32 attention's, computed directly
  def ref(q):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) / 4.0
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=jax.lax.Precision.HIGHEST).sum()

  np.testing.assert_allclose(np.asarray(grad(q)), np.asarray(jax.grad(ref)(q)), atol=2e-5)


def test_numpy_scalars_and_strict_causal():
  q, k, v, _ = make_inputs(Shape(1, 20, 20, 1, 1, 32), jnp.float32, 5)
  a = flash_attention(q, k, v, softmax_scale=0.2, beta=2.5, stabilize=True)
  b = flash_attention(q, k, v, softmax_scale=np.float32(0.2), beta=np.float32(2.5), stabilize=True)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(TypeError, match="causal='no'"):
    flash_attention(q, k, v, causal="no")


def _x(shape, dtype=jnp.bfloat16):
  return jnp.zeros(shape, dtype)


BAD = [
  (dict(query=_x((2, 8, 32))), ValueError, "rank 4"),
  (dict(key=_x((3, 8, 2, 32)), value=_x((3, 8, 2, 32))), ValueError, "batch"),
  (dict(key=_x((2, 8, 2, 64)), value=_x((2, 8, 2, 64))), ValueError, "head_dim"),
  (dict(key=_x((2, 8, 3, 32)), value=_x((2, 8, 3, 32))), ValueError, "num_kv_heads=3"),
  (dict(value=_x((2, 9, 2, 32))), ValueError, "value.shape"),
  (dict(query=_x((2, 8, 4, 32), jnp.float32)), TypeError, "dtype"),
  (
    dict(
      query=_x((2, 8, 4, 32), jnp.int32),
      key=_x((2, 8, 2, 32), jnp.int32),
      value=_x((2, 8, 2, 32), jnp.int32),
    ),
    TypeError,
    "query.dtype=int32",
  ),
  (
    dict(query=_x((2, 8, 4, 512)), key=_x((2, 8, 2, 512)), value=_x((2, 8, 2, 512))),
    ValueError,
    "head_dim=512",
  ),
  (dict(query=_x((2, 0, 4, 32))), ValueError, "empty"),
  (dict(softmax_scale=0.0), ValueError, "softmax_scale=0.0"),
  (dict(softmax_scale=-1.0), ValueError, "softmax_scale=-1.0"),
  (dict(softmax_scale=float("inf")), ValueError, "softmax_scale=inf"),
  (dict(softmax_scale=1e-40), ValueError, "normal float32 number.*softmax_scale=1e-40"),
  (dict(softmax_scale=1e39), ValueError, "normal float32 number.*softmax_scale=1e\\+39"),
  (dict(beta=1.0), ValueError, "beta=1.0"),
  (dict(tie_tolerance=-0.1), ValueError, "tie_tolerance=-0.1"),
  (dict(block_q=48), ValueError, "block_q=48"),
  (dict(block_k=8), ValueError, "block_k=8"),
  (dict(block_k=0), ValueError, "block_k=0"),
  (dict(numerics="paper2"), ValueError, "numerics='paper2'"),
]


@pytest.mark.parametrize("override,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_invalid_inputs_raise(override, exc, match):
  args = dict(query=_x((2, 8, 4, 32)), key=_x((2, 8, 2, 32)), value=_x((2, 8, 2, 32)))
  args.update(override)
  kwargs = {n: args.pop(n) for n in list(args) if n not in ("query", "key", "value")}
  with pytest.raises(exc, match=match.replace("(", r"\(").replace("[", r"\[")):
    flash_attention(args["query"], args["key"], args["value"], **kwargs)


def test_reference_rejects_bad_dtype():
  q = _x((1, 4, 1, 16))
  with pytest.raises(TypeError, match="int8"):
    reference_attention(q, q, q, dtype=jnp.int8)


@pytest.mark.parametrize(
  "flag", ["stabilize", "delta_float32", "center_keys", "single_lse", "return_stats"]
)
def test_flags_are_bools_not_truthy_values(flag):
  """A flag given as a string ("False" is truthy) or an int would switch an option on
  silently: every flag of flash_attention and of AttentionConfig takes a bool only, in one line
  naming it, before any work."""
  from jax_flashstable.attention.config import AttentionConfig

  q = jnp.ones((1, 16, 1, 16), jnp.bfloat16)
  with pytest.raises(TypeError, match=rf"^{flag} must be a bool, got {flag}='False'$"):
    flash_attention(q, q, q, **{flag: "False"})
  if flag != "return_stats":
    with pytest.raises(TypeError, match=rf"^{flag} must be a bool, got {flag}=1$"):
      AttentionConfig(**{flag: 1})
  with pytest.raises(TypeError, match=r"^interpret must be a bool or None, got interpret='yes'$"):
    flash_attention(q, q, q, interpret="yes")


def test_inputs_and_rng_key_of_the_wrong_kind_are_named_in_one_line():
  """A list for an array, an int or a batch of keys for rng_key: a TypeError naming the
  argument (not jax's own message about PRNG key data, nor query.shape=None)."""
  q = jnp.ones((1, 16, 1, 16), jnp.bfloat16)
  with pytest.raises(
    TypeError, match=r"^query must be an array \(jax or numpy\) of rank 4, got a list"
  ):
    flash_attention([[[[1.0]]]], q, q)
  batch = jax.random.split(jax.random.key(0), 2)
  for bad, shown in (
    (0, "0"),
    (batch, r"PRNGKeyArray\(shape=\(2,\), dtype=key<fry>\)"),
    ([[1], [1, 2]], r"\[\[1\], \[1, 2\]\]"),  # ragged: no NumPy shape, its repr
  ):
    with pytest.raises(
      TypeError, match=rf"^rng_key must be one jax.random key .*got rng_key={shown}$"
    ):
      flash_attention(q, q, q, numerics="stochastic", rng_key=bad)
  for good in (jax.random.key(0), jax.random.PRNGKey(0)):
    assert flash_attention(q, q, q, numerics="stochastic", rng_key=good).shape == q.shape


@pytest.mark.parametrize(
  "field,value",
  [
    ("num_warps", 0),
    ("num_warps", 3),
    ("num_warps", 4.0),
    ("num_stages", -1),
    ("num_stages", True),
    ("num_stages", 2.0),
  ],
)
def test_launch_parameters_out_of_range_are_refused(field, value):
  """num_warps (a power of two, 1–16) and num_stages (1–8) were passed to the kernels unchecked;
  ints only, as block_q and block_k (4.0 was taken)."""
  q = jnp.ones((1, 16, 1, 16), jnp.bfloat16)
  with pytest.raises(
    ValueError, match=rf"^{field} must be None or one of .*got {field}={value!r}$"
  ):
    flash_attention(q, q, q, **{field: value})


def test_unhashable_choices_and_interpret_off_a_gpu_are_named_in_one_line():
  """A list where a layout, implementation or dtype name goes is refused naming it (not
  Python's "unhashable type"); interpret=False on a backend without a GPU is refused naming
  the option and the backend (not Pallas' own "Only interpret mode is supported")."""
  from jax_flashstable import AttentionConfig

  q = jnp.zeros((1, 4, 1, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"^numerics=\['fa2'\] is not supported"):
    flash_attention(q, q, q, numerics=["fa2"])
  for field in ("numerics", "implementation", "reference_dtype"):
    with pytest.raises(ValueError, match=rf"^{field}=\['x'\] "):
      AttentionConfig(**{field: ["x"]})
  if jax.default_backend() != "gpu":  # mosaic_gpu: "… needs a Hopper GPU" (test_mosaic_gpu)
    for backend in ("auto", "triton"):
      with pytest.raises(
        ValueError,
        match=r"^interpret=False compiles the kernels: backend='triton' needs a CUDA GPU; .*'cpu'",
      ):
        flash_attention(q, q, q, backend=backend, interpret=False)
    assert resolved_backend(q, q, q, interpret=False).forward == "triton"  # a question: answered
