"""What limits our forward kernel against cuDNN? (issue 7) — a launcher for Nsight Compute.

Runs the forward of our kernel (fa2, compensation off and on) and of cuDNN
(`jax.nn.dot_product_attention`) at the headline shape (bf16, batch 4, length 4096, 16 heads,
head_dim 128, non-causal), `--calls` times each, so that `ncu` can read the kernels' counters.
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
  a = ap.parse_args()
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (4, a.length, 16, 128), jnp.bfloat16) for key in keys)
  fns = {"fa2": jax.jit(lambda q, k, v: flash_attention(q, k, v)),
         "fa2+comp": jax.jit(lambda q, k, v: flash_attention(q, k, v, stabilize=True))}
  if jax.default_backend() == "gpu":
    fns["cudnn"] = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
  for name, fn in fns.items():
    for _ in range(a.calls):
      out = fn(q, k, v).block_until_ready()
    print(name, out.shape, float(jnp.abs(out.astype(jnp.float32)).mean()))


if __name__ == "__main__":
  main()
