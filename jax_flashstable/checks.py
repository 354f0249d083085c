"""Argument checks shared by the library's entry points; light (no JAX import), so that the
training configuration can use them before anything heavy is imported. Each error is one line
naming the setting and its value."""

from __future__ import annotations

import numbers


def integer(name: str, value, least: int, error: type[Exception] = ValueError) -> int:
  """`value` as a Python int of at least `least`, from a Python or NumPy integer; `error`
  (ValueError unless given, e.g. `training.config.ConfigError`) naming it for anything else: a
  bool (a flag, not a count), a float such as 2.5 or 3.0, a string, a smaller integer."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
    raise error(f"{name}={value!r} must be an integer ≥ {least}")
  return int(value)


def distinct(name: str, items, error: type[Exception] = ValueError) -> list:
  """`items` as a list, each once; `error` naming `name` and the first item given twice: a
  list option whose repeat would run or count the same work twice (`--seeds 1,1`)."""
  items, seen = list(items), set()
  for item in items:
    if item in seen:
      raise error(f"{name}: {item!r} given twice")
    seen.add(item)
  return items
