"""Input validation shared by every entry point: errors name the offending value."""

from __future__ import annotations

import math

import numpy as np

import jax.numpy as jnp

from pallas_kernels.policy import MAX_HEAD_DIM, SUPPORTED_DTYPES, real_number


def check_inputs(
  query,
  key,
  value,
  softmax_scale,
  *,
  allow_float64=False,
  scale_dtype=np.float32,
  max_head_dim=MAX_HEAD_DIM,
):
  """Checks shapes and dtypes of query/key/value; returns the softmax scale to use.

  scale_dtype: the dtype the scores are scaled in (float32 in the kernels and the low-precision
  references, float64 in the FP64 ones); softmax_scale must be a normal number of it.
  max_head_dim: the kernels' and references' limit (`MAX_HEAD_DIM`); None for none (XLA's and
  cuDNN's attention, which check their own).

  Raises:
    ValueError: rank ≠ 4, mismatched batch, length or head_dim, num_heads % num_kv_heads ≠ 0,
      empty axes, head_dim > 256, a non-positive or non-finite softmax_scale, or one that is
      0, subnormal or infinite once in scale_dtype.
    TypeError: unsupported or mixed dtypes; an input that is not an array.
  """
  check_arrays(query=query, key=key, value=value)
  for name, x in (("query", query), ("key", key), ("value", value)):
    if getattr(x, "ndim", None) != 4:
      raise ValueError(
        f"{name} must have rank 4 [batch, seq, heads, head_dim], "
        f"got {name}.shape={getattr(x, 'shape', None)}"
      )
    if 0 in x.shape:
      raise ValueError(f"{name} has an empty axis: {name}.shape={x.shape}")
  dtypes = {jnp.dtype(x.dtype) for x in (query, key, value)}
  if len(dtypes) > 1:
    raise TypeError(
      f"query, key and value must share one dtype, got query.dtype={query.dtype}, "
      f"key.dtype={key.dtype}, value.dtype={value.dtype}"
    )
  dtype = dtypes.pop()
  allowed = SUPPORTED_DTYPES + ((jnp.dtype(jnp.float64),) if allow_float64 else ())
  if dtype not in allowed:
    raise TypeError(
      f"query.dtype={dtype} (also key's and value's) is not supported; supported: "
      f"{', '.join(str(d) for d in allowed)}"
    )
  (b, _, num_heads, head_dim), (bk, _, num_kv_heads, dk) = query.shape, key.shape
  if key.shape != value.shape:
    raise ValueError(
      f"key and value shapes differ: key.shape={key.shape}, value.shape={value.shape}"
    )
  if bk != b:
    raise ValueError(f"batch mismatch: query.shape[0]={b}, key.shape[0]={bk}")
  if dk != head_dim:
    raise ValueError(f"head_dim mismatch: query.shape[3]={head_dim}, key.shape[3]={dk}")
  if max_head_dim is not None and head_dim > max_head_dim:
    raise ValueError(f"head_dim={head_dim} is not supported (at most {max_head_dim})")
  if num_heads % num_kv_heads:
    raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
  if softmax_scale is None:
    return 1.0 / math.sqrt(head_dim)
  return check_softmax_scale(softmax_scale, scale_dtype)


def check_softmax_scale(softmax_scale, scale_dtype=np.float32) -> float:
  """softmax_scale as a Python float: a concrete real number > 0 that is a normal number of
  scale_dtype (the dtype the scores are scaled in). Raises TypeError for a non-number (or a
  traced value), ValueError naming the value otherwise."""
  scale = real_number("softmax_scale", softmax_scale)  # static: a concrete number
  if not (math.isfinite(scale) and scale > 0):
    raise ValueError(f"softmax_scale must be finite and > 0, got softmax_scale={softmax_scale!r}")
  info = np.finfo(scale_dtype)
  if not float(info.tiny) <= scale <= float(info.max):  # 0, a subnormal or inf in scale_dtype
    name = np.dtype(scale_dtype).name
    raise ValueError(
      f"softmax_scale must be a normal {name} number ({info.tiny:.3g} to {info.max:.3g}: the "
      f"scores are scaled in {name}), got softmax_scale={softmax_scale!r}"
    )
  return scale


def check_arrays(**inputs) -> None:
  """TypeError naming the first of `inputs` (name=value) that is not an array (a list, a
  scalar): every entry point's first check, before it reads a shape."""
  for name, x in inputs.items():
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      raise TypeError(
        f"{name} must be an array (jax or numpy) of rank 4, got a {type(x).__name__}; "
        f"e.g. jnp.asarray({name})"
      )
