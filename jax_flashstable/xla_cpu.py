"""XLA's CPU dots as the program states them, for comparisons of kernels and references.

XLA's CPU backend fuses some dots into YNNPACK kernels whose accumulation is not the one the
program asks for (seen with jax 0.11.2: the float32 reference attention's P·V more accurate than
float32 arithmetic, so the accuracy rule err ≤ 2·err(standard) + 1 ulp compared our kernels
with a better-than-float32 baseline and failed; bf16 products in backward fusions without
float32 accumulation). Comparing kernels with references needs plain float32 dots: the tests
(tests/conftest.py) and the CLI's numerics commands (`flashstable accuracy`, `deviation`,
`bias`, `crosscheck`) turn the fusion off before JAX starts. A GPU's XLA is no such baseline
either (cuBLAS's float32 attention was 4× more accurate than the kernel's float32 dots at
head_dim 256, H100, 2026-12-07), so `lab.accuracy.compare` runs its references on the CPU
backend wherever the kernel runs. `add_flag` adds any XLA flag the same way (the GPU test
session's `DETERMINISTIC_GPU_OPS`). No JAX import here.
"""

from __future__ import annotations

import os
import sys

FLAG = "--xla_cpu_experimental_ynn_fusion_type="


# XLA's switch for deterministic GPU ops (no atomics in its scatter-adds): the GPU test session's
# (tests/conftest.py) and `TrainConfig.deterministic`'s (docs/training.md). It acts on a GPU
# only; the CPU's jaxlib knows it.
DETERMINISTIC_GPU_OPS = "--xla_gpu_deterministic_ops=true"


def flag_set(flag: str) -> bool:
  """Whether XLA_FLAGS has `flag`, value and all."""
  return flag in os.environ.get("XLA_FLAGS", "").split()


def add_flag(flag: str) -> None:
  """Adds `flag` to XLA_FLAGS after the caller's own, unless it is there already; it acts only
  if JAX has not started its backends yet (XLA reads the flags once a process)."""
  if not flag_set(flag):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def plain_dots_set() -> bool:
  """Whether XLA_FLAGS has `FLAG` (`plain_dots` ran, or the caller set it)."""
  return flag_set(FLAG)


def plain_dots() -> None:
  """Adds `FLAG` (no YNNPACK dot fusions on XLA's CPU backend) to XLA_FLAGS, once (`add_flag`).
  On a GPU machine it changes the CPU backend only, where `lab.accuracy.compare` runs its
  references."""
  add_flag(FLAG)


def deterministic_gpu_ops() -> str | None:
  """Makes XLA's GPU ops deterministic for this process (`DETERMINISTIC_GPU_OPS`, `add_flag`),
  the switch behind `TrainConfig.deterministic`. Returns None when the flag is set or will act
  (JAX's backends have not started), and when it is not needed (they started on a CPU, whose
  runs repeat without it); else why it cannot act: JAX's backends started on another
  platform without it (XLA reads its flags once a process). No JAX import."""
  if flag_set(DETERMINISTIC_GPU_OPS):
    return None
  bridge = sys.modules.get("jax._src.xla_bridge")
  if bridge is None or not bridge.backends_are_initialized():
    add_flag(DETERMINISTIC_GPU_OPS)
    return None
  platform = sys.modules["jax"].default_backend()
  if platform == "cpu":
    return None
  return (
    f"JAX's {platform} backend started without {DETERMINISTIC_GPU_OPS} in XLA_FLAGS, and XLA "
    "reads its flags once a process: set it before JAX starts"
  )
