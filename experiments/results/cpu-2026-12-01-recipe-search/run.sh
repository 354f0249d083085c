#!/usr/bin/env bash
# CPU recipe search for `flashstable compare` (issue 16): tiny model, paper vs paper+comp.
cd /work/main
export XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= JAX_COMPILATION_CACHE_DIR=/work/main/.jaxcache
for lr in 0.01 0.03; do
  for tiles in 32 64; do
    nice -n 19 .venv/bin/python -m jax_flashstable.cli experiment instability --recipe tiny \
      --attention paper,paper+comp --seeds 0 --steps 400 --lr $lr --min-lr $lr --warmup-steps 20 \
      --tiles $tiles --diag-interval 50 --no-progress --out /tmp/cpusearch/lr${lr}_t${tiles} \
      > /tmp/cpusearch/lr${lr}_t${tiles}.log 2>&1
  done
done
