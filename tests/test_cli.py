"""The `flashstable` command line on the embedded sample (small sizes)."""

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jax_flashstable.cli import main

REPO = pathlib.Path(__file__).parents[1]

FAST = [
  "--model-set",
  "block_size=32",
  "--batch-size",
  "2",
  "--eval-interval",
  "0",
  "--no-progress",
  "--eval-batches",
  "1",
]


def test_compare_writes_report_and_png_and_resumes(tmp_path, capsys):
  out = tmp_path / "cmp"
  assert main(["compare", "--steps", "3", "--warmup-steps", "1", "--out-dir", str(out)] + FAST) == 0
  report = (out / "report.md").read_text()
  command = shlex.join(
    ["flashstable", "compare", "--steps", "3", "--warmup-steps", "1", "--out-dir", str(out), *FAST]
  )
  assert report.startswith(f"# flashstable compare\n\nCommand: `{command}`\n\nDate: 20")
  from jax_flashstable.experiment import compare

  on_cpu = compare.setting() is compare.SETTINGS["cpu"]  # the GPU setting: the paper layout's
  variants = ["fa2", "fa2+comp", "reference-fp32"] if on_cpu else ["paper", "paper+comp"]
  for name in variants:
    assert f"| {name} | 3 |" in report
  assert "(mean ± std, last 3 steps)" in report  # the steps the mean is over, not a constant
  assert "nan" not in report.lower()  # a value not measured (σ(W_Q) without diagnostics): "–"
  assert "No run exploded" in report and "noise" in report and "bit for bit" in report
  if on_cpu:  # 3 steps, diagnostics every 25: why no runaway threshold, said
    assert (
      "no finite max logit in the reference run here, reference-fp32 (seed 0, 3 steps)" in report
    )
  assert (
    "| warning step | dQ warning step |" in report
    and "dQ warning: `train.DQErrorWarning`" in report
  )
  assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
  summary = json.loads((out / "summary.json").read_text())
  assert [r["variant"] for r in summary] == variants
  assert all(r["last_steps"] == 3 and r["last_std"] >= 0 for r in summary)
  assert "report:" in capsys.readouterr().out
  # a rerun keeps the finished runs (it trains nothing)
  assert main(["compare", "--steps", "3", "--warmup-steps", "1", "--out-dir", str(out)] + FAST) == 0
  assert capsys.readouterr().out.count("done before, skipped") == len(variants)


def test_train_with_a_layer_override(tmp_path, capsys):
  out = tmp_path / "train"
  assert (
    main(
      [
        "train",
        "--steps",
        "2",
        "--attention",
        "fa2+comp",
        "--layer-attention",
        "1=reference-fp32",
        "--deterministic",
        "--out-dir",
        str(out),
      ]
      + FAST
    )
    == 0
  )
  cfg = json.loads((out / "config.json").read_text())["train"]
  assert cfg["attention"] == "fa2+comp" and cfg["attention_overrides"] == [[1, "reference-fp32"]]
  assert cfg["model_overrides"] == [["block_size", 32]] and cfg["deterministic"] is True
  # no checkpoint (2 steps < checkpoint_interval): a second train there would start afresh and
  # write over the run's logs: refused, the logs kept
  logged = (out / "metrics.jsonl").read_text()
  with pytest.raises(
    SystemExit, match=r"holds a run \(metrics.jsonl to step 2\) with no checkpoint"
  ):
    main(["train", "--steps", "3", "--out-dir", str(out)] + FAST)
  assert (out / "metrics.jsonl").read_text() == logged
  # the same command again: a finished run, as with a checkpoint (nothing trained, rc 0)
  again = ["train", "--steps", "2", "--attention", "fa2+comp"]
  again += ["--layer-attention", "1=reference-fp32", "--out-dir", str(out)]
  capsys.readouterr()
  assert main(again + FAST) == 0
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == (
    f"{out} holds a finished run (trained to step 2, steps=2; kept without a checkpoint): "
    "nothing to train; its summary:"
  )
  assert json.loads(printed[1]) == dict(json.loads(logged.splitlines()[-1]), explosion_step=None)
  assert (out / "metrics.jsonl").read_text() == logged
  # another configuration there (a different seed) is still refused
  with pytest.raises(SystemExit, match=r"holds a run \(metrics.jsonl to step 2\)"):
    main(again + ["--seed", "7"] + FAST)
  # a run whose last step failed (NonFiniteError writes that row, then stops) is not finished
  rows = [json.loads(line) for line in logged.splitlines()]
  rows[-1]["loss"] = float("nan")
  (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(SystemExit, match=r"holds a run \(metrics.jsonl to step 2\) with no check"):
    main(again + FAST)


def test_a_stop_by_max_seconds_says_so(tmp_path, capsys):
  """A run stopped by --max-seconds says where it stopped and whether it can go on, as a stop
  by Ctrl-C does (not only in the summary's "stopped")."""
  timed = ["train", "--steps", "3", "--max-seconds", "0.001"] + FAST
  assert main(timed + ["--out-dir", str(tmp_path / "a")]) == 0
  last = capsys.readouterr().out.splitlines()[-1]
  folder = (tmp_path / "a").resolve() / "checkpoints"
  assert last == (
    f"stopped by --max-seconds 0.001 after step 1: checkpoint of step 1 in {folder}; to go on, "
    "rerun the same command"
  )
  assert main(timed + ["--checkpoint-interval", "0", "--out-dir", str(tmp_path / "b")]) == 0
  last = capsys.readouterr().out.splitlines()[-1]
  assert last == (
    "stopped by --max-seconds 0.001 after step 1: no checkpoint (checkpoints are off), so it "
    "cannot go on"
  )


def test_bad_arguments(tmp_path):
  with pytest.raises(SystemExit, match="flashstable train: --model='nope': unknown model preset"):
    main(["train", "--model", "nope", "--out-dir", str(tmp_path)])
  with pytest.raises(SystemExit, match="n_layers"):
    main(["train", "--model-set", "n_layers=3", "--out-dir", str(tmp_path)])
  with pytest.raises(SystemExit, match="flashstable train: --data='.*missing': folder not found"):
    main(["train", "--data", str(tmp_path / "missing"), "--out-dir", str(tmp_path)])


def _bad_inputs(tmp):
  (tmp / "file").write_text("not a folder")
  (tmp / "texts").mkdir()
  cmp, train16 = tmp / "cmp", ["train", "--steps", "1", "--model-set", "compute_dtype=float16"]
  experiment = ["experiment", "instability", "--recipe", "tiny", "--out", str(tmp / "exp")]
  return [
    (["train", "--steps", "-5"], r"flashstable train: --steps=-5 must be an integer ≥ 1"),
    # seeds JAX cannot take (OverflowError from NumPy) or would take as a smaller one's
    (["train", "--seed", str(2**63)], rf"--seed={2**63} must be an integer below 2\*\*63$"),
    (
      ["compare", "--seed", str(2**32), "--out-dir", str(cmp)],
      r"--seed=4294967296 must be below 2\*\*32, the seeds JAX tells apart \(without x64 it "
      r"keeps a seed's low 32 bits: 4294967296 would be 0\)$",
    ),
    (experiment + ["--seeds", f"0,{2**32 + 5}"], r"--seeds '0,4294967301': seed=4294967301 must"),
    (["accuracy", "--seed", str(2**64), "--out", str(tmp / "a")], r"--seed: value=18446744073"),
    (["train", "--steps", str(2**63)], rf"--steps={2**63} must be an integer below 2\*\*63$"),
    (  # an empty corpus folder: refused before the out dir is made (it was made first)
      ["train", "--data", str(tmp / "texts")],
      r"^flashstable train: --data='.*texts': holds neither train.bin\[.xz\] nor text files$",
    ),
    (["train", "--steps", "0"], r"steps=0 must be"),
    (["train", "--lr", "-1"], r"lr=-1.0 must be a finite number > 0"),
    (["train", "--grad-clip", "-1"], r"--grad-clip=-1.0 must be a finite number ≥ 0"),
    (["train", "--batch-size", "0"], r"--batch-size=0 must be"),
    (
      ["train", "--seq-len", "5000"],
      r"--seq-len=5000 exceeds the context of model 'tiny' "
      r"\(block_size=128\)",
    ),
    (["train", "--steps", "ten"], r"train: argument --steps: invalid int value: 'ten'"),
    (["train", "--out-dir", str(tmp / "file")], r"--out-dir='.*file' is a file, not a folder"),
    (["train", "--out-dir", str(tmp / "file" / "run")], r"--out-dir='.*run' cannot be created"),
    (["train", "--attention", "nope"], r"attention='nope': unknown attention 'nope'"),
    (
      ["train", "--layer-attention", "7=xla"],
      r"--layer-attention='7=xla': .*layer 7, but n_layer=2",
    ),
    (
      ["train", "--model-set", "n_head=3"],
      r"^flashstable train: --model-set='n_head=3' \(model 'tiny'\): n_embd=64 is not a multiple",
    ),
    (["compare", "--steps", "0"], r"flashstable compare: --steps=0"),
    (
      ["experiment", "instability", "--recipe", "tiny", "--seeds", "1,-2", "--out", str(tmp)],
      r"flashstable experiment: --seeds '1,-2': every value must be ≥ 0, got -2",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--eval-batches", "0", "--out", str(tmp)],
      r"--eval-batches=0",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--time-budget", "-1"],
      r"argument --time-budget: must be a finite number ≥ 0, got -1",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--reference-max-logit", "0"],
      r"argument --reference-max-logit: must be a finite number > 0, got 0",
    ),
    (["experiment", "instability", "--recipe", "nope"], r"--recipe 'nope' is unknown"),
    (
      ["experiment", "instability", "--recipe", "tiny", "--runs", ""],
      r"argument --runs: expected one or more comma-separated files, got ''",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--runs", "/dev/null", "--out", str(tmp)],
      r"flashstable experiment: --runs '/dev/null': not a regular file",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--runs", "x" * 5000, "--out", str(tmp)],
      r"flashstable experiment: --runs 'x+': cannot be read \(File name too long\)",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--pack", str(tmp), "--out", str(tmp)],
      r"flashstable experiment: --pack '.*' is a folder, not a file",
    ),
    (
      ["experiment", "instability", "--recipe", "tiny", "--pack", " "],
      r"argument --pack: expected a file path, got ' '",
    ),
    (
      [
        "experiment",
        "instability",
        "--recipe",
        "tiny",
        "--data",
        str(tmp / "none"),
        "--out",
        str(tmp / "x"),
      ],
      r"data='.*none': folder not found",
    ),
    (
      ["bench", "--reps", "0"],
      r"^flashstable bench: argument --reps: value=0 must be an integer ≥ 1 \(see",
    ),
    (["bench", "--reps", "ten"], r"^flashstable bench: argument --reps: value='ten' must be an"),
    (["bench", "--warmup", "2.5"], r"argument --warmup: value='2.5' must be an integer ≥ 0 \(see"),
    (["bench", "--out", str(tmp / "file")], r"flashstable bench: --out='.*file' is a file"),
    (
      ["bench", "--targets", "fa2"],
      r"flashstable bench: --targets needs our attention with "
      r"the compensation \(e.g. fa2\+comp\), got 'fa2'",
    ),
    (["bench", "--targets", "--step-model", "gpt5"], r"--step-model 'gpt5': unknown 'gpt5'"),
    (
      ["bench", "--targets", "--step-batch", "0"],
      r"argument --step-batch: value=0 must be an integer ≥ 1",
    ),
    (["deviation", "--seq-lens", "128,-1"], r"--seq-lens '128,-1': every value must be ≥ 1"),
    (["deviation", "--dtypes", "bfloat17"], r"--dtypes 'bfloat17': unknown 'bfloat17'"),
    (["deviation", "--numerics", "fa3"], r"--numerics 'fa3': unknown 'fa3'"),
    (["deviation", "--block-ks", "24"], r"--block-ks=24"),
    (
      ["deviation", "--head-dims", "300"],
      r"flashstable deviation: .*head_dim=300 is not supported",
    ),
    (  # the default --dtypes hold float16: the message names the call of the sweep it refuses
      ["deviation", "--numerics", "stochastic"],
      r"^flashstable deviation: numerics='stochastic', dtype=float16, head_dim=64, .*needs bfloat16",
    ),
    (["bias", "--rows", "0"], r"flashstable bias: argument --rows: value=0 must be an integer ≥ 1"),
    (["bias", "--attention", "fa3"], r"^flashstable bias: --attention='fa3': unknown attention"),
    (["train", "--min-lr", "0.5", "--lr", "0.01"], r"train: --min-lr=0.5 is above --lr=0.01"),
    (["train", "--min-lr", "nan"], r"^flashstable train: --min-lr=nan must be a finite number"),
    (
      ["train", "--layer-attention", "1=fa2", "--layer-attention", "1=paper"],
      r"train: --layer-attention: 1 given twice",
    ),
    (["compare", "--model", "bogus"], r"compare: --model='bogus': unknown model preset"),
    (  # a field's name inside a path stays as it is
      ["train", "--out-dir", str(tmp / "file" / "lr=3")],
      r"train: --out-dir='.*/file/lr=3' cannot be created",
    ),
    (
      ["train", "--model-set", "n_layer=3", "--model-set", "n_layer=4"],
      r"train: --model-set: 'n_layer' given twice",
    ),
    (["bias", "--tie-values", "2,1e39"], r"--tie-values: tie value 1e\+39 is beyond bfloat16"),
    (["bias", "--attention", "fa2,,paper"], r"bias: --attention 'fa2,,paper': an empty item"),
    (["experiment", "instability", "--attention", ""], r"experiment: --attention '': empty"),
    (["crosscheck", str(tmp / "file"), "--numerics", "fa2,paper"], r"'fa2,paper': a list"),
    (["accuracy", "--dtypes", "int8"], r"flashstable accuracy: --dtypes 'int8': unknown 'int8'"),
    (["accuracy", "--seed", "-1"], r"argument --seed: value=-1 must be an integer ≥ 0"),
    (["crosscheck", str(tmp / "no.npz")], r"crosscheck: dump '.*no.npz' is not found"),
    (["crosscheck", str(tmp)], r"crosscheck: dump '.*' is a folder, not a dump file"),
    (["crosscheck", str(tmp / "file")], r"crosscheck: .*file is not a readable dump"),
    (["plot", str(tmp / "norun")], r"flashstable plot: run folder '.*norun' not found"),
    (["plot", str(tmp / "texts")], r"run folder '.*texts' has no metrics.jsonl"),
    (["plot", str(tmp / "file")], r"run folder '.*file' is a file, not a run folder"),
    (
      ["prepare", str(tmp / "nonexistent"), str(tmp / "bin")],
      r"flashstable prepare: text folder not found: .*nonexistent",
    ),
    (["prepare", str(tmp / "texts"), str(tmp / "bin")], r"no .txt/.md/.rst files under"),
    # an option another command has: named by the command that refused it, with its help
    (
      ["compare", "--attention", "fa3"],
      r"^flashstable compare: unrecognized arguments: --attention fa3 "
      r"\(see flashstable compare --help\)$",
    ),
    (
      ["bias", "--nope"],
      r"^flashstable bias: unrecognized arguments: --nope \(see flashstable bias",
    ),
    # an option before any command is named, not taken for the missing command; no command at all
    (["--bogus"], r"^flashstable: unrecognized arguments: --bogus \(see flashstable --help\)$"),
    ([], r"^flashstable: the following arguments are required: command \(see flashstable"),
    (
      ["experiment", "--bogus"],
      r"^flashstable experiment: unrecognized arguments: --bogus \(see flashstable experiment",
    ),
    (["experiment"], r"^flashstable experiment: the following arguments are required: name "),
    (
      ["prepare", str(tmp / "texts"), str(tmp / "bin"), "--val-every", "0"],
      r"argument --val-every: value=0 must be an integer ≥ 1",
    ),
    # a training option compare's variants would drop (each sets every layer's attention; the
    # runs resume rather than stop by time): refused, as experiment refuses them
    (
      ["compare", "--steps", "1", "--layer-attention", "1=stochastic", "--out-dir", str(cmp)],
      r"^flashstable compare: unrecognized arguments: --layer-attention 1=stochastic "
      r"\(see flashstable compare --help\)$",
    ),
    (
      ["compare", "--steps", "1", "--max-seconds", "5", "--out-dir", str(cmp)],
      r"^flashstable compare: unrecognized arguments: --max-seconds 5 ",
    ),
    # an attention the model's compute_dtype or head_dim does not take, in every command that
    # trains: one line before the model's setup (a traceback after it until 2026-12-06)
    (
      ["train", "--steps", "1", "--model-set", "n_embd=600", "--model-set", "n_head=2"],
      r"^flashstable train: --attention='fa2' cannot run in model 'tiny' "
      r"\(compute_dtype='bfloat16', head_dim=300\): head_dim=300 is not supported",
    ),
    (
      [*train16, "--attention", "fa2+comp:max_shift=10"],
      r"^flashstable train: --attention='fa2\+comp:max_shift=10' cannot run in model 'tiny' "
      r"\(compute_dtype='float16', head_dim=32\): max_shift=10.0 > 6 flushes",
    ),
    (
      [*train16, "--attention", "fa2+rsum"],
      r"^flashstable train: --attention='fa2\+rsum' cannot run .*: sum_rounded_p=True takes",
    ),
    (
      [*train16, "--layer-attention", "1=fa2+rsum"],
      r"^flashstable train: --layer-attention: layer 1='fa2\+rsum' cannot run in model 'tiny' "
      r"\(compute_dtype='float16', head_dim=32\): sum_rounded_p=True takes bfloat16 or float32",
    ),
    (
      [
        "train",
        "--steps",
        "1",
        "--model-set",
        "compute_dtype=float32",
        "--attention",
        "stochastic",
      ],
      r"^flashstable train: --attention='stochastic' cannot run in model 'tiny' "
      r"\(compute_dtype='float32', head_dim=32\): numerics='stochastic' rounds to bfloat16",
    ),
    (
      [*experiment, "--attention", "stochastic", "--model-set", "compute_dtype=float32"],
      r"^flashstable experiment: variant 'stochastic' cannot run in model 'tiny' "
      r"\(compute_dtype='float32', head_dim=32\): numerics='stochastic' rounds to bfloat16",
    ),
    (
      ["compare", "--steps", "1", "--model", "tiny", "--out-dir", str(cmp)]
      + ["--model-set", "n_embd=600", "--model-set", "n_head=2"],
      r"^flashstable compare: variant '[^']+' cannot run in model 'tiny' "
      r"\(compute_dtype='bfloat16', head_dim=300\): head_dim=300 is not supported",
    ),
    # a list item given twice would run or count the same work twice (`checks.distinct`)
    (["accuracy", "--dtypes", "bfloat16,float32,bfloat16"], r"'bfloat16' given twice$"),
    (["deviation", "--seq-lens", "128,256,128"], r"--seq-lens '128,256,128': 128 given twice$"),
    (["deviation", "--numerics", "fa2,fa2"], r"--numerics 'fa2,fa2': 'fa2' given twice$"),
    (["bias", "--tie-values", "1,1.0"], r"--tie-values '1,1.0': 1.0 given twice$"),
    (["bias", "--attention", "fa2,fa2"], r"^flashstable bias: --attention 'fa2,fa2': 'fa2' given"),
    (
      [*experiment, "--seeds", "1,2,1"],
      r"^flashstable experiment: --seeds '1,2,1': 1 given twice$",
    ),
    ([*experiment, "--attention", "paper,paper"], r"--attention 'paper,paper': 'paper' given"),
    (
      ["crosscheck-train", "--pairs", "paper=fa2,paper=fa2", "--out", str(tmp / "twin")],
      r"^flashstable crosscheck-train: pairs 'paper=fa2,paper=fa2': 'paper=fa2' given twice$",
    ),
    (["bench", "--overhead", "fa2,fa2", "--out", str(tmp / "b")], r"'fa2' given twice$"),
    (  # one problem in two spellings
      ["bench", "--shapes", "1,64,2,2,32,0;1,64,2,2,32,full", "--out", str(tmp / "b")],
      r"^flashstable bench: --shapes '[^']+': 'b1 q64 kv64 h2/2 d32 full' given twice$",
    ),
  ]


def test_every_user_error_is_one_line_before_any_work(tmp_path):
  """Bad values, paths and names of every command: SystemExit with one line naming the option
  and the value, before anything is traced or trained (nothing written under tmp_path)."""
  cases = _bad_inputs(tmp_path)
  before = sorted(tmp_path.rglob("*"))
  for argv, message in cases:
    with pytest.raises(SystemExit) as e:
      main(
        argv
        + (
          ["--out-dir", str(tmp_path / "run")]
          if argv[:1] == ["train"] and "--out-dir" not in argv
          else []
        )
      )
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, argv
    assert re.search(message, e.value.code), (argv, e.value.code)
  assert sorted(tmp_path.rglob("*")) == before


def _run_cli(*argv, timeout=120):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(
    [sys.executable, "-m", "jax_flashstable.cli", *argv],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _run_python(code):
  """`code` in a fresh interpreter with the repository on the path; its exit status 0."""
  env = dict(os.environ, PYTHONPATH=str(REPO))
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return out


def test_model_set_overrides_a_recipes_model_field():
  """--model-set replaces a recipe's own model override (anchor-4l's n_layer), as every
  option overrides the recipe; only a field given twice in --model-set is refused."""
  from jax_flashstable import cli
  from jax_flashstable.experiment.instability import RECIPES

  argv = ["experiment", "instability", "--recipe", "anchor-4l", "--model-set", "n_layer=6"]
  args = cli.build_parser().parse_args(argv)
  cfg = cli._train_config(args, **RECIPES["anchor-4l"])
  assert cfg.model_overrides == (("n_layer", 6),) and cfg.model_config().n_layer == 6


def test_a_request_beyond_the_devices_memory_is_one_line(monkeypatch):
  """XLA's RESOURCE_EXHAUSTED (e.g. bench --shapes with a length of 10⁶ on a CPU: "Out of
  memory allocating 9000128000000 bytes", 2026-12-05) is a user's size, not a bug: one line
  naming the command; any other runtime error stays a traceback. (Raised here as JAX raises
  it, not by allocating: a real 8 TB request could be granted lazily and the worker killed.)"""
  import jax

  from jax_flashstable import cli

  def exhausted(args):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes.\nmore")

  monkeypatch.setattr(cli, "_accuracy", exhausted)
  with pytest.raises(
    SystemExit,
    match=r"^flashstable accuracy: out of memory \(RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes.\); ask for smaller sizes$",
  ):
    main(["accuracy"])

  def other(args):
    raise jax.errors.JaxRuntimeError("INTERNAL: something else")

  monkeypatch.setattr(cli, "_accuracy", other)
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    main(["accuracy"])


def test_console_prints_one_line_and_exits_2(tmp_path):
  out = _run_cli("train", "--steps", "-5", "--out-dir", str(tmp_path / "r"))
  assert (out.returncode, out.stdout, out.stderr) == (
    2,
    "",
    "flashstable train: --steps=-5 must be an integer ≥ 1\n",
  )
  out = _run_cli("prepare", str(tmp_path / "nonexistent"), str(tmp_path / "bin"))
  assert out.returncode == 2 and out.stderr.splitlines() == [
    f"flashstable prepare: text folder not found: {tmp_path / 'nonexistent'}"
  ]
  # a warning is one line too (not its source path and line), the error after it
  data = tmp_path / "data"
  data.mkdir()
  np.arange(10, dtype=np.uint16).tofile(data / "train.bin")
  out = _run_cli("train", "--data", str(data), "--out-dir", str(tmp_path / "r"))
  assert out.returncode == 2 and out.stderr.splitlines() == [
    f"flashstable: UserWarning: no val.bin[.xz] in {data}: validation losses use the training "
    "tokens",
    f"flashstable train: --data={str(data)!r}: the train split has 10 tokens, too few for "
    "--seq-len=128 (at least 130)",
  ], out.stderr


def test_deterministic_sets_xlas_flag_before_any_command_starts_jax():
  """`--deterministic` (every training command: train, compare, experiment, crosscheck-train)
  puts --xla_gpu_deterministic_ops=true in XLA_FLAGS in `main`, before the command runs (and
  so before it starts JAX, as compare does to choose its setting); without it nothing is
  added."""
  code = (
    "import sys, os, jax_flashstable.cli as c\n"
    "from jax._src import xla_bridge\n"
    "def probe(args):\n"
    "  print(args.command, os.environ.get('XLA_FLAGS'), xla_bridge.backends_are_initialized())\n"
    "  return 0\n"
    "c._train = c._compare = c._experiment = c._crosscheck_train = probe\n"
    "for argv in (['train'], ['compare'], ['experiment', 'instability'], ['crosscheck-train']):\n"
    "  os.environ['XLA_FLAGS'] = '--xla_backend_optimization_level=1'\n"
    "  c.main(argv + ['--no-deterministic'])\n"
    "  c.main(argv + ['--deterministic'])\n"
  )
  out = _run_python(code)
  flags = "--xla_backend_optimization_level=1"
  assert out.stdout.splitlines() == [
    line
    for command in ("train", "compare", "experiment", "crosscheck-train")
    for line in (
      f"{command} {flags} False",
      f"{command} {flags} --xla_gpu_deterministic_ops=true False",
    )
  ]


def test_help_imports_no_jax():
  """`--help` (every page) builds its options without importing JAX, Flax, Optax or NumPy."""
  code = (
    "import sys, contextlib, io, jax_flashstable.cli as c\n"
    "p = c.build_parser()\n"
    "for argv in (['--help'], ['train', '--help'], ['experiment', '--help']):\n"
    "  with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
    "    p.parse_args(argv)\n"
    "print(sorted(m for m in ('jax', 'flax', 'optax', 'numpy', 'orbax')\n"
    "             if m in sys.modules))"
  )
  assert _run_python(code).stdout.strip() == "[]"
  assert _run_cli("train", "--help").stdout.startswith("usage: flashstable train")


AS_FROM_A_TERMINAL = (
  "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
  "sys.argv[0] = 'flashstable'; runpy.run_module('jax_flashstable.cli', run_name='__main__')"
)


def test_ctrl_c_saves_resumable_checkpoint_and_exits_130(tmp_path, capsys):
  """A real SIGINT during `train`: one line saying where and how to resume, status 130, no
  traceback, no "terminate called"; the checkpoint is of the last logged step; rerunning a
  finished run reports it instead of training (steps may shrink: decay_steps is fixed)."""
  run = tmp_path / "r"
  argv = [
    "train",
    "--steps",
    "5000",
    "--decay-steps",
    "5000",
    "--attention",
    "xla",
    "--out-dir",
    str(run),
  ] + FAST
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.Popen(
    # `python -m jax_flashstable.cli`, with SIGINT handled as from a terminal even when the
    # suite runs as a background job (SIGINT ignored there and inherited: the CLI would rightly
    # go on ignoring it)
    [sys.executable, "-c", AS_FROM_A_TERMINAL, *argv],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
      metrics = run / "metrics.jsonl"
      if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
        break
      time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
  last = steps[-1]
  assert proc.returncode == 130, err
  assert "Traceback" not in err and "terminate called" not in err
  assert err.strip().splitlines()[-1] == (
    f"flashstable: interrupted after step {last}: checkpoint of step {last} in "
    f"{run / 'checkpoints'}; to resume, rerun the same command (same out_dir and settings)"
  )
  assert steps == list(range(1, last + 1)) and last >= 3
  assert [p.name for p in (run / "checkpoints").iterdir()] == [str(last)]
  argv[argv.index("5000")] = "2"  # --steps 2 ≤ the checkpoint
  assert main(argv) == 0
  printed = capsys.readouterr().out
  assert f"holds a finished run (trained to step {last}, steps=2): nothing to train" in printed
  assert json.loads(printed.splitlines()[1])["step"] == last


def test_prepare(tmp_path):
  (tmp_path / "t").mkdir()
  (tmp_path / "t" / "a.txt").write_text("hello world " * 20)
  (tmp_path / "t" / "b.md").write_text("second file " * 20)
  assert main(["prepare", str(tmp_path / "t"), str(tmp_path / "bin")]) == 0
  assert pathlib.Path(tmp_path / "bin" / "train.bin").stat().st_size > 0
  with pytest.raises(SystemExit, match=r"^flashstable prepare: .*bin holds train.bin and val.bin"):
    main(["prepare", str(tmp_path / "t"), str(tmp_path / "bin")])


def test_every_help_page_renders(capsys):
  """argparse formats help strings with %: a stray % would crash `--help`."""
  from jax_flashstable.cli import build_parser

  parser = build_parser()
  commands = parser._subparsers._group_actions[0].choices
  for argv in [["--help"]] + [[c, "--help"] for c in commands]:
    with pytest.raises(SystemExit) as e:
      parser.parse_args(argv)
    assert e.value.code == 0, argv
  compare = commands["compare"].format_help()
  assert compare.count("compare.SETTINGS") == 1  # compare's own defaults, said once
  from jax_flashstable.models.gpt2 import MODEL_PRESETS

  train = " ".join(commands["train"].format_help().split())  # the help's line breaks undone
  assert f"--model MODEL default tiny; a preset: {', '.join(sorted(MODEL_PRESETS))} " in train
  # every command that writes a folder takes --out-dir, as train and compare do (and --out)
  for name, command in commands.items():
    if name in ("plot", "prepare"):  # their folders are positional
      continue
    argv = [name] + {"experiment": ["instability"], "crosscheck": ["dump.npz"]}.get(name, [])
    args = parser.parse_args(argv + ["--out-dir", "somewhere"])
    assert (getattr(args, "out", None) or args.out_dir) == "somewhere", name
  assert re.search(r"--out-dir OUT_DIR\s+default runs/compare", compare)


def test_numerics_commands_turn_xla_cpus_dot_fusions_off(monkeypatch, tmp_path):
  """`flashstable accuracy` (and deviation, bias, crosscheck) compares kernels with references,
  so it runs with XLA CPU's plain dot semantics as the tests do (`xla_cpu.plain_dots`; with
  YNNPACK's fusions the float32 reference beat float32 arithmetic and `accuracy --dtypes
  float32` failed 6 of 32 rows); train and the other commands leave XLA_FLAGS alone. The flag
  is added once, beside the user's own."""
  import jax_flashstable.cli as cli
  from jax_flashstable import xla_cpu

  calls = []
  monkeypatch.setattr(cli, "plain_dots", lambda: calls.append(1))
  for argv, want in (
    (["accuracy", "--dtypes", "int8", "--out", str(tmp_path / "a")], 1),
    (["plot", str(tmp_path / "none")], 0),
  ):
    calls.clear()
    with pytest.raises(SystemExit):
      main(argv)
    assert len(calls) == want, argv
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  xla_cpu.plain_dots()
  xla_cpu.plain_dots()
  assert os.environ["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", xla_cpu.FLAG]
