#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): what limits our kernels, read from Nsight Compute's hardware
# counters (the device's runtime is Firecracker, where ncu reads them; clocks left alone).
# Profiles experiments/05_profile_attention.py --which mgpu,bwd: our Mosaic GPU forward at
# block_k 128 with compensation off and on, our Triton forward+backward with compensation
# (forward, dQ and dK/dV kernels) and cuDNN's forward+backward, one call each. The Mosaic GPU
# kernel has no name of ours, so the first 40 kernels are read (q, k, v's random fill comes first)
# with autotuning off (it would launch kernels of its own). First, the Mosaic GPU forward's grid
# order (forward_mgpu.Q_TILES_INNER) in 20 interleaved pairs, both orders checked against the
# Triton forward. ~3 min.
# Usage (repo root, on the device):  CUDA_VISIBLE_DEVICES=0 bash experiments/h200_profile_check.sh "$OUT"
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
timeout 120 python3 - <<'PY' 2>&1 | tail -4
import jax, jax.numpy as jnp
from jax_flashstable import flash_attention
from jax_flashstable.accuracy import Shape, make_inputs
from jax_flashstable.bench import attention_flops, median_seconds, paired_overhead
import pallas_kernels.forward_mgpu as fm
q, k, v, _ = make_inputs(Shape(4, 4096, 4096, 16, 16, 128), jnp.bfloat16, 0)
ref = flash_attention(q, k, v, stabilize=True).astype(jnp.float32)
runs = {}
for inner in (False, True):   # the option is read when the kernel is traced: call once per order
  fm.Q_TILES_INNER = inner
  f = jax.jit(lambda q, k, v: flash_attention(q, k, v, stabilize=True, backend="mosaic_gpu",
                                              block_k=128))
  err = float(jnp.max(jnp.abs(f(q, k, v).astype(jnp.float32) - ref)))
  t = median_seconds(lambda f=f: jax.block_until_ready(f(q, k, v)), warmup=3, reps=30)
  runs[inner] = lambda f=f: jax.block_until_ready(f(q, k, v))
  print(f"Q_TILES_INNER={inner}: {attention_flops(4, 4096, 4096, 16, 128, causal=False) / t / 1e12:.0f}"
        f" TFLOP/s, max |mgpu - triton| {err:.1e}")
print(f"time(q tiles inner) / time(heads inner) - 1, median of 20 pairs: "
      f"{paired_overhead(runs[False], runs[True], 20):+.1%}")
PY
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 300 ncu --clock-control none -c 80 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  python3 experiments/05_profile_attention.py --which mgpu,bwd --calls 1 > "$OUT/ncu.txt" 2>&1
echo "ncu: exit $?, $(grep -c '^  [^ ]' "$OUT/ncu.txt") kernel reports"; tail -3 "$OUT/ncu.txt"
