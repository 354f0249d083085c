"""Speed: our kernels against cuDNN, XLA, JAX's Mosaic GPU attention and torch SDPA.

timing      FLOP counts, batched timings, interleaved pairs
runners     what can be timed, by name (attention specs and external implementations)
kernels     the kernel bench, compensation overheads, paired speed ratios, golden hashes
step_table  GPT-2 training-step time and MFU per attention
report      tables and plots
suite       `flashstable bench` end to end
"""

from jax_flashstable.bench.kernels import (
  bench,
  compensation_overhead,
  default_impls,
  default_shapes,
  golden_hashes,
  hash_key,
  paired_speed_ratio,
  xla_fingerprint,
)
from jax_flashstable.bench.report import format_bench, format_step_table, plot_bench
from jax_flashstable.bench.runners import EXTERNAL, NAME_FORMS, name_error, runs
from jax_flashstable.bench.step_table import gpt2_step_table
from jax_flashstable.bench.timing import (
  attention_flops,
  calls_per_timing,
  kernel_seconds,
  median_seconds,
  paired_overhead,
  seconds_per_call,
  waiting,
)

__all__ = [
  "EXTERNAL",
  "NAME_FORMS",
  "attention_flops",
  "bench",
  "calls_per_timing",
  "compensation_overhead",
  "default_impls",
  "default_shapes",
  "format_bench",
  "format_step_table",
  "golden_hashes",
  "gpt2_step_table",
  "hash_key",
  "kernel_seconds",
  "median_seconds",
  "name_error",
  "paired_overhead",
  "paired_speed_ratio",
  "plot_bench",
  "runs",
  "seconds_per_call",
  "waiting",
  "xla_fingerprint",
]
