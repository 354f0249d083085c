"""Timing on an accelerator: FLOP counts (FlashAttention's convention), batched wall-clock
timings that keep the host's dispatch and synchronisation out of kernel time, and interleaved
pairs for same-moment ratios."""

from __future__ import annotations

import statistics
import time

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
