"""Argument checks shared by the library's entry points; light (no JAX import), so that the
training configuration can use them before anything heavy is imported. Each error is one line
naming the setting and its value."""

from __future__ import annotations

import numbers


# Every count and seed ends up in NumPy or JAX, whose integers are at most 64 bits: a larger
# Python int fails there with a traceback (OverflowError), after work has started.
INT64_MAX = 2**63 - 1
# JAX without x64 (this project's setting) keeps a seed's low 32 bits: jax.random.key(2**32) is
# jax.random.key(0) (jax 0.11.2), so a larger seed would silently repeat a smaller one's run.
SEED_LIMIT = 2**32


def integer(name: str, value, least: int, error: type[Exception] = ValueError) -> int:
  """`value` as a Python int of at least `least` and at most `INT64_MAX`, from a Python or NumPy
  integer; `error` (ValueError unless given, e.g. `training.config.ConfigError`) naming it for
  anything else: a bool (a flag, not a count), a float such as 2.5 or 3.0, a string, a smaller
  integer, one beyond 64 bits."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
    raise error(f"{name}={value!r} must be an integer ≥ {least}")
  if value > INT64_MAX:
    raise error(f"{name}={value!r} must be an integer below 2**63")
  return int(value)


def random_seed(name: str, value, error: type[Exception] = ValueError) -> int:
  """A random seed: an integer in [0, 2**32) (`SEED_LIMIT`: the seeds JAX tells apart), one
  range for every command, NumPy-only ones too; `error` naming it otherwise."""
  value = integer(name, value, 0, error)
  if value >= SEED_LIMIT:
    raise error(
      f"{name}={value!r} must be below 2**32, the seeds JAX tells apart (without x64 it keeps "
      f"a seed's low 32 bits: {value} would be {value % SEED_LIMIT})"
    )
  return value


def distinct(name: str, items, error: type[Exception] = ValueError) -> list:
  """`items` as a list, each once; `error` naming `name` and the first item given twice: a
  list option whose repeat would run or count the same work twice (`--seeds 1,1`)."""
  items, seen = list(items), set()
  for item in items:
    if item in seen:
      raise error(f"{name}: {item!r} given twice")
    seen.add(item)
  return items
