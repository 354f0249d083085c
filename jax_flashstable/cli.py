"""`flashstable` command line: thin wrappers over the library (parse, call, say where results went).

A user error (a bad option value, a missing file, an unknown name) ends the command before any
work with one line naming the option and the value, exit status 2: commands raise
`SystemExit("flashstable <command>: ...")` (what the tests match) and `console_main`, the
console entry point, prints it. Ctrl-C ends with one line and status 130. Importing this
module, and `--help`, import no JAX (the training options come from `training.config`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import re
import shlex
import sys
import warnings

from jax_flashstable import interrupts
from jax_flashstable.xla_cpu import deterministic_gpu_ops, plain_dots
from jax_flashstable.checks import distinct, integer, random_seed

DTYPES = ("bfloat16", "float16", "float32")
# the commands that compare kernels with references: run with XLA CPU's plain dot semantics,
# as the tests are (`jax_flashstable.xla_cpu`)
NUMERICS_COMMANDS = ("accuracy", "deviation", "bias", "crosscheck")


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors: `flashstable train: argument --steps: invalid int value:
  'x'` instead of the usage text and the message (`console_main` prints it, status 2)."""

  def error(self, message):
    raise SystemExit(f"{self.prog}: {message} (see {self.prog} --help)")


def _files(text):
  """argparse type: one or more comma-separated file paths, none empty (an empty --runs must
  not read as no --runs)."""
  if not text.strip() or not all(x.strip() for x in text.split(",")):
    raise argparse.ArgumentTypeError(f"expected one or more comma-separated files, got {text!r}")
  distinct(repr(text), [x.strip() for x in text.split(",")], argparse.ArgumentTypeError)
  return text


_files.__name__ = "comma-separated files"


def _file(text):
  """argparse type: a file path, not empty."""
  if not text.strip():
    raise argparse.ArgumentTypeError(f"expected a file path, got {text!r}")
  return text


_file.__name__ = "file path"


def _integer_type(check, name: str):
  """argparse type: an integer by `check(name, value, error)` (a `checks` rule). Its error is
  an ArgumentTypeError, whose message argparse shows after the option's name (`argument
  --reps: value=0 must be an integer ≥ 1`); a ValueError's would be replaced by argparse's own
  `invalid ... value: '0'`. Text that is no integer is refused by the same rule, naming the
  text (`value='ten'`)."""

  def parse(text):
    try:
      value = int(text)
    except ValueError:
      value = text  # not an integer: the checks refuse a string, naming it
    return check("value", value, argparse.ArgumentTypeError)

  parse.__name__ = name
  return parse


def _count(low):
  """argparse type: an integer ≥ low, by the project's one integer rule (`checks.integer`)."""
  return _integer_type(lambda n, v, e: integer(n, v, low, e), f"integer ≥ {low}")


# argparse type: a random seed (`checks.random_seed`: an integer in [0, 2**32))
_seed = _integer_type(random_seed, "seed")


def _non_negative(text):
  """argparse type: a finite float ≥ 0."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}") from None
  if not 0 <= value < float("inf"):
    raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text}")
  return value


def _positive(text):
  """argparse type: a finite float > 0."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
  if not 0 < value < float("inf"):
    raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
  return value


def _out(command, path, option="--out"):
  """`path` when it is a folder that can be written (or created); else the one-line error."""
  from jax_flashstable.training.config import ConfigError, check_output_dir

  try:
    check_output_dir(path, option)
  except ConfigError as e:
    raise SystemExit(f"flashstable {command}: {e}") from None
  return path


def _pack_out(command, pack, out):
  """--pack: a file that can be written (its folder writable or creatable, itself not a
  folder, neither a run folder of --out nor inside one: OUT/VARIANT/seedN, or for the twin
  OUT/SIDE/VARIANT/seedN, whose files it would replace), checked before any work; else the
  one-line error."""
  _out(command, str(pathlib.Path(pack).parent), "--pack's folder")
  if pathlib.Path(pack).is_dir():
    raise SystemExit(f"flashstable {command}: --pack {pack!r} is a folder, not a file")
  from jax_flashstable.experiment.instability import is_run_name

  target, root = pathlib.Path(pack).resolve(), pathlib.Path(out).resolve()
  if target.is_relative_to(root):
    parts = target.relative_to(root).parts
    if any(is_run_name(part) for part in parts[1:3]):
      raise SystemExit(f"flashstable {command}: --pack {pack!r} is a run folder of --out or in one")


def _choices(command, option, text, allowed, single=False):
  """The comma-separated items of `text` (single: one item), each one of `allowed`; else the
  one-line error."""
  items = [x.strip() for x in text.split(",")]
  bad = [x for x in items if x not in allowed]
  if bad or not text.strip() or (single and len(items) > 1):
    why = "unknown " + ", ".join(map(repr, bad)) if bad else "empty" if items == [""] else "a list"
    raise SystemExit(
      f"flashstable {command}: {option} {text!r}: {why}; choose "
      f"{'one ' if single else ''}from {', '.join(allowed)}"
    )
  return distinct(f"flashstable {command}: {option} {text!r}", items, SystemExit)


def _accuracy(args):
  names = _choices("accuracy", "--dtypes", args.dtypes, DTYPES)
  _out("accuracy", args.out)
  import jax.numpy as jnp

  from jax_flashstable.lab.accuracy import accuracy_report, format_report

  dtypes = [jnp.dtype(d) for d in names]
  rows = accuracy_report(dtypes=dtypes, seed=args.seed)
  table = format_report(rows)
  from jax_flashstable.results import format_meta

  header = (
    f"# flash_attention vs FP64 golden\n\n{format_meta(_meta(args) | dict(seed=args.seed))}\n\n"
    "Rule: error(flash) ≤ 2·error(standard attention, same dtype) + 1 ulp of the dtype at the "
    "reference's scale + 1 float32 ulp at the scale of the terms it sums, for max and mean; "
    "FP64 and the standard attention on XLA's CPU with plain dots.\n\n"
  )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "accuracy.md"), "w") as f:
    f.write(header + table + "\n")
  with open(os.path.join(args.out, "accuracy.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print(table)
  failed = [r for r in rows if not r["passes"]]
  print(f"\n{len(rows) - len(failed)}/{len(rows)} rows pass; report in {args.out}/accuracy.md")
  return 1 if failed else 0


def _train_config(args, **defaults):
  """TrainConfig from parsed CLI args (only the options the user gave override `defaults`).
  Its values are checked on construction (ConfigError) before anything heavy is imported."""
  import dataclasses

  from jax_flashstable.training.config import TrainConfig

  command = f"flashstable {getattr(args, 'command', '')}".rstrip()
  kw = dict(defaults)
  for f in dataclasses.fields(TrainConfig):
    v = getattr(args, f.name, None)
    if v is not None and f.name not in ("model_overrides", "attention_overrides"):
      kw[f.name] = v
  layer_overrides = []
  for item in getattr(args, "layer_attention", None) or []:
    layer, _, spec = item.partition("=")
    if not layer.isdigit() or not spec:
      raise SystemExit(f"{command}: --layer-attention expects LAYER=SPEC, got {item!r}")
    layer_overrides.append((int(layer), spec))
  if layer_overrides:
    kw["attention_overrides"] = tuple(layer_overrides)
  TrainConfig(**kw)  # the values, before JAX is imported
  if args.model_set:
    from jax_flashstable.attention.config import parse_field_value
    from jax_flashstable.models.gpt2 import GPTConfig

    gtypes = {f.name: f.type for f in dataclasses.fields(GPTConfig)}
    model_overrides = dict(
      kw.get("model_overrides", ())
    )  # the recipe's, which --model-set overrides
    keys = [item.partition("=")[0] for item in args.model_set]
    distinct(f"{command}: --model-set", keys, SystemExit)
    for item in args.model_set:
      key, _, value = item.partition("=")
      if key not in gtypes or key.startswith("attention"):
        raise SystemExit(
          f"{command}: --model-set {key!r} is not a GPTConfig field "
          f"({sorted(k for k in gtypes if not k.startswith('attention'))})"
        )
      try:
        model_overrides[key] = parse_field_value(key, value, gtypes[key])
      except ValueError as e:
        raise SystemExit(f"{command}: --model-set {item!r}: {e}") from None
    kw["model_overrides"] = tuple(model_overrides.items())
  return TrainConfig(**kw)


# what the help adds to a TrainConfig option's default
COMPARE_HELP = (
  "the main job: attentions from the same weights on the same batches (on a GPU the paper "
  "layout without and with the compensation at anchor-b128; on a CPU fa2, fa2+comp and the FP32 "
  "reference); report (explosion, runaway, warnings) + PNG"
)
OPTION_NOTES = {
  "warning_action": "; off, log, checkpoint or stop (these two need --diag-interval)",
  "warning_rule": "; logit (any layer's max logit), dq_error (--warning-layer's dQ error) or "
  "dq_common (its part along the keys' mean); the dQ rules need --diag-interval",
  "warning_layer": "; 0-based, watched by --warning-rule dq_error and dq_common only",
  "max_seconds": "; wall seconds from the start, setup and compilation included, then a "
  "checkpoint (where checkpoints are on) and stop (0: no limit)",
  # models.gpt2.MODEL_PRESETS' names (test_cli checks), not imported: the help starts no JAX
  "model": "; a preset: gpt-6l, gpt2-small, tiny",
  "deterministic": "; XLA's deterministic GPU ops (--xla_gpu_deterministic_ops=true) for the JAX "
  "runs, so that a GPU run repeats bit for bit (CPU runs repeat without it); about 18%% slower "
  "(gpt2-small, H200); refused with a cudnn attention, which fails under it",
  "data": "; a folder of train.bin and val.bin (GPT-2 BPE tokens, uint16, nanoGPT's format) "
  "or their .xz; none: the embedded sample",
}


def _add_train_options(p, skip=(), layer_attention=True, defaults=None):
  """One option per TrainConfig field; `defaults` ({field: value}, or a string for all, or
  {field: value, "*": string for the rest}) is what the help shows when the command does not
  use TrainConfig's own defaults."""
  import dataclasses

  from jax_flashstable.training.config import TrainConfig

  for f in dataclasses.fields(TrainConfig):
    if f.name in ("model_overrides", "attention_overrides") or f.name in skip:
      continue
    flag = "--" + f.name.replace("_", "-")
    t = str(f.type)
    if "bool" in t:
      shown = OPTION_NOTES.get(f.name, "").removeprefix("; ") or None
      p.add_argument(
        flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=shown
      )
    else:
      typ = int if ("int" in t and "float" not in t) else float if "float" in t else str
      given = {"*": defaults} if isinstance(defaults, str) else dict(defaults or {})
      shown = (
        f"default {given[f.name]}" if f.name in given else given.get("*", f"default {f.default}")
      ) + OPTION_NOTES.get(f.name, "")
      p.add_argument(flag, dest=f.name, type=typ, default=None, help=shown)
  p.add_argument(
    "--model-set",
    action="append",
    metavar="FIELD=VALUE",
    help="override a GPTConfig field of the preset, e.g. n_layer=4 (repeatable)",
  )
  if layer_attention:
    p.add_argument(
      "--layer-attention",
      action="append",
      metavar="LAYER=SPEC",
      help="attention of one layer (0-based), e.g. 1=reference-fp32 (repeatable)",
    )


def _train(args):
  cfg = _train_config(args).validate()  # ConfigError: one line (main), before any work
  from jax_flashstable.training.train import (
    CheckpointError,
    NonFiniteError,
    config_changes,
    explosion_step,
    has_checkpoints,
    read_metrics,
    train_and_evaluate,
  )

  out = pathlib.Path(cfg.out_dir)
  if not has_checkpoints(out) and (logged := read_metrics(out)):
    last = logged[-1]
    stored = (out / "config.json").exists()
    finite = all(math.isfinite(last.get(k, math.nan)) for k in ("loss", "grad_norm"))
    if stored and finite and last["step"] >= cfg.steps and not config_changes(out, cfg):
      # finished, kept without a checkpoint (checkpoint_interval above steps, or 0): as a
      # finished run with one, nothing to train (a non-finite last row is a failed run)
      print(
        f"{cfg.out_dir} holds a finished run (trained to step {last['step']}, "
        f"steps={cfg.steps}; kept without a checkpoint): nothing to train; its summary:"
      )
      losses = [(r["step"], r["loss"]) for r in logged]
      print(json.dumps(dict(last, explosion_step=explosion_step(losses, cfg.warmup_steps))))
      return 0
    # train_and_evaluate would start afresh there and write over the run's logs
    raise SystemExit(
      f"flashstable train: --out-dir {cfg.out_dir!r} holds a run (metrics.jsonl to step "
      f"{logged[-1]['step']}) with no checkpoint to resume from; use another --out-dir, or "
      "remove it to train afresh"
    )

  try:
    s = train_and_evaluate(cfg)
  except NonFiniteError as e:
    print(f"flashstable train: {e}", file=sys.stderr)
    return 2
  except CheckpointError as e:
    raise SystemExit(f"flashstable train: {e}") from None
  if s.get("already_finished"):
    print(
      f"{cfg.out_dir} holds a finished run (trained to step {s['step']}, steps={cfg.steps}): "
      "nothing to train; its summary:"
    )
  print(json.dumps(s))
  print(f"metrics in {pathlib.Path(cfg.out_dir) / 'metrics.jsonl'}")
  if s.get("stopped") == "time":  # said as Ctrl-C's stop is
    where = (
      f"checkpoint of step {s['step']} in {out.resolve() / 'checkpoints'}; to go on, rerun the "
      "same command"
      if has_checkpoints(out)
      else "no checkpoint (checkpoints are off), so it cannot go on"
    )
    print(f"stopped by --max-seconds {cfg.max_seconds:g} after step {s['step']}: {where}")
  return 0


def _compare(args):
  from jax_flashstable.experiment import compare

  setting = compare.setting()
  out = _out("compare", args.out_dir or "runs/compare", "--out-dir")
  cfg = _train_config(args, **setting["recipe"])
  from jax_flashstable.training.train import CheckpointError

  try:
    compare.run_compare(
      cfg,
      out,
      setting["variants"],
      cfg.seed if args.seed is not None else setting["seed"],
      command=_command(args),
      reference_max_logit=compare.reference_max_logit(setting, cfg),
    )
  except (ValueError, FileNotFoundError, CheckpointError) as e:
    raise SystemExit(f"flashstable compare: {_message(e)}") from None
  print(pathlib.Path(out, "report.md").read_text())
  print(f"report: {out}/report.md, curves: {out}/curves.png")
  return 0


def _prepare(args):
  if not pathlib.Path(args.text_dir).exists():
    raise SystemExit(f"flashstable prepare: text folder not found: {args.text_dir}")
  _out("prepare", args.out_dir, "OUT_DIR")
  from jax_flashstable.training.data import prepare_text_folder

  try:
    counts = prepare_text_folder(args.text_dir, args.out_dir, val_every=args.val_every)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"flashstable prepare: {e}") from None
  print(
    f"wrote {args.out_dir}/train.bin ({counts['train']} tokens) and val.bin ({counts['val']} tokens)"
  )
  return 0


def _command(args):
  """The command as typed (`main` keeps its argv), quoted for a shell."""
  return shlex.join(["flashstable", *args.argv])


def _meta(args):
  """The run's metadata: date, device, jax, the command as typed and its parsed arguments."""
  from jax_flashstable.results import run_meta

  args_ = {k: v for k, v in vars(args).items() if k not in ("func", "argv")}
  return run_meta(command=_command(args), args=args_)


def _seeds(text, command):
  """--seeds' comma-separated seeds, each a `checks.random_seed`; else the one-line error."""
  seeds = _ints(text, "--seeds", 0, command)
  for s in seeds:
    try:
      random_seed("seed", s)
    except ValueError as e:
      raise SystemExit(f"flashstable {command}: --seeds {text!r}: {e}") from None
  return seeds


def _ints(text, option="value", low=None, command=""):
  """The comma-separated integers of `text` (each ≥ low when given); else the one-line error."""
  where = f"flashstable{' ' + command if command else ''}: {option}"
  try:
    values = tuple(int(x) for x in text.split(","))
  except ValueError:
    raise SystemExit(f"{where} expects comma-separated integers, got {text!r}") from None
  if low is not None and min(values) < low:
    raise SystemExit(f"{where} {text!r}: every value must be ≥ {low}, got {min(values)}")
  return tuple(distinct(f"{where} {text!r}", values, SystemExit))


def _floats(text, option="value", command=""):
  """The comma-separated finite numbers of `text`; else the one-line error (as `_ints`)."""
  where = f"flashstable{' ' + command if command else ''}: {option}"
  try:
    values = tuple(float(x) for x in text.split(","))
  except ValueError:
    values = ()
  if not values or not all(abs(x) < float("inf") for x in values):
    raise SystemExit(f"{where} {text!r} must be comma-separated finite numbers")
  return tuple(distinct(f"{where} {text!r}", values, SystemExit))


def _deviation(args):
  from jax_flashstable.lab.numerics_lab import (
    check_deviation,
    deviation_benchmark,
    deviation_headline,
    format_deviation,
    plot_deviation,
  )
  from jax_flashstable.results import write_results
  from pallas_kernels.policy import NUMERICS, check_tile

  seq_lens = _ints(args.seq_lens, "--seq-lens", 1, "deviation")
  head_dims = _ints(args.head_dims, "--head-dims", 1, "deviation")
  block_ks = _ints(args.block_ks, "--block-ks", 16, "deviation")
  for b in block_ks:
    try:
      check_tile("--block-ks", b)
    except ValueError as e:
      raise SystemExit(f"flashstable deviation: {e}") from None
  dtypes = _choices("deviation", "--dtypes", args.dtypes, DTYPES)
  layouts = _choices("deviation", "--numerics", args.numerics, sorted(NUMERICS))
  _out("deviation", args.out)
  rows = []
  try:  # every layout's combinations checked before the first is computed
    for layout in layouts:
      check_deviation(seq_lens, head_dims, dtypes, block_ks, num_heads=args.heads, layout=layout)
  except (ValueError, TypeError) as e:
    raise SystemExit(f"flashstable deviation: {e}") from None
  for layout in layouts:
    rows += deviation_benchmark(
      seq_lens,
      head_dims,
      tuple(dtypes),
      block_ks,
      num_heads=args.heads,
      seed=args.seed,
      layout=layout,
    )
  write_results(args.out, "deviation", rows, format_deviation(rows), _meta(args))
  print(f"plot: {plot_deviation(rows, os.path.join(args.out, 'deviation.png'))}")
  for layout, ratio in deviation_headline(rows).items():
    print(
      f"headline [{layout}]: flash / standard max deviation at bf16 (geometric mean over the "
      f"sweep) = {ratio:.2f} (Golden et al. 2024 report about 10x for their kernel)"
    )
  return 0


def _bias(args):
  from jax_flashstable.attention.config import split_specs
  from jax_flashstable.lab.numerics_lab import (
    BIAS_ATTENTIONS,
    bias_benchmark,
    bias_configs,
    bit_example,
    format_bias,
    plot_bias,
    tied_rows,
  )
  from jax_flashstable.results import write_results

  try:  # split_specs' messages name --attention
    specs = BIAS_ATTENTIONS if args.attention is None else split_specs(args.attention)
  except ValueError as e:
    raise SystemExit(f"flashstable bias: {e}") from None
  try:
    configs = bias_configs(specs)
  except ValueError as e:  # (the default list is valid: a bad value is the user's --attention)
    raise SystemExit(f"flashstable bias: --attention={args.attention!r}: {e}") from None
  ties = {}
  if args.tie_values is not None:
    ties = dict(tie_values=_floats(args.tie_values, "--tie-values", "bias"))
  _out("bias", args.out)
  try:
    inputs = tied_rows(num_rows=args.rows, seed=args.seed, **ties)
  except ValueError as e:
    raise SystemExit(f"flashstable bias: --tie-values: {e}") from None
  rows = bias_benchmark(inputs, configs, seed=args.seed)
  write_results(args.out, "bias", rows, format_bias(rows), _meta(args))
  print(f"plot: {plot_bias(rows, os.path.join(args.out, 'bias.png'))}")
  ex = bit_example()
  print("\nbit example (P̄V tile sum as rounded by each layout, read back from the kernel as O·l):")
  for layout, r in ex.items():
    print(
      f"  {layout:>10}: ties+small {r['ties+small']['pv_sum']:+.6f}, ties alone {r['ties']['pv_sum']:+.6f}"
    )
  return 0


def _crosscheck(args):
  if not pathlib.Path(args.dump).is_file():
    what = "a folder, not a dump file" if pathlib.Path(args.dump).is_dir() else "not found"
    raise SystemExit(f"flashstable crosscheck: dump {args.dump!r} is {what}")
  from pallas_kernels.policy import NUMERICS, check_tile

  _choices("crosscheck", "--numerics", args.numerics, sorted(NUMERICS), single=True)
  for name in ("block_q", "block_k"):
    if getattr(args, name) is not None:
      try:
        check_tile(f"--{name.replace('_', '-')}", getattr(args, name))
      except ValueError as e:
        raise SystemExit(f"flashstable crosscheck: {e}") from None
  _out("crosscheck", args.out)
  from jax_flashstable.lab.crosscheck import dump_call, format_report, recompute
  from jax_flashstable.results import write_results

  try:  # the file, its tensors and attrs, and the call, checked before any computation
    tensors, call = dump_call(
      args.dump,
      numerics=args.numerics,
      stabilize=args.stabilize,
      single_lse=args.single_lse,
      block_q=args.block_q,
      block_k=args.block_k,
    )
  except (ValueError, TypeError) as e:
    raise SystemExit(f"flashstable crosscheck: {e}") from None
  args.single_lse = call["single_lse"]  # the dump's backward unless given: in the report's meta
  report = recompute(tensors, call)
  rows = [dict(tensor=name, **r) for name, r in report.items()]
  write_results(args.out, "crosscheck", rows, format_report(report), _meta(args))
  return 0


def _check_packs(runs: str):
  """--runs: every comma-separated pack a regular file, checked before any is read
  (ValueError naming the first that is not, and why: `instability.pack_problem`)."""
  from jax_flashstable.experiment.instability import pack_paths, pack_problem

  for path in pack_paths(runs):
    if problem := pack_problem(path):
      raise ValueError(f"--runs {path!r}: {problem}")


def _logs(run_dirs, out) -> dict:
  """{metrics.jsonl: (mtime_ns, size)} of every run under out: what `_packed` compares to see
  whether the command wrote a run (a run trained or resumed rewrites its log; the same
  filesystem's clock on both sides)."""
  found = {}
  for d in run_dirs(out):
    f = d / "metrics.jsonl"
    if f.exists():
      st = f.stat()
      found[f] = (st.st_mtime_ns, st.st_size)
  return found


@contextlib.contextmanager
def _packed(args, pack_runs, run_dirs):
  """--pack: every run under --out (`run_dirs`) written into the pack when the command ends,
  and also when it fails once its checks passed (the `armed` flag of what it yields) if it
  wrote a run (a metrics.jsonl new or changed since it started: trained or resumed) or was
  asked to report the runs there (--report-only): a run that failed, a report that refuses,
  and the runs still come back. With --runs only on success (those runs are in their packs
  already). A pack that cannot be written on the way out is one line; the command's own
  error follows."""
  state = argparse.Namespace(armed=False)
  before = _logs(run_dirs, args.out) if args.pack and not args.runs else {}
  try:
    yield state
  except BaseException:
    if args.pack and state.armed and not args.runs:
      try:
        now = _logs(run_dirs, args.out)
        if now and (args.report_only or any(before.get(f) != v for f, v in now.items())):
          print(f"runs packed: {pack_runs(args.out, args.pack)}", file=sys.stderr)
      except Exception as e:  # the command's own error is the one to see
        why = (_message(e).splitlines() or [""])[0]
        print(f"flashstable: runs not packed ({type(e).__name__}: {why})", file=sys.stderr)
    raise
  if args.pack:
    print(f"runs packed: {pack_runs(args.out, args.pack)}")


def _experiment(args):
  from jax_flashstable.experiment import instability as experiment

  if args.recipe not in experiment.RECIPES:
    raise SystemExit(
      f"flashstable experiment: --recipe {args.recipe!r} is unknown; choose from "
      f"{sorted(experiment.RECIPES)}"
    )
  base = _train_config(args, **experiment.RECIPES[args.recipe])
  from jax_flashstable.attention.config import split_specs
  from jax_flashstable.training.train import CheckpointError

  try:
    variants = split_specs(args.variants)
  except ValueError as e:
    raise SystemExit(f"flashstable experiment: {_message(e)}") from None
  seeds = _seeds(args.seeds, "experiment")
  _out("experiment", args.out)
  if args.pack:
    _pack_out("experiment", args.pack, args.out)
  with _packed(args, experiment.pack_runs, experiment.run_dirs) as packing:
    try:
      if args.report_only or args.runs:
        # the report covers every run under --out: --attention and --seeds choose nothing, but a
        # misspelled spec is still an error, not ignored
        for v in variants:
          experiment.variant_attention(v, tiles=args.tiles, layer=args.layer)
      packing.armed = True  # the checks passed: runs are made or reported from here on
      if args.runs:
        _check_packs(args.runs)
        experiment.unpack_runs(args.runs, args.out)
      if args.report_only or args.runs:
        experiment.check_recipe(args.out, base)
        rows = experiment.collect(args.out, base, args.layer, args.reference_max_logit)
        if not rows:
          raise SystemExit(
            f"flashstable experiment: --out {args.out!r} holds no runs to report (folders "
            "VARIANT/seedN with a metrics.jsonl); train them, or give their packs with --runs"
          )
        # the header records what the report covers, not the options' defaults
        args.variants = ",".join(sorted({r["variant"] for r in rows}))
        args.seeds = ",".join(str(s) for s in sorted({r["seed"] for r in rows}))
      else:
        rows = experiment.run_matrix(
          base,
          variants,
          seeds,
          args.out,
          tiles=args.tiles,
          layer=args.layer,
          time_budget=args.time_budget,
          reference_max_logit=args.reference_max_logit,
        )
    except (ValueError, FileNotFoundError, CheckpointError) as e:
      raise SystemExit(f"flashstable experiment: {_message(e)}") from None
    meta = _meta(args) | dict(recipe_name=args.recipe)
    if args.report_only or args.runs:  # the runs' devices, not this machine's
      meta |= dict(report_made_on=meta.pop("device"), device=experiment.trained_on(args.out))
    path = experiment.write_report(args.out, rows, base, args.layer, meta)
    print(path.read_text())
    print(f"report: {path}, curves: {args.out}/curves.png")
    return 0


def _crosscheck_train(args):
  import shlex

  from jax_flashstable.experiment import instability, twin

  if args.recipe not in instability.RECIPES:
    raise SystemExit(
      f"flashstable crosscheck-train: unknown recipe {args.recipe!r}; choose from "
      f"{sorted(instability.RECIPES)}"
    )
  base = _train_config(args, **instability.RECIPES[args.recipe])
  named_seeds = args.seeds is not None
  if not named_seeds:
    args.seeds = "24"  # training's default; a report of runs covers what they hold (below)
  seeds = _seeds(args.seeds, "crosscheck-train")
  _out("crosscheck-train", args.out)
  if args.pack:
    _pack_out("crosscheck-train", args.pack, args.out)
  with _packed(args, twin.pack, twin.run_dirs) as packing:
    report = args.side == "both" or args.report_only or args.runs or args.jax_runs
    try:
      instability.check_layer(base, args.layer)
      twin.check_tolerance(args.tolerance)
      try:
        torch_args = shlex.split(args.torch_args)
      except ValueError as e:  # shlex's "No closing quotation", naming nothing
        raise ValueError(f"--torch-args {args.torch_args!r}: {e}") from None
      twin.check_torch_args(torch_args)
      reporting = (args.report_only or args.runs) and not args.jax_runs
      # a report of runs already made covers every pair they hold unless --pairs names some
      if args.pairs is None and not reporting:
        args.pairs = twin.DEFAULT_PAIRS
      pairs = None if args.pairs is None else twin.parse_pairs(args.pairs)
      packing.armed = True  # the checks passed: runs are made or reported from here on
      if args.jax_runs:  # before anything runs: the JAX side is then done
        twin.take_jax_runs(
          args.jax_runs,
          base,
          pairs,
          seeds,
          args.out,
          tiles=args.tiles,
          layer=args.layer,
          side=args.side,
          null_steps=args.null_steps,
        )
      if args.runs:
        _check_packs(args.runs)
        instability.unpack_runs(args.runs, args.out, rank=twin.rounding_rank)
      elif not args.report_only:
        done = twin.run(
          base,
          pairs,
          seeds,
          args.out,
          side=args.side,
          tiles=args.tiles,
          layer=args.layer,
          time_budget=args.time_budget,
          null_steps=args.null_steps,
          torch_python=args.torch_python,
          torch_gpu=args.torch_gpu,
          torch_args=torch_args,
        )
      if reporting:  # runs made elsewhere, judged by this command's recipe
        instability.check_recipe(pathlib.Path(args.out) / "jax", base)
      named_pairs = pairs is not None
      if pairs is None:  # recorded in the report's header as the pairs it covers
        pairs = twin.pairs_under(args.out)
        args.pairs = ",".join(p.spec for p in pairs)
      result = (
        twin.collect(
          args.out,
          base,
          pairs,
          tiles=args.tiles,
          layer=args.layer,
          tolerance=args.tolerance,
          reference_max_logit=args.reference_max_logit,
        )
        if report
        else None
      )
      if reporting and named_seeds:  # the seeds named: those rows, and each must be there
        missing = sorted(set(seeds) - {r["seed"] for r in result["rows"]})
        if missing and (result["rows"] or not named_pairs):  # else the pairs' error, below
          held = ", ".join(str(s) for s in sorted({r["seed"] for r in result["rows"]})) or "none"
          raise ValueError(
            f"--seeds: no runs of seed {', '.join(map(str, missing))} under {args.out} "
            f"(seeds held: {held})"
          )
        result["rows"] = [r for r in result["rows"] if r["seed"] in seeds]
      if reporting:  # the header records what the report covers; a named pair must be there
        empty = [p.name for p in pairs if not any(r["pair"] == p.name for r in result["rows"])]
        if empty and named_pairs:
          runs = (pathlib.Path(args.out) / "torch").glob("*/seed*")
          held = ", ".join(sorted({r.parent.name for r in runs})) or "none"
          of_seeds = f" at seed {args.seeds}" if named_seeds else ""
          raise ValueError(
            f"--pairs: no runs of {', '.join(empty)}{of_seeds} under {args.out} (twin runs: {held})"
          )
        if empty:  # pairs found under --out, none at the seeds named: not covered
          pairs = [p for p in pairs if p.name not in empty]
          args.pairs = ",".join(p.spec for p in pairs)
        args.seeds = ",".join(str(s) for s in sorted({r["seed"] for r in result["rows"]}))
    except ValueError as e:
      raise SystemExit(f"flashstable crosscheck-train: {_message(e)}") from None
    if result is not None:
      meta = _meta(args) | dict(recipe_name=args.recipe)
      if args.jax_runs:
        meta["jax_runs"] = args.jax_runs
      if args.report_only or args.runs:
        meta["report_made_on"] = meta.pop("device")
      path = twin.write_report(args.out, result, base, args.layer, meta)
      print(path.read_text())
      print(f"report: {path}, curves: {args.out}/twin.png")
    else:
      other = "torch" if args.side == "jax" else "jax"
      print(
        f"{args.side} side done; once the {other} side has run (--side {other}), the report: "
        "the same command with --report-only"
      )
    return 1 if not (args.report_only or args.runs) and done["failed"] else 0


def _bench(args):
  import dataclasses

  import jax

  from jax_flashstable.attention.config import split_specs
  from jax_flashstable.bench import suite, targets
  from jax_flashstable.lab.shapes import Shape

  _out("bench", args.out)
  if args.step_model is not None:
    from jax_flashstable.models.gpt2 import MODEL_PRESETS

    _choices("bench", "--step-model", args.step_model, sorted(MODEL_PRESETS))
  try:
    if args.shapes is not None and not args.shapes.strip():
      raise ValueError(f"--shapes {args.shapes!r}: empty")
    shapes = [Shape.parse(t) for t in args.shapes.split(";")] if args.shapes else None
    distinct(f"--shapes {args.shapes!r}", [s.name for s in shapes or ()])  # "1,64,…,0;…,full"
    if (args.step_model or args.step_batch) and args.targets is None:
      raise ValueError("--step-model and --step-batch set the training step of --targets")
    step = None
    if args.step_model or args.step_batch:
      step = targets.StepSetting.default(jax.default_backend() == "gpu")
      step = dataclasses.replace(
        step, model=args.step_model or step.model, batch_size=args.step_batch or step.batch_size
      )
    return suite.run(
      args.out,
      shapes=shapes,
      names=split_specs(args.names) if args.names is not None else None,
      warmup=args.warmup,
      reps=args.reps,
      pairs=args.overhead_pairs,
      overhead=split_specs(args.overhead, "--overhead") if args.overhead else [],
      paired=split_specs(args.paired, "--paired") if args.paired else [],
      paired_reference=args.paired_reference,
      hashes=args.hashes,
      meta=_meta(args),
      targets=args.targets,
      step=step,
    )
  except ValueError as e:
    raise SystemExit(f"flashstable bench: {e}") from None


def _plot(args):
  run = pathlib.Path(args.run_dir)
  if not (run / "metrics.jsonl").is_file():
    what = (
      "has no metrics.jsonl"
      if run.is_dir()
      else "is a file, not a run folder"
      if run.exists()
      else "not found"
    )
    raise SystemExit(f"flashstable plot: run folder {args.run_dir!r} {what}")
  _out("plot", args.run_dir, "RUN_DIR")
  from jax_flashstable.training.plot import plot_run

  print(f"wrote {plot_run(args.run_dir)}")
  return 0


class _RenamedFlag(argparse.Action):
  """An option's former name: still accepted, with a one-line note naming the new one."""

  def __call__(self, parser, namespace, values, option_string=None):
    print(f"flashstable: {option_string} is now {self.metavar}", file=sys.stderr)
    setattr(namespace, self.dest, values)


def _renamed(p, flag, old, dest=None, **kw):
  """`flag` with `old` kept as a deprecated alias (hidden from --help)."""
  dest = dest or flag.lstrip("-").replace("-", "_")
  p.add_argument(flag, dest=dest, **kw)
  p.add_argument(
    old,
    dest=dest,
    action=_RenamedFlag,
    metavar=flag,
    default=argparse.SUPPRESS,
    help=argparse.SUPPRESS,
  )


def build_parser():
  ap = _Parser(
    prog="flashstable", description="BF16 flash attention numerics, visible and verifiable."
  )
  # required, but checked in `main` after the unknown arguments (`flashstable --bogus` names
  # --bogus rather than the missing command; the same for `experiment`'s name)
  sub = ap.add_subparsers(dest="command", required=False)
  accuracy_help = "flash_attention vs the FP64 golden value on a fixed sweep"
  p = sub.add_parser(
    "accuracy",
    help=accuracy_help,
    description=accuracy_help + " (lab.accuracy.SWEEP: four shapes, causal and not, grouped "
    "heads, odd lengths; without and with stabilize): the output and the three gradients' max "
    "and mean error against FP64, beside standard attention's in the same dtype, each row "
    "passing or failing the rule printed with the report. Writes OUT/accuracy.md and .json.",
  )
  p.add_argument("--dtypes", default="bfloat16", help="comma-separated, e.g. bfloat16,float16")
  p.add_argument(
    "--seed", type=_seed, default=0, help="seed of the random inputs (default %(default)s)"
  )
  p.add_argument(
    "--out", "--out-dir", default="runs/accuracy", help="report folder (default %(default)s)"
  )
  p.set_defaults(func=_accuracy)
  p = sub.add_parser("train", help="train GPT-2 (Flax/Optax) with a per-layer attention choice")
  _add_train_options(p)
  p.set_defaults(func=_train)
  p = sub.add_parser(
    "compare",
    help=COMPARE_HELP,
    description=COMPARE_HELP + ". Writes OUT_DIR/report.md, curves.png and summary.json.",
    epilog="Defaults: the setting's where it sets the field, else TrainConfig's "
    "(compare.SETTINGS: on a GPU the recipe anchor-b128, seed 25; on a CPU the tiny model, "
    "250 steps, batch 4, seed 0; docs/experiments.md).",
  )
  # as experiment's: no --layer-attention (each variant sets every layer's attention) and no
  # --max-seconds (an interrupted run resumes next time), which run_matrix would drop
  # (`instability.check_base`)
  _add_train_options(
    p,
    skip=("attention", "max_seconds"),
    layer_attention=False,
    defaults={"*": "default: the setting's (below)", "out_dir": "runs/compare"},
  )
  p.set_defaults(func=_compare)
  p = sub.add_parser(
    "deviation", help="max/mean |O − O_FP64| of flash vs standard attention (Golden et al. 2024)"
  )
  p.add_argument("--seq-lens", default="128,256,512")
  p.add_argument("--head-dims", default="64")
  p.add_argument("--dtypes", default="bfloat16,float16,float32")
  p.add_argument("--block-ks", default="64")
  _renamed(
    p,
    "--numerics",
    "--layouts",
    default="fa2",
    help="comma-separated precision layouts (pallas_kernels.policy.NUMERICS)",
  )
  p.add_argument("--heads", type=_count(1), default=2)
  p.add_argument("--seed", type=_seed, default=0)
  p.add_argument("--out", "--out-dir", default="runs/deviation")
  p.set_defaults(func=_deviation)
  p = sub.add_parser(
    "bias",
    help="signed error of O and delta on rows with tied maxima, every "
    "layout × stabilize (Qiu & Yao 2025), and the paper's bit example",
  )
  p.add_argument(
    "--attention",
    help="comma-separated flash specs (PRESET[+MODIFIER...][:FIELD=VALUE,...], e.g. "
    "paper+comp+guard:max_shift=6); default: every layout without and with +comp",
  )
  p.add_argument("--rows", type=_count(1), default=512)
  p.add_argument(
    "--tie-values",
    help="comma-separated values of the tied maxima (scores, softmax_scale 1, rounded to bf16), "
    "one per row at random; default: -4,0,2,5 (numerics_lab.tied_rows)",
  )
  p.add_argument("--seed", type=_seed, default=0)
  p.add_argument("--out", "--out-dir", default="runs/bias")
  p.set_defaults(func=_bias)
  p = sub.add_parser(
    "crosscheck",
    help="recompute a tensor dump (e.g. from PyTorch) with our "
    "kernels: %% bit-identical, ulp histogram, max and signed mean error",
  )
  p.add_argument("dump", help=".npz in the format of jax_flashstable/dumpfile.py")
  p.add_argument("--numerics", default="fa2")
  p.add_argument(
    "--stabilize",
    action=argparse.BooleanOptionalAction,
    default=None,
    help="default: the dump's attrs",
  )
  p.add_argument(
    "--single-lse",
    action=argparse.BooleanOptionalAction,
    default=None,
    help="the backward's P from one float32 lse (+lse); default: the dump's attrs, else no",
  )
  p.add_argument("--block-q", type=_count(16), default=None)
  p.add_argument("--block-k", type=_count(16), default=None)
  p.add_argument("--out", "--out-dir", default="runs/crosscheck")
  p.set_defaults(func=_crosscheck)
  p = sub.add_parser(
    "experiment",
    help="the BF16 loss-explosion experiment: attention variants "
    "× seeds on one recipe, resumable, with a report (Qiu & Yao 2025)",
  )
  p.add_argument(  # required: checked in `main`
    "name",
    nargs="?",
    choices=["instability"],
    help="the experiment: instability (each variant trained at each seed on the recipe, then "
    "which exploded, ran away or warned, in OUT/report.md)",
  )
  p.add_argument(
    "--recipe",
    default="anchor",
    help="one of experiment.RECIPES (anchor: GPT 6×384, batch 32; anchor-b128: batch 128, "
    "where the paper layout explodes on an H200; tiny: CPU; the others: anchor's variations); "
    "any training option below overrides it",
  )
  _renamed(
    p,
    "--attention",
    "--variants",
    dest="variants",
    default="paper,paper+comp",
    help="comma-separated variants: attention specs (PRESET[+MODIFIER...][:FIELD=VALUE,...], "
    "e.g. paper, paper+comp, fa2, fa2+delta32+comp, cudnn (GPU only), reference-fp32), or "
    "SPEC@layer (standard attention elsewhere, SPEC in the watched layer)",
  )
  p.add_argument(
    "--seeds", default="0", help="comma-separated seeds (initialisation and data order)"
  )
  p.add_argument(
    "--tiles", type=_count(16), default=512, help="the paper layout's block_q = block_k"
  )
  p.add_argument(
    "--layer",
    type=_count(0),
    default=1,
    help="the watched layer (0-based); the @layer variants use flash there only",
  )
  p.add_argument(
    "--time-budget",
    type=_non_negative,
    default=0.0,
    help="seconds of wall time for this invocation (0: none); unfinished runs "
    "resume from their last checkpoint next time",
  )
  p.add_argument(
    "--reference-max-logit",
    type=_positive,
    default=None,
    help="the FP32 reference's largest watched-layer max logit, measured elsewhere (the "
    "runaway threshold is 10× the largest of it and of the matrix's reference-fp32 runs)",
  )
  p.add_argument(
    "--report-only",
    action="store_true",
    help="train nothing; report every run "
    "folder under --out (e.g. after runs made by several processes)",
  )
  p.add_argument(
    "--runs",
    default=None,
    type=_files,
    help="report the runs of --pack files (comma-separated, e.g. several sessions' packs; "
    "unpacked into --out; a run in several: the one trained furthest), training nothing",
  )
  p.add_argument(
    "--pack",
    default=None,
    type=_file,
    help="write every run folder (no checkpoints) into this one .jsonl.xz file at the end, also "
    "when a run or the report fails (with --runs: on success only)",
  )
  p.add_argument(
    "--out",
    "--out-dir",
    default="runs/instability",
    help="the runs' folder (VARIANT/seedN each), report.md and curves.png (default: %(default)s)",
  )
  _add_train_options(
    p,
    skip=("attention", "seed", "out_dir", "max_seconds"),
    layer_attention=False,
    defaults="default: the recipe's (experiment.RECIPES)",
  )
  p.set_defaults(func=_experiment)
  p = sub.add_parser(
    "crosscheck-train",
    help="the training beside its PyTorch twin "
    "(torch_crosscheck/gpt_twin.py): same weights and batches, per-step loss "
    "difference, outcomes under the experiment's rules; report + PNG",
  )
  p.add_argument(
    "--recipe",
    default="anchor-b128",
    help="one of experiment.RECIPES (tiny: CPU); any training option below overrides it",
  )
  p.add_argument(
    "--pairs",
    default=None,
    help="default: reference-fp32,paper; with --report-only or --runs, every twin attention "
    "the runs hold. Comma-separated twin attentions, each paired with its default JAX partner "
    "(experiment.twin.PAIRS: reference-fp32, paper[+comp][+lse] with the same, "
    "sdpa-cudnn[+center] with cudnn[+center], sdpa-flash[+center] with fa2[+center]), "
    "or TWIN=JAXSPEC; the twin attentions are gpt_twin.py's (paper[+comp][+lse], "
    "reference-fp32, sdpa-flash|efficient|cudnn|math[+center]; efficient and cudnn need CUDA)",
  )
  p.add_argument(
    "--seeds",
    default=None,
    help="comma-separated seeds (initialisation and data order; default 24; with --runs or "
    "--report-only: those the runs hold, or the ones named, which they must hold)",
  )
  p.add_argument(
    "--tiles", type=_count(16), default=512, help="the paper layout's block_q = block_k, both sides"
  )
  p.add_argument(
    "--layer", type=_count(0), default=1, help="the watched layer (0-based; runaway rule)"
  )
  p.add_argument(
    "--reference-max-logit",
    type=_positive,
    default=None,
    help="the FP32 reference's largest watched-layer max logit, measured elsewhere (each "
    "side's runaway threshold is 10× the largest of it and of that side's reference-fp32 runs)",
  )
  p.add_argument(
    "--side",
    choices=["both", "jax", "torch"],
    default="both",
    help="both: JAX in "
    "this process, the twin in subprocesses at the same time; jax / torch: one side "
    "only (e.g. one process per GPU), no report (torch with --jax-runs: the report)",
  )
  p.add_argument(
    "--null-steps",
    type=int,
    default=0,
    help="also run the first N steps of each "
    "JAX run with every batch as two half-batches (the rounding-level baseline)",
  )
  p.add_argument(
    "--tolerance",
    type=float,
    default=2.0**-8,
    help="relative |Δloss| within "
    "which the curves agree (default 2^-8: one bf16 ulp of the loss's scale)",
  )
  p.add_argument(
    "--torch-python",
    default=None,
    help="the twin's interpreter (default "
    "$FLASHSTABLE_TORCH_PYTHON, else .torchvenv/bin/python if present, else this one)",
  )
  p.add_argument(
    "--torch-gpu",
    default=None,
    help="CUDA_VISIBLE_DEVICES of the twin's processes (default: inherited)",
  )
  p.add_argument(
    "--torch-args",
    default="",
    help="how the twin runs: gpt_twin.py train's --device, --compile, --matmul, --threads, "
    "--deterministic, --print-interval, --max-seconds, --checkpoint-interval (e.g. "
    "'--threads 1' or '--compile off'); the others are this command's",
  )
  p.add_argument(
    "--time-budget",
    type=float,
    default=0.0,
    help="seconds of wall time (0: none); "
    "unfinished JAX runs resume from their checkpoint, twin runs start again",
  )
  p.add_argument(
    "--report-only", action="store_true", help="train nothing; report the runs under --out"
  )
  p.add_argument(
    "--runs",
    default=None,
    type=_files,
    help="report the runs of --pack files (comma-separated, e.g. several sessions' packs; "
    "unpacked into --out; a run in several: a twin rounding on the bits before one made with "
    "convert pairs, then the one trained furthest), training nothing",
  )
  p.add_argument(
    "--jax-runs",
    default=None,
    type=_files,
    help="take the JAX runs from `experiment instability --pack` files (comma-separated; "
    "each asked pair and seed must be there, finished, made with these settings) into "
    "--out/jax instead of training them; with --side torch only the twin trains, then the report",
  )
  p.add_argument(
    "--pack",
    default=None,
    type=_file,
    help="write every run (no checkpoints) into this one .jsonl.xz file at the end, also when "
    "a run or the report fails (with --runs: on success only)",
  )
  p.add_argument("--out", "--out-dir", default="runs/twin")
  _add_train_options(
    p,
    skip=("attention", "seed", "out_dir", "max_seconds"),
    layer_attention=False,
    defaults="default: the recipe's (experiment.RECIPES)",
  )
  p.set_defaults(func=_crosscheck_train)
  p = sub.add_parser(
    "bench",
    help="fwd and fwd+bwd TFLOP/s of our kernels (layouts × "
    "compensation) next to cuDNN, XLA and torch SDPA; compensation overhead",
    description="fwd and fwd+bwd TFLOP/s of our kernels (layouts × compensation) next to "
    "cuDNN, XLA and torch SDPA, the compensation's overhead, and with --targets issue 19's "
    "speed targets. Writes OUT/bench.md, bench.json and bench.png (docs/bench.md).",
  )
  p.add_argument(
    "--shapes",
    default=None,
    help="';'-separated batch,len,heads,kv_heads,head_dim,"
    "causal (default: 1k–16k, d64/128, causal and not, GQA on a GPU; small on CPU)",
  )
  _renamed(
    p,
    "--attention",
    "--impls",
    dest="names",
    default=None,
    help="comma-separated: attention specs (PRESET[+MODIFIER...][:FIELD=VALUE,...], e.g. "
    "fa2, paper+comp, fa2+comp+mgpu:block_k=128, xla, cudnn), pallas-mgpu, torch-flash, "
    "torch-cudnn, torch-efficient, torch-math (cudnn, pallas-mgpu: GPU only; torch-*: torch "
    "SDPA where torch is installed, its GPU backends on a GPU)",
  )
  p.add_argument("--warmup", type=_count(0), default=3, help="untimed runs first (default 3)")
  p.add_argument(
    "--reps",
    type=_count(1),
    default=20,
    help="timings of each measurement, their median (default 20)",
  )
  p.add_argument(
    "--overhead-pairs",
    type=_count(0),
    default=20,
    help="interleaved pairs for the compensation overhead (0: skip, but --targets takes at "
    "least 1; default 20)",
  )
  _renamed(
    p,
    "--paired",
    "--paired-impls",
    default="",
    help="comma-separated implementations "
    "whose speed relative to --paired-reference is measured in --overhead-pairs "
    "interleaved pairs on the first shape (a same-moment ratio)",
  )
  p.add_argument(
    "--paired-reference",
    default="cudnn",
    help="the reference of --paired (cudnn: GPU only; on CPU name e.g. xla)",
  )
  _renamed(
    p,
    "--overhead",
    "--overhead-layouts",
    default="fa2",
    help="comma-separated attention "
    "specs of our kernels whose compensation overhead (against SPEC+comp) is measured, "
    "e.g. fa2,fa2+mgpu:block_k=128 ('': none, e.g. for --paired alone)",
  )
  p.add_argument(
    "--hashes",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="record the golden output hashes of every layout",
  )
  p.add_argument(
    "--targets",
    nargs="?",
    const="fa2+comp",
    default=None,
    metavar="SPEC",
    help="judge SPEC (default fa2+comp) against the speed targets (forward ≥ 0.95× "
    "and forward+backward ≥ 0.80× --paired-reference, ahead of pallas-mgpu, "
    "compensation overhead ≤ 3%% / 1%%, training step): shapes default to the "
    "headline b4×4096×16×d128 non-causal and causal on a GPU; a 'targets' table "
    "closes bench.md",
  )
  p.add_argument(
    "--step-model",
    default=None,
    help="with --targets: the training-step model (default gpt2-small on a GPU, tiny on a CPU)",
  )
  p.add_argument(
    "--step-batch",
    type=_count(1),
    default=None,
    help="with --targets: its global batch (default 16 on a GPU, 2 on a CPU)",
  )
  p.add_argument(
    "--out",
    "--out-dir",
    default="runs/bench",
    help="folder for bench.md, .json, .png (default runs/bench)",
  )
  p.set_defaults(func=_bench)
  p = sub.add_parser("plot", help="draw loss, grad norm and diagnostics of a training run")
  p.add_argument("run_dir")
  p.set_defaults(func=_plot)
  p = sub.add_parser("prepare", help="tokenize a folder of text files into train.bin/val.bin")
  p.add_argument("text_dir")
  p.add_argument("out_dir")
  p.add_argument(
    "--val-every", type=_count(1), default=100, help="document i goes to val if i %% N == 0"
  )
  p.set_defaults(func=_prepare)
  return ap


def _chosen_parser(parser, args):
  """The parser of the command args name (`flashstable compare`'s for `compare`; for
  `experiment NAME`, `flashstable experiment`'s: NAME is its positional argument, not a
  parser), the top one when no command was chosen."""
  for dest in ("command", "name"):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or getattr(args, dest, None) not in subs[0].choices:
      break
    parser = subs[0].choices[getattr(args, dest)]
  return parser


def main(argv=None):
  """Runs one command; returns its exit status. User errors raise SystemExit with the one-line
  message (`flashstable <command>: ...`); `console_main` prints it."""
  argv = sys.argv[1:] if argv is None else list(argv)
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv)
  if unknown:  # named by the command that refused them, with that command's help
    before_command = argv[: argv.index(args.command)] if args.command in argv else argv
    refused_by = parser if set(unknown) & set(before_command) else _chosen_parser(parser, args)
    refused_by.error(f"unrecognized arguments: {shlex.join(unknown)}")
  for dest in ("command", "name"):  # required, checked after the unknown arguments
    if getattr(args, dest, "") is None:
      _chosen_parser(parser, args).error(f"the following arguments are required: {dest}")
  args.argv = argv  # the command as typed, for the results' headers (`_meta`)
  if args.command in NUMERICS_COMMANDS:  # kernels against references: XLA CPU's plain dots
    plain_dots()
  if getattr(args, "deterministic", None):  # before any command starts JAX (TrainConfig's)
    deterministic_gpu_ops()
  from jax_flashstable.training.config import ConfigError

  try:
    return args.func(args)
  except ConfigError as e:  # a TrainConfig value, name or path (TrainConfig.validate)
    raise SystemExit(f"flashstable {args.command}: {_message(e)}") from None
  except Exception as e:  # a request larger than the device's memory: a user's size, not a bug
    if type(e).__name__ not in ("JaxRuntimeError", "XlaRuntimeError"):
      raise
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    first = str(e).strip().splitlines()[0][:300]
    raise SystemExit(
      f"flashstable {args.command}: out of memory ({first}); ask for smaller sizes"
    ) from None


def _message(e: Exception) -> str:
  """An error's one line; a TrainConfig's (ConfigError) in the command line's words."""
  from jax_flashstable.training.config import ConfigError

  return _as_options(str(e)) if isinstance(e, ConfigError) else str(e)


def _as_options(text: str) -> str:
  """A TrainConfig error in the words of the command line: FIELD=VALUE → --field-name=VALUE
  (attention_overrides: --layer-attention; model_overrides: --model-set)."""
  import dataclasses

  from jax_flashstable.training.config import TrainConfig

  names = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)}
  names |= {"attention_overrides": "--layer-attention", "model_overrides": "--model-set"}
  fields = "|".join(sorted(names, key=len, reverse=True))
  # at the start or after a space, "(", "," or ";": not inside a path or a quoted value
  return re.sub(rf"(?<![^\s(,;])({fields})(?=[=:])", lambda m: names[m.group(1)], text)


def _one_line_warning(message, category, filename, lineno, line=None):
  """A warning as one line on the console (`warnings.formatwarning`), not its source path and
  line: a user's data or settings warned about, not a bug."""
  return f"flashstable: {category.__name__}: {message}\n"


def console_main(argv=None):
  """The `flashstable` console entry point (and `python -m jax_flashstable.cli`): a user error
  is its one line on stderr and exit status 2; Ctrl-C one line and status 130 (the training
  loop has saved a checkpoint and says how to resume); never a traceback for either. Ctrl-C
  is taken on a thread of its own (`interrupts.take_on_a_thread`), set up before JAX starts."""
  interrupts.take_on_a_thread()
  warnings.formatwarning = _one_line_warning
  try:
    code = main(argv)
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      raise
    print(e.code, file=sys.stderr)
    code = 2
  except KeyboardInterrupt as e:
    print(f"flashstable: {e}" if str(e) else "flashstable: interrupted", file=sys.stderr)
    code = 130
  sys.exit(code)


if __name__ == "__main__":
  console_main()
