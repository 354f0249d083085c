"""The paper's bit example through the kernel, and the deviation and bias benchmarks."""

import json
import re

import numpy as np
import pytest

from jax_flashstable.cli import main
from jax_flashstable.results import run_meta
from jax_flashstable.lab.numerics_lab import (
  LAYOUTS,
  Bias,
  bias_benchmark,
  bias_configs,
  bit_example,
  tied_rows,
)


def test_bit_example_through_the_kernel():
  ex = bit_example(("paper", "fa2", "fp32_out"))
  # paper layout: the tile's P̄V sum −4.703990459… is rounded to bf16 −4.71875; the tie
  # alone (−4.703125, a midpoint) rounds to even, −4.6875
  assert ex["paper"]["ties+small"]["pv_sum"] == pytest.approx(-4.71875, abs=1e-6)
  assert ex["paper"]["ties"]["pv_sum"] == pytest.approx(-4.6875, abs=1e-6)
  # fp32_out keeps the exact sum (FA2 does not round P̄V)
  assert ex["fp32_out"]["ties+small"]["pv_sum"] == pytest.approx(-4.703990459442139, abs=2e-6)
  assert ex["fa2"]["ties+small"]["out"] == -2.359375


def test_bias_statistic_flags_a_planted_bias():
  rng = np.random.default_rng(0)
  noise = rng.standard_normal(4000)
  assert abs(Bias.of(noise).z) < 4
  assert Bias.of(noise + 0.2).z > 5


def test_bias_benchmark_flags_paper_and_clears_fp32_out_and_stochastic():
  """On tied maxima with same-sign values the paper layout's per-tile bf16 buffers add a bias
  (measured, sign not assumed); FP32 O and stochastic rounding do not. "Unbiased" for fp32_out
  is |mean| < 0.01 bf16 ulp: its float32 errors are ~1e-3 ulp, so any residue gives a large z."""
  rows = {r["attention"]: r for r in bias_benchmark(tied_rows(num_rows=512), LAYOUTS)}
  paper, fp32_out, stochastic = (
    rows[k]["out_vs_fp64"] for k in ("paper", "fp32_out", "stochastic")
  )
  assert abs(paper["z"]) > 5 and abs(paper["mean"]) > 0.05
  assert abs(rows["paper"]["out_vs_rounded"]["z"]) > 5  # beyond correct rounding
  assert abs(stochastic["z"]) < 3
  assert abs(fp32_out["mean"]) < 0.01
  assert abs(rows["paper"]["delta_vs_fp64"]["z"]) > 3  # and it reaches delta


def test_capped_shift_bias_and_the_rounded_row_sum():
  """Ties spread over 7–22 (beyond the cap of 6, below the literal rule's switch-off at
  ≈ 23.7): the literal paper compensation's shift d = max varies from row to row, so the bf16
  rounding of its tied P̄ = e^−d does not add up; the shift capped at 6 gives every row the same
  P̄ = e^−6, rounded 0.28% low for the P̄V dot only, and O's bias grows several times past the
  paper layout's own (measured: +0.49 ulp against +0.11, 2,048 rows, CPU, 2026-12-02). With
  sum_rounded_p (`+rsum`) it is gone, and fa2 + comp's −0.07 ulp with it."""
  ties = tuple(np.arange(7.0, 22.25, 0.25))
  specs = (
    "paper",
    "paper+comp",
    "paper+comp+guard:max_shift=6",
    "paper+comp+guard+rsum:max_shift=6",
    "fa2+comp",
    "fa2+comp+rsum",
  )
  rows = bias_benchmark(tied_rows(num_rows=512, tie_values=ties), specs)
  mean = {spec: r["out_vs_fp64"]["mean"] for spec, r in zip(specs, rows)}
  assert mean["paper"] > 0.05 and abs(mean["paper+comp"]) < mean["paper"] / 2
  assert mean["paper+comp+guard:max_shift=6"] > 3 * mean["paper"]
  assert abs(mean["paper+comp+guard+rsum:max_shift=6"]) < mean["paper"] / 3
  assert abs(mean["fa2+comp"]) > 0.03 and abs(mean["fa2+comp+rsum"]) < 0.02


@pytest.mark.parametrize(
  "specs, match",
  [(("xla",), "not a flash layout"), (("fa2+delta32",), "delta32"), ((), "no attention")],
)
def test_bias_refuses_what_it_cannot_measure(specs, match):
  with pytest.raises(ValueError, match=match):
    bias_configs(specs)


def test_bias_benchmark_rows_and_signs():
  rows = bias_benchmark(tied_rows(num_rows=64, kv_len=32), ("fa2", "stochastic"))
  assert [r["attention"] for r in rows] == ["fa2", "stochastic", "correctly rounded FP64"]
  for r in rows:
    for key in ("out_vs_fp64", "out_vs_rounded", "delta_vs_fp64", "delta_vs_rounded"):
      assert np.isfinite(r[key]["mean"])
  # each stochastic draw is within one ulp; nearest rounding within half an ulp
  assert abs(rows[1]["out_vs_fp64"]["mean"]) < 1 and abs(rows[0]["out_vs_fp64"]["mean"]) < 0.5


@pytest.mark.parametrize(
  "args, match",
  [
    (["--attention", "cudnn"], "not a flash layout"),
    (["--attention", "paper+bogus"], "unknown modifier"),
    (["--tie-values", "1,x"], "--tie-values"),
    (["--tie-values", "inf"], "--tie-values"),
  ],
)
def test_cli_bias_refuses_bad_input(args, match, tmp_path):
  with pytest.raises(SystemExit, match=match):
    main(["bias", *args, "--out", str(tmp_path)])


def test_cli_deviation_and_bias(tmp_path, capsys):
  assert (
    main(["deviation", "--seq-lens", "64", "--dtypes", "bfloat16,float32", "--out", str(tmp_path)])
    == 0
  )
  assert "headline" in capsys.readouterr().out
  assert (tmp_path / "deviation.json").exists() and (tmp_path / "deviation.png").stat().st_size > 0
  # two specs, ties at 7 and 30: the rows the command writes are those asked for
  args = ["--rows", "32", "--attention", "paper,fa2+comp+rsum", "--tie-values", "7,30"]
  assert main(["bias", *args, "--out", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert "bit example" in out
  # the markdown's header: the command as typed, then date · device · jax, not the raw JSON;
  # the parsed arguments stay in the JSON
  head = (tmp_path / "bias.md").read_text().split("\n\n")[:3]
  assert head[0] == "# bias"
  assert head[1] == f"Command: `flashstable bias {' '.join(args)} --out {tmp_path}`"
  device = re.escape(run_meta()["device"])  # "cpu", "NVIDIA H100 80GB HBM3", …
  facts = rf"date: \d{{4}}-\d\d-\d\d · device: {device} · jax: [\d.]+"
  assert re.fullmatch(facts, head[2]), head[2]
  meta = json.loads((tmp_path / "bias.json").read_text())["meta"]
  assert meta["args"]["tie_values"] == "7,30" and meta["command"].startswith("flashstable bias")
  rows = json.loads((tmp_path / "bias.json").read_text())["rows"]
  assert [r["attention"] for r in rows] == ["paper", "fa2+comp+rsum", "correctly rounded FP64"]
  assert (tmp_path / "bias.png").stat().st_size > 0
