#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): our Mosaic GPU forward (backend="mosaic_gpu").
# 1. tests/test_mosaic_gpu.py on the GPU (the real kernel against FP64 and the Triton forward);
# 2. the headline bench: both our forwards ± compensation, JAX's own Mosaic GPU attention and
#    cuDNN, non-causal and causal, with the compensation overhead of the Mosaic GPU forward
#    (20 pairs; the Triton one's was measured three times on 2026-11-29);
# 3. key/value tiles in flight (num_stages) 2–4 at block_k 64, 1–2 at 128 (what fits), and
#    the default without ping-pong scheduling;
#    (the CUDA runtime version is logged first: causal needs one outside 12.8.0–12.9.0);
# 4. a gpt2-small training step with each forward and with cuDNN (tokens/s, MFU).
# Each part has its own timeout (sum 510 s). Usage (repo root, on the device):
#   CUDA_VISIBLE_DEVICES=0 bash experiments/h200_mgpu_check.sh "$OUT"
set -u
OUT=${1:-runs/h200}
R=/tmp/mgpu
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
python3 -c "from jax._src.lib import cuda_versions as c; print('CUDA runtime', c.cuda_runtime_get_version())" 2>&1 | tail -1
timeout 130 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py 2>&1 \
  | tail -25 | tee $R/tests.log
timeout 190 python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,0;4,4096,16,16,128,1" \
  --impls flash:fa2,flash:fa2+stabilize,flash-mgpu:fa2,flash-mgpu:fa2+stabilize,pallas-mgpu,cudnn \
  --overhead-layouts mgpu:fa2 --overhead-pairs 20 --no-hashes --out $R/headline 2>&1 \
  | grep -v "^ " | tail -22
timeout 80 python3 - <<'PY' 2>&1 | tee $R/stages.log
import jax, jax.numpy as jnp
from jax_flashstable import flash_attention
from jax_flashstable.accuracy import Shape, make_inputs
from jax_flashstable.bench import attention_flops, median_seconds
s = Shape(4, 4096, 4096, 16, 16, 128)
q, k, v, _ = make_inputs(s, jnp.bfloat16, 0)
import pallas_kernels.forward_mgpu as fm
for pingpong, block_k, stages in ((True, 64, 2), (True, 64, 3), (True, 64, 4), (True, 128, 1),
                                  (True, 128, 2), (False, 64, 2)):  # those that fit in smem
  fm.PINGPONG = pingpong                                            # read when traced
  f = jax.jit(lambda q, k, v: flash_attention(q, k, v, backend="mosaic_gpu", block_k=block_k,
                                              num_stages=stages, stabilize=True))
  try:
    t = median_seconds(lambda: jax.block_until_ready(f(q, k, v)), warmup=3, reps=20)
    print(f"mosaic_gpu fwd+comp pingpong={pingpong} block_k={block_k} stages={stages}: {t * 1e3:.3f} ms, "
          f"{attention_flops(4, 4096, 4096, 16, 128, causal=False) / t / 1e12:.0f} TFLOP/s")
  except Exception as e:  # a configuration that fails is a result too
    print(f"mosaic_gpu pingpong={pingpong} block_k={block_k} stages={stages}: {type(e).__name__}: {str(e)[:200]}")
PY
timeout 110 python3 experiments/02_gpt2_step_time.py --out $R/step --attention flash-stable \
  --attention flash-stable:backend=mosaic_gpu --attention cudnn 2>&1 | grep -v "^WARNING" | tail -8
tar czf "$OUT/mgpu.tgz" -C $R .
