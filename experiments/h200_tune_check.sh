#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): speed options of our Mosaic GPU forward
# (pallas_kernels/forward_mgpu.py: MosaicGPUOptions fused_pv, early_turn, exp2) at block_k 128 / 2 stages and
# 64 / 3, compensation on (and off with none or all of them), on the headline shape
# (b4 × 4096 × 16 × d128, non-causal), single timings (median of 30 batches of back-to-back calls); each configuration's
# output is compared with the Triton forward's on the GPU; then causal with the default options,
# and the jitted forward+backward GPU test. Usage (repo root, on the device):
#   CUDA_VISIBLE_DEVICES=1 bash experiments/h200_tune_check.sh "$OUT"
# device seconds: 490 (its timeouts added up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
R=/tmp/mgpu_tune
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
timeout 300 python3 - <<'PY' 2>&1 | tee $R/tune.log
import itertools, jax, jax.numpy as jnp, numpy as np
from jax_flashstable import flash_attention
from jax_flashstable.lab.shapes import Shape, make_inputs
from jax_flashstable.bench import attention_flops, seconds_per_call, waiting
import pallas_kernels.forward_mgpu as fm
s = Shape(4, 4096, 4096, 16, 16, 128)
q, k, v, _ = make_inputs(s, jnp.bfloat16, 0)
flops = attention_flops(4, 4096, 4096, 16, 128, causal=False)
def timed(block_k, stages, stabilize, causal=False, options=fm.MosaicGPUOptions()):
  f = jax.jit(lambda q, k, v: flash_attention(q, k, v, backend="mosaic_gpu", block_k=block_k,
              num_stages=stages, stabilize=stabilize, causal=causal, mgpu_options=options))
  ref = flash_attention(q, k, v, block_k=block_k, stabilize=stabilize, causal=causal)
  err = float(jnp.max(jnp.abs(f(q, k, v).astype(jnp.float32) - ref.astype(jnp.float32))))
  t = seconds_per_call(waiting(f, q, k, v), warmup=3, reps=30)
  return t, err
configs = [dict(fused_pv=f, early_turn=e, exp2=x) for f, e, x in itertools.product((False, True), repeat=3)]
for block_k, stages in ((128, 2), (64, 3)):
  for c in configs:
    for stabilize in (True, False) if all(c.values()) or not any(c.values()) else (True,):
      try:
        t, err = timed(block_k, stages, stabilize, options=fm.MosaicGPUOptions(**c))
        print(f"bk{block_k} st{stages} {c} stabilize={stabilize}: {t*1e3:.3f} ms "
              f"{flops/t/1e12:.0f} TFLOP/s, max |mgpu - triton| {err:.1e}", flush=True)
      except Exception as e:
        print(f"bk{block_k} st{stages} {c}: {type(e).__name__}: {str(e)[:300]}", flush=True)
try:
  t, err = timed(128, 2, True, causal=True)
  print(f"causal bk128 st2 default options, stabilize: {t*1e3:.3f} ms {flops/2/t/1e12:.0f} TFLOP/s, "
        f"max |mgpu - triton| {err:.1e}")
except Exception as e:
  print(f"causal: {type(e).__name__}: {str(e)[:300]}")
PY

# a quick GPU check of the jitted forward+backward (h200_mgpu_check.sh runs every GPU test)
timeout 190 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py -k jitted 2>&1 | tail -5
tar czf "$OUT/mgpu_tune.tgz" -C $R .
