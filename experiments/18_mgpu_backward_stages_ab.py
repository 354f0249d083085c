"""Issue 19: the Mosaic GPU backward's tiles in flight (`pallas_kernels/backward_mgpu.py`,
`KernelConfig.stages_bwd_mgpu`: dK/dV's and dQ's), and the `MosaicGPUOptions` it reads
(longest_first: the causal dQ kernel's query tiles, the last first; rounded_scores: S as PTX
mul.rn.f32 and P without a select, which moves float32 values away from the row max, so it
says "DIFFERS" with the largest difference; persistent_bwd: both kernels one CTA an SM over
their work items; delta_in_dq: delta summed by the dQ kernel, in its own float32 order, so it
may say "DIFFERS" too; o_by_tma: with delta_in_dq, O's rows by TMA or from global memory,
the same bits; items_early: the persistent producer's item tiles one item early, the same
bits), against each other: each variant's backward
(dK/dV and dQ, given the same forward residuals) against the first variant's in interleaved
pairs (the median of `--pairs` ratios, each side 10 back-to-back calls, as `flashstable bench
--paired`), its time alone, its kernels' own time on the GPU and its ratio to the first's
(`timing.kernel_seconds`, JAX's profiler), and whether its dQ, dK and dV equal the first's bit for bit (the
ring's depth and the grid's order move no float32 sum: it must say "same bits"). Default
shape b4 × 4096 × 16 × d256 bf16, where the default became dK/dV 2, dQ 1 (2026-12-05; 1 and 1
before).

    python3 experiments/18_mgpu_backward_stages_ab.py [--causal] [--pairs 15] [--shape B,N,H,HK,D] \
      [--out FILE] DKV,DQ[,OPTION=0|1 ...][,bk_dq=64|128] ...   # e.g. 1,1 2,1 (the first
      # is the reference; bk_dq: the dQ kernel's key tile)
    python3 experiments/18_mgpu_backward_stages_ab.py --causal --shape 4,4096,16,16,128 \
      3,2 3,2,longest_first=1

Every variant is checked (`backward_mgpu.supported`: shared memory, with the variant's dQ key
tile, bk_dq=128 taking more) before any work, one line naming a bad one. GPU only (a Hopper GPU); ~10 s a
variant at the default shape on one H100.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


BACKWARD_OPTIONS = (
  "longest_first",
  "rounded_scores",
  "scale_in_exp2",
  "persistent_bwd",
  "delta_in_dq",
  "o_by_tma",
  "items_early",
)  # `MosaicGPUOptions` the backward reads


# `KernelConfig` fields of the Mosaic GPU backward a variant may set, and their values
KERNEL_FIELDS = {
  "bk_dq": ("block_k_dq_mgpu", ("64", "128")),
}


def parse_stages(spec: str) -> tuple[tuple[int, int], dict]:
  """ "DKV,DQ[,OPTION=0|1 ...][,bk_dq=64|128]" → ((dkv, dq), {option: bool, "bk_dq": int}):
  tiles in flight, each an integer 1–8, `BACKWARD_OPTIONS` and the dQ kernel's key tile
  (`KERNEL_FIELDS`; `split_fields` takes it out); ValueError naming the spec."""
  parts = spec.split(",")
  if len(parts) < 2 or not all(p.isdecimal() and 1 <= int(p) <= 8 for p in parts[:2]):
    raise ValueError(f"variant {spec!r} is not DKV,DQ (tiles in flight, integers 1–8)")
  fields, options = BACKWARD_OPTIONS, {}
  for item in parts[2:]:
    key, eq, value = item.partition("=")
    if key in KERNEL_FIELDS:
      allowed = KERNEL_FIELDS[key][1]
      if value not in allowed:
        raise ValueError(
          f"variant {spec!r}: {item!r} is not {' or '.join(f'{key}={v}' for v in allowed)}"
        )
      options[key] = int(value)
      continue
    if not eq or key not in fields or value not in ("0", "1"):
      raise ValueError(
        f"variant {spec!r}: {item!r} is not OPTION=0|1 (OPTION: {', '.join(fields)})"
      )
    options[key] = value == "1"
  return (int(parts[0]), int(parts[1])), options


def split_fields(options: dict) -> tuple[dict, dict]:
  """`parse_stages`' options as (the `MosaicGPUOptions` fields, the `KernelConfig` fields)."""
  rest = dict(options)
  fields = {name: rest.pop(key) for key, (name, _) in KERNEL_FIELDS.items() if key in rest}
  return rest, fields


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("variants", nargs="+")
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--pairs", type=int, default=15)
  ap.add_argument("--shape", default="4,4096,16,16,256", help="batch,len,heads,kv_heads,head_dim")
  ap.add_argument("--out", default=None, help="also append every line to this file")
  a = ap.parse_args(argv)
  import jax.numpy as jnp

  from jax_flashstable.lab.shapes import Shape
  from pallas_kernels import backward_mgpu
  from pallas_kernels.attention import next_power_of_2
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  name = "18_mgpu_backward_stages_ab"
  try:
    s = Shape.parse(a.shape, causal=a.causal)  # the bench's shape grammar and checks
  except ValueError as e:
    sys.exit(f"{name}: --shape: {e}")
  shape = (s.batch, s.q_len, s.num_heads, s.num_kv_heads, s.head_dim)
  if a.pairs < 1:
    sys.exit(f"{name}: --pairs {a.pairs} (at least 1)")
  head_dim, group = max(16, next_power_of_2(shape[4])), shape[2] // shape[3]
  variants = []
  for spec in a.variants:
    try:
      stages, options = parse_stages(spec)
      options, fields = split_fields(options)
      options = MosaicGPUOptions(**options)
    except ValueError as e:
      sys.exit(f"{name}: {e}")
    why = backward_mgpu.supported(
      numerics="fa2",
      head_dim=head_dim,
      dtype=jnp.bfloat16,
      num_stages=stages,
      group=group,
      block_k_dq=fields.get("block_k_dq_mgpu"),
    )
    if why:
      sys.exit(f"{name}: variant {spec!r}: {why}")
    variants.append((spec, stages, options, fields))
  import jax

  from pallas_kernels.forward_mgpu import on_hopper

  if not on_hopper():
    sys.exit(f"{name}: needs a Hopper GPU; this is {jax.devices()[0].device_kind}")
  run(a, shape, variants)


def run(a, shape, variants):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jax_flashstable.bench.timing import (
    attention_flops,
    kernel_seconds,
    line_printer,
    paired_overhead,
    seconds_per_call,
    waiting,
  )
  from jax_flashstable.lab.shapes import Shape, make_inputs
  from pallas_kernels import attention
  from pallas_kernels.backward_mgpu import flash_backward_mgpu
  from pallas_kernels.forward import flash_forward
  from pallas_kernels.policy import get_numerics

  say = line_printer(a.out)

  b, n, h, hk, d = shape
  q, k, v, _ = make_inputs(Shape(b, n, n, h, hk, d), jnp.bfloat16, 0)
  do = jax.random.normal(jax.random.key(1), q.shape, jnp.float32).astype(jnp.bfloat16)
  cfg = attention.kernel_config(
    q_len=n,
    kv_len=n,
    head_dim=d,
    dtype=jnp.bfloat16,
    softmax_scale=d**-0.5,
    causal=a.causal,
    numerics=get_numerics("fa2"),
    compensation=None,
    interpret=False,
    backend="mosaic_gpu",
    group=h // hk,
  )
  if cfg.backend_bwd != "mosaic_gpu" or n % 128 or d not in (32, 64, 128, 256):
    sys.exit(
      f"18_mgpu_backward_stages_ab: --shape {a.shape}: the Mosaic GPU backward runs it padded "
      "(length a multiple of 128 and head_dim 32, 64, 128 or 256 run unpadded)"
    )
  triton = dataclasses.replace(cfg, backend="triton")  # the residuals, as the tests take them
  out, m, log_l, _, _ = jax.jit(lambda q, k, v: flash_forward(q, k, v, triton))(q, k, v)
  flops = 2.5 * attention_flops(b, n, n, h, d, causal=a.causal)  # the backward's 5 products
  say(
    f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, shape {shape}, causal={a.causal}, "
    f"default stages {cfg.stages_bwd_mgpu}"
  )
  first, run_first, k_first = None, None, None
  for spec, stages, options, fields in variants:
    vcfg = dataclasses.replace(cfg, stages_bwd_mgpu=stages, mgpu=options, **fields)
    f = jax.jit(
      lambda q, k, v, o, m, l, do, vcfg=vcfg: flash_backward_mgpu(q, k, v, o, m, l, do, vcfg)
    )
    args = (q, k, v, out, m, log_l, do)
    try:
      grads = [np.asarray(g.astype(jnp.float32)) for g in f(*args)]
    except Exception as e:  # a variant that does not compile: say so, go on with the next
      say(f"{spec}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
      continue
    run_v = waiting(f, *args)
    t, t_kernels = seconds_per_call(run_v), kernel_seconds(run_v)  # (k is the keys)
    if first is None:
      first, run_first, same, ratio = (spec, grads), run_v, "the reference", 1.0
      k_first = t_kernels
    else:
      same = (
        f"same bits as {first[0]}"
        if all(np.array_equal(g, r) for g, r in zip(grads, first[1]))
        else f"DIFFERS from {first[0]} (max |Δ| "
        f"{max(float(np.max(np.abs(g - r))) for g, r in zip(grads, first[1])):.2e})"
      )
      ratio = 1 + paired_overhead(run_first, run_v, pairs=a.pairs)  # time(variant) / time(first)
    kernels = (
      ""
      if None in (t_kernels, k_first)
      else f", kernels {t_kernels * 1e6:.1f} µs ({t_kernels / k_first:.3f}× the first's)"
    )
    say(
      f"dK/dV, dQ stages {spec:6s} {t * 1e3:.3f} ms, {flops / t / 1e12:.0f} TFLOP/s, "
      f"{ratio:.3f}× the first's time (paired){kernels}; {same}"
    )


if __name__ == "__main__":
  main()
