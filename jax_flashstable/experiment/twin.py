"""`flashstable crosscheck-train`: the JAX training beside its PyTorch twin
(`torch_crosscheck/gpt_twin.py`), run from the same initial weights on the same batches, with a
report of where the two loss curves part and of each run's outcome under the instability
experiment's rules.

A pair is a twin attention and the JAX attention it is compared with (`PAIRS`: exact twins —
the same rounding points — for reference-fp32 and paper, paper+comp, paper+lse,
paper+comp+lse, whose backwards form P as JAX's: from m and log l apart, or with +lse from one
float32 lse; the nearest production numerics for the SDPA backends: sdpa-flash ↔ fa2,
sdpa-cudnn ↔ cudnn, and with their backward at centred keys sdpa-flash+center ↔ fa2+center,
sdpa-cudnn+center ↔ cudnn+center). Per pair and seed:

  OUT/init/seed<k>.npz            the JAX run's initial parameters (`train.init_state`) in the
                                  twin's .npz layout (`export_init`; the layout is documented
                                  once, in gpt_twin.py's docstring)
  OUT/jax/<variant>/seed<k>/      the JAX run, through `instability.run_matrix` (its
                                  checkpoints, resumption and refusal of changed settings), or
                                  taken as it is from the instability experiment's packs
                                  (`take_jax_runs`, --jax-runs: the same run, not trained again)
  OUT/torch/<attention>/seed<k>/  the twin, a subprocess: it checkpoints every
                                  checkpoint_interval steps and stops with a checkpoint 30 s
                                  before the time budget ends (--max-seconds); the next call
                                  resumes it (gpt_twin.py, `read_checkpoint`)
  OUT/null/<variant>/seed<k>/     (null_steps > 0) the JAX run again with every batch fed as two
                                  half-batches (`HalvedBatches`): the same weights, data and
                                  arithmetic but for where the batch sums are split and rounded —
                                  how fast JAX parts from itself under a rounding-level change
  OUT/report.md, report.json, twin.png

Both sides write metrics.jsonl, diagnostics.jsonl and summary.json, so `instability.collect`
reads each side with the same rules: explosion (trailing-10 mean loss > 2× its running
minimum after warmup, or non-finite) and runaway (the watched layer's max logit above 10× the
largest of that side's own reference-fp32 runs; none without such runs, and the report says
so). A run is done once its summary.json exists; repeating the command skips it.

Tolerance
---------
Two loss curves agree at a step when |loss_torch − loss_jax| ≤ τ·|loss_jax|, τ = `TOLERANCE` =
2⁻⁸: the spacing of bfloat16 numbers relative to the value (one ulp of a bf16 number in [2^e,
2^(e+1)) is 2^(e−7), i.e. 2⁻⁸ to 2⁻⁷ of it), so curves within τ are one curve at the precision
the model computes its matmuls in. Measured on CPU (tiny recipe, batch 4, 100 steps,
reference-fp32 and paper, `experiments/results/cpu-2026-12-01-twin/`): while the two runs share
their rounding history the twin sits at 2.7e-7 of the loss at steps 1–2 (the same weights: lr(0)
= 0), at a median 2.2–2.6e-6 over steps 1–10 and 1.5–1.6e-5 over 11–30, below 1e-3 to step 47–48
— as JAX does against itself with each batch in two halves (the null: medians 3.3–3.8e-6 and
1.2e-5, below 1e-3 to step 46–49) — and both part from JAX where one run takes a gradient-norm
spike that the other does not (steps 50–51: the twin's 4.9 and 14.1 where JAX has 1.25 and
0.66): the twin crosses τ at step 51 (reference) and 50 (paper), the null at 52 and 53; past
that both sit at a median 0.6–1.5e-3 with excursions above τ. τ is thus crossed only where
training itself amplifies the rounding differences (Adam turns gradient entries that differ by a
bf16 ulp into parameter differences of order lr; a spike or a clipping decision turns those into
different trajectories): every pair of runs, JAX against itself included, parts at some step,
and the report gives that step for the twin and, with --null-steps, for the JAX null beside it,
with the divergence per window of steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from jax_flashstable import interrupts
from jax_flashstable.checks import distinct, integer, random_seed
from jax_flashstable.experiment import instability
from jax_flashstable.results import format_facts, format_meta
from jax_flashstable.training.config import ConfigError, overrides_text
from jax_flashstable.training.train import (
  NonFiniteError,
  TrainConfig,
  config_changes,
  describe_changes,
  read_metrics,
  stored_values,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TWIN_SCRIPT = ROOT / "torch_crosscheck" / "gpt_twin.py"
# gpt_twin.ATTENTIONS (gpt_twin imports torch, so it is not imported here; a test keeps the two
# equal)
SDPA_ATTENTIONS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
TWIN_ATTENTIONS = (
  "paper",
  "paper+comp",
  "paper+lse",
  "paper+comp+lse",
  "reference-fp32",
  *SDPA_ATTENTIONS,
  *(f"{a}+center" for a in SDPA_ATTENTIONS),  # each backend with its backward at centred keys
)
# twin attention → the JAX variant it is compared with by default
PAIRS = {
  "reference-fp32": "reference-fp32",
  "paper": "paper",
  "paper+comp": "paper+comp",
  "paper+lse": "paper+lse",
  "paper+comp+lse": "paper+comp+lse",
  "sdpa-cudnn": "cudnn",
  "sdpa-flash": "fa2",
  "sdpa-cudnn+center": "cudnn+center",
  "sdpa-flash+center": "fa2+center",
}
# twins with JAX's own rounding points (the paper ones in the backward too: P from m and log l
# apart, or with +lse from one float32 lse, as JAX's single_lse)
EXACT = ("reference-fp32", "paper", "paper+comp", "paper+lse", "paper+comp+lse")
TOLERANCE = 2.0**-8
WINDOW = 100  # the agreement window: the first WINDOW steps
PROFILE = ((1, 10), (11, 30), (31, 100), (101, 300), (301, 1000), (1001, 3000), (3001, 10**9))
# the report's windows of the watched layer's dQ error (after warmup, before and after the
# runaways of the paper layout's JAX runs, 800–1,900 at anchor-b128)
DQ_WINDOWS = ((201, 500), (501, 1000), (1001, 3000))
SIDES = ("both", "jax", "torch")
SIDE_DIRS = ("jax", "torch", "null")
EXIT_NON_FINITE = 3  # gpt_twin's exit status for a non-finite loss


# --- the initial parameters in the twin's layout ---------------------------------------------


def params_arrays(params) -> dict[str, np.ndarray]:
  """{key: float32 array} of a GPT's parameters (an `nnx.Module` or its `nnx.Param` state) in
  the twin's .npz layout (gpt_twin.py's docstring: the nnx path joined with ".", the
  ".embedding" of wte/wpe dropped, JAX orientation)."""
  from flax import nnx

  state = nnx.state(params, nnx.Param) if isinstance(params, nnx.Module) else params
  return {
    ".".join(map(str, path)).removesuffix(".embedding"): np.asarray(v[...], np.float32)
    for path, v in nnx.to_flat_state(state)
  }


def export_params(params, path) -> dict[str, np.ndarray]:
  """Writes `params_arrays(params)` to the .npz `path` (atomically: a temporary file renamed,
  so a reader never sees half a file); returns the arrays."""
  arrays = params_arrays(params)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
  np.savez(tmp, **arrays)
  tmp.replace(path)
  return arrays


def export_init(cfg: TrainConfig, path) -> dict[str, np.ndarray]:
  """The initial parameters of `cfg`'s run (`train.init_state(cfg)`: they depend on the model
  and the seed only) written to `path` in the twin's layout; returns them. float32; anchor
  (gpt-6l): 39 arrays, 30.0 M parameters, 120 MB."""
  from jax_flashstable.training.train import init_state

  return export_params(init_state(cfg)[2], path)


# --- pairs and the twin's configuration --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pair:
  """A twin attention (`TWIN_ATTENTIONS`) and the JAX variant (instability's grammar) it is
  compared with."""

  torch: str
  jax: str

  @property
  def name(self) -> str:
    return f"{self.torch} ↔ {self.jax}"

  @property
  def spec(self) -> str:
    """The pair as `parse_pairs` reads it: A with A's default JAX partner, else A=SPEC."""
    return self.torch if PAIRS.get(self.torch) == self.jax else f"{self.torch}={self.jax}"


def parse_pairs(text: str) -> list[Pair]:
  """ "A,B=SPEC,…" → pairs: an item A (a twin attention) is paired with PAIRS[A]; A=SPEC with
  the JAX variant SPEC (whose own FIELD=VALUE items may follow, as in
  "sdpa-math=paper:block_q=64,block_k=64"). Raises ValueError naming the item, or the pair
  given twice."""
  pairs: list[list[str]] = []
  for item in (text or "").split(","):
    if not item and text:
      raise ValueError(f"pairs {text!r}: an empty item (two commas, or one at an end)")
    head, eq, rest = item.partition("=")
    if head in TWIN_ATTENTIONS:
      if not eq and head not in PAIRS:
        raise ValueError(f"pair {item!r}: {head} has no default JAX partner; write {head}=SPEC")
      pairs.append([head, rest if eq else PAIRS[head]])
    elif eq and pairs and item:
      pairs[-1][1] += "," + item  # a FIELD=VALUE of the JAX spec
    elif item:
      raise ValueError(
        f"pair {item!r}: {head!r} is not a twin attention ({', '.join(TWIN_ATTENTIONS)})"
      )
  if not pairs:
    raise ValueError(f"no pairs in {text!r}; e.g. {','.join(PAIRS)}")
  for t, j in pairs:
    if not j:
      raise ValueError(f"pair {t}=: the JAX variant is empty")
  found = [Pair(t, j) for t, j in pairs]
  distinct(f"pairs {text!r}", [p.spec for p in found])
  return found


DEFAULT_PAIRS = "reference-fp32,paper"  # crosscheck-train's --pairs when it trains


def pairs_held(text: str, out_dir) -> str:
  """The pairs of `text` (`parse_pairs`' grammar) with a run under out_dir, as `parse_pairs`
  reads them, comma-separated; "" when none: a pair whose JAX side has a run folder
  (OUT/jax/SPEC), or whose twin has one (OUT/torch/A) when SPEC is A's default partner (the
  twin's folder is shared by every pair of A, so A=SPEC needs its own JAX run). What a report
  of a queue's folder can name: an item its budget left unstarted has no run, and a report
  naming it refuses. Raises ValueError for bad pairs (`parse_pairs`)."""
  out = pathlib.Path(out_dir)

  def held(p: Pair) -> bool:
    own_twin = PAIRS.get(p.torch) == p.jax and (out / "torch" / p.torch).is_dir()
    return own_twin or (out / "jax" / p.jax).is_dir()

  return ",".join(p.spec for p in parse_pairs(text) if held(p))


def pairs_under(out_dir) -> list[Pair]:
  """The pairs of the twin runs under out_dir (OUT/torch/<attention>/), each with its default
  JAX partner (`PAIRS`), in `TWIN_ATTENTIONS` order: what a report of packed runs covers when
  no pairs are named (runs made as A=SPEC, with another JAX partner, need --pairs A=SPEC: the
  twin's folder does not say which). Raises ValueError when there is no twin run, or a twin
  attention with no default partner (naming it: its pair must be named as A=SPEC)."""
  root = pathlib.Path(out_dir) / "torch"
  found = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
  if not found:
    raise ValueError(
      f"no twin runs under {out_dir} (has the torch side run?); name the pairs with --pairs"
    )
  alone = sorted(a for a in found if a not in PAIRS)
  if alone:
    raise ValueError(
      f"twin runs of {', '.join(alone)} under {out_dir}, which have no default JAX partner; "
      "name the pairs with --pairs (A=SPEC)"
    )
  return [Pair(a, PAIRS[a]) for a in TWIN_ATTENTIONS if a in found]


def twin_attention_config(attention: str, tiles: int, beta=2.0, tie_tolerance=1e-3):
  """The `AttentionConfig` with the twin attention's numerics, or None (an SDPA backend): a
  paper twin "paper[+comp][+lse]" is JAX's paper layout with those modifiers (the grammar's:
  +comp the compensation, with `beta` and `tie_tolerance`; +lse single_lse) and `tiles`."""
  from jax_flashstable.attention.config import MODIFIERS, AttentionConfig

  if attention == "reference-fp32":
    return AttentionConfig.parse("reference-fp32")
  name, *mods = attention.split("+")
  if name != "paper" or attention not in TWIN_ATTENTIONS:
    return None
  kw = {k: v for m in mods for k, v in MODIFIERS[m].items()}
  if kw.get("stabilize"):
    kw.update(beta=beta, tie_tolerance=tie_tolerance)
  return AttentionConfig(numerics="paper", block_q=tiles, block_k=tiles, **kw)


def twin_jax_spec(attention: str, tiles: int, beta=2.0, tie_tolerance=1e-3) -> str | None:
  """The JAX spec with the twin attention's numerics, `twin_attention_config`'s name (gpt_twin's
  `AttentionChoice.jax_spec` spells the same; a test keeps the two equal)."""
  cfg = twin_attention_config(attention, tiles, beta, tie_tolerance)
  return None if cfg is None else cfg.name


def is_exact(pair: Pair, tiles: int) -> bool:
  """Whether the pair's JAX variant has exactly the twin attention's numerics (whichever
  kernels run them: the backends share the rounding points)."""
  from jax_flashstable.attention.config import AttentionConfig

  if pair.torch not in EXACT:
    return False
  jax_cfg = AttentionConfig.parse(instability.variant_attention(pair.jax, tiles=tiles)[0])
  twin_cfg = twin_attention_config(pair.torch, tiles, jax_cfg.beta, jax_cfg.tie_tolerance)
  return dataclasses.replace(twin_cfg, backend=jax_cfg.backend) == jax_cfg


def twin_stabilizes(attention: str) -> bool:
  """Whether the twin attention has the compensation (its beta and tie_tolerance matter)."""
  cfg = twin_attention_config(attention, 64)
  return cfg is not None and cfg.stabilize


def twin_fields(cfg: TrainConfig, attention: str, tiles: int) -> dict:
  """The twin's `TwinConfig` fields that decide its trajectory, from the JAX run's config:
  model shape, optimizer, schedule, data order, evaluation, diagnostics and the stop rule.
  Raises ValueError for what the twin cannot mirror (naming it)."""
  from jax_flashstable.attention.config import AttentionConfig
  from jax_flashstable.training.data import resolve_data_dir

  m = cfg.model_config()
  if m.compute_dtype != "bfloat16":
    raise ValueError(
      f"compute_dtype={m.compute_dtype!r}: the twin computes its matmuls in bfloat16 only"
    )
  if cfg.attention_overrides:
    raise ValueError(
      f"{overrides_text('attention_overrides', cfg.attention_overrides)}: the twin uses one "
      "attention in every layer"
    )
  if cfg.data_parallel:
    raise ValueError("data_parallel=True: the twin trains on one device")
  for f, low in (
    ("steps", 1),
    ("batch_size", 1),
    ("grad_accum", 1),
    ("eval_batches", 1),
    ("eval_interval", 0),
    ("diag_interval", 0),
    ("diag_rows", 0),
    ("stop_after_explosion", -1),
  ):
    if getattr(cfg, f) < low:  # what gpt_twin would refuse, refused here first
      raise ValueError(f"{f} must be >= {low}, got {f}={getattr(cfg, f)}")
  att = AttentionConfig.parse(cfg.attention)
  try:
    data = None if cfg.data is None else str(resolve_data_dir(cfg.data))
  except FileNotFoundError as e:  # a missing folder: one line, as TrainConfig.validate's
    raise ValueError(str(e)) from None
  stabilizes = twin_stabilizes(attention)
  fields = dict(
    data=data,
    attention=attention,
    block_q=tiles,
    block_k=tiles,
    beta=att.beta if stabilizes else 2.0,
    tie_tolerance=att.tie_tolerance if stabilizes else 1e-3,
    n_layer=m.n_layer,
    n_head=m.n_head,
    n_embd=m.n_embd,
    block_size=m.block_size,
    vocab_size=m.vocab_size,
    bias=m.bias,
  )
  for f in (
    "steps",
    *instability.SCHEDULE_FIELDS,
    "seed",
    "eval_interval",
    "eval_batches",
    "diag_interval",
    "diag_rows",
    "stop_after_explosion",
    "checkpoint_interval",
  ):
    fields[f] = getattr(cfg, f)
  return fields


# fields of a stored twin run that may differ from a new request (they do not decide the
# trajectory, or, like the data and init paths, name the same thing from elsewhere)
_TWIN_FREE = frozenset(
  (
    "init",
    "data",
    "out_dir",
    "print_interval",
    "threads",
    "device",
    "compile",
    "save_final",
    "stop_after_explosion",
    "deterministic",
    "checkpoint_interval",
    "max_seconds",
  )
)


def twin_changes(run_dir, fields: dict, resuming=False) -> dict:
  """{field: (stored, new)} for each trajectory field of the twin run stored in run_dir that
  `fields` would change ({} when nothing is stored); `steps` may change when decay_steps is
  fixed (as `train.config_changes`). resuming: the run is to go on from its checkpoint, whose
  stop rule must stay too (gpt_twin.py's RESUME_FREE)."""
  path = pathlib.Path(run_dir) / "config.json"
  if not path.exists():
    return {}
  old = json.loads(path.read_text()).get("train", {})
  free = set(_TWIN_FREE) - ({"stop_after_explosion"} if resuming else set())
  if old.get("decay_steps") is not None and fields.get("decay_steps") is not None:
    free.add("steps")
  return {k: (old[k], v) for k, v in fields.items() if k not in free and k in old and old[k] != v}


def twin_command(python: str, fields: dict, init, out_dir, extra=()) -> list[str]:
  """The `gpt_twin.py train` command line for `fields` (`twin_fields`)."""
  cmd = [python, str(TWIN_SCRIPT), "train", "--init", str(init), "--out", str(out_dir)]
  for k, v in fields.items():
    if k == "data" and v is None:
      continue  # the twin's default: the same sample
    text = "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    cmd += ["--" + k.replace("_", "-"), text]
  return cmd + list(extra)


def default_torch_python() -> str:
  """$FLASHSTABLE_TORCH_PYTHON, else .torchvenv/bin/python under the repository root if it
  exists, else this interpreter (the GPU image has torch beside JAX)."""
  if os.environ.get("FLASHSTABLE_TORCH_PYTHON"):
    return os.environ["FLASHSTABLE_TORCH_PYTHON"]
  venv = ROOT / ".torchvenv" / "bin" / "python"
  return str(venv) if venv.exists() else sys.executable


def resolve_python(python: str) -> str:
  """`python` as a path: a bare name ("python3") is looked up on PATH. Raises ValueError
  naming it when there is no such file."""
  import shutil

  found = python if os.sep in python else shutil.which(python)
  if not found or not pathlib.Path(found).exists():
    raise ValueError(f"--torch-python {python!r}: no such file")
  return found


def check_torch_python(python: str, env: dict | None = None) -> tuple[str, bool]:
  """torch's version in `python` (a path or a name on PATH) and whether it sees a CUDA device
  under `env` (None: this process's environment). Raises ValueError naming the interpreter if
  it cannot run or cannot import torch."""
  python = resolve_python(python)
  try:
    with interrupts.unblocked():
      proc = subprocess.run(
        [
          python,
          "-c",
          f"import torch; print({TORCH_MARK!r}, torch.__version__, torch.cuda.is_available())",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
      )
  except OSError as e:
    raise ValueError(f"the twin's interpreter {python!r} does not run: {e}") from None
  if proc.returncode:
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    raise ValueError(
      f"the twin's interpreter {python!r} cannot import torch: {last} (it is --torch-python, "
      "else $FLASHSTABLE_TORCH_PYTHON, else .torchvenv/bin/python, which `bash scripts/setup.sh "
      "test` makes, else this one)"
    )
  found = [line.split() for line in proc.stdout.splitlines() if line.startswith(TORCH_MARK + " ")]
  if not found or len(found[-1]) != 3:
    raise ValueError(
      f"--torch-python {python!r} printed no torch version: {proc.stdout.strip()[-200:]!r}"
    )
  _, version, cuda = found[-1]
  return version, cuda == "True"


TORCH_MARK = "flashstable-torch:"  # the line of check_torch_python's probe among torch's output


# gpt_twin.CUDA_ONLY: the SDPA backends torch has on CUDA only (a test keeps the two equal)
CUDA_ONLY = tuple(
  a for a in TWIN_ATTENTIONS if a.removesuffix("+center") in ("sdpa-efficient", "sdpa-cudnn")
)


def _positive(v: str) -> bool:
  try:
    return math.isfinite(float(v)) and float(v) > 0
  except ValueError:
    return False


# --torch-args: how the twin runs, not what it trains (every other gpt_twin.py train option is
# crosscheck-train's, from the recipe and --pairs, and the report would call a changed run
# exact); each with a check of its value as gpt_twin.py's parser would make it
TORCH_ARGS = {
  "device": lambda v: v in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", v) is not None,
  "compile": lambda v: v in ("auto", "on", "off", "attention"),
  "matmul": lambda v: v in ("auto", "bf16", "emulated"),
  "threads": lambda v: v.isdigit(),
  "deterministic": lambda v: v in ("true", "false"),
  "print-interval": lambda v: v.isdigit(),
  "max-seconds": _positive,  # a stop that the same command resumes, bit for bit
  "checkpoint-interval": lambda v: v.isdigit(),
}


class _TorchArgsParser(argparse.ArgumentParser):
  def error(self, message):  # e.g. an ambiguous abbreviation: one line, no exit
    raise ValueError(message)


def check_torch_args(torch_args) -> dict[str, str]:
  """`torch_args` (a split --torch-args) read as gpt_twin.py's parser reads them (--name value,
  --name=value, an unambiguous abbreviation, the last one winning; --deterministic alone is
  true): {option: value} of the `TORCH_ARGS` options given. ValueError in one line for any
  other option or a value gpt_twin.py would refuse, so that a bad one fails before anything
  trains, not after the JAX side."""
  args = list(torch_args)
  said = f"--torch-args {shlex.join(args)!r}"
  parser = _TorchArgsParser(add_help=False)
  for key in TORCH_ARGS:  # every value kept, so that each is checked
    const = "true" if key == "deterministic" else ""
    parser.add_argument("--" + key, dest=key, action="append", nargs="?", const=const)
  try:
    given, unknown = parser.parse_known_args(args)
  except ValueError as e:
    raise ValueError(f"{said}: {e}") from None
  if unknown:
    raise ValueError(
      f"{said}: {unknown[0]!r} is not one of the options crosscheck-train passes on "
      f"({', '.join('--' + k for k in TORCH_ARGS)}); the rest are its own"
    )
  for key, values in vars(given).items():
    for value in values or ():
      if not TORCH_ARGS[key](value):
        raise ValueError(f"{said}: --{key} {value!r} is not a value it takes")
  return {key: values[-1] for key, values in vars(given).items() if values}


def check_twin_device(attentions, python, cuda: bool, torch_args=(), visible=None):
  """ValueError naming the twin attentions that need CUDA when the twin will run without it
  (torch in `python` sees no CUDA device, under CUDA_VISIBLE_DEVICES=`visible` if given, or
  torch_args ask for `--device cpu`, read as gpt_twin's parser reads it: `check_torch_args`),
  so that a command fails before it trains anything rather than after the JAX side's runs."""
  forced = check_torch_args(torch_args).get("device", "auto")
  if cuda and forced != "cpu":
    return
  need = [a for a in dict.fromkeys(attentions) if a in CUDA_ONLY]
  if not need:
    return
  if forced == "cpu":
    where = "--torch-args ask for --device cpu"
  else:
    where = f"torch in {python} sees no CUDA device"
    if visible is not None:
      where += f" with CUDA_VISIBLE_DEVICES={visible!r}"
  kind = "these backends" if len(need) > 1 else "this backend"
  raise ValueError(f"--pairs {','.join(need)}: torch's SDPA has {kind} on CUDA only, and {where}")


# --- the null: JAX with every batch as two half-batches ---------------------------------------


class HalvedBatches:
  """A `Dataset` whose training batches are another's, each fed as two half-batches: for a run
  with batch_size B/2 and grad_accum 2·g, micro-batch j of step s is half j % 2 of the
  original's micro-batch j // 2 (`Dataset.batch("train", seed, s·g + j // 2, B, …)`); the same
  sequences in the same steps. Validation batches are the original's, full size."""

  def __init__(self, data, grad_accum: int = 1):
    self.data, self.grad_accum, self.folder = data, grad_accum, data.folder
    self.train, self.val = data.train, data.val
    self._last = None

  def batch(self, split, seed, step, batch_size, seq_len):
    if split != "train":
      return self.data.batch(split, seed, step, 2 * batch_size, seq_len)
    step_, j = divmod(step, 2 * self.grad_accum)
    key = (seed, step_ * self.grad_accum + j // 2, 2 * batch_size, seq_len)
    if self._last is None or self._last[0] != key:
      self._last = (key, self.data.batch("train", *key))
    x, y = self._last[1]
    half = slice((j % 2) * batch_size, (j % 2 + 1) * batch_size)
    return x[half], y[half]


def null_config(cfg: TrainConfig, steps: int, out_dir) -> TrainConfig:
  """`cfg` with the batch in two halves (batch_size / 2, grad_accum × 2), capped at `steps`
  with the same schedule, without diagnostics, checkpoints or early warning. Raises ValueError
  for an odd batch_size."""
  if cfg.batch_size % 2:
    raise ValueError(
      f"batch_size={cfg.batch_size} is odd: the null run splits each batch in two halves"
    )
  return dataclasses.replace(
    cfg,
    steps=min(steps, cfg.steps),
    decay_steps=cfg.decay_steps or cfg.steps,
    batch_size=cfg.batch_size // 2,
    grad_accum=2 * cfg.grad_accum,
    diag_interval=0,
    checkpoint_interval=0,
    warning_action="off",
    out_dir=str(out_dir),
  )


# --- running both sides --------------------------------------------------------------------


@dataclasses.dataclass
class _Item:
  pair: Pair
  seed: int
  cfg: TrainConfig  # the JAX run
  fields: dict  # the twin's


def _done(run_dir) -> bool:
  return (pathlib.Path(run_dir) / "summary.json").exists()


def plan(
  base: TrainConfig, pairs, seeds, out_dir, *, tiles=512, layer=1, null_steps=0, side="both"
) -> list[_Item]:
  """The (pair, seed) items, every setting checked before anything runs. Raises ValueError
  naming a bad pair, seed, setting, or a stored run made with other settings."""
  if side not in SIDES:
    raise ValueError(f"side={side!r} is not one of {', '.join(SIDES)}")
  null_steps = integer("null_steps", null_steps, 0)
  if null_steps > base.steps:  # the null is the JAX run again: no longer than it
    raise ValueError(f"null_steps={null_steps} is more than the runs' steps={base.steps}")
  if not seeds:
    raise ValueError("no seeds")
  for s in seeds:
    if random_seed("seed", s) >= 2**31:
      raise ValueError(f"seed={s!r} must be below 2^31")
  out = pathlib.Path(out_dir)
  items = []
  for pair in pairs:
    if pair.jax.endswith(instability.LAYER_SUFFIX):
      raise ValueError(
        f"pair {pair.name}: {pair.jax} keeps standard attention outside layer "
        f"{layer}; the twin uses one attention in every layer"
      )
    for seed in seeds:
      cfg = instability.variant_config(
        base, pair.jax, seed, out / "jax" / pair.jax / f"seed{seed}", tiles=tiles, layer=layer
      )
      try:
        fields = twin_fields(cfg, pair.torch, tiles)
      except ValueError as e:
        raise ValueError(f"pair {pair.name}: {e}") from None
      items.append(_Item(pair, seed, cfg, fields))
  for it in items:
    jax_dir = pathlib.Path(it.cfg.out_dir)
    torch_dir = out / "torch" / it.pair.torch / f"seed{it.seed}"
    checks = []
    if side != "torch" and not _done(jax_dir):  # to train: as run_matrix will, before the
      try:  # twin's runs start beside it
        it.cfg.validate()
      except ConfigError as e:
        raise ConfigError(f"pair {it.pair.name}: {e}") from None
      checks.append(
        (
          jax_dir,
          config_changes(jax_dir, it.cfg)
          if _done(jax_dir) or (jax_dir / "checkpoints").exists()
          else {},
        )
      )
      if null_steps:
        null_dir = out / "null" / it.pair.jax / f"seed{it.seed}"
        ncfg = null_config(it.cfg, null_steps, null_dir)
        checks.append((null_dir, config_changes(null_dir, ncfg) if _done(null_dir) else {}))
    if side != "jax":
      done, cut = _done(torch_dir), twin_checkpoint_step(torch_dir)  # a cut run resumes
      changes = twin_changes(torch_dir, it.fields, resuming=not done) if done or cut else {}
      checks.append((torch_dir, changes))
    for run_dir, changes in checks:
      if changes:
        raise ValueError(
          f"{run_dir} was run with another configuration "
          f"({describe_changes(changes)}); use another --out (or delete the run)"
        )
  return items


# --- the JAX side taken from the instability experiment's packs --------------------------------

# Settings a resumed run may change (`train.RESUMABLE_FIELDS`, and `steps` where decay_steps
# fixes the cosine) that decide where a finished run ended: a run taken for the twin has them
# as this command's JAX run would. The other free ones (out_dir, max_seconds, progress,
# checkpoint_interval, deterministic) decide where it lives, when it was cut, what it saved and
# the order of a GPU's float sums, not its steps.
REUSE_STRICT = ("steps", "stop_after_explosion", "warning_action", "warning_rule", "warning_layer")


def reuse_changes(run_dir, cfg: TrainConfig) -> dict:
  """{field: (stored, new)} for each setting in which the run stored in run_dir is not the run
  `cfg` would make: `train.config_changes` (every TrainConfig field but `RESUMABLE_FIELDS`;
  attention specs as the configs they name) and `REUSE_STRICT`, compared as they are."""
  changes = config_changes(run_dir, cfg)
  old = json.loads((pathlib.Path(run_dir) / "config.json").read_text()).get("train", {})
  new = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
  for k in REUSE_STRICT:
    if k in old and old[k] != new[k]:
      changes[k] = (old[k], new[k])
  return changes


def _held(found) -> str:
  """'paper 24, 25; fa2 21' of `instability.read_packs`' runs."""
  by = {}
  for run in found:
    variant, _, seed = run.rpartition("/seed")
    by.setdefault(variant, []).append(int(seed) if seed.isdigit() else seed)
  return "; ".join(f"{v} {', '.join(map(str, sorted(s)))}" for v, s in sorted(by.items())) or "none"


def _same_files(a: pathlib.Path, b: pathlib.Path) -> bool:
  read = lambda d, n: (d / n).read_bytes() if (d / n).exists() else None
  return all(read(a, n) == read(b, n) for n in instability.RUN_FILES)


def take_jax_runs(
  packs, base: TrainConfig, pairs, seeds, out_dir, *, tiles=512, layer=1, log=print, **plan_args
) -> list[str]:
  """The JAX run of every (pair, seed) taken from `instability.pack_runs` files (`flashstable
  experiment instability --pack`; several: the run trained furthest, `instability.read_packs`)
  into OUT/jax/<variant>/seed<k>/, so that the JAX side finds it done and only the twin trains.
  Each run must be in the packs, finished (summary.json) and made with the settings this
  command's JAX run has (`reuse_changes`: its TrainConfig but for out_dir, max_seconds, progress,
  checkpoint_interval and deterministic); then it is that run, and the twin starts from its initial
  parameters (`export_init`: they depend on the model and the seed only). A run already in
  OUT/jax is kept if it is the pack's (the same files) and refused otherwise. `plan_args`
  (side, null_steps) go to `plan`, which checks the request first. Returns the runs taken
  ("variant/seedK").

  Raises ValueError, one line naming the pack, the run and the setting, before anything is
  written: a pack missing or unreadable, a (pair, seed) it does not hold, a run unfinished or
  made with other settings (another recipe, steps, tiles, data, …)."""
  import shutil
  import tempfile

  items = plan(base, pairs, seeds, out_dir, tiles=tiles, layer=layer, **plan_args)
  names = ",".join(map(str, instability.pack_paths(packs)))
  try:
    found = instability.read_packs(packs)
  except (FileNotFoundError, ValueError) as e:  # one line naming the pack (read_packs)
    raise ValueError(f"--jax-runs: {e}") from None
  out = pathlib.Path(out_dir)
  wanted = {f"{it.pair.jax}/seed{it.seed}": it for it in items}
  with tempfile.TemporaryDirectory(prefix="jax-runs-") as tmp:
    for run, it in wanted.items():
      what = f"{it.pair.jax} seed {it.seed}"
      if run not in found:
        if any(k.startswith(("jax/", "torch/")) for k in found):  # crosscheck-train's own pack
          raise ValueError(
            f"--jax-runs {names}: a crosscheck-train pack (its runs under jax/ and torch/), "
            "not `experiment instability --pack` files: report it with --runs, or unpack it "
            "into --out (h200_twin.sh PREVIOUS)"
          )
        raise ValueError(
          f"--jax-runs {names}: no run {what} (for the pair {it.pair.name}); the packs hold "
          f"{_held(found)}"
        )
      r = found[run]
      folder = instability.write_run(r["records"], pathlib.Path(tmp) / run)
      if not (folder / "config.json").exists() or not (folder / "summary.json").exists():
        raise ValueError(
          f"--jax-runs {r['pack']}: {what} is unfinished ({r['steps']} steps, no "
          f"{'summary' if (folder / 'config.json').exists() else 'config'}.json); finish it "
          "with `experiment instability` or leave the seed out"
        )
      if changes := reuse_changes(folder, it.cfg):
        hint = (  # another attention: not a setting to ask for (see docs/studies/training-twin.md)
          "train the JAX side"
          if {"attention", "attention_overrides"} & set(changes)
          else f"ask for the settings it was made with ({stored_values(changes)}) or train "
          "the JAX side"
        )
        raise ValueError(
          f"--jax-runs {r['pack']}: {what} was run with other settings than this command's "
          f"JAX run ({describe_changes(changes)}); it is another run: {hint}"
        )
      target = out / "jax" / run
      if target.exists() and not _same_files(folder, target):
        raise ValueError(
          f"{target} holds another run than {what} of {r['pack']}; use another --out (or delete it)"
        )
    for run, it in wanted.items():
      target, r = out / "jax" / run, found[run]
      how = "already there" if target.exists() else "taken"
      if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(pathlib.Path(tmp) / run, target)
      summary = json.loads((target / "summary.json").read_text())
      log(
        f"jax {it.pair.jax} seed {it.seed}: {how} from {r['pack']} ({r['steps']} steps, "
        f"stopped: {summary.get('stopped')}), not trained"
      )
  return list(wanted)


def run(
  base: TrainConfig,
  pairs,
  seeds,
  out_dir,
  *,
  side="both",
  tiles=512,
  layer=1,
  time_budget=0.0,
  null_steps=0,
  torch_python=None,
  torch_gpu=None,
  torch_args=(),
  log=print,
) -> dict:
  """Runs every (pair, seed) side not yet done within `time_budget` seconds of wall time
  (0: none): the JAX runs (and, with null_steps, their nulls) in this process, one after
  another, and the twin runs one after another in subprocesses at the same time (side
  "both"), or only one side ("jax", "torch": e.g. two processes, one per GPU). torch_gpu:
  CUDA_VISIBLE_DEVICES of the twin's processes (None: inherited). torch_args: extra
  `gpt_twin.py train` options, those of `TORCH_ARGS` only (e.g. ["--threads", "1"],
  ["--compile", "off"]).

  Returns {"failed": [messages]} (a twin that exited with an error; a run cut by the budget is
  not a failure: it is left unfinished). Raises ValueError (`check_torch_args`, `plan`,
  `check_torch_python`, `check_twin_device`) before any run starts.
  """
  t0 = time.perf_counter()
  check_torch_args(torch_args)
  if not (
    isinstance(time_budget, (int, float)) and math.isfinite(time_budget) and time_budget >= 0
  ):
    raise ValueError(f"time_budget must be a number >= 0 (seconds), got {time_budget!r}")
  items = plan(
    base, pairs, seeds, out_dir, tiles=tiles, layer=layer, null_steps=null_steps, side=side
  )
  out = pathlib.Path(out_dir)
  left = lambda: time_budget - (time.perf_counter() - t0) if time_budget else math.inf
  torch_jobs = {}
  if side != "jax":
    for it in items:
      run_dir = out / "torch" / it.pair.torch / f"seed{it.seed}"
      if not _done(run_dir):
        torch_jobs.setdefault((it.pair.torch, it.seed), (it, run_dir))
      elif (it.pair.torch, it.seed) not in torch_jobs:
        torch_jobs[it.pair.torch, it.seed] = None
        log(f"torch {it.pair.torch} seed {it.seed}: done before, skipped")
    torch_jobs = {k: v for k, v in torch_jobs.items() if v is not None}
  failed = []
  thread = None
  if torch_jobs:
    python = resolve_python(torch_python or default_torch_python())
    if not TWIN_SCRIPT.is_file():
      raise ValueError(
        f"the twin {TWIN_SCRIPT} is not there (it ships with the repository, not with the package)"
      )
    env = dict(os.environ)
    if torch_gpu is not None:
      env["CUDA_VISIBLE_DEVICES"] = str(torch_gpu)
    version, cuda = check_torch_python(python, env)
    visible = env.get("CUDA_VISIBLE_DEVICES")  # the twin's, set or inherited
    check_twin_device([a for a, _ in torch_jobs], python, cuda, torch_args, visible)
    log(f"torch {version} in {python}" + ("" if cuda else " (no CUDA device)"))
    for seed in sorted({s for _, s in torch_jobs}):
      it = next(i for (_, s), (i, _) in torch_jobs.items() if s == seed)
      export_init(it.cfg, out / "init" / f"seed{seed}.npz")

    def torch_side():
      short = {}  # attention → the twin of it that ran out of GPU memory (the next would too)
      for (attention, seed), (it, run_dir) in torch_jobs.items():
        if attention in short:
          log(
            f"torch {attention} seed {seed}: not started, {short[attention]} ran out of GPU memory"
          )
          continue
        msg = _run_twin(
          python, it, run_dir, out / "init" / f"seed{seed}.npz", torch_args, env, left(), log
        )
        if msg:
          failed.append(msg)
          if OUT_OF_GPU_MEMORY in msg:
            short[attention] = f"torch {attention} seed {seed}"

    if side == "both":
      thread = threading.Thread(target=torch_side, name="torch-side", daemon=True)
      thread.start()
    else:
      torch_side()
  try:
    if side != "torch":
      _jax_side(base, items, out, tiles, layer, null_steps, left, log)
  finally:
    if thread is not None:
      thread.join()  # the twin runs go on to their end (or the budget's)
  for msg in failed:
    log(msg)
  return dict(failed=failed)


def _jax_side(base, items, out, tiles, layer, null_steps, left, log):
  """The JAX runs of `items` (each (variant, seed) once) and their nulls, in order."""
  seen = set()
  for it in items:
    if (it.pair.jax, it.seed) in seen:
      continue
    seen.add((it.pair.jax, it.seed))
    if _done(it.cfg.out_dir):
      log(f"jax {it.pair.jax} seed {it.seed}: done before, skipped")
    else:
      if left() < 30:
        log(f"jax {it.pair.jax} seed {it.seed}: not started, the time budget is spent")
      else:
        instability.run_matrix(
          base,
          [it.pair.jax],
          [it.seed],
          out / "jax",
          tiles=tiles,
          layer=layer,
          time_budget=0.0 if math.isinf(left()) else left(),
          log=lambda m: log("jax " + m),
        )
    if null_steps:
      _run_null(it, null_steps, out / "null" / it.pair.jax / f"seed{it.seed}", left(), log)


SAVE_MARGIN = 30  # s: a twin's --max-seconds ends this long before the budget's kill
# what `_run_twin`'s message says of a twin that died of a CUDA out-of-memory error (the last
# line of its traceback one of OOM_LINES): `crosscheck_train`, and the queue of
# experiments/h200_twin.sh, start no later twin of that attention (the same shape: it would too)
OUT_OF_GPU_MEMORY = "ran out of GPU memory"
OOM_LINES = re.compile(r"torch\.(OutOfMemoryError|AcceleratorError: CUDA error: out of memory)")


def twin_checkpoint_step(run_dir) -> int:
  """The step of the twin run's checkpoint (gpt_twin.py writes checkpoint.json beside
  checkpoint.pt); 0 without one."""
  run_dir = pathlib.Path(run_dir)
  if not (run_dir / "checkpoint.pt").exists() or not (run_dir / "checkpoint.json").exists():
    return 0
  try:
    return int(json.loads((run_dir / "checkpoint.json").read_text())["step"])
  except (ValueError, KeyError, TypeError):
    return 0


def _run_twin(python, it: _Item, run_dir, init, torch_args, env, left, log) -> str | None:
  """One twin run as a subprocess, its output relayed line by line (and kept in
  run_dir/twin.log); killed when `left` seconds are spent. Returns an error message or None."""
  name = f"torch {it.pair.torch} seed {it.seed}"
  if left < 30:
    log(f"{name}: not started, the time budget is spent")
    return None
  run_dir = pathlib.Path(run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)
  # the twin stops itself with a checkpoint SAVE_MARGIN s before the budget's kill
  own = ["--max-seconds", f"{max(left - SAVE_MARGIN, 1):.0f}"] if math.isfinite(left) else []
  cmd = twin_command(python, it.fields, init, run_dir, [*own, *torch_args])
  log(f"{name}: training ({' '.join(cmd[1:])})")
  t0, first = time.perf_counter(), twin_checkpoint_step(run_dir)  # first: resumed after it
  with open(run_dir / "twin.log", "w") as keep:
    with interrupts.unblocked():  # the twin answers Ctrl-C itself
      proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
      )
    timer, cut = None, threading.Event()  # cut: the budget's timer killed it (not a signal else)

    def stop():
      cut.set()
      proc.kill()

    if math.isfinite(left):
      timer = threading.Timer(left, stop)
      timer.start()
    tail = []
    for line in proc.stdout:
      keep.write(line)
      tail = (tail + [line.rstrip()])[-20:]
      log(f"[{name}] {line.rstrip()}")
    rc = proc.wait()
    if timer is not None:
      timer.cancel()
  rows = [r for r in read_metrics(run_dir) if r["step"] > first]  # this call's steps
  dt = time.perf_counter() - t0
  speed = (
    f"{len(rows)} step{'s' * (len(rows) != 1)} in {dt:.0f} s, {len(rows) / dt:.2f} steps/s "
    "with startup, "
    f"{1 / statistics.median(r['step_time_s'] for r in rows[10:] or rows):.2f} per step"
    if rows
    else f"no step in {dt:.0f} s"
  )
  last = rows[-1]["step"] if rows else first
  if rc in (0, EXIT_NON_FINITE) and _done(run_dir):
    log(f"{name}: done at step {last} ({speed})")
    return None
  if (rc == 0 or cut.is_set()) and not _done(run_dir):  # stopped itself, or the budget's kill
    saved = twin_checkpoint_step(run_dir)
    how = "stopped by its time limit" if rc == 0 else "cut by the time budget"
    again = f"it resumes after step {saved} next time" if saved else "it starts again next time"
    log(f"{name}: {how} at step {last} ({speed}); {again}")
    return None
  if rc < 0:  # killed from outside: the kernel's out-of-memory killer, a user's kill
    how = f"was killed by {signal.Signals(-rc).name} at step {last}"
    if -rc == signal.SIGKILL:
      how += " (out of memory? see the kernel log)"
    return f"{name}: gpt_twin.py {how}:\n" + "\n".join(tail[-8:])
  oom = [line for line in tail if OOM_LINES.match(line)]  # a traceback's last line
  if oom:
    return f"{name}: gpt_twin.py {OUT_OF_GPU_MEMORY} at step {last}:\n" + oom[-1]
  return f"{name}: gpt_twin.py exited with status {rc}:\n" + "\n".join(tail[-8:])


def _run_null(it: _Item, steps, run_dir, left, log):
  """The JAX null of an item (`null_config`, `HalvedBatches`), unless done."""
  from jax_flashstable.training.data import Dataset
  from jax_flashstable.training.train import train_and_evaluate

  name = f"null {it.pair.jax} seed {it.seed}"
  if _done(run_dir):
    log(f"{name}: done before, skipped")
    return
  if left < 30:
    log(f"{name}: not started, the time budget is spent")
    return
  ncfg = null_config(it.cfg, steps, run_dir)
  if math.isfinite(left):
    ncfg = dataclasses.replace(ncfg, max_seconds=left)
  log(f"{name}: training {ncfg.steps} steps with each batch as two halves")
  data = HalvedBatches(Dataset(ncfg.data, ncfg.model_config().vocab_size), it.cfg.grad_accum)
  try:
    s = train_and_evaluate(ncfg, dataset=data)
  except NonFiniteError as e:
    s = dict(stopped="non-finite", error=str(e))
  if s.get("stopped") == "time":
    log(f"{name}: cut by the time budget at step {s.get('step')}; it starts again next time")
    return
  (pathlib.Path(run_dir) / "summary.json").write_text(json.dumps(s, default=str))


# --- comparing -----------------------------------------------------------------------------


def check_tolerance(tolerance):
  """ValueError unless `tolerance` is a finite number > 0 (naming it)."""
  if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
    raise ValueError(f"tolerance must be a number > 0, got tolerance={tolerance!r}")


def compare_losses(reference, other, tolerance=TOLERANCE, window=WINDOW) -> dict:
  """Step-by-step comparison of two runs' metrics rows (`train.read_metrics`), `reference`
  the JAX run. Per common step: d = |loss_other − loss_ref| and r = d / |loss_ref| (∞ where
  exactly one of them is non-finite; a step where both are is skipped). Returns:

    steps             number of common steps (both runs logged them)
    start_rel         max r over steps 1–2 (both sides evaluate the initial weights: lr(0) = 0)
    max_abs_window, max_rel_window   max d, r over the first `window` steps
    max_abs, max_rel  max d, r over all common steps
    first_apart       the first step with r > tolerance (None: none)
    profile           [(first, last, median r)] per `PROFILE` window of steps with data
    param_rel_window, param_rel_end  |Δparam_norm| / param_norm at the last common step within
                      the window and at the last common step (the weights' divergence)
  """
  f32 = lambda v: float(np.float32(v))  # the logged float32 values, also after `pack`
  a = {r["step"]: r for r in reference}
  b = {r["step"]: r for r in other}
  steps, rel, diff = [], [], []
  for s in sorted(set(a) & set(b)):
    x, y = f32(a[s]["loss"]), f32(b[s]["loss"])
    if not (math.isfinite(x) or math.isfinite(y)):
      continue
    d = abs(y - x) if math.isfinite(x) and math.isfinite(y) else math.inf
    steps.append(s)
    diff.append(d)
    rel.append(d / abs(x) if math.isfinite(d) and x != 0 else math.inf if d else 0.0)
  inside = [i for i, s in enumerate(steps) if s <= window]
  pick = lambda xs, idx, default=math.nan: max((xs[i] for i in idx), default=default)

  def param_rel(s):
    pa, pb = f32(a[s].get("param_norm", math.nan)), f32(b[s].get("param_norm", math.nan))
    return abs(pb - pa) / abs(pa) if pa else math.nan

  profile = []
  for lo, hi in PROFILE:
    sel = [r for s, r in zip(steps, rel) if lo <= s <= hi]
    if sel:
      profile.append((lo, min(hi, steps[-1]), statistics.median(sel)))
  return dict(
    steps=len(steps),
    start_rel=pick(rel, [i for i, s in enumerate(steps) if s <= 2]),
    max_abs_window=pick(diff, inside),
    max_rel_window=pick(rel, inside),
    max_abs=max(diff, default=math.nan),
    max_rel=max(rel, default=math.nan),
    first_apart=next((s for s, r in zip(steps, rel) if r > tolerance), None),
    profile=profile,
    param_rel_window=param_rel(steps[inside[-1]]) if inside else math.nan,
    param_rel_end=param_rel(steps[-1]) if steps else math.nan,
  )


ENVELOPE_FACTOR = 2.0  # the twin's divergence may be this many times the null's ...
# ... or this (relative), whichever is larger: the loss difference two implementations of one
# forward show on the same weights is float32 rounding, measured at steps 1–2 (lr(0) = 0) on
# the H200 at 1.8e-7–2.1e-6 (docs/studies/training-twin.md); 1e-5 leaves room ×5 above it. A
# chosen floor: below it the ratios compare rounding noise, and in the first window it decides
ENVELOPE_FLOOR = 1e-5


def within_null_envelope(twin_cmp: dict | None, null_cmp: dict | None):
  """Whether the twin diverges from JAX no more than JAX from itself when only the order of
  its float32 sums changes (the null: each batch in two halves): in every `PROFILE` window
  both comparisons cover to the same last step, the twin's median relative |Δloss| ≤
  ENVELOPE_FACTOR × the null's, or ≤ ENVELOPE_FLOOR (a chosen floor above the float32 rounding
  of the loss; below it the ratios compare rounding noise). The factor 2 allows the twin rounding orders of its own
  beside the null's. Returns (verdict, the last step judged); (None, 0) without a null or a
  window in common. A twin inside the envelope is as close to JAX as the arithmetic lets two
  runs be at this recipe, however early both leave τ (docs/studies/training-twin.md)."""
  if twin_cmp is None or null_cmp is None:
    return None, 0
  twin = {lo: (last, med) for lo, last, med in twin_cmp["profile"]}
  null = {lo: (last, med) for lo, last, med in null_cmp["profile"]}
  judged = [
    (twin[lo][0], twin[lo][1] <= max(ENVELOPE_FACTOR * null[lo][1], ENVELOPE_FLOOR))
    for lo in twin
    if lo in null and twin[lo][0] == null[lo][0]
  ]
  if not judged:
    return None, 0
  return all(ok for _, ok in judged), max(last for last, _ in judged)


def agrees(comparison: dict | None, window=WINDOW) -> bool:
  """Whether a `compare_losses` result stays within the tolerance over the first `window`
  steps (all of them compared) or over every common step of a shorter run."""
  if comparison is None or not comparison["steps"]:
    return False
  return (comparison["first_apart"] or math.inf) > min(window, comparison["steps"])


def decided(row: dict) -> bool:
  """Whether both sides of a report row (`collect`) have settled their outcome
  (`instability.DECIDED`): the (pair, seed)s whose outcomes compare; the others are open."""
  return row["jax_outcome"] in instability.DECIDED and row["torch_outcome"] in instability.DECIDED


def agreement(row: dict) -> str:
  """How the two sides' outcomes of a report row compare: 'same outcome'; 'both failed' (one
  exploded, the other ran away: both left the reference's range, one further); 'outcomes
  differ' (one calm, one failed); 'outcome open' (a side not decided, `decided`)."""
  j, t = row["jax_outcome"], row["torch_outcome"]
  if not decided(row):
    return "outcome open"
  if j == t:
    return "same outcome"
  return "outcomes differ" if "calm" in (j, t) else "both failed"


def outcome(row: dict | None) -> str:
  """`instability.outcome` of a side's run, or 'missing' without one."""
  return "missing" if row is None else instability.outcome(row)


def twin_rounding(run_dir) -> str | None:
  """How a twin run made its bf16 roundings (its config.json): "bits" (`common.round_bf16`,
  since 2026-12-05); before, convert pairs: "convert pairs, compiled" under torch.compile with
  a torch before 2.13 (2.11, the GPU image's, drops them: its paper layout lost most of its
  rounding points; 2.12.0's pass is the same, read from its wheel;
  experiments/results/cpu-2026-12-05-twin-torch211), "convert pairs,
  compiled, kept" with torch 2.13 or later, "convert pairs, eager"; None without a
  config.json."""
  path = pathlib.Path(run_dir) / "config.json"
  return _rounding(json.loads(path.read_text())) if path.exists() else None


def _rounding(cfg: dict) -> str:
  """`twin_rounding` of a run's config.json."""
  if cfg.get("rounding") == "bits":
    return "bits"
  if cfg.get("compile", "on" if cfg.get("compiled") else "off") == "off":
    return "convert pairs, eager"
  version = re.match(r"torch (\d+)\.(\d+)", cfg.get("framework", ""))
  kept = version is not None and tuple(map(int, version.groups())) >= (2, 13)
  return "convert pairs, compiled" + (", kept" if kept else "")


def rounding_rank(records) -> tuple[int]:
  """`instability.read_packs`' rank for the packs of `--runs` (after whether a run has a
  result at all): a twin run whose bf16 roundings a compiler dropped ("convert pairs,
  compiled", `twin_rounding`: under torch 2.11 its paper layout lost most of its rounding
  points) after any other, however far it trained; the rest (bits, eager, kept; JAX runs, whose
  config.json names no framework of torch's) rank alike."""
  for rec in records:
    if rec["file"] == "config.json":
      cfg = rec["rows"][0]
      lost = cfg.get("framework", "").startswith("torch") and (
        _rounding(cfg) == "convert pairs, compiled"
      )
      return (int(not lost),)
  return (1,)


def _side_rows(out: pathlib.Path, side: str, base: TrainConfig, layer: int, reference_max_logit):
  if not (out / side).is_dir():
    return {}, None
  rows = instability.collect(out / side, base, layer, reference_max_logit)
  threshold = instability.runaway_threshold(rows, reference_max_logit)
  return {(r["variant"], r["seed"]): r for r in rows}, threshold


def _seeds_of(out: pathlib.Path, side: str, variant: str) -> set[int]:
  d = out / side / variant
  return {int(p.name[4:]) for p in d.glob("seed*") if p.name[4:].isdigit()} if d.is_dir() else set()


def collect(
  out_dir,
  base: TrainConfig,
  pairs,
  *,
  tiles=512,
  layer=1,
  tolerance=TOLERANCE,
  window=WINDOW,
  reference_max_logit=None,
) -> dict:
  """Every (pair, seed) with a run on either side under out_dir: both sides' `collect` rows
  (`instability.collect`, each side with its own runaway threshold, from its reference-fp32
  runs and `reference_max_logit`), the loss comparison
  (`compare_losses`) of twin and JAX and of the JAX null and JAX, the outcomes and a sentence.
  Returns {"rows": [...], "thresholds": {"jax": t, "torch": t}, "tolerance", "window"}."""
  check_tolerance(tolerance)
  reference_max_logit = instability.check_reference_max_logit(reference_max_logit)
  out = pathlib.Path(out_dir)
  jax_rows, jax_t = _side_rows(out, "jax", base, layer, reference_max_logit)
  torch_rows, torch_t = _side_rows(out, "torch", base, layer, reference_max_logit)
  rows = []
  for pair in pairs:
    seeds = _seeds_of(out, "jax", pair.jax) | _seeds_of(out, "torch", pair.torch)
    for seed in sorted(seeds):
      j, t = jax_rows.get((pair.jax, seed)), torch_rows.get((pair.torch, seed))
      jm = read_metrics(out / "jax" / pair.jax / f"seed{seed}")
      tm = read_metrics(out / "torch" / pair.torch / f"seed{seed}")
      nm = read_metrics(out / "null" / pair.jax / f"seed{seed}")
      row = dict(
        pair=pair.name,
        torch=pair.torch,
        jax=pair.jax,
        seed=seed,
        exact=is_exact(pair, tiles),
        jax_run=_brief(j),
        torch_run=_brief(t),
        jax_outcome=outcome(j),
        torch_outcome=outcome(t),
        twin=compare_losses(jm, tm, tolerance, window) if jm and tm else None,
        null=compare_losses(jm, nm, tolerance, window) if jm and nm else None,
        torch_rounding=twin_rounding(out / "torch" / pair.torch / f"seed{seed}"),
      )
      row["agreement"] = agreement(row)
      row["envelope"] = within_null_envelope(row["twin"], row["null"])
      row["same_outcome"] = row["agreement"] == "same outcome"
      row["statement"] = statement(row, tolerance, window)
      rows.append(row)
  return dict(
    rows=rows, thresholds=dict(jax=jax_t, torch=torch_t), tolerance=tolerance, window=window
  )


def _brief(r: dict | None) -> dict | None:
  keys = (
    "steps",
    "finished",
    "stopped",
    "explosion_step",
    "runaway_step",
    "warning_step",
    "min_loss",
    "final_loss",
    "max_logit",
    "dq_errs",
    "dq_errs_any",
    "tie_rates",
    "max_sigma_wq",
    "max_grad_norm",
    "steps_per_s",
  )
  return None if r is None else {k: r[k] for k in keys}


def _event(r: dict | None, outcome_: str) -> str:
  if r is None:
    return "no run"
  return {
    "exploded": f"exploded at {r['explosion_step']}",
    "runaway": f"ran away at {r['runaway_step']}",
    "calm": f"calm to {r['steps']}",
    "unfinished": f"unfinished at {r['steps']}",
    "too short": f"ended at {r['steps']}, within warmup (undecided)",
  }[outcome_]


def statement(row: dict, tolerance=TOLERANCE, window=WINDOW) -> str:
  """One sentence on a (pair, seed) of `collect`: how long the loss curves agree within the
  tolerance, the null's parting step and envelope (row["envelope"]) beside it, and the two
  outcomes."""
  c, n = row["twin"], row["null"]
  if c is None:
    text = "no loss comparison yet"
  elif c["first_apart"] is None:
    text = f"within τ over all {c['steps']} common steps" + (
      f" (fewer than the {window} of the agreement window)" if c["steps"] < window else ""
    )
  else:
    text = (
      f"within τ to step {c['first_apart'] - 1}, apart from step {c['first_apart']} "
      f"({'after' if c['first_apart'] > window else 'within'} the first {window} steps)"
    )
  if n is not None:
    text += (
      "; JAX null within τ over its " + f"{n['steps']} steps"
      if n["first_apart"] is None
      else f"; JAX null apart from step {n['first_apart']}"
    )
    inside, last = row["envelope"]
    if inside is not None:
      text += f"; {'within' if inside else 'outside'} the null's envelope to step {last}"
  j = _event(row["jax_run"], row["jax_outcome"])
  t = _event(row["torch_run"], row["torch_outcome"])
  text = f"{text}. JAX {j}, torch {t}: {agreement(row)}."
  if row.get("torch_rounding") == "convert pairs, compiled":
    text += (
      " The twin rounded by convert pairs under torch.compile (before 2026-12-05), which "
      "torch 2.11 drops: its bf16 rounding points are not all JAX's"
      + (" (its paper layout lost most of them)." if row["torch"].startswith("paper") else ".")
    )
  return text


# --- the report ----------------------------------------------------------------------------


_g = instability.cell


def format_report(result: dict, recipe: dict, layer=1) -> str:
  tol, window = result["tolerance"], result["window"]
  th = result["thresholds"]
  rule = lambda t: (
    f"max logit > {instability.magnitude(t)}"
    if t is not None
    else "not defined (no reference-fp32 run with diagnostics)"
  )
  rows = result["rows"]
  lines = [
    f"Recipe: {format_facts(recipe)}",
    "",
    f"τ = {tol:.3g} (relative: |loss_torch − loss_jax| ≤ τ·|loss_jax|; 2⁻⁸ is one bf16 "
    "ulp of the loss's scale); Δ below are relative to the JAX loss. Explosion: trailing "
    "10-step mean loss > 2× its running minimum after warmup, or non-finite. Runaway: "
    f"layer {layer}'s max logit above 10× the largest of the same side's reference-fp32 "
    f"runs and of a value given (--reference-max-logit) — JAX: {rule(th['jax'])}; "
    f"torch: {rule(th['torch'])}. Exact pairs share every "
    "rounding point; the others pair an SDPA backend with the nearest JAX numerics.",
    "",
  ]
  exact = [r for r in rows if r["exact"] and r["twin"] is not None]
  held = [r for r in exact if agrees(r["twin"], window)]
  settled = [r for r in rows if decided(r)]
  short = sum(r["twin"]["steps"] < window for r in exact)  # judged on every common step
  fewer = f", {short} of them over fewer steps (all they have)" if short else ""
  # the JAX null (the same run, each batch in two halves: a change of rounding order only) is
  # the yardstick: where it parts from JAX within the window as early as the twin does, the
  # twin's parting is the recipe's amplification of rounding, not a difference of the port
  nulls = [r for r in exact if r["null"] is not None and r["null"]["steps"]]
  yardstick = ""
  if nulls:
    null_held = [r for r in nulls if agrees(r["null"], window)]
    apart = lambda side: sorted(
      r[side]["first_apart"] for r in nulls if not agrees(r[side], window)
    )
    span = lambda s: f"step {s[0]}" if s[0] == s[-1] else f"steps {s[0]}–{s[-1]}"
    yardstick = (
      f" JAX's null (each batch in two halves) holds within τ in {len(null_held)} of "
      f"{len(nulls)} of them"
    )
    null_apart, twin_apart = apart("null"), apart("twin")
    if null_apart:
      yardstick += f" (apart from {span(null_apart)}" + (
        f"; the twin from {span(twin_apart)})" if twin_apart else ")"
      )
    yardstick += "."
    judged = [r["envelope"] for r in nulls]
    lasts = sorted(last for ok, last in judged if ok is not None)
    to = f" (judged to {span(lasts)})" if lasts else ""
    yardstick += (
      f" Within the null's envelope (median |Δ| per window ≤ {ENVELOPE_FACTOR:g}× the null's, "
      f"or ≤ {ENVELOPE_FLOOR:g}), over every window both cover: "
      f"{sum(ok is True for ok, _ in judged)} of {len(nulls)}{to}."
    )
  lines += [
    f"**Exact pairs agreeing within τ over the first {window} steps: {len(held)} of "
    f"{len(exact)} compared{fewer}.**{yardstick} Outcomes the same on both sides: "
    f"{sum(r['same_outcome'] for r in settled)} of {len(settled)} decided (pair, seed); "
    "calm on both sides or failed on both (a runaway or an explosion): "
    f"{sum(r['agreement'] != 'outcomes differ' for r in settled)} of {len(settled)}.",
    "",
    f"| pair | seed | exact | steps JAX / torch | Δ steps 1–2 | max Δ steps 1–{window} "
    "| max Δ run | apart from step | null apart from | JAX | torch "
    "| max logit JAX / torch | steps/s JAX / torch |",
    "|---|---:|---|---|---:|---:|---:|---:|---:|---|---|---|---|",
  ]
  for r in rows:
    c, n, j, t = r["twin"], r["null"], r["jax_run"], r["torch_run"]
    lines.append(
      f"| {r['pair']} | {r['seed']} | {'yes' if r['exact'] else 'nearest'} | "
      f"{j['steps'] if j else '–'} / {t['steps'] if t else '–'} | "
      f"{_g(c and c['start_rel'])} | {_g(c and c['max_rel_window'])} | "
      f"{_g(c and c['max_rel'])} | {(c['first_apart'] or '–') if c else 'n/a'} | "
      f"{(n['first_apart'] or '–') if n else 'n/a'} | "
      f"{_event(j, r['jax_outcome'])} | {_event(t, r['torch_outcome'])} | "
      f"{instability.magnitude(j and j['max_logit'])} / {instability.magnitude(t and t['max_logit'])} | "
      f"{_g(j and j['steps_per_s'], '.1f')} / {_g(t and t['steps_per_s'], '.1f')} |"
    )
  heads = [f"{lo}–{hi if hi < 10**9 else '…'}" for lo, hi in PROFILE]
  lines += [
    "",
    "Divergence: median relative |Δloss| per window of steps (twin − JAX; null: JAX "
    "with each batch in two halves − JAX).",
    "",
    "| pair | seed | run | " + " | ".join(heads) + " | Δparam_norm at end |",
    "|---|---:|---|" + "---:|" * (len(heads) + 1),
  ]
  for r in rows:
    for label, c in (("twin", r["twin"]), ("null", r["null"])):
      if c is None:
        continue
      med = {lo: m for lo, _, m in c["profile"]}
      lines.append(
        f"| {r['pair']} | {r['seed']} | {label} | "
        + " | ".join(_g(med.get(lo)) for lo, _ in PROFILE)
        + f" | {_g(c['param_rel_end'])} |"
      )
  lines += _mechanism_tables(rows, layer)
  lines += ["", "Per (pair, seed):", ""] + [
    f"- {r['pair']}, seed {r['seed']}: {r['statement']}" for r in rows
  ]
  return "\n".join(lines)


def _mechanism_tables(rows, layer) -> list[str]:
  """The mechanism's size on both sides, median per window of DQ_WINDOWS, JAX / torch, for
  the (pair, seed) where either side logged it (no lines where none did): the watched layer's
  tie rate (`_run_row`'s tie_rates, mean over heads: the paper layout's, the twin's since
  2026-12-05, `gpt_twin.diagnose`) and its dQ error (`diagnostics.dq_error`, largest head; the
  twin's since 2026-12-04, `gpt_twin.dq_diagnostics`), and the largest dQ error of any layer
  (dq_errs_any)."""
  tie = (
    "tie_rates",
    f"Layer {layer}'s tie rate (share of rows with a key tile on which the compensation's rule "
    "fires, mean over heads; the twin counts it for the paper layouts only, JAX for fa2 too), "
    "median per window of steps, JAX / torch:",
  )
  dq = (
    "dq_errs",
    f"Layer {layer}'s dQ error (rms of dQ − FP32 attention's dQ, relative to its size, largest "
    "head; the bias term of Qiu & Yao 2025, §4, grows it), median per window of steps, "
    "JAX / torch:",
  )
  any_layer = (
    "dq_errs_any",
    "The largest dQ error of any layer (and head), median per window of steps, JAX / torch: "
    "after the two sides part, the bias term need not grow first in the same layer (the "
    "examples: docs/studies/training-twin.md):",
  )
  tables = (tie, dq, any_layer)
  return [line for field, caption in tables for line in _window_table(rows, field, caption)]


def _window_table(rows, field, caption) -> list[str]:
  """One statistic of both sides' runs (`_run_row`'s (step, value) list `field`), median per
  window of DQ_WINDOWS, "JAX / torch" per cell; [] when no run logged it."""

  def median(run, lo, hi):
    xs = [x for step, x in (run or {}).get(field) or [] if lo <= step <= hi]
    return statistics.median(xs) if xs else None

  logged = [r for r in rows if any((r[s] or {}).get(field) for s in ("jax_run", "torch_run"))]
  if not logged:
    return []
  heads = [f"{lo:,}–{hi:,}" for lo, hi in DQ_WINDOWS]
  size = lambda x: _g(x, ".3f") if x is None or x < 10 else instability.magnitude(x)  # noqa: E731
  lines = ["", caption, "", "| pair | seed | " + " | ".join(heads) + " |"]
  lines.append("|---|---:|" + "---:|" * len(heads))
  for r in logged:
    j, t = r["jax_run"], r["torch_run"]
    cells = [f"{size(median(j, lo, hi))} / {size(median(t, lo, hi))}" for lo, hi in DQ_WINDOWS]
    lines.append(f"| {r['pair']} | {r['seed']} | " + " | ".join(cells) + " |")
  return lines


def plot(out_dir, result: dict, layer=1) -> pathlib.Path:
  """OUT/twin.png: loss of both sides (JAX solid, torch dashed), relative |Δloss| against the
  step with τ (null dotted), the watched layer's max logit with each side's runaway threshold,
  and the relative difference of the parameter norms."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from jax_flashstable.training.train import read_diagnostics

  out = pathlib.Path(out_dir)
  fig, ((loss_ax, diff_ax), (logit_ax, param_ax)) = plt.subplots(2, 2, figsize=(14, 9))
  for i, r in enumerate(result["rows"]):
    colour = plt.cm.tab10(i % 10)
    label = f"{r['pair']} s{r['seed']}"
    runs = {
      side: out / side / (r["torch"] if side == "torch" else r["jax"]) / f"seed{r['seed']}"
      for side in SIDE_DIRS
    }
    metrics = {side: read_metrics(d) for side, d in runs.items()}
    for side, ls in (("jax", "-"), ("torch", "--")):
      m = metrics[side]
      loss_ax.plot(
        [x["step"] for x in m],
        [x["loss"] for x in m],
        ls,
        color=colour,
        lw=0.6,
        label=f"{label} {side}" if m else None,
      )
      d = read_diagnostics(runs[side])
      logit_ax.plot(
        [x["step"] for x in d], [max(x["max_logit"][layer]) for x in d], ls, color=colour, lw=1
      )
    for other, ls in (("torch", "-"), ("null", ":")):
      a = {x["step"]: x for x in metrics["jax"]}
      pts = [
        (
          x["step"],
          abs(x["loss"] - a[x["step"]]["loss"]) / abs(a[x["step"]]["loss"]),
          abs(x["param_norm"] - a[x["step"]]["param_norm"]) / a[x["step"]]["param_norm"],
        )
        for x in metrics[other]
        if x["step"] in a and a[x["step"]]["loss"]
      ]
      if pts:
        s, dl, dp = zip(*pts)
        tag = "twin" if other == "torch" else "null"
        diff_ax.plot(
          s, [max(v, 1e-12) for v in dl], ls, color=colour, lw=0.6, label=f"{label} {tag}"
        )
        param_ax.plot(s, [max(v, 1e-12) for v in dp], ls, color=colour, lw=0.8)
  diff_ax.axhline(result["tolerance"], color="k", lw=0.8, ls="--", label="τ")
  for side, ls in (("jax", "-"), ("torch", "--")):
    if result["thresholds"][side] is not None:
      logit_ax.axhline(
        result["thresholds"][side], color="k", lw=0.8, ls=ls, label=f"runaway threshold ({side})"
      )
  loss_ax.set(title="training loss (JAX solid, torch dashed)", xlabel="step")
  diff_ax.set(title="|loss_torch − loss_jax| / loss_jax (null dotted)", xlabel="step", yscale="log")
  logit_ax.set(title=f"layer {layer}: max attention logit", xlabel="step", yscale="log")
  param_ax.set(title="|Δ param_norm| / param_norm", xlabel="step", yscale="log")
  for ax in (loss_ax, diff_ax, logit_ax):
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(out / "twin.png", dpi=100)
  plt.close(fig)
  return out / "twin.png"


def write_report(out_dir, result: dict, base: TrainConfig, layer=1, meta=None) -> pathlib.Path:
  """OUT/report.md, report.json (meta, recipe, thresholds, rows) and twin.png."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  recipe = {k: v for k, v in dataclasses.asdict(base).items() if k not in instability.RUN_FIELDS}
  meta = dict(meta or {}, trained_on={s: instability.trained_on(out / s) for s in ("jax", "torch")})
  (out / "report.json").write_text(
    json.dumps(dict(meta=meta, recipe=recipe, **result), indent=1, default=str)
  )
  text = format_report(result, recipe, layer)
  (out / "report.md").write_text(
    f"# Training cross-check: JAX and its PyTorch twin\n\n{format_meta(meta)}\n\n{text}\n"
  )
  plot(out, result, layer)
  return out / "report.md"


# --- the runs as one small file ------------------------------------------------------------


def run_dirs(out_dir) -> list[pathlib.Path]:
  """The run folders under OUT/jax, OUT/torch and OUT/null (`instability.run_dirs` per side)."""
  return [d for side in SIDE_DIRS for d in instability.run_dirs(pathlib.Path(out_dir) / side)]


def pack(out_dir, path) -> pathlib.Path:
  """Every run under OUT/jax, OUT/torch and OUT/null as one xz JSON-lines file
  (`instability.pack_lines` per side, the run names prefixed with the side, e.g.
  "torch/paper/seed24"; `instability.write_pack`); `instability.unpack_runs(path, OUT)`
  recreates them."""
  out = pathlib.Path(out_dir)
  lines = [line for side in SIDE_DIRS for line in instability.pack_lines(out / side, f"{side}/")]
  return instability.write_pack(lines, path)
