#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): our Mosaic GPU forward (backend="mosaic_gpu").
# 1. tests/test_mosaic_gpu.py on the GPU (the real kernel, default speed options, against FP64
#    and the Triton forward); the CUDA runtime version is logged first (causal needs one
#    outside 12.8.0–12.9.0);
# 2. the headline bench: our Mosaic GPU forward at block_k 128 ± compensation, the Triton one,
#    JAX's own Mosaic GPU attention and cuDNN, non-causal and causal, with the compensation
#    overhead of the Mosaic GPU forward and its speed as a fraction of cuDNN's (20 interleaved
#    pairs each);
# 3. (STEP=1) a gpt2-small training step with it and with cuDNN (tokens/s, MFU).
# The speed options were chosen with h200_tune_check.sh. Each part has its own timeout.
# Usage (repo root, on the device):
#   CUDA_VISIBLE_DEVICES=0 bash experiments/h200_mgpu_check.sh "$OUT"
# device seconds: 510 (its timeouts added up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
R=/tmp/mgpu
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
python3 -c "from jax._src.lib import cuda_versions as c; print('CUDA runtime', c.cuda_runtime_get_version())" 2>&1 | tail -1
timeout 210 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py 2>&1 \
  | tail -25 | tee $R/tests.log
timeout 190 python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,0;4,4096,16,16,128,1" \
  --attention fa2+comp,fa2+mgpu:block_k=128,fa2+comp+mgpu:block_k=128,pallas-mgpu,cudnn \
  --overhead fa2+mgpu:block_k=128 --overhead-pairs 20 --paired fa2+comp+mgpu:block_k=128 \
  --no-hashes --out $R/headline 2>&1 \
  | grep -v "^ " | tail -20
(( ${STEP:-1} )) && timeout 110 python3 experiments/02_gpt2_step_time.py --out $R/step \
  --attention fa2+comp+mgpu:block_k=128 --attention cudnn 2>&1 \
  | grep -v "^WARNING" | tail -6
tar czf "$OUT/mgpu.tgz" -C $R .
