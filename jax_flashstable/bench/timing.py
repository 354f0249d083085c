"""Timing on an accelerator: FLOP counts (FlashAttention's convention), batched wall-clock
timings that keep the host's dispatch and synchronisation out of kernel time, interleaved
pairs for same-moment ratios, and the GPU's own kernel durations from JAX's profiler (CUPTI)."""

from __future__ import annotations

import glob
import statistics
import tempfile
import time
import warnings

import jax

from jax_flashstable.checks import integer


def attention_flops(batch, q_len, kv_len, num_heads, head_dim, causal, backward=False):
  """4·B·H·Lq·Lk·D for the forward (two matmuls); causal counts half; backward is 2.5× the
  forward, so forward+backward is 3.5× (FlashAttention-2's convention)."""
  f = 4.0 * batch * num_heads * q_len * kv_len * head_dim * (0.5 if causal else 1.0)
  return f * 3.5 if backward else f


def median_seconds(run, warmup=3, reps=20, calls=1):
  """Median wall time of one call, from `reps` timings of run() (which must wait for the device)
  after `warmup` calls; with calls > 1 each timing is run(calls) — that many calls dispatched
  back to back with one wait (`waiting`) — divided by calls."""
  warmup, reps, calls = (
    integer("warmup", warmup, 0),
    integer("reps", reps, 1),
    integer("calls", calls, 1),
  )
  go = run if calls == 1 else (lambda: run(calls))
  for _ in range(warmup):
    go()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    go()
    times.append((time.perf_counter() - t) / calls)
  return statistics.median(times)


def calls_per_timing(run, target_s=0.05, most=10):
  """How many back-to-back calls make one timing of ~target_s (1 to `most`): at ~1–5 ms per
  call the host's dispatch and synchronisation (a fraction of a millisecond per waited call
  on the H200: docs/bench.md) would otherwise count as kernel time."""
  return max(1, min(most, int(target_s / median_seconds(run, warmup=1, reps=3))))


def seconds_per_call(run, warmup=3, reps=20):
  """`median_seconds` of run (a `waiting` callable) in batches of `calls_per_timing` calls."""
  return median_seconds(run, warmup, reps, calls_per_timing(run))


def paired_overhead(run_a, run_b, pairs=20, inner=10):
  """Median over `pairs` interleaved pairs of time(b)/time(a) − 1 (which of a and b runs first
  alternates from pair to pair, so drifts in clock or temperature cancel). Each time is one
  `run(inner)`: `inner` calls dispatched back to back with one wait at the end, so the host's
  dispatch and synchronisation (see `calls_per_timing`) overlap the kernels instead of adding
  to a ~1 ms kernel's time."""
  pairs, inner = integer("pairs", pairs, 1), integer("inner", inner, 1)
  ratios = []
  for i in range(pairs):
    t = {}
    for which, run in (("a", run_a), ("b", run_b)) if i % 2 == 0 else (("b", run_b), ("a", run_a)):
      t0 = time.perf_counter()
      run(inner)
      t[which] = time.perf_counter() - t0
    ratios.append(t["b"] / t["a"])
  return statistics.median(ratios) - 1.0


def waiting(f, *args):
  """run(calls=1): `calls` calls of f(*args) dispatched back to back, then a wait for the last
  (the device runs them in order); the form `median_seconds` and `paired_overhead` time."""

  def run(calls=1):
    for _ in range(calls):
      out = f(*args)
    return jax.block_until_ready(out)

  return run


def line_printer(path=None):
  """say(line): prints the line and, with `path`, appends it to that file at once (flushed),
  so that a run cut short keeps what it measured (the experiments' A/B logs)."""
  log = open(path, "a") if path else None

  def say(line):
    print(line, flush=True)
    if log:
      log.write(line + "\n")
      log.flush()

  return say


def kernels_of_trace(trace_dir) -> dict:
  """{GPU line name: [(kernel name, ns), ...]} from the newest xplane.pb under `trace_dir` (a
  `jax.profiler` trace): every event of the GPU planes' stream lines (one event per kernel or
  copy, its duration on the GPU); other GPU lines (XLA's op and module summaries) with no
  events, so that their names show. {} for a trace without GPU planes (a CPU)."""
  from jax.profiler import ProfileData

  path = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))[-1]
  out = {}
  for plane in ProfileData.from_file(path).planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      stream = line.name.startswith("Stream")
      out[f"{plane.name} {line.name}"] = [(e.name, e.duration_ns) for e in line.events if stream]
  return out


def kernel_seconds(run, calls=10) -> float | None:
  """The GPU time of one call of `run` (a `waiting` callable), in seconds: the durations of
  every kernel and copy that run(calls) puts on the GPU, as JAX's profiler (CUPTI) records
  them, summed and divided by calls; the host's dispatch and the gaps between kernels are
  not in it (wall-clock pairs of small kernels can be bound by the dispatch instead; memsets
  count: cuDNN's forward clears a buffer, about 1 µs a call). None where the trace holds no
  GPU kernels (a CPU), and with a warning where no trace could be taken (another one running,
  no trace file), so that an A/B goes on without its kernel times. Run it after a warm-up call
  (compilation is not a kernel, but a first call's autotuning may be)."""
  calls = integer("calls", calls, 1)
  with tempfile.TemporaryDirectory() as d:
    try:
      jax.profiler.start_trace(d)
    except RuntimeError as e:  # a trace already running (one a process): no kernel times
      warnings.warn(f"kernel_seconds: no profiler trace ({e})", stacklevel=2)
      return None
    try:
      run(calls)
    finally:
      jax.profiler.stop_trace()
    try:
      events = [ns for line in kernels_of_trace(d).values() for _, ns in line]
    except IndexError:  # stop_trace wrote no xplane.pb
      warnings.warn(f"kernel_seconds: the profiler wrote no trace under {d}", stacklevel=2)
      return None
  return sum(events) / calls / 1e9 if events else None
