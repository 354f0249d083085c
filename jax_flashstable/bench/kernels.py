"""Kernel speed: forward and forward+backward TFLOP/s of any implementation on any problem,
checked against an FP32 reference first; compensation overheads and speed ratios measured in
interleaved pairs; the golden output hashes of every layout."""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.api import flash_attention, reference_attention
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.bench.runners import kernels, name_error, runs
from jax_flashstable.bench.timing import (
  attention_flops,
  median_seconds,
  paired_overhead,
  seconds_per_call,
)
from jax_flashstable.checks import integer
from jax_flashstable.lab.shapes import Shape, make_inputs


def bench(shapes, impls, *, dtype=jnp.bfloat16, warmup=3, reps=20, seed=0, log=print):
  """Forward and forward+backward time and TFLOP/s of every implementation on every shape.

  Every implementation is first checked against an FP32 reference on a slice of the inputs
  (`max_err` ≤ 2⁻⁵ for bf16 inputs of unit variance, else the row says `ok: False` and is not
  timed). TFLOP/s follow FlashAttention's convention (`attention_flops`). Implementations a
  device lacks (cuDNN off GPU, torch not importable) become rows with a `skipped` reason.
  Rows of our kernels say which ran (`kernels`: "forward/backward", e.g. "mosaic_gpu/triton").
  Returns a list of dict rows. `impls` is one name or a sequence of names; ValueError (one
  line, before any work) for an unknown name or a count below 1 (`reps`; `warmup` may be 0).
  """
  impls = (impls,) if isinstance(impls, str) else tuple(impls)
  _known(*impls)
  integer("warmup", warmup, 0), integer("reps", reps, 1)
  rows = []
  for shape in shapes:
    q, k, v, do = make_inputs(shape, dtype, seed)
    ref, g = _reference_slice(shape, q, k, v)
    flops = attention_flops(
      shape.batch, shape.q_len, shape.kv_len, shape.num_heads, shape.head_dim, shape.causal
    )
    for name in impls:
      row = dict(
        impl=name,
        shape=shape.name,
        batch=shape.batch,
        seq_len=shape.q_len,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        causal=shape.causal,
      )
      try:
        if (which := kernels(name, shape, q, k, v)) is not None:
          row["kernels"] = which  # forward/backward, backend="auto" resolved
        fwd, fb, out = runs(name, shape, q, k, v, do)
        err = float(np.max(np.abs(out[:1, :, :g] - ref)))
        row.update(max_err=err, ok=bool(np.isfinite(err) and err <= 2**-5))
        if row["ok"]:
          t_f, t_fb = seconds_per_call(fwd, warmup, reps), seconds_per_call(fb, warmup, reps)
          row.update(
            fwd_ms=1e3 * t_f,
            fwdbwd_ms=1e3 * t_fb,
            fwd_tflops=flops / t_f / 1e12,
            fwdbwd_tflops=3.5 * flops / t_fb / 1e12,
          )
      except Exception as e:  # not available here (or failed): say why, go on
        why = (str(e).splitlines() or ["(no message)"])[0][:200]  # e.g. a bare assert
        row = dict(row, skipped=f"{type(e).__name__}: {why}")
        rows.append(row)
        log(f"{shape.name:>32} {name:>26}: skipped ({row['skipped']})")
        continue
      rows.append(row)
      log(
        f"{shape.name:>32} {name:>26}: "
        + (
          f"fwd {row['fwd_tflops']:.3g}, fwd+bwd "
          f"{row['fwdbwd_tflops']:.3g} TFLOP/s, max err {err:.1e}"
          if row["ok"]
          else f"FAILED check, max err {err:.2e}"
        )
      )
  _add_ratios(rows)
  return rows


def _known(*names):
  """ValueError (`runners.name_error`'s line) for the first name the bench does not know."""
  for name in names:
    if (why := name_error(name)) is not None:
      raise ValueError(why)


def _add_ratios(rows, base="cudnn"):
  """fwd/fwd+bwd TFLOP/s as a fraction of `base` on the same shape, where both were timed."""
  by_shape = {r["shape"]: r for r in rows if r["impl"] == base and "fwd_tflops" in r}
  for r in rows:
    b = by_shape.get(r["shape"])
    if b is not None and "fwd_tflops" in r:
      r[f"fwd_vs_{base}"] = r["fwd_tflops"] / b["fwd_tflops"]
      r[f"fwdbwd_vs_{base}"] = r["fwdbwd_tflops"] / b["fwdbwd_tflops"]


def _paired(shape, impl_a, impl_b, dtype, pairs, seed):
  """`paired_overhead` of impl_b against impl_a on identical inputs, forward and
  forward+backward, after one warm-up call of each."""
  q, k, v, do = make_inputs(shape, dtype, seed)
  a, b = runs(impl_a, shape, q, k, v, do), runs(impl_b, shape, q, k, v, do)
  for run in a[:2] + b[:2]:
    median_seconds(run, warmup=3, reps=1)
  return paired_overhead(a[0], b[0], pairs), paired_overhead(a[1], b[1], pairs)


def compensation_overhead(shape, attention="fa2", *, dtype=jnp.bfloat16, pairs=20, seed=0):
  """Relative cost of the compensation in forward and forward+backward: `paired_overhead` of
  `attention` (a spec) against the same spec with stabilize=true, on one shape. ValueError
  for a spec that is not a flash attention or pairs below 1."""
  integer("pairs", pairs, 1)
  config = AttentionConfig.parse(attention)
  if config.implementation != "flash":
    raise ValueError(f"the compensation overhead needs a flash attention, got {attention!r}")
  plain = dataclasses.replace(config, stabilize=False)
  fwd, fwdbwd = _paired(
    shape, plain.name, dataclasses.replace(plain, stabilize=True).name, dtype, pairs, seed
  )
  return dict(
    shape=shape.name, attention=plain.name, pairs=pairs, fwd_overhead=fwd, fwdbwd_overhead=fwdbwd
  )


def paired_speed_ratio(shape, impl, reference="cudnn", *, dtype=jnp.bfloat16, pairs=20, seed=0):
  """Speed of `impl` as a fraction of `reference` (1.2: 1.2× as fast), forward and
  forward+backward, each the median over `pairs` interleaved pairs (`paired_overhead`), so
  that both run under the same clocks and load: the ratio of one run, not of two medians
  taken at different moments (cuDNN's own speed varies between runs: docs/bench.md). Raises
  ValueError for an unknown name or pairs below 1."""
  _known(impl, reference)
  integer("pairs", pairs, 1)
  fwd, fwdbwd = _paired(shape, impl, reference, dtype, pairs, seed)  # time(ref)/time(impl) − 1
  return dict(
    shape=shape.name,
    impl=impl,
    reference=reference,
    pairs=pairs,
    fwd_ratio=1.0 + fwd,
    fwdbwd_ratio=1.0 + fwdbwd,
  )


def default_shapes(gpu: bool):
  """The sweep `flashstable bench` runs: on a GPU lengths 1k–16k at 16k tokens per batch,
  head_dim 64 and 128, causal and not, plus one GQA shape (16 query heads on 4 key/value heads);
  on CPU (interpret mode) two small shapes."""
  if not gpu:
    return [Shape(1, 128, 128, 2, 2, 64, False), Shape(1, 128, 128, 4, 2, 64, True)]
  shapes = [
    Shape(16384 // n, n, n, 16, 16, d, c)
    for n in (1024, 4096, 16384)
    for d in (64, 128)
    for c in (False, True)
  ]
  return shapes + [Shape(4, 4096, 4096, 16, 4, 128, True)]


def default_impls(gpu: bool, layouts=("fa2",)):
  impls = [f"{l}{s}" for l in layouts for s in ("", "+comp")] + ["xla"]
  if gpu:
    impls += ["cudnn", "torch-flash", "torch-cudnn"]
  return impls


def hash_key(backend: str | None = None) -> str:
  """The key of tests/golden_hashes.json this machine's `golden_hashes` are recorded under:
  the JAX backend ("gpu": the Triton kernels on the GPU), or for the CPU
  "cpu-xla-<xla_fingerprint()>", the class of XLA's CPU code generation itself.

  The float32 bits of the interpret-mode kernels follow XLA's CPU code generation, which the
  instruction set alone does not name: on 2026-12-01 12 of the 16 hashes of an AVX2 EPYC
  differed from those of an AVX-512 CPU, and on 2026-12-02 an AVX-512 Xeon (avx512_bf16,
  avx512_fp16) gave all 16 of the AVX2 EPYC's, none of the other AVX-512 CPU's 12 — so the
  class is measured, not read from /proc/cpuinfo. XLA_FLAGS (an ISA cap, YNNPACK fusions) and
  PJRT_NPROC are part of it, through the fingerprint."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return backend
  return f"cpu-xla-{xla_fingerprint()}"


def xla_fingerprint() -> str:
  """SHA-256 (first 16 hex digits) of the bits of XLA's own attention — jitted
  `jax.nn.dot_product_attention(implementation="xla")`, forward and the three gradients, in
  float32 and in bfloat16 — on the shapes and seed of `golden_hashes`' inputs (head_dim 64
  and 128; the keys untied).

  It names the machine's class of XLA code generation (vector width, FMA contraction, the
  dots' blocking and threads) without any of this library's kernels, so a changed kernel
  cannot change it. Checked 2026-12-02 on an AVX-512 Xeon: it changes exactly where
  `golden_hashes` do (XLA capped at AVX2: both unchanged; at AVX and at SSE4.2: both changed,
  the two caps alike in both). A proxy: it runs XLA's dots, exp and reductions, not the
  kernels' tiled loops, so two classes it does not tell apart are possible (one of them would
  then fail `tests/test_bench.py`, whose unrecorded keys are checked against every record)."""
  attend = jax.jit(
    lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
  )
  h = hashlib.sha256()
  for head_dim in (64, 128):
    q, k, v, do = make_inputs(Shape(1, 200, 200, 2, 2, head_dim, True), jnp.bfloat16, 0)
    for dtype in (jnp.float32, jnp.bfloat16):
      o, vjp = jax.vjp(attend, *(x.astype(dtype) for x in (q, k, v)))
      for x in (o, *vjp(do.astype(dtype))):
        h.update(np.asarray(x).tobytes())
  return h.hexdigest()[:16]


def golden_hashes(
  layouts=("fa2", "paper", "fp32_out", "stochastic"), block_q=64, block_k=64, head_dims=(64, 128)
):
  """SHA-256 (first 16 hex digits) of the bits of out, lse, dQ, dK and dV of every layout ×
  stabilize × head_dim on fixed inputs (seed 0, batch 1, length 200, 2 heads, causal; every
  odd key a copy of the even one before it, so rows have tied maxima and the compensation
  acts) with the given tiles: tuning (warps, stages, loop structure) must leave them unchanged.
  The Triton kernels' hashes (backend="triton": on a Hopper GPU "auto" would pick the Mosaic
  GPU kernels, whose float32 values differ). Keys: "<layout>[+comp]" for head_dim 64, with
  "@d<head_dim>" appended for the others."""
  out = {}
  for head_dim in head_dims:
    q, k, v, do = make_inputs(Shape(1, 200, 200, 2, 2, head_dim, True), jnp.bfloat16, 0)
    k = k.at[:, 1::2].set(k[:, 0::2])
    for layout in layouts:
      for stab in (False, True):
        name = f"{layout}{'+comp' if stab else ''}"
        kw = dict(
          AttentionConfig.parse(name).flash_kwargs(),
          causal=True,
          block_q=block_q,
          block_k=block_k,
          rng_key=jax.random.key(0) if layout == "stochastic" else None,
          backend="triton",
        )
        o, vjp, stats = jax.vjp(  # one forward: the statistics come out as its aux
          lambda q, k, v: flash_attention(q, k, v, return_stats=True, **kw), q, k, v, has_aux=True
        )
        grads = vjp(do.astype(o.dtype))
        h = hashlib.sha256()
        for x in (o, stats.lse, *grads):
          h.update(np.asarray(x).tobytes())
        out[name + ("" if head_dim == 64 else f"@d{head_dim}")] = h.hexdigest()[:16]
  return out


def _reference_slice(shape, q, k, v):
  """FP32 reference output for batch 0 and the query heads of the first key/value head (cheap
  at any length): the check each implementation passes before it is timed."""
  g = shape.num_heads // shape.num_kv_heads
  ref = reference_attention(
    q[:1, :, :g], k[:1, :, :1], v[:1, :, :1], causal=shape.causal, dtype=jnp.float32
  )
  return np.asarray(ref, np.float32), g
