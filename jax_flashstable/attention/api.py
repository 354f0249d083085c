"""Public attention functions: `flash_attention` (the Pallas kernels) and the references."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.attention import flash_attention_padded, kernel_config
from pallas_kernels.checks import check_inputs
from pallas_kernels.forward_mgpu import MosaicGPUOptions
from pallas_kernels.policy import (
  BACKENDS,
  Compensation,
  boolean,
  check_shift_options,
  get_numerics,
  shown,
)
from pallas_kernels.reference import reference_attention, reference_attention_vjp

__all__ = [
  "AttentionStats",
  "Kernels",
  "flash_attention",
  "reference_attention",
  "reference_attention_vjp",
  "resolved_backend",
]


class AttentionStats(NamedTuple):
  """Per-row statistics read from the forward kernel, each [batch, q_len, num_heads] float32.

  lse: log-sum-exp of the scaled scores, natural log (JAX's Pallas `mha` stores base 2).
  row_max: the final running max m used by the kernel (shifted by the compensation on rows
    whose tie rule fired; lse = row_max + log(row_sum) either way).
  max_p: the largest P̄ = exp(S − m) the kernel formed in float32 before rounding it for the
    P̄V dot; exactly 1.0 on uncompensated rows, < 1 where the compensation shifted m.
  tied_tiles: number of key/value tiles in which the row had more than one score within
    `tie_tolerance` of the tile max (always 0 with stabilize=False).
  """

  lse: jax.Array
  row_max: jax.Array
  max_p: jax.Array
  tied_tiles: jax.Array


def _default_interpret() -> bool:
  return jax.default_backend() != "gpu"


def flash_attention(
  query,
  key,
  value,
  *,
  causal=False,
  softmax_scale=None,
  stabilize=False,
  beta=2.0,
  tie_tolerance=1e-3,
  numerics="fa2",
  delta_float32=False,
  center_keys=False,
  single_lse=False,
  sum_rounded_p=False,
  guard_shift=False,
  max_shift=None,
  shift_above=0.0,
  block_q=None,
  block_k=None,
  interpret=None,
  return_stats=False,
  rng_key=None,
  num_warps=None,
  num_stages=None,
  backend="auto",
  mgpu_options: MosaicGPUOptions | None = None,
):
  """Flash attention (FlashAttention-2, Dao 2023, Alg. 1 and 2) as Pallas kernels.

  Scores, running `row_max`, `row_sum` and the output accumulator are float32; P̄ = exp(S − m)
  is rounded to the input dtype before the P̄V dot; the output is rounded once. The backward
  pass recomputes P from the saved natural-log `lse`, uses `delta` = rowsum(dO∘O) from the
  rounded output, and is deterministic (no atomics). `pallas_kernels/policy.py` is the table
  of every layout's rounding points.

  With `stabilize=True` the kernel applies the compensation of Qiu & Yao 2025
  (arXiv 2510.04212, Alg. 1): per key/value tile, a row with more than one score within
  `tie_tolerance` of the tile max uses m' = beta·max (max > 0) or 0 (max < 0) instead of max.
  Unlike the paper, the shift m' − max is clipped to [2^−7, 20] ([2^−7, 6] for float16, whose
  P̄ must stay a normal float16 number), so ties at 0 are shifted too and ties of large
  magnitude do not underflow the row (`pallas_kernels.policy.Compensation`). The paper layout
  keeps the paper's literal shift, with which its clamp of each tile's sum at ≥ 1e−10 scales a
  tied row's O by 2e^−max/1e−10 once the tied max exceeds ≈ 23.7 (toward 0), unless
  `guard_shift`.

  Args:
    query: [batch, q_len, num_heads, head_dim], bfloat16, float16 or float32.
    key, value: [batch, kv_len, num_kv_heads, head_dim], same dtype; query head h uses
      key/value head h // (num_heads // num_kv_heads) (GQA/MQA, contiguous groups as jax.nn).
    causal: top-left aligned causal mask (key j visible to query i iff j ≤ i), as
      `jax.nn.dot_product_attention(is_causal=True)`; q_len may differ from kv_len.
    softmax_scale: multiplies QKᵀ; defaults to 1/√head_dim.
    stabilize, beta, tie_tolerance: the compensation (beta > 1, tie_tolerance ≥ 0, absolute,
      in units of the scaled score).
    numerics: the precision layout (`pallas_kernels.policy.Numerics`): "fa2" (FP32
      accumulators, one rounding of O), "paper" (the BF16 buffers of Qiu & Yao's reference
      kernel, rounded every tile; backward tiles = forward tiles), "fp32_out" (fa2 returning a
      float32 O), "stochastic" (fa2 with an unbiased stochastic final rounding of O to bf16;
      needs `rng_key` and bfloat16 inputs).
    delta_float32: the backward's delta = rowsum(dO∘O) from the float32 O before its rounding
      (the forward keeps it: 4 bytes per output element more), so the rows of dS sum to 0 up
      to float32 rounding (Qiu & Yao 2025, §4: the bias enters through delta). The returned O
      is rounded as the layout says.
    center_keys: the backward's dQ = dS·(K − c) with c the mean key per (batch, kv head)
      (K − c in float32, rounded to the input dtype): exact because each row of dS sums to 0,
      and removes the (rowsum dS)·c term rounding leaves when keys share a large component.
    single_lse: the backward forms P = exp(S − lse) from one float32 lse = m + log l per row
      instead of exp((S − m) − log l): the production kernels' kind of P (FlashAttention-2/3,
      cuDNN and JAX's Pallas mha keep one float32 lse; they form it in base 2, so not their
      bits), whose rows err by up to ½ ulp(lse) relative once the row max m is large
      (`pallas_kernels.policy.Numerics.probs`; docs/numerics.md).
    sum_rounded_p: the forward's row sum l adds P̄ as the P̄V dot takes it (rounded to bf16:
      the paper layout, or bfloat16 inputs; float32 inputs elsewhere round nothing) instead of
      the float32 P̄, so that a relative rounding error shared by a row's large P̄ cancels in
      O = Σ r(P̄)·v / Σ r(P̄); the backward's P takes the rounded P̄ over the same l (O's
      weights on the tile that set the row's max; docs/numerics.md). With the
      compensation every tie whose shift is capped has the same P̄ = e^−max_shift, whose bf16
      rounding (−0.28% at 6) otherwise scales all those rows' O alike
      (`pallas_kernels.policy.Numerics.row_sum_terms`, `probs`; docs/numerics.md). Triton
      kernels (backend="auto" picks them; "mosaic_gpu" raises ValueError); ValueError for
      float16 inputs outside the paper layout, TypeError unless a bool.
    guard_shift: numerics="paper" with stabilize=True only: the clipped shift of the other
      layouts instead of the paper's literal m' = β·max, so that ties at large scores do not
      drive the row's O toward 0 (the paper's tie rule and rounding points stay). Raises
      ValueError with another layout (they always clip) or without stabilize.
    max_shift: with stabilize=True, the cap of the clipped shift m' − max (None: 20, 6 for
      float16). In the paper layout (with guard_shift: its literal shift has no cap), 6 keeps
      the tied P̄ = e^−6 far above the kernel's 1e−10 clamp of a tile's sum; at 20 the clamp
      scales two-tie rows' O by 0.976 per clamped tile (`pallas_kernels.policy.Compensation`).
      ValueError without stabilize, in the paper layout without guard_shift, above 6 for
      float16 outside the paper layout, unless finite and ≥ 2^−7; TypeError unless a number.
    shift_above: with stabilize=True, the rule shifts only tied tiles whose |max| is at least
      this, in units of the scaled scores (default 0: every tied tile, the paper's rule). With
      the paper layout's literal shift, 23.7 keeps the rule where its 1e−10 clamp starts
      switching rows off (two ties at 23.7), and on fully masked tiles: a test variant, not a
      fix (`pallas_kernels.policy.Compensation` gives the exact account). ValueError unless finite
      and ≥ 0, or when not 0 without stabilize; TypeError unless a real number.
    block_q, block_k: forward tile sizes, powers of two ≥ 16. They are part of the numerics
      (ties are detected per key tile). Defaults: block_k = 64, block_q = 128 (64 when
      head_dim > 128), the same on CPU and GPU.
    interpret: run the kernels in Pallas interpret mode; defaults to True unless the default
      JAX backend is a GPU (then the Triton lowering is used).
    return_stats: also return `AttentionStats`. `lse` is differentiable (its cotangent enters
      dS as P·d_lse); row_max, max_p and tied_tiles are not (their cotangents are ignored, as
      under `jax.lax.stop_gradient`). Forward-mode autodiff (`jax.jvp`) and second
      derivatives are not supported (custom_vjp; a second derivative raises
      NotImplementedError).
    rng_key: a `jax.random` key, for numerics="stochastic" only.
    num_warps, num_stages: Triton launch parameters of the forward kernel (speed only);
      defaults 4 warps (8 when head_dim > 64) and 2 stages. The Triton backward kernels use 4
      warps and 2 stages (the faster choice in the H200 tile sweep; docs/studies/speed.md).
      With backend="mosaic_gpu", num_stages is the number of key/value tiles in flight
      (default 2) and num_warps is not used; the Mosaic GPU backward's two kernels keep 2
      tiles each (at a padded head_dim of 256 dK/dV 2 and dQ 1, fewer with grouped heads;
      `pallas_kernels.backward_mgpu.default_stages`).
    mgpu_options: speed options of the Mosaic GPU forward (`MosaicGPUOptions`; the defaults
      and their measurements: docs/studies/speed.md); used where that forward runs
      (`resolved_backend`), unused by the Triton kernels. TypeError for anything else.
    backend: the kernels. "auto" (default): the Mosaic GPU kernels on a Hopper GPU wherever
      they support the call (the limits below; causal also needs a CUDA runtime outside
      12.8.0–12.9.0), the Triton kernels elsewhere — on a CPU, on other GPUs, in interpret
      mode, and for the layouts and options the Mosaic GPU forward lacks
      (`pallas_kernels.attention.choose_backend`); `resolved_backend` says which forward and
      backward a call gets.
      "triton": Pallas Triton, every layout, any GPU.
      "mosaic_gpu": Pallas Mosaic GPU for Hopper (wgmma, TMA and a warp-specialised producer,
      FlashAttention-3, Shah et al. 2024, §3; `pallas_kernels.forward_mgpu`, `backward_mgpu`)
      with the same rounding points (outputs may differ by an ulp or two of the input dtype;
      float32 intermediates differ more), for numerics "fa2" and "fp32_out",
      bfloat16/float16 inputs, head_dim 17–256 (padded to 32, 64, 128 or 256; fp32_out up to
      128), block_k 64 or 128 (64 at head_dim > 128), num_stages 1–8 within shared memory, no
      return_stats; it needs a Hopper GPU or interpret mode, and raises ValueError for a call
      its forward does not support. Its backward (two kernels, deterministic) runs the same
      head_dims (at 256 the dK/dV kernel in two parts of 128 columns; docs/api.md), but for
      center_keys at 256, where the Triton backward follows the Mosaic GPU forward. On CPU it
      runs in Pallas' GPU interpret mode.
  Returns:
    [batch, q_len, num_heads, head_dim] in query's dtype (float32 for "fp32_out"), or
    (out, AttentionStats).
    Differentiable in query, key and value.
  Raises:
    ValueError: rank ≠ 4, mismatched batch/head_dim, num_heads % num_kv_heads ≠ 0,
      head_dim > 256 (others up to 256 are zero-padded to a power of two), a softmax_scale
      that is not a normal float32 > 0, beta ≤ 1, negative tie_tolerance, block sizes that
      are not powers of two ≥ 16, unknown numerics, unknown backend or a call
      backend="mosaic_gpu" does not support.
    TypeError: unsupported or mixed dtypes; a flag (causal, stabilize, delta_float32,
      center_keys, single_lse, sum_rounded_p, guard_shift, return_stats; interpret: or None)
      that is not a bool.
    NotImplementedError: a second derivative (`jax.hessian`, a grad of a grad, a jvp of a
      grad), when it is traced.
  """
  cfg, seeds = _kernel_config(
    query,
    key,
    value,
    causal=causal,
    softmax_scale=softmax_scale,
    stabilize=stabilize,
    beta=beta,
    tie_tolerance=tie_tolerance,
    numerics=numerics,
    delta_float32=delta_float32,
    center_keys=center_keys,
    single_lse=single_lse,
    sum_rounded_p=sum_rounded_p,
    guard_shift=guard_shift,
    max_shift=max_shift,
    shift_above=shift_above,
    block_q=block_q,
    block_k=block_k,
    interpret=interpret,
    return_stats=return_stats,
    rng_key=rng_key,
    num_warps=num_warps,
    num_stages=num_stages,
    backend=backend,
    mgpu_options=mgpu_options,
  )
  # compiled kernels off a GPU: Pallas' own error otherwise (`resolved_backend` may still ask
  # which kernels a GPU would run; backend="mosaic_gpu" off a Hopper is refused before this)
  if not cfg.interpret and jax.default_backend() != "gpu":
    raise ValueError(
      f"interpret=False compiles the kernels: backend={cfg.backend!r} needs "
      f"{'a Hopper GPU' if cfg.backend == 'mosaic_gpu' else 'a CUDA GPU'}; this JAX backend "
      f"is {jax.default_backend()!r}: leave interpret at None or True"
    )
  out, stats = flash_attention_padded(query, key, value, cfg, seeds)
  if not return_stats:
    return out
  return out, AttentionStats(*(x.transpose(0, 2, 1) for x in stats))  # -> [batch, q, heads]


class Kernels(NamedTuple):
  """The kernels a `flash_attention` call runs: "triton" or "mosaic_gpu" each."""

  forward: str
  backward: str


def resolved_backend(query, key, value, **kwargs) -> Kernels:
  """Which kernels `flash_attention(query, key, value, **kwargs)` runs (the forward, and the
  backward its gradient runs), with backend="auto" resolved on this machine's default device
  and `interpret` default (`pallas_kernels.attention.choose_backend`): for experiments to
  record. query/key/value may be arrays or `jax.ShapeDtypeStruct`s; kwargs are
  `flash_attention`'s and are checked the same way (same errors).
  """
  try:
    call = inspect.signature(flash_attention).bind(query, key, value, **kwargs)
  except TypeError as e:  # e.g. "got an unexpected keyword argument 'foo'"
    raise TypeError(f"resolved_backend takes flash_attention's arguments: {e}") from None
  call.apply_defaults()
  cfg, _ = _kernel_config(**call.arguments)
  return Kernels(cfg.backend, cfg.backend_bwd)


def _kernel_config(
  query,
  key,
  value,
  *,
  causal,
  softmax_scale,
  stabilize,
  beta,
  tie_tolerance,
  numerics,
  delta_float32,
  center_keys,
  single_lse,
  sum_rounded_p,
  guard_shift,
  max_shift,
  shift_above,
  block_q,
  block_k,
  interpret,
  return_stats,
  rng_key,
  num_warps,
  num_stages,
  backend,
  mgpu_options,
):
  """`flash_attention`'s checks and its (KernelConfig, seeds or None). Every argument is
  given (no defaults here: `flash_attention`'s signature holds the one set of them)."""
  softmax_scale = check_inputs(query, key, value, softmax_scale)
  max_shift = check_shift_options(
    numerics, stabilize, guard_shift, max_shift, query.dtype, shift_above
  )
  compensation = Compensation.for_dtype(
    query.dtype,
    beta,
    tie_tolerance,
    guard_paper=bool(guard_shift),
    max_shift=max_shift,
    shift_above=shift_above,
  )
  for name, flag in (("causal", causal), ("stabilize", stabilize), ("return_stats", return_stats)):
    boolean(name, flag)
  boolean("interpret", interpret, none=True)
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got backend={backend!r}")
  layout = get_numerics(numerics).with_options(
    delta_float32=delta_float32,
    center_keys=center_keys,
    single_lse=single_lse,
    sum_rounded_p=sum_rounded_p,
  )
  layout.rounds_row_sum(query.dtype)  # ValueError for float16 outside the paper layout
  seeds = None
  if layout.stochastic:
    if query.dtype != jnp.bfloat16:
      raise TypeError(
        f"numerics='stochastic' rounds to bfloat16 and needs bfloat16 inputs, "
        f"got query.dtype={query.dtype}"
      )
    if rng_key is None:
      raise ValueError("numerics='stochastic' needs rng_key (a jax.random key)")
    dtype, shape = getattr(rng_key, "dtype", None), getattr(rng_key, "shape", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    if not (typed and shape == () or dtype == jnp.uint32 and shape == (2,)):
      raise TypeError(
        "rng_key must be one jax.random key (jax.random.key(seed), or a raw "
        f"jax.random.PRNGKey), got rng_key={shown(rng_key)}"
      )
    seeds = jax.random.bits(rng_key, (2,), jnp.uint32)
  elif rng_key is not None:
    raise ValueError(f"rng_key is only used by numerics='stochastic', got numerics={numerics!r}")
  cfg = kernel_config(
    q_len=query.shape[1],
    kv_len=key.shape[1],
    head_dim=query.shape[3],
    dtype=query.dtype,
    softmax_scale=softmax_scale,
    causal=causal,
    numerics=layout,
    compensation=compensation if stabilize else None,
    block_q=block_q,
    block_k=block_k,
    interpret=_default_interpret() if interpret is None else interpret,
    return_stats=return_stats,
    num_warps=num_warps,
    num_stages=num_stages,
    backend=backend,
    mgpu_options=mgpu_options,
    group=query.shape[2] // key.shape[2],
  )
  return cfg, seeds
