"""Flax integration: an `attention_fn` for nnx/linen multi-head attention, and the dispatcher
that every model layer uses (`attend`)."""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp

from jax_flashstable.attention import api as _attention
from jax_flashstable.attention.config import AttentionConfig
from pallas_kernels.checks import MAX_HEAD_DIM, check_arrays, check_inputs
from pallas_kernels.policy import boolean, centered_keys


def _register_interpret_config():
  """Imports, now, the modules that Pallas's interpret-mode lowering (our kernels on a CPU)
  imports on first use. One of them defines a JAX config option that is part of the tracing
  context (`pallas_fuser_disable_nested_fuse`, jax 0.11), so when it first appears inside a
  jitted step the context of the second call differs from the first one's: every `jax.jit` or
  `nnx.jit` step over our attention traced and compiled twice (first and second call)."""
  for name in (
    "jax._src.pallas.mosaic.interpret.interpret_pallas_call",
    "jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call",
  ):
    try:
      importlib.import_module(name)
    except ImportError:  # another jax version: nothing to register early
      pass


_register_interpret_config()


def attend(
  query,
  key,
  value,
  config: AttentionConfig | str,
  *,
  causal: bool,
  softmax_scale=None,
  rng_key=None,
):
  """softmax(scale·QKᵀ)V by `config.implementation`; [batch, len, heads, head_dim] in and out.

  key/value may have fewer heads (GQA). The result has query's dtype (float32 for the
  "fp32_out" layout). `rng_key` drives numerics="stochastic" and is ignored otherwise.
  `config.center_keys` is a backward option everywhere: the output is the implementation's own,
  and dQ is formed from the keys less their mean (`pallas_kernels.policy.centered_keys`).
  The flash kernels do it inside their backward; for the other implementations (`xla`, `cudnn`,
  the references) the backward runs the implementation again at the centred keys and takes
  its dQ, dK and dV there (dK and dV are the same in exact arithmetic: each row's softmax is
  unchanged by the shift): one more forward per backward, and the inputs kept instead of the
  implementation's residuals. The forward never sees a later key; the gradients may, at
  rounding level, through the mean.

  `config` is an AttentionConfig or a spec of its grammar ("fa2+comp", "xla", …).

  Raises:
    ValueError: a bad spec; numerics="stochastic" without an rng_key; inputs that are not
      [batch, len, heads, head_dim] arrays of matching sizes, with an empty axis, or a
      softmax_scale that is not finite, > 0 and a normal float32 number (every implementation:
      `checks.check_inputs`, the kernels' checks); head_dim > 256 for flash and the references
      (XLA's and cuDNN's attention keep their own limits and take float64 inputs); cudnn where
      JAX's default backend is not a GPU.
    TypeError: a causal that is not a bool, a softmax_scale that is not a concrete number,
      inputs that are not arrays or of mixed or unsupported dtypes.
  """
  config = AttentionConfig.parse(config)
  boolean("causal", causal)
  impl = config.implementation
  ours = impl in ("flash", "reference")  # XLA's and cuDNN's: their own dtypes and head_dim
  softmax_scale = check_inputs(
    query,
    key,
    value,
    softmax_scale,
    allow_float64=not ours,
    max_head_dim=MAX_HEAD_DIM if ours else None,
  )
  if impl == "flash":
    stochastic = config.numerics == "stochastic"
    if stochastic and rng_key is None:
      raise ValueError(f"attention {config.name!r} uses numerics='stochastic' and needs rng_key")
    return _attention.flash_attention(
      query,
      key,
      value,
      causal=causal,
      softmax_scale=softmax_scale,
      rng_key=rng_key if stochastic else None,
      **config.flash_kwargs(),
    )
  if impl == "reference":
    dtype = jnp.dtype(config.reference_dtype)
    run = lambda q, k, v: _reference(q, k, v, causal, softmax_scale, dtype)  # noqa: E731
  else:
    if impl == "cudnn" and jax.default_backend() != "gpu":  # JAX's own error names no attention
      raise ValueError(
        f"attention {config.name!r} needs a GPU (cuDNN); the default backend is "
        f"{jax.default_backend()!r}"
      )
    run = functools.partial(
      jax.nn.dot_product_attention, scale=softmax_scale, is_causal=causal, implementation=impl
    )
  return (_centred_backward(run) if config.center_keys else run)(query, key, value)


def _centred_backward(run):
  """run(q, k, v) whose backward is run's own evaluated at `centered_keys(k)`: dQ formed from
  centred keys (`AttentionConfig.center_keys` for an implementation that is not ours)."""

  @jax.custom_vjp
  def centred(q, k, v):
    return run(q, k, v)

  def forward(q, k, v):
    return run(q, k, v), (q, k, v)

  def backward(inputs, d_out):
    q, k, v = inputs
    return jax.vjp(run, q, centered_keys(k), v)[1](d_out)

  centred.defvjp(forward, backward)
  return centred


# The backward recomputes the materialized reference's scores and probabilities instead of
# keeping them ([batch, heads, q_len, kv_len] in reference_dtype, two per layer: 6.4 GB a layer in
# float32 at batch 128 × 6 heads × 1024², which put the FP32 reference of the anchor-b128 recipe
# out of an H200's memory): the same program evaluated twice — bit for bit on the CPU
# (tests/test_flax.py); on a GPU the recomputation could differ by float32 rounding (not measured).
def _reference_kept(query, key, value, causal, softmax_scale, dtype):
  out = _attention.reference_attention(
    query, key, value, causal=causal, softmax_scale=softmax_scale, dtype=dtype
  )
  return out.astype(query.dtype)


_reference = jax.checkpoint(_reference_kept, static_argnums=(3, 4, 5))


def attention_fn(
  query,
  key,
  value,
  bias=None,
  mask=None,
  broadcast_dropout=True,
  dropout_rng=None,
  dropout_rate=0.0,
  deterministic=False,
  dtype=None,
  precision=None,
  module=None,
  promote_dtype=None,
  is_causal=False,
  *,
  config: AttentionConfig = AttentionConfig(),
  causal: bool = False,
):
  """Drop-in `attention_fn` for `flax.nnx.MultiHeadAttention` and
  `flax.linen.MultiHeadDotProductAttention`.

  Use `functools.partial(attention_fn, config=...)`; with linen, which passes only a mask,
  also `causal=True`. nnx passes `is_causal`. Receives unscaled query/key/value
  [batch, len, heads, head_dim] (key/value may have fewer heads) and applies 1/√head_dim.

  Raises:
    NotImplementedError: a mask (an explicit one, or the one `nnx.MultiHeadAttention(decode=
      True)` builds from its KV cache: autoregressive decoding is not supported) or a bias
      (only causal masking is), dropout_rate > 0 when not deterministic, or batch dimensions
      other than one.
    ValueError: a config with numerics="stochastic" (it needs a key per call; use `attend`
      with `rng_key=`, as the GPT model does).
    TypeError: query, key or value not an array.
    And `attend`'s errors.
  """
  del broadcast_dropout, dropout_rng, precision, promote_dtype
  check_arrays(query=query, key=key, value=value)  # before any shape is read
  if mask is not None:
    raise NotImplementedError(_mask_message(query, key, mask, module))
  if bias is not None:
    raise NotImplementedError("jax_flashstable attention_fn supports no attention bias")
  if dropout_rate > 0.0 and not deterministic:
    raise NotImplementedError(
      f"attention dropout is not supported, got dropout_rate={dropout_rate}"
    )
  if query.ndim != 4:
    raise NotImplementedError(
      f"expected [batch, len, heads, head_dim], got query.shape={query.shape}"
    )
  if dtype is not None:
    query, key, value = (x.astype(dtype) for x in (query, key, value))
  causal = boolean("causal", causal) | boolean("is_causal", is_causal)
  return attend(query, key, value, config, causal=causal)


def _mask_message(query, key, mask, module) -> str:
  """What is unsupported about a mask, and what to do instead."""
  decoding = getattr(module, "decode", False) or (
    query.ndim == 4 and query.shape[1] == 1 and key.shape[1] > 1 and mask.shape[-2] == 1
  )
  if decoding:
    return (
      "jax_flashstable attention_fn does not support autoregressive decoding with a KV "
      f"cache: it got a mask of one query over {key.shape[1]} cached keys, the mask "
      "nnx.MultiHeadAttention(decode=True) builds from its cache (no explicit mask is "
      "supported either). Train or prefill with decode=False and is_causal=True; decode "
      "with the default attention_fn (jax.nn.dot_product_attention)"
    )
  return (
    f"jax_flashstable attention_fn supports no mask (got mask.shape={tuple(mask.shape)}): "
    "only causal masking, with is_causal=True (nnx) or make_attention_fn(..., "
    "causal=True) (linen); for other masks use jax.nn.dot_product_attention"
  )


def make_attention_fn(config: AttentionConfig | str = "fa2", causal: bool = False):
  """`attention_fn` bound to a config (a spec of `AttentionConfig`'s grammar, e.g. "fa2+comp",
  or an AttentionConfig). Raises ValueError for a bad spec, TypeError for a causal that is not
  a bool, here rather than at the first call."""
  config = AttentionConfig.parse(config)
  return functools.partial(attention_fn, config=config, causal=boolean("causal", causal))
