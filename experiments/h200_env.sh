# Sourced by every experiments/h200_*.sh (device tool, run from the repo root): the project on
# the path, no GPU memory preallocation (several processes share a GPU), unbuffered logs, the
# persistent JAX compilation cache and the corpus cache on the machine's local disk, and NVLink
# multicast off for NCCL (the device tool's KINDS.md, outside this repository: keep it off on multi-GPU kinds).
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache FLASHSTABLE_CACHE=/tmp/fscache
# torch.compile's caches (Inductor's FX graph and AOTAutograd caches, its Triton kernels) at a
# fixed path, so that one session's can seed the next fresh machine: h200_twin.sh brings them
# back as $OUT/torchinductor.tar.xz; copied to .devcache/ here and carried (`carry:
# [".data", ".devcache"]`), they are unpacked once per machine. A cache hit is keyed by the
# graph, torch's version and the GPU, so a stale entry is a miss, never a wrong kernel.
export TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor
if [[ -f .devcache/torchinductor.tar.xz && ! -d $TORCHINDUCTOR_CACHE_DIR ]]; then
  mkdir -p $TORCHINDUCTOR_CACHE_DIR
  tar -xJf .devcache/torchinductor.tar.xz -C $TORCHINDUCTOR_CACHE_DIR \
    || echo "h200_env.sh: .devcache/torchinductor.tar.xz did not unpack; compiling afresh" >&2
fi
# pack_inductor_cache FILE: the cache as FILE (xz, all cores, at most 60 s), unless $OUT would
# then hold more than the device's 8 files or it is over 12 MiB (files back: 16 MiB each; the
# carried tree: 64 MiB with .data's 11): then no file and one line saying why
pack_inductor_cache() {
  [[ -d $TORCHINDUCTOR_CACHE_DIR ]] || return 0
  rm -f "$1"  # an earlier call's, on a warm machine
  if (( $(find "$(dirname "$1")" -maxdepth 1 -type f | wc -l) >= 8 )); then
    echo "torch.compile's cache not packed: \$OUT already holds 8 files"; return 0
  fi
  if ! XZ_OPT="-T0 -3" timeout 60 tar -cJf "$1" -C $TORCHINDUCTOR_CACHE_DIR .; then
    rm -f "$1"; echo "torch.compile's cache not packed: tar failed or took over 60 s"; return 0
  fi
  local size; size=$(stat -c %s "$1")
  if (( size > 12 * 1024 * 1024 )); then
    rm -f "$1"; echo "torch.compile's cache: $(( size / 1048576 )) MiB packed, too large to bring back"
  fi
}
# the runs folder of the main job's device runs (h200_compare.sh; h200_hold.sh snapshots it)
COMPARE_RUNS=/tmp/compare
# pack_runs DIR FILE: every run under DIR packed into FILE (`instability.pack_runs`, no checkpoints)
pack_runs() { python3 -c "import sys; from jax_flashstable.experiment.instability import pack_runs
pack_runs(*sys.argv[1:])" "$@"; }
# set_line FILE OLD NEW: FILE's line OLD (the whole line, literally) replaced by NEW in the
# device's copy of the tree (a default timed before it is made the default; nothing is
# committed from there); exits the script naming FILE and OLD where no such line is there
set_line() {
  python3 - "$@" <<'PY' || exit 1
import pathlib, sys
path, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lines = path.read_text().split("\n")
if old not in lines:
  sys.exit(f"set_line: {path} has no line {old!r}")
path.write_text("\n".join(new if line == old else line for line in lines))
PY
}
# bench_targets DIR LOG: `flashstable bench --targets ${SPEC:-fa2+comp}` (20 interleaved pairs,
# the step's rounds, no hashes) into DIR and LOG, at most 290 s; returns the bench's exit status
bench_targets() {
  timeout 290 python3 -m jax_flashstable.cli bench --targets "${SPEC:-fa2+comp}" \
    --overhead-pairs 20 --reps 10 --no-hashes --out "$1" > "$2" 2>&1
}
# targets_verdicts DIR LOG: `bench_targets DIR LOG`, its exit status and its verdict table
targets_verdicts() {
  bench_targets "$1" "$2"
  echo "bench --targets: exit $?"
  grep -v "^ \|^$" "$2" | tail -16
}
# gpu_tests SECONDS PYTEST_ARGS...: pytest on the device's GPU into $OUT/gpu_tests.log, at most
# SECONDS (0: no tests), then its failures and summary
gpu_tests() {
  (( $1 > 0 )) || return 0
  timeout -s INT -k 30 "$1" python3 -m pytest -q -p no:cacheprovider -rfE "${@:2}" > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests: exit $?"; grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/gpu_tests.log" | head -20
}
# step_vs_cudnn DIR ROUNDS SECONDS [LABEL]: the gpt2-small step, fa2+comp against cuDNN's,
# ROUNDS interleaved rounds (experiment 02; 0: not run) into DIR and DIR.log, at most SECONDS
step_vs_cudnn() {
  (( $2 > 0 )) || return 0
  timeout "$3" python3 experiments/02_gpt2_step_time.py --steps "$2" --attention fa2+comp \
    --attention cudnn --out "$1" > "$1.log" 2>&1
  echo "step${4:+ ($4)}: exit $?"; grep -v "^ *$" "$1.log" | grep -v Warning | tail -8
}
