"""Accuracy against the FP64 golden value (Golden et al. 2024, arXiv 2405.02803, §3).

Shared by the tests and by `flashstable accuracy`: seeded inputs, error summaries, and the
acceptance rule used by flash-attention's own test-suite: for each tensor (O, dQ, dK, dV),
error(flash, FP64) ≤ 2·error(standard attention in the same low precision, FP64) + u, for the
max and for the mean absolute error, with u = one ulp of the inputs' dtype at the reference's
scale, 2^(⌊log2 max|ref|⌋ − p) with p = 7 (bfloat16), 10 (float16) or 23 (float32) mantissa
bits (scale floored at 2^−10, float32 at 1), plus one float32 ulp at the scale of the terms the
tensor sums (`term_scales`; for dQ and dK the terms of P∘(dP − delta) before they cancel). Every
flash program sums in float32, and two correct float32 sums in different orders differ at the
terms' scale, not at the result's: a length-1 softmax's dQ is exactly 0 in FP64 and in the
standard attention, and 1.4e-7 on an H100, where the kernel's dP and XLA's delta are summed in
different orders (2026-12-07; 0 on the CPU, where they happen to agree).

The FP64 value and the standard attention run on XLA's CPU backend on every platform, with plain
dots (`jax_flashstable.xla_cpu`): one baseline arithmetic wherever the kernel runs. On a GPU,
XLA's float32 attention (cuBLAS) accumulates more accurately than a kernel's float32 FMA chain
(H100, 2026-12-07: 5.1e-7 against 2.0e-6 at head_dim 256, where the CPU's plain dots give
2.0e-6 for both), which held the kernel to a better-than-float32 baseline.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.api import flash_attention, reference_attention_vjp
from jax_flashstable.lab.shapes import Shape, make_inputs
from jax_flashstable.xla_cpu import plain_dots_set

TENSORS = ("out", "d_query", "d_key", "d_value")


@dataclasses.dataclass(frozen=True)
class Error:
  max: float
  mean: float
  finite: bool

  @classmethod
  def of(cls, x, ref):
    x = np.asarray(x, np.float64)
    d = np.abs(x - np.asarray(ref, np.float64))
    return cls(float(d.max()), float(d.mean()), bool(np.isfinite(x).all()))


def bf16_ulp(x):
  """Elementwise: one bf16 ulp at each value's binade, 2^(⌊log2 |x|⌋ − 7) (float64)."""
  return 2.0 ** (np.floor(np.log2(np.abs(np.asarray(x, np.float64)) + 1e-300)) - 7)


def ulp_at_scale(ref, floor=None, dtype=jnp.bfloat16) -> float:
  """One ulp of `dtype` at the reference's scale: 2^(⌊log2 max|ref|⌋ − mantissa bits).

  The scale is floored so that a reference that is exactly zero (dQ and dK of a length-1
  softmax, where dP − delta cancels) is compared at the scale of the float32 cancellation of
  unit-scale inputs, not at 2^−133: `floor` defaults to 2^−10 for 16-bit dtypes (one bf16 ulp
  there is 2^−17) and to 1 for float32 (one ulp 2^−23). `ref` may also be a scale (a float).
  """
  if floor is None:
    floor = 1.0 if jnp.dtype(dtype).itemsize == 4 else 2.0**-10
  top = max(float(np.max(np.abs(ref))), floor)
  return 2.0 ** (math.floor(math.log2(top)) - jnp.finfo(dtype).nmant)


def flash_vjp(query, key, value, d_out, **kwargs):
  """(out, (d_query, d_key, d_value)) of `flash_attention`, jitted."""

  def run(q, k, v, do):
    out, vjp = jax.vjp(lambda *a: flash_attention(*a, **kwargs), q, k, v)
    return out, vjp(do.astype(out.dtype))

  return jax.jit(run)(query, key, value, d_out)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Errors of flash and of the low-precision standard attention against FP64, per tensor."""

  flash: dict
  standard: dict
  ulp: dict  # one ulp of the inputs' dtype at the reference's scale
  sum_ulp: dict  # one float32 ulp at the scale of the terms (`term_scales`)

  def passes(self) -> dict:
    """tensor -> True when the rule in the module docstring holds for max and mean."""
    return {
      t: self.flash[t].finite
      and self.flash[t].max <= 2 * self.standard[t].max + self.ulp[t] + self.sum_ulp[t]
      and self.flash[t].mean <= 2 * self.standard[t].mean + self.ulp[t] + self.sum_ulp[t]
      for t in TENSORS
    }


def compare_to_golden(shape: Shape, dtype, seed=0, **flash_kwargs) -> Comparison:
  """Runs flash and standard attention in `dtype` on seeded inputs and compares with FP64."""
  q, k, v, do = make_inputs(shape, dtype, seed)
  return compare(q, k, v, do, causal=shape.causal, **flash_kwargs)


def compare(query, key, value, d_out, *, causal, result=None, **flash_kwargs) -> Comparison:
  """Flash (`flash_kwargs`) and standard attention in the inputs' dtype on these inputs,
  [batch, seq, heads, head_dim], against FP64: O and the three gradients for cotangent d_out.
  Flash runs on the default device; FP64 and the standard attention on the CPU (module doc).
  result: flash's (out, (d_query, d_key, d_value)) when already computed (not run again)."""
  if not plain_dots_set():
    warnings.warn(
      "accuracy.compare: XLA's CPU dots may be YNNPACK's, more accurate than float32 "
      "arithmetic: call jax_flashstable.xla_cpu.plain_dots() before JAX starts",
      stacklevel=2,
    )
  dtype = query.dtype
  kw = dict(causal=causal, softmax_scale=flash_kwargs.get("softmax_scale"))
  out, grads = (
    result
    if result is not None
    else flash_vjp(query, key, value, d_out, causal=causal, **flash_kwargs)
  )
  cpu = jax.devices("cpu")[0]
  q, k, v, do = jax.device_put((query, key, value, d_out), cpu)
  with jax.default_device(cpu):
    gold, gold_grads = reference_attention_vjp(q, k, v, do, dtype=jnp.float64, **kw)
    std, std_grads = reference_attention_vjp(q, k, v, do, dtype=dtype, **kw)
  golds = (gold,) + tuple(gold_grads)
  flash = dict(zip(TENSORS, (Error.of(x, g) for x, g in zip((out,) + tuple(grads), golds))))
  standard = dict(zip(TENSORS, (Error.of(x, g) for x, g in zip((std,) + tuple(std_grads), golds))))
  terms = term_scales(q, k, v, do, causal=causal, softmax_scale=kw["softmax_scale"])
  return Comparison(
    flash,
    standard,
    {t: ulp_at_scale(g, dtype=dtype) for t, g in zip(TENSORS, golds)},
    {t: ulp_at_scale(terms[t], floor=2.0**-126, dtype=jnp.float32) for t in TENSORS},
  )


def term_scales(query, key, value, d_out, *, causal, softmax_scale=None) -> dict:
  """tensor -> the largest sum of absolute terms behind any of its elements, in FP64.

  With P the FP64 softmax: O sums P·|V|, dV sums Pᵀ·|dO|, dQ sums scale·(P∘(|dO|·|V|ᵀ +
  rowsum(|dO|∘|O|)))·|K| and dK its transpose with |Q|: the terms of dS = P∘(dP − delta)
  before they cancel, dP = dO·Vᵀ and delta = rowsum(dO∘O) each at the scale of its own
  float32 sum's terms (a length-1 softmax whose dO is orthogonal to V has dP = delta = 0, and
  their float32 sums are not). Key/value heads are shared by
  num_heads/num_kv_heads query heads (their dK, dV sum over the group); causal masks key j > query i.
  Inputs [batch, seq, heads, head_dim], any float dtype; returns floats.
  """
  q, k, v, do = (np.asarray(x, np.float64) for x in (query, key, value, d_out))
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
  scale = 1 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
  if causal:
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  dp = np.einsum("bqhd,bkhd->bhqk", np.abs(do), np.abs(v))
  o = np.einsum("bhqk,bkhd->bqhd", p, v)
  delta = np.einsum("bqhd,bqhd->bhq", np.abs(do), np.abs(o))[..., None]
  a = scale * p * (dp + delta)

  def by_kv_head(x):  # [batch, kv_len, heads, d] -> summed over each query-head group
    return x.reshape(x.shape[0], x.shape[1], -1, group, x.shape[3]).sum(3)

  return {
    "out": float(np.einsum("bhqk,bkhd->bqhd", p, np.abs(v)).max()),
    "d_query": float(np.einsum("bhqk,bkhd->bqhd", a, np.abs(k)).max()),
    "d_key": float(by_kv_head(np.einsum("bhqk,bqhd->bkhd", a, np.abs(q))).max()),
    "d_value": float(by_kv_head(np.einsum("bhqk,bqhd->bkhd", p, np.abs(do))).max()),
  }


# The fixed sweep of `flashstable accuracy` (the main job until the training loop lands).
SWEEP = (
  Shape(1, 256, 256, 4, 4, 64),
  Shape(1, 256, 256, 4, 4, 64, causal=True),
  Shape(1, 200, 333, 4, 2, 128, causal=True),
  Shape(2, 97, 97, 4, 1, 32),
)


def accuracy_report(shapes=SWEEP, dtypes=(jnp.bfloat16,), seed=0, stabilize=(False, True)):
  """Rows of flash vs standard-attention error against FP64, per shape, dtype, tensor."""
  rows = []
  for shape in shapes:
    for dtype in dtypes:
      for stab in stabilize:
        c = compare_to_golden(shape, dtype, seed=seed, stabilize=stab)
        ok = c.passes()
        for t in TENSORS:
          rows.append(
            dict(
              shape=shape.name,
              dtype=jnp.dtype(dtype).name,
              stabilize=stab,
              tensor=t,
              flash_max=c.flash[t].max,
              flash_mean=c.flash[t].mean,
              standard_max=c.standard[t].max,
              standard_mean=c.standard[t].mean,
              ratio_max=c.flash[t].max / max(c.standard[t].max, 1e-30),
              passes=ok[t],
            )
          )
  return rows


def format_report(rows):
  out = [
    "| shape | dtype | stabilize | tensor | flash max | standard max | flash/standard | flash mean | standard mean | rule |",
    "|---|---|---|---|---:|---:|---:|---:|---:|---|",
  ]
  for r in rows:
    out.append(
      f"| {r['shape']} | {r['dtype']} | {r['stabilize']} | {r['tensor']} | {r['flash_max']:.2e} | "
      f"{r['standard_max']:.2e} | {r['ratio_max']:.2f} | {r['flash_mean']:.2e} | "
      f"{r['standard_mean']:.2e} | {'pass' if r['passes'] else 'FAIL'} |"
    )
  return "\n".join(out)
