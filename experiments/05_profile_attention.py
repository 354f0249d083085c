"""What limits our forward kernel against cuDNN? (issue 7) — a launcher for Nsight Compute.

Runs the forward of our kernel (fa2, compensation off and on) and of cuDNN
(`jax.nn.dot_product_attention`) at the headline shape (bf16, batch 4, length 4096, 16 heads,
head_dim 128, non-causal; `--shape B,N,H,HK,D` and `--causal` for another, e.g. gpt2-small's
16,1024,12,12,64 --causal), `--calls` times each, so that `ncu` can read the kernels' counters.
`--which` picks the groups: `triton` (that forward), `mgpu` (our Mosaic GPU forward at
block_k 128, compensation off and on), `bwd` (forward+backward with compensation: our Triton
backward kernels, and cuDNN's), `auto` (forward+backward with compensation at the defaults,
backend auto: on Hopper the Mosaic GPU forward and its dK/dV and dQ kernels, then cuDNN's
forward+backward); the Mosaic GPU kernels are not named, so profile without `-k`
(and with `XLA_FLAGS=--xla_gpu_autotune_level=0`, so that autotuning launches nothing).
Command (H200): ncu -k regex:"flashstable|sdpa|fmha|cudnn" --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
    python3 experiments/05_profile_attention.py
CPU: runs (interpret mode, small shape with --length 256) but there is nothing to profile.
Expected runtime: seconds alone; ~1 min under ncu.
"""

import argparse

import jax
import jax.numpy as jnp

from jax_flashstable import flash_attention


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--length", type=int, default=None, help="the headline shape at this length")
  ap.add_argument("--shape", default=None, help="batch,len,heads,kv_heads,head_dim")
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--calls", type=int, default=2)
  ap.add_argument("--which", default="triton", help="comma-separated: triton, mgpu, bwd, auto")
  a = ap.parse_args()
  groups = {"triton", "mgpu", "bwd", "auto"}
  which = set(a.which.split(","))
  if not which <= groups:
    raise SystemExit(
      f"--which: unknown group(s) {sorted(which - groups)}; "
      "use a comma-separated subset of triton, mgpu, bwd, auto"
    )
  if a.length is not None and a.shape is not None:
    raise SystemExit("--length and --shape: give one (--length sets the headline shape's length)")
  from jax_flashstable.lab.shapes import Shape

  try:
    s = Shape.parse(a.shape or f"4,{a.length or 4096},16,16,128", causal=a.causal)
  except ValueError as e:
    raise SystemExit(f"--shape: {e}") from None
  gpu = jax.default_backend() == "gpu"
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (s.batch, s.q_len, s.num_heads, s.head_dim), jnp.bfloat16)
  k, v = (
    jax.random.normal(key, (s.batch, s.kv_len, s.num_kv_heads, s.head_dim), jnp.bfloat16)
    for key in keys[1:]
  )
  causal = a.causal
  cudnn = lambda q, k, v: jax.nn.dot_product_attention(
    q, k, v, is_causal=causal, implementation="cudnn"
  )
  fns = {}
  if "triton" in which:
    fns["fa2"] = jax.jit(lambda q, k, v: flash_attention(q, k, v, causal=causal))
    fns["fa2+comp"] = jax.jit(
      lambda q, k, v: flash_attention(q, k, v, causal=causal, stabilize=True)
    )
    if gpu:
      fns["cudnn"] = jax.jit(cudnn)
  if "mgpu" in which:
    for stabilize in (False, True):
      fns[f"mgpu{'+comp' * stabilize}"] = jax.jit(
        lambda q, k, v, s=stabilize: flash_attention(
          q, k, v, causal=causal, stabilize=s, backend="mosaic_gpu", block_k=128, interpret=not gpu
        )
      )
  if which & {"bwd", "auto"}:
    # all three gradients, so that no backward kernel (dK/dV's) is dead code
    grad = lambda f: jax.jit(
      lambda q, k, v: sum(
        g.astype(jnp.float32).sum()
        for g in jax.grad(lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))(
          q, k, v
        )
      )
    )
  if "bwd" in which:
    fns["fa2+comp fwd+bwd"] = grad(
      lambda q, k, v: flash_attention(q, k, v, causal=causal, stabilize=True, backend="triton")
    )
  if "auto" in which:
    fns["fa2+comp fwd+bwd, backend auto"] = grad(
      lambda q, k, v: flash_attention(q, k, v, causal=causal, stabilize=True)
    )
  if gpu and which & {"bwd", "auto"}:
    fns["cudnn fwd+bwd"] = grad(cudnn)
  for name, fn in fns.items():
    for _ in range(a.calls):
      out = fn(q, k, v).block_until_ready()
    print(name, out.shape, float(jnp.abs(out.astype(jnp.float32)).mean()))  # a scalar for grads


if __name__ == "__main__":
  main()
