"""Standard (materialized) attention: the references the kernels are measured against.

- float64: the "golden value" of Golden et al. 2024 (arXiv 2405.02803, §3). Computed by JAX
  with 64-bit types switched on locally (`jax.enable_x64`), so the caller need not turn on x64
  globally; the result comes back as a float64 NumPy array.
- float32: every dot at `Precision.HIGHEST` (no TF32 on GPU).
- bfloat16 / float16: three rounding points, each after an float32 computation:
    S = round(softmax_scale · QKᵀ)   (QKᵀ accumulated in float32)
    P = round(softmax(S))            (softmax in float32 on the rounded S)
    O = round(P V)                   (accumulated in float32)
  This is the "standard attention in BF16" baseline of Golden et al.
Grouped heads: query head h reads key/value head h // (num_heads // num_kv_heads), as jax.nn.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from pallas_kernels.checks import check_inputs
from pallas_kernels.policy import boolean

HIGHEST = lax.Precision.HIGHEST


def _attention(query, key, value, causal, softmax_scale, dtype):
  group = query.shape[2] // key.shape[2]
  key = jnp.repeat(key.astype(dtype), group, axis=2)
  value = jnp.repeat(value.astype(dtype), group, axis=2)
  query = query.astype(dtype)
  acc = jnp.float64 if dtype == jnp.float64 else jnp.float32
  low = dtype not in (jnp.float32, jnp.float64)
  s = jnp.einsum("bqhd,bkhd->bhqk", query, key, precision=HIGHEST, preferred_element_type=acc)
  s = s * softmax_scale
  if low:
    s = s.astype(dtype)  # rounding point 1
  if causal:
    q_len, kv_len = query.shape[1], key.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((q_len, kv_len), bool)), s, -jnp.inf)
  if dtype == jnp.float64:
    # one S for the row max and the subtraction: in the jitted FP64 program XLA CPU fused the
    # QKᵀ dot into both and computed it twice in different orders, so a score could exceed
    # its "max" by an ulp, e^(ulp) overflowed once ulps passed ~700 (softmax_scale ≥ 1e18 on
    # unit scores: NaN; jax 0.11.2). The value is S's, as eager.
    s = lax.optimization_barrier(s)
  p = jax.nn.softmax(s.astype(acc), axis=-1)
  if low:
    p = p.astype(dtype)  # rounding point 2
  o = jnp.einsum("bhqk,bkhd->bqhd", p, value, precision=HIGHEST, preferred_element_type=acc)
  return o.astype(dtype)  # rounding point 3


# float64: one compiled program (eager op-by-op dispatch is most of its cost).
@functools.partial(jax.jit, static_argnums=(3, 4))
def _attention_fp64(query, key, value, causal, softmax_scale):
  return _attention(query, key, value, causal, softmax_scale, jnp.float64)


def _eval_apart(closed, *args):
  """Evaluates a closed jaxpr with every top-level equation's results passed through an
  optimization barrier: under jit, XLA can then neither fuse nor simplify across two
  operations (no FMA contraction, no convert pair removed as excess precision), so each
  operation rounds its result as it does when dispatched on its own, op by op."""
  env = dict(zip(closed.jaxpr.constvars, closed.consts))
  env.update(zip(closed.jaxpr.invars, args))
  read = lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]
  for eqn in closed.jaxpr.eqns:
    with eqn.ctx.manager:
      outs = eqn.primitive.bind(*map(read, eqn.invars), **eqn.primitive.get_bind_params(eqn.params))
    outs = lax.optimization_barrier(list(outs) if eqn.primitive.multiple_results else [outs])
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in closed.jaxpr.outvars]


def _apart(fun, *args):
  """fun(*args) as the operations of its jaxpr kept apart (`_eval_apart`): the bits of running
  fun op by op (eager dispatch: one compiled program per operation) from one compiled program.
  Tested bit for bit against op by op on every low-precision reference of the test suite."""
  closed, shapes = jax.make_jaxpr(fun, return_shape=True)(*args)
  return jax.tree.unflatten(jax.tree.structure(shapes), _eval_apart(closed, *args))


# The low-precision references: each operation must round its result as written. Jitted as one
# program, XLA fuses and contracts (an FMA) where the plain arithmetic rounds: the float32
# baseline of the accuracy rule came out more accurate than float32 arithmetic (the float32
# case of tests/test_mechanism.py: naive dQ error 2.1e-6 jitted, 7.0e-6 op by op). Op by op,
# every operation is a compiled program of its own, and compiling them was most of the test
# suite's time in the references; `_apart` gives the op-by-op bits from one program. Called
# inside a transformation (a training step's reference-fp32 layers), the reference is part of
# that program, as any JAX function.
@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _attention_low(query, key, value, causal, softmax_scale, dtype):
  return _apart(
    lambda q, k, v: _attention(q, k, v, causal, softmax_scale, dtype), query, key, value
  )


def _attention_vjp(query, key, value, d_out, causal, softmax_scale, dtype):
  out, vjp = jax.vjp(
    lambda q, k, v: _attention(q, k, v, causal, softmax_scale, dtype), query, key, value
  )
  return out, vjp(jnp.asarray(d_out).astype(out.dtype))


@functools.partial(jax.jit, static_argnums=(4, 5))
def _attention_vjp_fp64(query, key, value, d_out, causal, softmax_scale):
  return _attention_vjp(query, key, value, d_out, causal, softmax_scale, jnp.float64)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _attention_vjp_low(query, key, value, d_out, causal, softmax_scale, dtype):
  return _apart(
    lambda *a: _attention_vjp(*a, causal, softmax_scale, dtype), query, key, value, d_out
  )


def _traced(*args):
  return any(isinstance(x, jax.core.Tracer) for x in args)


def _check_dtype(dtype, *args):
  """The reference's dtype; TypeError for another, and for float64 on traced args (the FP64
  reference is computed outside the trace, with x64 on locally, and returns NumPy)."""
  allowed = "float64, float32, bfloat16 or float16"
  try:
    resolved = None if dtype is None else jnp.dtype(dtype)  # (np.dtype(None) is float64)
  except TypeError:
    resolved = None
  if resolved not in (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16):
    raise TypeError(f"reference dtype must be {allowed}, got dtype={dtype!r}")
  dtype = resolved
  if dtype == jnp.float64 and _traced(*args):
    raise TypeError(
      "the float64 reference runs on concrete arrays, outside jit/grad/vmap (it returns NumPy), "
      "got traced inputs; its gradients: reference_attention_vjp(..., dtype=jnp.float64)"
    )
  return dtype


def _scale_dtype(dtype):
  """The dtype a reference scales its scores in (`check_inputs`' scale_dtype): float64 in the
  FP64 reference, float32 in the others."""
  return np.float64 if dtype == jnp.float64 else np.float32


def reference_attention(query, key, value, *, causal=False, softmax_scale=None, dtype=jnp.float32):
  """Materialized softmax(scale·QKᵀ)·V computed in `dtype` (see the module docstring).

  Args:
    query: [batch, q_len, num_heads, head_dim].
    key, value: [batch, kv_len, num_kv_heads, head_dim], num_heads % num_kv_heads == 0.
    causal: top-left aligned causal mask (key j visible to query i iff j ≤ i).
    softmax_scale: defaults to 1/√head_dim.
    dtype: float64, float32, bfloat16 or float16.
  Returns:
    [batch, q_len, num_heads, head_dim]: a float64 NumPy array for dtype float64, else a JAX
    array of `dtype`.
  Raises:
    ValueError/TypeError for bad shapes or an unsupported dtype (see `pallas_kernels.checks.check_inputs`);
    TypeError for dtype float64 inside jit, grad or vmap (traced inputs).
  """
  dtype = _check_dtype(dtype, query, key, value)
  softmax_scale = check_inputs(
    query, key, value, softmax_scale, allow_float64=True, scale_dtype=_scale_dtype(dtype)
  )
  causal = boolean("causal", causal)
  if dtype == jnp.float64:
    with jax.enable_x64(True):
      args = [jnp.asarray(np.asarray(x, np.float64)) for x in (query, key, value)]
      return np.asarray(_attention_fp64(*args, causal, softmax_scale))
  if _traced(query, key, value):  # inside a jit, grad, checkpoint…: part of that program
    return _attention(query, key, value, causal, softmax_scale, dtype)
  return _attention_low(query, key, value, causal, softmax_scale, dtype)


def reference_attention_vjp(
  query, key, value, d_out, *, causal=False, softmax_scale=None, dtype=jnp.float32
):
  """(out, (d_query, d_key, d_value)) of `reference_attention` for the cotangent `d_out`.

  float64 results are NumPy arrays (computed with x64 on locally); the gradients of the
  low-precision references are the autodiff of the rounded program, each operation rounded as
  on its own (op by op, `_apart`).
  """
  dtype = _check_dtype(dtype, query, key, value, d_out)
  softmax_scale = check_inputs(
    query, key, value, softmax_scale, allow_float64=True, scale_dtype=_scale_dtype(dtype)
  )
  causal = boolean("causal", causal)
  if getattr(d_out, "shape", None) != query.shape:  # JAX's own VJP message names no argument
    raise ValueError(
      f"d_out must have the output's shape query.shape={query.shape}, "
      f"got d_out.shape={getattr(d_out, 'shape', None)}"
    )

  if dtype == jnp.float64:
    with jax.enable_x64(True):
      query, key, value, d_out = [
        jnp.asarray(np.asarray(x, np.float64)) for x in (query, key, value, d_out)
      ]
      out, grads = _attention_vjp_fp64(query, key, value, d_out, causal, softmax_scale)
      return np.asarray(out), tuple(np.asarray(g) for g in grads)
  query, key, value = (x.astype(dtype) for x in (query, key, value))
  if _traced(query, key, value, d_out):
    return _attention_vjp(query, key, value, d_out, causal, softmax_scale, dtype)
  return _attention_vjp_low(query, key, value, d_out, causal, softmax_scale, dtype)
