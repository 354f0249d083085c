"""What limits our forward kernel against cuDNN? (issue 7) — a launcher for Nsight Compute.

Runs the forward of our kernel (fa2, compensation off and on) and of cuDNN
(`jax.nn.dot_product_attention`) at the headline shape (bf16, batch 4, length 4096, 16 heads,
head_dim 128, non-causal), `--calls` times each, so that `ncu` can read the kernels' counters.
`--which` picks the groups: `triton` (that forward), `mgpu` (our Mosaic GPU forward at
block_k 128, compensation off and on), `bwd` (forward+backward with compensation: our Triton
backward kernels, and cuDNN's); the Mosaic GPU kernel is not named, so profile without `-k`
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
  ap.add_argument("--length", type=int, default=4096)
  ap.add_argument("--calls", type=int, default=2)
  ap.add_argument("--which", default="triton", help="comma-separated: triton, mgpu, bwd")
  a = ap.parse_args()
  which = set(a.which.split(","))
  if not which <= {"triton", "mgpu", "bwd"}:
    raise SystemExit(
      f"--which: unknown group(s) {sorted(which - {'triton', 'mgpu', 'bwd'})}; "
      "use a comma-separated subset of triton, mgpu, bwd"
    )
  gpu = jax.default_backend() == "gpu"
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (4, a.length, 16, 128), jnp.bfloat16) for key in keys)
  cudnn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
  fns = {}
  if "triton" in which:
    fns["fa2"] = jax.jit(lambda q, k, v: flash_attention(q, k, v))
    fns["fa2+comp"] = jax.jit(lambda q, k, v: flash_attention(q, k, v, stabilize=True))
    if gpu:
      fns["cudnn"] = jax.jit(cudnn)
  if "mgpu" in which:
    for stabilize in (False, True):
      fns[f"mgpu{'+comp' * stabilize}"] = jax.jit(
        lambda q, k, v, s=stabilize: flash_attention(
          q, k, v, stabilize=s, backend="mosaic_gpu", block_k=128, interpret=not gpu
        )
      )
  if "bwd" in which:
    # all three gradients, so that no backward kernel (dK/dV's) is dead code
    grad = lambda f: jax.jit(
      lambda q, k, v: sum(
        g.astype(jnp.float32).sum()
        for g in jax.grad(lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))(
          q, k, v
        )
      )
    )
    fns["fa2+comp fwd+bwd"] = grad(lambda q, k, v: flash_attention(q, k, v, stabilize=True))
    if gpu:
      fns["cudnn fwd+bwd"] = grad(cudnn)
  for name, fn in fns.items():
    for _ in range(a.calls):
      out = fn(q, k, v).block_until_ready()
    print(name, out.shape, float(jnp.abs(out.astype(jnp.float32)).mean()))  # a scalar for grads


if __name__ == "__main__":
  main()
