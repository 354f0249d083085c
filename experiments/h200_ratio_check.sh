#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): the targets as paired ratios, each the median of 30
# interleaved pairs of 10 back-to-back calls (bench.paired_overhead), at the headline shape
# (b4 × 4096 × 16 × d128), non-causal then causal: our Mosaic GPU forward (block_k 128,
# compensation on) as a fraction of cuDNN, forward and forward+backward; the compensation
# overhead of the Mosaic GPU forward and of the Triton kernels; then the Mosaic GPU forward's grid
# order (MosaicGPUOptions.q_tiles_inner: query tiles innermost or heads innermost), both orders
# checked against the Triton forward. ~5 min. Usage (repo root, on the device):
#   CUDA_VISIBLE_DEVICES=0 bash experiments/h200_ratio_check.sh "$OUT"
# device seconds: 400 (its timeouts added up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
R=/tmp/ratio
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
for causal in 0 1; do
  timeout 150 python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,$causal" \
    --attention fa2+comp+mgpu:block_k=128,cudnn --overhead fa2+mgpu:block_k=128,fa2 \
    --overhead-pairs 30 --paired fa2+comp+mgpu:block_k=128 --no-hashes \
    --out $R/causal$causal 2>&1 | grep -v "^ \|^|\|^$" | tail -8
  echo "bench causal=$causal: exit ${PIPESTATUS[0]}"
done
timeout 100 python3 - <<'PY' 2>&1 | tail -4
import jax, jax.numpy as jnp
from jax_flashstable import flash_attention
from jax_flashstable.lab.shapes import Shape, make_inputs
from jax_flashstable.bench import attention_flops, paired_overhead, seconds_per_call, waiting
import pallas_kernels.forward_mgpu as fm
q, k, v, _ = make_inputs(Shape(4, 4096, 4096, 16, 16, 128), jnp.bfloat16, 0)
ref = flash_attention(q, k, v, stabilize=True).astype(jnp.float32)
runs = {}
for inner in (False, True):
  f = jax.jit(lambda q, k, v, inner=inner: flash_attention(
      q, k, v, stabilize=True, backend="mosaic_gpu", block_k=128,
      mgpu_options=fm.MosaicGPUOptions(q_tiles_inner=inner)))
  err = float(jnp.max(jnp.abs(f(q, k, v).astype(jnp.float32) - ref)))
  runs[inner] = waiting(f, q, k, v)
  t = seconds_per_call(runs[inner], warmup=3, reps=30)
  print(f"q_tiles_inner={inner}: {attention_flops(4, 4096, 4096, 16, 128, causal=False) / t / 1e12:.0f}"
        f" TFLOP/s, max |mgpu - triton| {err:.1e}")
print(f"time(q tiles inner) / time(heads inner) - 1, median of 30 pairs: "
      f"{paired_overhead(runs[False], runs[True], 30):+.1%}")
PY
echo "grid-order A/B: exit ${PIPESTATUS[0]}"
tar czf "$OUT/ratio.tgz" -C $R .
