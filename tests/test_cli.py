"""The `flashstable` command line on the embedded sample (small sizes)."""
import json
import pathlib

import pytest

from jax_flashstable.cli import main

FAST = ["--model-set", "block_size=32", "--batch-size", "2", "--eval-interval", "0", "--no-progress",
        "--eval-batches", "1"]


def test_compare_writes_report_and_png_and_resumes(tmp_path, capsys):
  out = tmp_path / "cmp"
  assert main(["compare", "--steps", "3", "--warmup-steps", "1", "--out-dir", str(out)] + FAST) == 0
  report = (out / "report.md").read_text()
  for name in ("fa2", "fa2+comp", "reference-fp32"):
    assert f"| {name} | 3 |" in report
  assert "No run exploded" in report and "noise" in report and "bit for bit" in report
  assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
  summary = json.loads((out / "summary.json").read_text())
  assert [r["variant"] for r in summary] == ["fa2", "fa2+comp", "reference-fp32"]
  assert all(r["last_steps"] == 3 and r["last_std"] >= 0 for r in summary)
  assert "report:" in capsys.readouterr().out
  # a rerun keeps the finished runs (it trains nothing)
  assert main(["compare", "--steps", "3", "--warmup-steps", "1", "--out-dir", str(out)] + FAST) == 0
  assert capsys.readouterr().out.count("done before, skipped") == 3


def test_train_with_a_layer_override(tmp_path):
  out = tmp_path / "train"
  assert main(["train", "--steps", "2", "--attention", "fa2+comp", "--layer-attention",
               "1=reference-fp32", "--out-dir", str(out)] + FAST) == 0
  cfg = json.loads((out / "config.json").read_text())["train"]
  assert cfg["attention"] == "fa2+comp" and cfg["attention_overrides"] == [[1, "reference-fp32"]]
  assert cfg["model_overrides"] == [["block_size", 32]]


def test_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="'nope'"):
    main(["train", "--model", "nope", "--out-dir", str(tmp_path)])
  with pytest.raises(SystemExit, match="n_layers"):
    main(["train", "--model-set", "n_layers=3", "--out-dir", str(tmp_path)])
  with pytest.raises(FileNotFoundError, match="missing"):
    main(["train", "--data", str(tmp_path / "missing"), "--out-dir", str(tmp_path)])


def test_prepare(tmp_path):
  (tmp_path / "t").mkdir()
  (tmp_path / "t" / "a.txt").write_text("hello world " * 20)
  (tmp_path / "t" / "b.md").write_text("second file " * 20)
  assert main(["prepare", str(tmp_path / "t"), str(tmp_path / "bin")]) == 0
  assert pathlib.Path(tmp_path / "bin" / "train.bin").stat().st_size > 0


def test_every_help_page_renders(capsys):
  """argparse formats help strings with %: a stray % would crash `--help`."""
  from jax_flashstable.cli import build_parser
  parser = build_parser()
  commands = parser._subparsers._group_actions[0].choices
  for argv in [["--help"]] + [[c, "--help"] for c in commands]:
    with pytest.raises(SystemExit) as e:
      parser.parse_args(argv)
    assert e.value.code == 0, argv
  assert "compare.SETTINGS" in commands["compare"].format_help()      # compare's own defaults
