"""The linter and the formatter, with the settings of pyproject.toml ([tool.ruff]: line length
100, indent 2) over the package, the kernels, the tests, the experiments and the PyTorch
cross-check: `ruff check` (defects such as unused imports and undefined names) and `ruff format
--check` (every file as the formatter writes it; `ruff format` fixes it)."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATHS = ("jax_flashstable", "pallas_kernels", "tests", "experiments", "torch_crosscheck")


def _ruff():
  if importlib.util.find_spec("ruff") is not None:
    return [sys.executable, "-m", "ruff"]
  if (exe := shutil.which("ruff")) is not None:
    return [exe]
  return None


def test_ruff_check():
  ruff = _ruff()
  if ruff is None:
    pytest.skip("ruff is not installed (it comes with the test extra: bash scripts/setup.sh test)")
  result = subprocess.run(
    [*ruff, "check", "--no-cache", "--output-format", "concise", *PATHS],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"


def test_ruff_format():
  ruff = _ruff()
  if ruff is None:
    pytest.skip("ruff is not installed (it comes with the test extra: bash scripts/setup.sh test)")
  result = subprocess.run(
    [*ruff, "format", "--check", "--no-cache", *PATHS],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, (
    f"files the formatter would change (run `ruff format`):\n{result.stdout}"
  )
