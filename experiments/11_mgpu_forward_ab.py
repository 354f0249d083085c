"""Issue 19: which launch settings and speed options of our Mosaic GPU forward
(`pallas_kernels/forward_mgpu.py`) bring it closer to cuDNN's forward? Each variant against
cuDNN in interleaved pairs (the median of `--pairs` ratios, each side 10 back-to-back calls,
as `flashstable bench --paired`), its TFLOP/s alone, its kernels' own time on the GPU and
its ratio to cuDNN's (`timing.kernel_seconds`, JAX's profiler: at small shapes the paired
wall-clock ratio can be bound by the host's dispatch; at gpt2-small's attention on 2026-12-06
the pairs said 0.963× where the step's profile found 0.72×), and whether its output equals, bit for
bit, the first variant of the same numerics (block_k, compensation, and the options that
change float32 values: fused_pv, exp2, scale_in_exp2 where the scale is not a power of two ≤ 1;
`MosaicGPUOptions`): a speed change must say "same bits". Headline shape b4 × 4096 × 16 × d128 bf16 by default.

    python3 experiments/11_mgpu_forward_ab.py [--causal] [--pairs 15] [--out FILE] VARIANT ...

VARIANT: comma-separated KEY=VALUE: bk (block_k: 64 or 128; default 64), st (num_stages,
key/value tiles in flight; default 2), comp (the compensation, 0/1; default 1), jax (1: JAX's
own `attention_mgpu` forward instead of ours, at block_kv bk and st tiles in flight, on float16
inputs with the query scaled first, as `flashstable bench`'s pallas-mgpu; with bk and st only:
what the key tile costs a Mosaic GPU kernel without our numerics), and any field
of `MosaicGPUOptions` as 0/1 (pingpong, fused_pv, early_turn, exp2, q_tiles_inner, opt_barrier,
k_wait_in_pv, longest_first, overlap, tie_lanes, scale_in_exp2, persistent, wide_step,
unit_alpha, items_early). Every variant is checked
before any work, its options together too (one line naming the bad one). With MOSAIC_GPU_DUMP_PTXAS=1 ptxas
reports each kernel's registers and spills on stderr.
GPU only (a Hopper GPU: the Mosaic GPU forward and cuDNN); ~15 s a variant on one H200.
Example (on the device, repo root):

    source experiments/h200_env.sh
    python3 experiments/11_mgpu_forward_ab.py --out $OUT/ab.txt bk=64,st=2 bk=64,st=3 bk=64,st=4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

OPTIONS_CHANGING_FLOATS = ("fused_pv", "exp2", "scale_in_exp2")  # MosaicGPUOptions


def parse_variant(spec: str, options_cls) -> dict:
  """{'block_k', 'num_stages', 'stabilize', 'jax', 'options': {field: bool}} from
  "bk=64,st=3,exp2=0", the options fields of options_cls (`MosaicGPUOptions`), which must
  accept them together; jax=1 takes bk and st only; ValueError naming the spec and the bad
  item."""
  option_fields = [f.name for f in dataclasses.fields(options_cls)]
  out = dict(block_k=64, num_stages=2, stabilize=True, jax=False, options={})
  keys = set()
  for item in filter(None, spec.split(",")):
    key, eq, value = item.partition("=")
    keys.add(key)
    if not eq:
      raise ValueError(f"variant {spec!r}: {item!r} is not KEY=VALUE")
    if key in ("bk", "st"):
      if not value.isdecimal():
        raise ValueError(f"variant {spec!r}: {key}={value!r} is not a positive int")
      out["block_k" if key == "bk" else "num_stages"] = int(value)
    elif key in ("comp", "jax") or key in option_fields:
      if value not in ("0", "1"):
        raise ValueError(f"variant {spec!r}: {key}={value!r} is not 0 or 1")
      if key in ("comp", "jax"):
        out["stabilize" if key == "comp" else "jax"] = value == "1"
      else:
        out["options"][key] = value == "1"
    else:
      known = ", ".join(["bk", "st", "comp", "jax", *option_fields])
      raise ValueError(f"variant {spec!r}: unknown key {key!r} (known: {known})")
  if out["jax"] and keys - {"jax", "bk", "st"}:
    raise ValueError(
      f"variant {spec!r}: jax=1 (JAX's attention_mgpu) takes bk and st only: it has no "
      "compensation and none of our options"
    )
  if out["jax"] and out["num_stages"] < 2:  # its TuningConfig's own rule
    raise ValueError(f"variant {spec!r}: jax=1 needs st ≥ 2 (attention_mgpu's key tiles in flight)")
  try:
    options_cls(**out["options"])
  except ValueError as e:
    raise ValueError(f"variant {spec!r}: {e}") from None
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("variants", nargs="+")
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--pairs", type=int, default=15)
  ap.add_argument("--shape", default="4,4096,16,16,128", help="batch,len,heads,kv_heads,head_dim")
  ap.add_argument("--out", default=None, help="also append every line to this file")
  a = ap.parse_args(argv)
  import jax.numpy as jnp

  import pallas_kernels.forward_mgpu as fm
  from pallas_kernels.attention import next_power_of_2

  from jax_flashstable.lab.shapes import Shape

  try:
    s = Shape.parse(a.shape, causal=a.causal)  # the bench's shape grammar and checks
  except ValueError as e:
    sys.exit(f"11_mgpu_forward_ab: --shape: {e}")
  shape = (s.batch, s.q_len, s.num_heads, s.num_kv_heads, s.head_dim)
  head_dim = max(16, next_power_of_2(shape[4]))  # flash_attention pads it so
  variants = []
  for spec in a.variants:
    try:
      v = parse_variant(spec, fm.MosaicGPUOptions)
    except ValueError as e:
      sys.exit(f"11_mgpu_forward_ab: {e}")
    why = fm.supported(  # JAX's kernel (jax=1): the same wgmma tiles and shared memory
      numerics="fa2",
      block_k=v["block_k"],
      head_dim=head_dim,
      dtype=jnp.bfloat16,
      num_stages=v["num_stages"],
    )
    if why:
      sys.exit(f"11_mgpu_forward_ab: variant {spec!r}: {why}")
    variants.append((spec, v))
  if a.pairs < 1:
    sys.exit(f"11_mgpu_forward_ab: --pairs {a.pairs} (at least 1)")
  import jax

  if not fm.on_hopper():
    sys.exit(
      f"11_mgpu_forward_ab: needs a Hopper GPU (cuDNN and the Mosaic GPU forward); "
      f"this is {jax.devices()[0].device_kind}"
    )
  run(a, shape, variants, fm)


def _changing_floats(opts, d, stabilize, fm):
  """The values of the options that change float32 values, as the call runs them:
  scale_in_exp2 resolved (`forward_mgpu.resolve_scale_in_exp2`: None is on where it changes
  no value) and counted as on only where it changes values (a scale that is not a power of
  two ≤ 1), so variants with the same bits share a group and are checked against each other."""
  from pallas_kernels.policy import Compensation

  c, comp = d**-0.5, Compensation() if stabilize else None
  values = {name: getattr(opts, name) for name in OPTIONS_CHANGING_FLOATS}
  exact = fm.resolve_scale_in_exp2(dataclasses.replace(opts, scale_in_exp2=None), c, comp)
  on = fm.resolve_scale_in_exp2(opts, c, comp).scale_in_exp2
  values["scale_in_exp2"] = bool(on) and not exact.scale_in_exp2
  return tuple(values.values())


def run(a, shape, variants, fm):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jax_flashstable import flash_attention
  from jax_flashstable.bench.runners import _mosaic_gpu_attention
  from jax_flashstable.bench.timing import (
    attention_flops,
    kernel_seconds,
    line_printer,
    paired_overhead,
    seconds_per_call,
    waiting,
  )
  from jax_flashstable.lab.shapes import Shape, make_inputs

  say = line_printer(a.out)

  b, n, h, hk, d = shape
  q, k, v, _ = make_inputs(Shape(b, n, n, h, hk, d), jnp.bfloat16, 0)
  flops = attention_flops(b, n, n, h, d, causal=a.causal)
  say(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, shape {shape}, causal={a.causal}")
  cudnn = jax.jit(
    lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, is_causal=a.causal, implementation="cudnn"
    )
  )
  run_ref = waiting(cudnn, q, k, v)
  t_ref, k_ref = seconds_per_call(run_ref), kernel_seconds(run_ref)
  kernels = lambda k: "" if k is None else f"; kernels {k * 1e6:.1f} µs"  # noqa: E731
  say(f"cudnn: {t_ref * 1e3:.3f} ms, {flops / t_ref / 1e12:.0f} TFLOP/s{kernels(k_ref)}")
  first = {}
  for spec, var in variants:
    opts = fm.MosaicGPUOptions(**var["options"])
    args = (q, k, v)
    print(f"# compiling {spec}", flush=True)  # stdout only: names ptxas's next report
    try:
      if var["jax"]:  # JAX's own kernel, on its own inputs (float16, the query scaled)
        f, prepare = _mosaic_gpu_attention(
          Shape(b, n, n, h, hk, d, a.causal), block_kv=var["block_k"], stages=var["num_stages"]
        )
        f, args = jax.jit(f), prepare(q, k, v, q)[:3]
      else:
        f = jax.jit(
          lambda q, k, v, var=var, opts=opts: flash_attention(
            q,
            k,
            v,
            causal=a.causal,
            stabilize=var["stabilize"],
            block_k=var["block_k"],
            num_stages=var["num_stages"],
            backend="mosaic_gpu",
            mgpu_options=opts,
          )
        )
      out = np.asarray(f(*args).astype(jnp.float32))
    except Exception as e:  # a variant that does not compile: say so, go on with the next
      say(f"{spec}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
      continue
    numerics = (
      "jax" if var["jax"] else "ours",
      var["block_k"],
      var["stabilize"],
      *_changing_floats(opts, d, var["stabilize"], fm),
    )
    if numerics not in first:
      first[numerics], same = (spec, out), "first of its numerics"
    elif np.array_equal(out, first[numerics][1]):
      same = f"same bits as {first[numerics][0]}"
    else:
      diff = float(np.max(np.abs(out - first[numerics][1])))
      same = f"DIFFERS from {first[numerics][0]} (max |Δ| {diff:.2e})"
    run_v = waiting(f, *args)
    t, t_kernels = seconds_per_call(run_v), kernel_seconds(run_v)  # (k is the keys)
    slower = paired_overhead(run_ref, run_v, pairs=a.pairs)  # time(variant) / time(cudnn) − 1
    ratio = "" if None in (t_kernels, k_ref) else f", {k_ref / t_kernels:.3f}× cudnn by kernel time"
    say(
      f"{spec:32s} {1 / (1 + slower):.3f}× cudnn (paired), {t * 1e3:.3f} ms, "
      f"{flops / t / 1e12:.0f} TFLOP/s{kernels(t_kernels)}{ratio}; {same}"
    )


if __name__ == "__main__":
  main()
