# Sourced by every experiments/h200_*.sh (device tool, run from the repo root): the project on
# the path, no GPU memory preallocation (several processes share a GPU), unbuffered logs, the
# persistent JAX compilation cache and the corpus cache on the machine's local disk, and NVLink
# multicast off for NCCL (the device's KINDS.md: keep it off on multi-GPU kinds).
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache FLASHSTABLE_CACHE=/tmp/fscache
# the runs folder of the main job's device runs (h200_compare.sh; h200_hold.sh snapshots it)
COMPARE_RUNS=/tmp/compare
# pack_runs DIR FILE: every run under DIR packed into FILE (`instability.pack_runs`, no checkpoints)
pack_runs() { python3 -c "import sys; from jax_flashstable.experiment.instability import pack_runs
pack_runs(*sys.argv[1:])" "$@"; }
