"""`flashstable experiment instability`: the BF16 loss explosion of Qiu & Yao (arXiv 2510.04212,
§4–5) as a matrix of attention variants × seeds, resumable, with a report.

Every run trains the same model from the same recipe; a seed fixes initialisation and data
order, so two variants with the same seed see identical batches. Runs live in
`OUT/<variant>/seed<k>/` (metrics.jsonl, diagnostics.jsonl, summary.json). A run with a
summary.json is done and is skipped when the command is repeated; an unfinished run resumes from
its last checkpoint (when the recipe checkpoints). The report (`OUT/report.md`, `report.json`,
`curves.png`) gives per run the explosion step (after warmup: trailing-mean loss > 2× its
running minimum, or non-finite; `train.ExplosionMonitor`), the loss, the spectral norm of the
watched layer's whole W_Q and its tie rate (rows whose key tiles had tied maxima), the
runaway step (the watched layer's max logit above `RUNAWAY_FACTOR` × the largest the
reference-fp32 runs of the matrix reached, or a reference's largest given with
`--reference-max-logit`), per variant how many seeds exploded and ran away,
the survival curve (fraction of seeds not yet exploded against the step, Kaplan–Meier with
unfinished runs censored) and, for each variant beside its compensated twin (`paper` and
`paper+comp`), the one-sided Fisher exact p-value that the compensation explodes less.
`pack_runs` / `unpack_runs` keep a matrix's run folders as one small file (the results kept in
git).
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import math
import numbers
import os
import pathlib
import re
import statistics
import tempfile
import time

import jax
import numpy as np

from jax_flashstable.checks import random_seed
from jax_flashstable.results import format_facts, format_meta
from jax_flashstable.training.train import (
  DQErrorWarning,
  EarlyWarning,
  NonFiniteError,
  TrainConfig,
  config_changes,
  describe_changes,
  explosion_step,
  load_dataset,
  read_diagnostics,
  read_metrics,
  stored_values,
  train_and_evaluate,
  warning_step,
)
from jax_flashstable.attention.config import MODIFIERS, AttentionConfig
from jax_flashstable.training.config import (
  ConfigError,
  check_attention,
  named_error,
  overrides_text,
)
from pallas_kernels.policy import check_tile, real_number

# A variant is an attention spec of `AttentionConfig`'s grammar ("paper", "paper+comp", "fa2",
# "cudnn", "reference-fp32", "fa2+delta32+comp", …) for every layer, or SPEC@layer: standard
# attention (xla) in every layer but the watched one, which uses SPEC. The paper layout's
# logical tile is the experiment's `tiles` (the paper's kernel: 512×512 at length 1024) unless
# the spec sets block_q or block_k.
LAYER_SUFFIX = "@layer"
# The flash variants run the Triton kernels unless the spec names +mgpu: every run of this
# study before 2026-12-01 was made with them (the default before backend="auto"), and a series
# must not change kernels under one variant name. A run's stored `attention` names the backend.
EXPERIMENT_BACKEND = "triton"
# The variants of the study so far, in the order a report lists them (any spec is accepted).
VARIANTS = (
  "paper",
  "paper+comp",
  "fa2",
  "fa2+comp",
  "fp32_out",
  "stochastic",
  "cudnn",
  "xla",
  "reference-fp32",
  "paper@layer",
  "paper+comp@layer",
  "fa2+delta32",
  "fa2+delta32+comp",
  "fa2+center",
  "fa2+center+comp",
  "fa2+lse",
  "fa2+lse+comp",
  "cudnn+center",
)

# The anchor of issue 6 (measured with the paper's PyTorch model and kernel on one H200):
# GPT 6 layers × 6 heads × 384, no bias, context 1024, batch 32, AdamW (0.9, 0.95), no weight
# decay, peak lr 3e-3 after 200 warmup steps, cosine to 1e-5 over 20k steps, clipping 1.0.
_ANCHOR = dict(
  model="gpt-6l",
  batch_size=32,
  lr=3e-3,
  min_lr=1e-5,
  warmup_steps=200,
  steps=20000,
  decay_steps=20000,
  weight_decay=0.0,
  grad_clip=1.0,
  eval_interval=500,
  eval_batches=4,
  diag_interval=250,
  diag_rows=64,
  stop_after_explosion=300,
  checkpoint_interval=1000,
)
RECIPES = {
  "anchor": _ANCHOR,
  # the search for a recipe that fails more reliably than the anchor
  # (docs/studies/instability-anchor.md):
  # the anchor at a higher peak learning rate
  **{f"anchor-lr{lr:g}": dict(_ANCHOR, lr=lr) for lr in (4e-3, 6e-3)},
  # ... and at another depth: 12 layers as in GPT-2 small (width and heads of the anchor), or 4
  **{f"anchor-{n}l": dict(_ANCHOR, model_overrides=(("n_layer", n),)) for n in (4, 12)},
  # the anchor at batch 128 (131k tokens per step), where the key pair splits cleanly (issue
  # 16); the cosine keeps the anchor's 20k-step length, the horizon is 3,000 steps. Diagnostics
  # every 100 steps (they read the weights, not change them) for the early warning's lead.
  "anchor-b128": dict(_ANCHOR, batch_size=128, steps=3000, diag_interval=100),
  # a CPU-sized matrix (the test suite runs it)
  "tiny": dict(
    model="tiny",
    batch_size=4,
    lr=3e-3,
    min_lr=3e-4,
    warmup_steps=5,
    steps=30,
    weight_decay=0.0,
    eval_interval=0,
    eval_batches=1,
    diag_interval=10,
    diag_rows=16,
    stop_after_explosion=10,
  ),
}


def variant_attention(variant: str, *, tiles=512, layer=1) -> tuple[str, tuple]:
  """(attention of every layer, ((layer, spec),) or ()) of a variant; ValueError naming what is
  wrong in it."""
  spec = variant.removesuffix(LAYER_SUFFIX)
  cfg = AttentionConfig.parse(spec)
  if (
    cfg.implementation == "flash"
    and cfg.numerics == "paper"
    and cfg.block_q is None
    and cfg.block_k is None
  ):
    cfg = dataclasses.replace(cfg, block_q=tiles, block_k=tiles)
  if cfg.implementation == "flash" and cfg.backend == "auto":
    if cfg.mgpu_options is not None and EXPERIMENT_BACKEND != "mosaic_gpu":
      raise ValueError(
        f"variant {variant!r}: the experiment runs backend 'auto' as {EXPERIMENT_BACKEND!r}, "
        "which reads no Mosaic GPU options; add '+mgpu' to run them"
      )
    cfg = dataclasses.replace(cfg, backend=EXPERIMENT_BACKEND)
  if variant.endswith(LAYER_SUFFIX):
    return "xla", ((layer, cfg.name),)
  return cfg.name, ()


def check_layer(base: TrainConfig, layer) -> None:
  """Raises ValueError unless `layer` (the watched layer, 0-based) is a layer of base's model
  (ConfigError for a model that does not build)."""
  try:
    n_layer = base.model_config().n_layer
  except ValueError as e:  # the field it came from named first, as TrainConfig.validate does
    raise ConfigError(named_error(base, e)) from None
  if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not 0 <= layer < n_layer:
    raise ValueError(f"layer={layer!r} is not a layer of {base.model!r} (n_layer={n_layer})")


def variant_config(
  base: TrainConfig, variant: str, seed: int, out_dir, *, tiles=512, layer=1
) -> TrainConfig:
  """The TrainConfig of one run: `base` with the variant's attention in every layer (SPEC, or
  SPEC@layer: SPEC in the watched layer, xla elsewhere), `seed` and `out_dir`. Raises
  ValueError for a variant that does not parse or cannot run in base's model (its
  compute_dtype, head_dim: `training.config.check_attention`), a watched layer the model does
  not have, and for a setting of `base` the run would not keep (`check_base`)."""
  check_tile("tiles", tiles)  # the paper layout's logical tile
  check_base(base)
  check_layer(base, layer)
  try:
    attention, overrides = variant_attention(variant, tiles=tiles, layer=layer)
  except ValueError as e:
    raise ValueError(f"variant {variant!r}: {e}") from None
  cfg = dataclasses.replace(
    base, attention=attention, attention_overrides=overrides, seed=seed, out_dir=str(out_dir)
  )
  mcfg = cfg.model_config()  # builds: check_layer built base's, the variant's spec parsed
  for config in dict.fromkeys([mcfg.attention, *(c for _, c in mcfg.attention_overrides)]):
    check_attention(f"variant {variant!r}", config, cfg, mcfg, error=ValueError)
  return cfg


def check_base(base: TrainConfig) -> None:
  """Raises ValueError naming a setting of a matrix's `base` that its runs would not keep:
  per-layer attentions (`attention_overrides`: each variant sets every layer's; SPEC@layer
  sets the watched layer alone) and `max_seconds` (the runs stop by the matrix's time_budget,
  which replaces it). The others each run keeps, but attention, seed and out_dir, which
  `variant_config`'s arguments set (a TrainConfig always has them). First, as
  `TrainConfig.validate` does, `check_deterministic` (ConfigError, a ValueError): the
  variants' checks start JAX."""
  base.check_deterministic()
  if base.attention_overrides:
    raise ValueError(
      f"{overrides_text('attention_overrides', base.attention_overrides)}: each variant sets "
      "the attention of every layer (SPEC@layer: SPEC in the watched layer, standard attention "
      "elsewhere), so a per-layer attention of the base would be dropped; give none"
    )
  if base.max_seconds:
    raise ValueError(
      f"max_seconds={base.max_seconds!r}: the runs stop by the matrix's time budget "
      "(time_budget: the wall time of them all; a run cut resumes next time), which would "
      "replace it; give max_seconds=0"
    )


def run_matrix(
  base: TrainConfig,
  variants,
  seeds,
  out_dir,
  *,
  tiles=512,
  layer=1,
  time_budget=0.0,
  reference_max_logit=None,
  log=print,
  out_option="--out",
) -> list[dict]:
  """Runs every (variant, seed) not yet done, in order, within `time_budget` seconds of wall
  time (0: none; a run cut by it is left unfinished and resumes next time). Returns the report
  rows (`collect`, with `reference_max_logit`). `out_option`: the command's option for
  out_dir, as its errors name it.

  Raises:
    ValueError (`train.ConfigError`), before any training: a variant, seed, setting
      (`TrainConfig.validate`) or data folder that cannot run, or a run folder that was run
      with another configuration (the message names the settings it was run with).
  """
  out = pathlib.Path(out_dir)
  t0 = time.perf_counter()
  seeds = [random_seed("seed", s) for s in seeds]
  reference_max_logit = check_reference_max_logit(reference_max_logit)
  configs = [
    (v, s, variant_config(base, v, s, out / v / f"seed{s}", tiles=tiles, layer=layer))
    for v in variants
    for s in seeds
  ]  # validates all first
  for _, _, cfg in configs:
    cfg.validate()
  for variant, seed, cfg in configs:  # a run done or checkpointed with other settings
    run_dir = pathlib.Path(cfg.out_dir)
    if ((run_dir / "summary.json").exists() or (run_dir / "checkpoints").exists()) and (
      changes := config_changes(run_dir, cfg)
    ):
      raise ValueError(
        f"{variant} seed {seed}: {run_dir} was run with another configuration "
        f"({describe_changes(changes)}); to keep it and train this one, use "
        f"another {out_option}; to continue it, use its settings "
        f"({stored_values(changes)})"
      )
  dataset = load_dataset(base) if configs else None  # checked once, shared
  for variant, seed, cfg in configs:
    run_dir = pathlib.Path(cfg.out_dir)
    if (run_dir / "summary.json").exists():
      log(f"{variant} seed {seed}: done before, skipped")
      continue
    left = time_budget - (time.perf_counter() - t0) if time_budget else 0.0
    if time_budget and left < 30:
      log(f"{variant} seed {seed}: not started, the time budget is spent")
      continue
    cfg = dataclasses.replace(cfg, max_seconds=left)
    kernel = AttentionConfig.parse(cfg.attention).implementation == "flash"
    where = " in Pallas interpret mode" if kernel and jax.default_backend() == "cpu" else ""
    layers = f", layers {dict(cfg.attention_overrides)}" if cfg.attention_overrides else ""
    log(f"{variant} seed {seed}: training ({cfg.attention}{layers}{where})")
    try:
      s = train_and_evaluate(cfg, dataset)
    except NonFiniteError as e:
      s = dict(stopped="non-finite", error=str(e))
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      log(f"{variant} seed {seed}: {out_of_memory(e)}; left unfinished, it runs next time")
      continue
    if s.get("stopped") == "time":
      how = (
        "resumes from its checkpoint next time"
        if cfg.checkpoint_interval
        else "restarts next time (no --checkpoint-interval)"
      )
      log(f"{variant} seed {seed}: stopped by the time budget at step {s.get('step')}; {how}")
      continue
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(
      json.dumps(dict(s, variant=variant, seed=seed), default=str)
    )
  return collect(out, base, layer, reference_max_logit)


def out_of_memory(error) -> str:
  """One line for a run that ran out of device memory (XLA's RESOURCE_EXHAUSTED), naming the
  allocation it failed on: at batch 128 a flash run's training step asks about 50 GiB and the
  reference's 84 GiB (the float32 logits over the vocabulary and their gradient), so two
  processes on one GPU can exhaust it."""
  size = re.search(r"allocate ([\d.]+ ?[KMGT]i?B)", str(error))
  asked = f"an allocation of {size[1]} failed" if size else str(error).splitlines()[0][:120]
  return f"out of device memory ({asked}; other processes on the device count too)"


# A run "runs away" when the watched layer's max logit exceeds this many times the largest the
# reference-fp32 runs of the same matrix reached (every seed of them): the logit growth of the
# paper's §4 without the loss explosion that may or may not follow within the horizon.
RUNAWAY_FACTOR = 10.0
REFERENCE = AttentionConfig.parse("reference-fp32")  # (a run folder named fp32-reference too)
COMPENSATED = "+comp"  # variant v and v + COMPENSATED differ only in the compensation


def _run_row(run_dir: pathlib.Path, warmup_steps: int, layer: int, diag_interval: int) -> dict:
  metrics = read_metrics(run_dir)
  diags = read_diagnostics(run_dir)
  losses = [(r["step"], r["loss"]) for r in metrics]
  finite = [l for _, l in losses if math.isfinite(l)]
  times = [r["step_time_s"] for r in metrics[10:]] or [r["step_time_s"] for r in metrics]
  sigma = [d["sn_q_full"][layer] for d in diags]
  logits = [(d["step"], max(d["max_logit"][layer])) for d in diags if "max_logit" in d]
  dq_errs = [  # the watched layer's dQ error, largest head (NaN heads skipped; logged since 12-02)
    (d["step"], max(heads))
    for d in diags
    if (heads := [x for x in (d.get("dq_err") or [[]] * (layer + 1))[layer] if x == x])
  ]
  dq_errs_any = [  # the largest dQ error of any layer and head (after two runs part, the bias
    # term need not grow first in the watched layer)
    (d["step"], max(heads))
    for d in diags
    if (heads := [x for row in d.get("dq_err") or [] for x in row if x == x])
  ]
  tie_rates = [  # the watched layer's tie rate, mean over heads (NaN: not counted)
    (d["step"], statistics.fmean(d["tie_rate"][layer]))
    for d in diags
    if all(math.isfinite(x) for x in d["tie_rate"][layer])
  ]
  vals = [r["val_loss"] for r in metrics if "val_loss" in r]
  diag_times = [d["diag_time_s"] for d in diags[1:] if "diag_time_s" in d]  # [0] compiles
  diag_cost = (
    statistics.median(diag_times) / (diag_interval * statistics.median(times))
    if diag_times and times and diag_interval
    else math.nan
  )
  warned, warned_layer = warning_step(diags, warmup_steps)
  return dict(
    steps=metrics[-1]["step"] if metrics else 0,
    explosion_step=explosion_step(losses, warmup_steps),
    warning_step=warned,
    warning_layer=warned_layer,
    **_dq_rule_fields(diags, warmup_steps, layer),
    min_loss=min(finite) if finite else math.nan,
    final_loss=metrics[-1]["loss"] if metrics else math.nan,
    final_val_loss=vals[-1] if vals else math.nan,
    max_grad_norm=max((r["grad_norm"] for r in metrics), default=math.nan),
    max_sigma_wq=max(sigma, default=math.nan),
    last_sigma_wq=sigma[-1] if sigma else math.nan,
    max_logit=max((x for _, x in logits), default=math.nan),
    logits=logits,
    dq_errs=dq_errs,
    dq_errs_any=dq_errs_any,
    tie_rates=tie_rates,
    mean_tie_rate=statistics.fmean(x for _, x in tie_rates) if tie_rates else math.nan,
    steps_per_s=1.0 / statistics.median(times) if times else math.nan,
    diag_cost=diag_cost,
  )


def _dq_rule_fields(diags, warmup_steps: int, layer: int) -> dict:
  """Per dQ rule of the report (DQ_REPORT_FIELDS), on the watched layer: `{prefix}warning_step`
  (None where not warned, or where no row logged the rule's field: dq_err before 2026-12-02,
  dq_common before 2026-12-04) and `{prefix}logged`, which tells the two apart."""
  fields = {}
  for prefix, field in DQ_REPORT_FIELDS.items():
    rule = warning_step(diags, warmup_steps, DQErrorWarning, layer=layer, reads=field)
    fields[f"{prefix}warning_step"] = rule[0]
    fields[f"{prefix}logged"] = any(d.get(field) is not None for d in diags)
  return fields


def is_reference(variant: str) -> bool:
  """Whether a variant (a run folder's name) is the FP32 reference, in any spelling."""
  import warnings

  with warnings.catch_warnings():  # older run folders have older spellings
    warnings.simplefilter("ignore", FutureWarning)
    try:
      return AttentionConfig.parse(variant) == REFERENCE
    except ValueError:
      return False


def check_reference_max_logit(value) -> float | None:
  """None, or a finite number > 0 as a float (a reference's largest watched-layer max logit,
  measured elsewhere).

  Raises:
    TypeError / ValueError: one line naming the value.
  """
  if value is None:
    return None
  value = real_number("reference_max_logit", value)
  if not 0 < value < math.inf:
    raise ValueError(f"reference_max_logit={value!r} must be a finite number > 0")
  return value


def _reference_logits(rows) -> list[float]:
  return [
    r["max_logit"] for r in rows if is_reference(r["variant"]) and math.isfinite(r["max_logit"])
  ]


def runaway_threshold(rows, reference_max_logit=None) -> float | None:
  """`RUNAWAY_FACTOR` × the largest watched-layer max logit of the reference-fp32 rows and of
  `reference_max_logit` (a reference's largest measured elsewhere: `--reference-max-logit`),
  or None when there is neither (no reference-fp32 run with diagnostics, no value given).

  Raises:
    TypeError / ValueError: reference_max_logit not a finite number > 0
      (`check_reference_max_logit`).
  """
  given = check_reference_max_logit(reference_max_logit)
  ref = _reference_logits(rows) + ([given] if given is not None else [])
  return RUNAWAY_FACTOR * max(ref) if ref else None


def _runaway_basis(rows, reference_max_logit) -> str:
  """What the threshold comes from, for the report's rule: each source with its value, the
  one that sets the threshold first."""
  ref = _reference_logits(rows)
  sources = [(max(ref), f"the reference-fp32 runs' largest, {max(ref):g}")] if ref else []
  if reference_max_logit is not None:
    sources.append((reference_max_logit, f"{reference_max_logit:g} given"))
  sources.sort(key=lambda source: -source[0])
  return "; ".join(
    text + (" (sets it)" if i == 0 and len(sources) > 1 else "")
    for i, (_, text) in enumerate(sources)
  )


# a recipe's batch, optimizer and schedule (TrainConfig fields; the twin mirrors them too)
SCHEDULE_FIELDS = (
  "batch_size",
  "grad_accum",
  "seq_len",
  "lr",
  "min_lr",
  "warmup_steps",
  "decay_steps",
  "weight_decay",
  "beta1",
  "beta2",
  "eps",
  "grad_clip",
)
# the TrainConfig fields a report judges runs by or states as their recipe (its header): a
# stored run made with other values is not the command's recipe
RECIPE_FIELDS = (
  "model",
  "model_overrides",
  *SCHEDULE_FIELDS,
  "diag_interval",
)  # not stop_after_explosion: it decides only where an exploded run ended (reports mix 200, 300)


def check_recipe(out_dir, base: TrainConfig, option="--recipe and its options"):
  """ValueError (one line, naming the run and the first field) when a run folder under out_dir
  (`OUT/<variant>/seed<k>/config.json`) was trained with other `RECIPE_FIELDS` than `base`: a
  report judges every run by base's warmup and diagnostics interval and states base as their
  recipe, so runs of another recipe (or mixed into the folder) would be misjudged silently.
  Fields a stored config lacks are not compared."""
  new = json.loads(json.dumps(dataclasses.asdict(base), default=str))
  for path in sorted(pathlib.Path(out_dir).glob("*/seed*/config.json")):
    old = json.loads(path.read_text()).get("train", {})
    for k in RECIPE_FIELDS:
      if k in old and old[k] != new[k]:
        run = f"{path.parent.parent.name} {path.parent.name}"
        raise ValueError(
          f"{run} under {out_dir} was trained with {k}={old[k]!r}, not {new[k]!r} as {option} "
          "give: report it with the recipe and options it was made with"
        )


def collect(out_dir, base: TrainConfig, layer=1, reference_max_logit=None) -> list[dict]:
  """One row per run folder under out_dir (finished or not), read from its metrics. A row's
  `runaway_step` is the first diagnostics step whose watched-layer max logit exceeds
  `runaway_threshold(rows, reference_max_logit)` (None: not by its last step, or no threshold)."""
  reference_max_logit = check_reference_max_logit(reference_max_logit)
  rows = []
  runs = run_dirs(out_dir)
  for run_dir in sorted(runs, key=lambda d: (d.parent.name, int(d.name[4:]))):
    if not (run_dir / "metrics.jsonl").exists():
      continue
    summary = run_dir / "summary.json"
    s = json.loads(summary.read_text()) if summary.exists() else {}
    row = dict(
      variant=run_dir.parent.name,
      seed=int(run_dir.name[4:]),
      finished=summary.exists(),
      stopped=s.get("stopped"),
      **_run_row(run_dir, base.warmup_steps, layer, base.diag_interval),
    )
    row["past_warmup"] = row["steps"] > base.warmup_steps  # the explosion rule has started
    row["outcome"] = (
      "exploded"
      if row["explosion_step"] is not None
      else f"ended at step {row['steps']}, within warmup (undecided)"
      if row["finished"] and not row["past_warmup"]
      else f"stable to step {row['steps']}"
      if row["finished"]
      else "unfinished (stable so far)"
      if row["steps"]
      else "not started (no step logged)"
    )
    rows.append(row)
  threshold = runaway_threshold(rows, reference_max_logit)
  basis = _runaway_basis(rows, reference_max_logit)
  for row in rows:
    logits = row.pop("logits")
    row["runaway_threshold"] = threshold
    row["runaway_basis"] = basis
    row["runaway_step"] = (
      None if threshold is None else next((step for step, x in logits if x > threshold), None)
    )
    for rule in REPORT_RULES:  # per rule (its prefix): steps from the warning to the event
      for event in ("explosion", "runaway"):
        row[f"{rule}{event}_lead"] = (
          row[f"{event}_step"] - row[f"{rule}warning_step"]
          if None not in (row[f"{event}_step"], row[f"{rule}warning_step"])
          else None
        )
      row[f"{rule}false_alarm"] = (
        row[f"{rule}warning_step"] is not None
        and row["explosion_step"] is None
        and row["runaway_step"] is None
      )
  return rows


# the report's warning rules, by the prefix of their row fields: `train.EarlyWarning` (the max
# logit's growth) and `train.DQErrorWarning` (the watched layer's dQ error; on its part along
# the keys' mean); a dQ rule is reported on the runs that logged its field (`{prefix}logged`)
REPORT_RULES = {
  "": "`train.EarlyWarning`",
  "dq_": "`train.DQErrorWarning`",
  "dqc_": '`train.DQErrorWarning(reads="dq_common")`',
}
# the dQ rules' prefixes and the diagnostics field each one's `DQErrorWarning` reads
DQ_REPORT_FIELDS = {"dq_": "dq_err", "dqc_": "dq_common"}


DECIDED = ("exploded", "runaway", "calm")  # the outcomes (`outcome`) a run has settled


def outcome(row: dict) -> str:
  """A `collect` row's outcome: 'exploded', 'runaway', 'calm', 'unfinished' or 'too short' (it
  finished without an event by the end of warmup, where the explosion rule has not started:
  undecided, not calm)."""
  if row["explosion_step"] is not None:
    return "exploded"
  if row["runaway_step"] is not None:
    return "runaway"
  if not row["finished"]:
    return "unfinished"
  return "calm" if row["past_warmup"] else "too short"


def _decided(row, event: str) -> bool:
  """A run counts for `event` ("explosion" or "runaway") once the event happened or it
  finished past warmup without it (not 'unfinished' or 'too short', `outcome`)."""
  return row[f"{event}_step"] is not None or (row["finished"] and row["past_warmup"])


def survival(rows, event="explosion"):
  """Kaplan–Meier fraction of runs not yet at `event` against the step: (steps, fractions),
  starting at (0, 1.0); an unfinished run without the event is censored at its last step
  (scipy.stats.ecdf)."""
  import scipy.stats

  hit = [r[f"{event}_step"] for r in rows if r[f"{event}_step"] is not None]
  censored = [r["steps"] for r in rows if r[f"{event}_step"] is None]
  if not hit:
    return [0, max(censored, default=0)], [1.0, 1.0]
  sf = scipy.stats.ecdf(scipy.stats.CensoredData(uncensored=hit, right=censored)).sf
  return [0, *(int(q) for q in sf.quantiles)], [1.0, *(float(p) for p in sf.probabilities)]


def fisher_p(rows, variant, event="explosion", other=None) -> float | None:
  """One-sided Fisher exact p-value that `variant` has `event` more often than `other` (by
  default its compensated twin, variant + "+comp") among decided runs; None without both."""
  import scipy.stats

  if event == "runaway" and (not rows or rows[0]["runaway_threshold"] is None):
    return None
  counts = []
  for v in (variant, other or variant + COMPENSATED):
    rs = [r for r in rows if r["variant"] == v and _decided(r, event)]
    n_hit = sum(r[f"{event}_step"] is not None for r in rs)
    counts.append([n_hit, len(rs) - n_hit])
  if not all(sum(c) for c in counts):
    return None
  return float(scipy.stats.fisher_exact(counts, alternative="greater").pvalue)


# The modifiers that remove the bias or a piece of its mechanism: a variant with one of them is
# tested (one-sided) for having the event less often than the variant without it. "comp+guard"
# is one fix: the compensation with the clipped shift (paper layout), against neither; "rsum"
# (the row sum of the rounded P̄) with or without the compensation that it corrects.
FIXES = ("comp", "comp+guard", "comp+rsum", "comp+guard+rsum", "rsum", "center", "delta32")
COMP_SETTINGS = ("beta", "tie_tolerance", "max_shift", "shift_above")


def option_pairs(variants) -> list[tuple[str, str, str]]:
  """(variant, the same with one fix more, the fix) for every such pair of the matrix, however
  spelled (`paper+center+comp` is `paper+center` with "comp"; a variant's "@layer" must match):
  paper and paper+comp, paper and paper+center, paper+center and paper+center+comp, cudnn and
  cudnn+center (+center is the one fix xla, cudnn and the references take); a fix with
  the compensation whatever its settings (`paper+comp+guard:max_shift=6` is `paper` with
  "comp+guard"; `paper+comp:shift_above=23.7` is `paper` with "comp:shift_above=23.7", the
  compensation on the large ties only). Variants that do not parse, and other modifiers (`+lse`, a backend), make no
  pair; nor does a variant that is another spelling of an earlier one's configuration (e.g.
  `paper+triton`: the experiment runs `paper` on Triton): its runs repeat that variant's
  seeds, not new ones."""
  import warnings

  def parsed(v):
    with warnings.catch_warnings():  # older run folders have older spellings
      warnings.simplefilter("ignore", FutureWarning)
      try:
        attention, layers = variant_attention(v)
        spec = layers[0][1] if layers else attention
        return AttentionConfig.parse(spec), bool(layers)
      except ValueError:
        return None

  found = {}
  for v in variants:  # a respelling of an earlier variant: left out (None), as one that fails
    pv = parsed(v)
    found[v] = None if pv is not None and pv in found.values() else pv
  pairs = []
  for v, pv in found.items():
    if pv is None:
      continue
    for fix in FIXES:
      mods = fix.split("+")
      parts = [MODIFIERS[m] for m in mods]
      if any(all(getattr(pv[0], k) == x for k, x in part.items()) for part in parts):
        continue  # v has it, or a part of it, already
      try:
        fixed = dataclasses.replace(pv[0], **{k: x for part in parts for k, x in part.items()})
      except ValueError:  # a combination no kernel runs (+guard outside the paper layout)
        continue
      # a fix with the compensation pairs whatever its settings (beta, tolerance, cap)
      settings = {k: getattr(fixed, k) for k in COMP_SETTINGS} if "comp" in mods else {}
      comp_only_above = lambda c: "comp" in mods and c.shift_above  # noqa: E731
      pairs += [
        # shift_above leaves ties below it alone: a test variant, named as such in the pair
        (v, w, fix + (f":shift_above={pw[0].shift_above:g}" if comp_only_above(pw[0]) else ""))
        for w, pw in found.items()
        if pw is not None and pw[1] == pv[1] and dataclasses.replace(pw[0], **settings) == fixed
      ]
  return pairs


def trained_on(out_dir) -> str:
  """The devices the runs under out_dir were trained on (their config.json), comma-separated."""
  found = set()
  for cfg in pathlib.Path(out_dir).glob("*/seed*/config.json"):
    c = json.loads(cfg.read_text())
    n = c.get("device_count", 1)
    found.add((c.get("device") or c.get("backend", "unknown")) + (f" ×{n}" if n > 1 else ""))
  return ", ".join(sorted(found)) or "no runs"


def _count(rs, event):
  """'hit / decided', with the runs not decided for `event` by kind: unfinished, or finished
  within warmup (`outcome` 'too short')."""
  open_ = [r["finished"] for r in rs if not _decided(r, event)]  # finished: within warmup
  n_hit = sum(r[f"{event}_step"] is not None for r in rs)
  kinds = [
    f"{n} {name}"
    for n, name in ((open_.count(False), "unfinished"), (open_.count(True), "within warmup"))
    if n
  ]
  return f"{n_hit} / {len(rs) - len(open_)}" + (f" ({', '.join(kinds)})" if kinds else "")


def cell(x, fmt=".2g") -> str:
  """A report's cell: x formatted, "–" for None or NaN (not measured, or a run with no step)."""
  nan = isinstance(x, (float, np.floating)) and math.isnan(x)
  return "–" if x is None or nan else format(x, fmt)


def magnitude(x) -> str:
  """A magnitude for a report (a max logit, a threshold): thousands separated at ≥ 100, else 3
  significant digits (a CPU run's max logits are a few units); "–" for None or NaN."""
  return cell(x, ",.0f" if x is not None and abs(x) >= 100 else ".3g")


def format_report(rows, recipe: dict, layer: int) -> str:
  """The report's markdown: `collect`'s rows, the recipe's TrainConfig fields as a dict (its
  "warmup_steps" states the early warning's rule; KeyError without it), the watched layer."""
  threshold = rows[0]["runaway_threshold"] if rows else None
  # (rows of a report.json from before the basis was kept: the reference runs were the only one)
  basis = rows[0].get("runaway_basis", "the reference-fp32 runs' largest") if rows else ""
  rule = (
    f"max logit > {magnitude(threshold)} ({RUNAWAY_FACTOR:g} × {basis})"
    if threshold is not None
    else "not defined: the matrix has no reference-fp32 run and no --reference-max-logit"
  )
  lines = [
    f"Recipe: {format_facts(recipe)}",
    "",
    "explosion: trailing 10-step mean loss > 2× its running minimum after warmup, or a "
    f"non-finite loss; runaway: layer {layer} {rule}.",
    "",
    f"| variant | seed | steps | explosion step | runaway step | warning step (layer) "
    f"| layer {layer} dQ warning step | along the keys' mean | min loss "
    f"| final loss | final val | max grad norm | layer {layer} W_Q σ max / last "
    f"| layer {layer} max logit | layer {layer} tie rate | steps/s | diagnostics cost | outcome |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
  ]
  for r in rows:
    runaway = "n/a" if threshold is None else r["runaway_step"] or "–"
    warned = f"{r['warning_step']} ({r['warning_layer']})" if r["warning_step"] is not None else "–"
    dq_warned = " | ".join(  # per dQ rule: its step, "–" not warned, "n/a" its field not logged
      str(r.get(f"{p}warning_step") or ("–" if r.get(f"{p}logged") else "n/a"))
      for p in DQ_REPORT_FIELDS
    )
    lines.append(
      f"| {r['variant']} | {r['seed']} | {r['steps']} | {r['explosion_step'] or '–'} | "
      f"{runaway} | {warned} | {dq_warned} | {cell(r['min_loss'], '.3f')} | "
      f"{cell(r['final_loss'], '.3f')} | {cell(r['final_val_loss'], '.3f')} | "
      f"{cell(r['max_grad_norm'], '.2f')} | "
      f"{cell(r['max_sigma_wq'], '.1f')} / {cell(r['last_sigma_wq'], '.1f')} | "
      f"{magnitude(r['max_logit'])} | {cell(r['mean_tie_rate'], '.3f')} | "
      f"{cell(r['steps_per_s'], '.1f')} | {cell(r['diag_cost'], '.1%')} | {r['outcome']} |"
    )
  variants = list(dict.fromkeys(r["variant"] for r in rows))
  horizon = max((r["steps"] for r in rows), default=0)
  marks = [s for s in range(500, horizon + 1, 500)]
  head = ["variant", "exploded / runs (finished or exploded)", "ran away / runs"]
  lines += [
    "",
    "| " + " | ".join(head + [f"not exploded at {s:,}" for s in marks]) + " |",
    "|---|---|---|" + "---:|" * len(marks),
  ]
  for v in variants:
    rs = [r for r in rows if r["variant"] == v]
    steps, frac = survival(rs)
    at = lambda t: next((f for s, f in reversed(list(zip(steps, frac))) if s <= t), 1.0)
    ran = _count(rs, "runaway") if threshold is not None else "n/a"
    cells = [v, _count(rs, "explosion"), ran] + [f"{at(s):.2f}" for s in marks]
    lines.append("| " + " | ".join(cells) + " |")
  rules = {"": EarlyWarning(recipe["warmup_steps"])} | {
    prefix: DQErrorWarning(recipe["warmup_steps"], layer=layer, reads=field)
    for prefix, field in DQ_REPORT_FIELDS.items()
  }
  for rule, monitor in rules.items():
    logged = [r for r in rows if not rule or r.get(f"{rule}logged")]
    what = f"the {DQErrorWarning.DQ_FIELDS[monitor.reads]}" if rule else ""  # what it reads
    if not logged:  # no run logged the rule's field, or rows made before the report read it
      if rule == "dqc_" and not any(r.get("dq_logged") for r in rows):
        continue  # nothing of dQ at all: the dq_ rule's line says so
      lines += [
        "",
        f"Early warning ({REPORT_RULES[rule]}: {monitor.describe()}): "
        + (
          f"no run here logged {what}."
          if any(f"{rule}logged" in r for r in rows)
          else "not in these rows (made before the report gave it); report the runs again."
        ),
      ]
      continue
    lines += [
      "",
      f"Early warning ({REPORT_RULES[rule]}: {monitor.describe()}): per variant, the runs it "
      "warned before the event, the lead in steps (event step − warning step), and false "
      "alarms (a warning on a run with neither event)"
      + (
        f"; on the {len(logged)} of {len(rows)} runs that logged {what}."
        if len(logged) < len(rows)
        else "."
      ),
      "",
      "| variant | warned before explosion | lead to explosion | warned before runaway | "
      "lead to runaway | false alarms |",
      "|---|---|---|---|---|---|",
    ]
    for v in variants:
      rs = [r for r in logged if r["variant"] == v]
      if not rs:
        continue
      cells = []
      for event in ("explosion", "runaway"):
        hit = [r for r in rs if r[f"{event}_step"] is not None]
        leads = [
          r[f"{rule}{event}_lead"]
          for r in hit
          if r.get(f"{rule}{event}_lead") is not None and r[f"{rule}{event}_lead"] >= 0
        ]
        if event == "runaway" and threshold is None:
          cells += ["n/a", "n/a"]
          continue
        cells += [
          f"{len(leads)} / {len(hit)}",
          f"{min(leads)}–{max(leads)} (median {statistics.median(leads):g})" if leads else "–",
        ]
      cells.append(str(sum(bool(r.get(f"{rule}false_alarm")) for r in rs)))
      lines.append(f"| {v} | " + " | ".join(cells) + " |")
  pairs = option_pairs(variants)
  if pairs:
    lines += [
      "",
      "One-sided Fisher exact test, H1: the variant has the event more often than with one "
      f"fix more ({', '.join('+' + f for f in FIXES)}; decided runs only):",
      "",
      "| variant vs + fix | fix | p (explosion) | p (runaway) |",
      "|---|---|---:|---:|",
    ]
    for v, w, fix in pairs:
      p = [fisher_p(rows, v, e, w) for e in ("explosion", "runaway")]
      lines.append(
        f"| {v} vs {w} | {fix} | "
        + " | ".join("n/a" if x is None else f"{x:.2g}" for x in p)
        + " |"
      )
  return "\n".join(lines)


def plot_report(out_dir, rows, layer=1):
  """OUT/curves.png: per run the loss, the watched layer's W_Q spectral norm, tie rate and max
  logit (with the runaway threshold), the grad norm; per variant the survival curve."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  out = pathlib.Path(out_dir)
  fig, axes = plt.subplots(2, 3, figsize=(16, 8))
  (loss_ax, sigma_ax, tie_ax), (logit_ax, grad_ax, surv_ax) = axes
  variants = list(dict.fromkeys(r["variant"] for r in rows))  # a colour per variant,
  styles = ["-", "--", ":", "-."]  # a line style per seed
  colour = lambda v: plt.cm.tab10(variants.index(v) % 10)
  for i, r in enumerate(rows):
    run = out / r["variant"] / f"seed{r['seed']}"
    m, d = read_metrics(run), read_diagnostics(run)
    kw = dict(color=colour(r["variant"]), ls=styles[i % 4])
    step = [x["step"] for x in m]
    loss_ax.plot(step, [x["loss"] for x in m], lw=0.5, label=f"{r['variant']} s{r['seed']}", **kw)
    grad_ax.plot(step, [x["grad_norm"] for x in m], lw=0.4, **kw)
    dstep = [x["step"] for x in d]
    sigma_ax.plot(dstep, [x["sn_q_full"][layer] for x in d], lw=1, **kw)
    tie_ax.plot(dstep, [statistics.fmean(x["tie_rate"][layer]) for x in d], lw=1, **kw)
    logit_ax.plot(dstep, [max(x["max_logit"][layer]) for x in d], lw=1, **kw)
  if rows and rows[0]["runaway_threshold"] is not None:
    logit_ax.axhline(rows[0]["runaway_threshold"], color="k", lw=0.8, ls=":", label="runaway")
    logit_ax.legend(fontsize=7)
  for v in variants:
    steps, frac = survival([r for r in rows if r["variant"] == v])
    surv_ax.step(steps, frac, where="post", color=colour(v), lw=1.5, label=v)
  loss_ax.set(title="training loss", xlabel="step")
  sigma_ax.set(title=f"σ_max of layer {layer}'s W_Q", xlabel="step", yscale="log")
  tie_ax.set(title=f"layer {layer}: rows with tied tile maxima", xlabel="step")
  logit_ax.set(title=f"layer {layer}: max attention logit", xlabel="step", yscale="log")
  grad_ax.set(title="gradient norm (before clipping)", xlabel="step", yscale="log")
  surv_ax.set(title="seeds not yet exploded (Kaplan–Meier)", xlabel="step", ylim=(-0.03, 1.03))
  surv_ax.legend(fontsize=7)
  loss_ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(out / "curves.png", dpi=100)
  plt.close(fig)
  return out / "curves.png"


# TrainConfig fields a report's recipe leaves out: those each run sets (attention, seed,
# out_dir) and those of how it ran, not what it trained (a run's config.json has them)
RUN_FIELDS = (
  "attention",
  "attention_overrides",
  "seed",
  "out_dir",
  "progress",
  "max_seconds",
  "deterministic",
)


def write_report(out_dir, rows, base: TrainConfig, layer=1, meta=None) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  recipe = {k: v for k, v in dataclasses.asdict(base).items() if k not in RUN_FIELDS}
  text = format_report(rows, recipe, layer)
  (out / "report.json").write_text(
    json.dumps(dict(meta=meta or {}, recipe=recipe, rows=rows), indent=1, default=str)
  )
  (out / "report.md").write_text(f"# Instability experiment\n\n{format_meta(meta)}\n\n{text}\n")
  if rows:
    plot_report(out, rows, layer)
  return out / "report.md"


# --- the run folders as one small file ----------------------------------------------------------

RUN_FILES = ("config.json", "summary.json", "metrics.jsonl", "diagnostics.jsonl")
_TIMING = frozenset(("step_time_s", "tokens_per_s", "mfu", "diag_time_s"))


def _compact(x, key=None):
  """Floats to float32's shortest repr (the training logs' values are float32), timings to 4
  significant digits; the rest unchanged."""
  if isinstance(x, float):
    return float(f"{x:.4g}") if key in _TIMING else float(str(np.float32(x)))
  if isinstance(x, list):
    return [_compact(y, key) for y in x]
  if isinstance(x, dict):
    return {k: _compact(v, k) for k, v in x.items()}
  return x


def is_run_name(name: str) -> bool:
  """A run folder's name: seed<k>, k an ASCII decimal integer."""
  return name.startswith("seed") and name[4:].isdecimal() and name[4:].isascii()


def run_dirs(out_dir) -> list[pathlib.Path]:
  """The run folders under out_dir (OUT/<variant>/seed<k>, `is_run_name`), sorted: what a
  report reads and a pack holds."""
  return sorted(
    d for d in pathlib.Path(out_dir).glob("*/seed*") if is_run_name(d.name) and d.is_dir()
  )


def write_pack(lines, path) -> pathlib.Path:
  """The pack's JSON lines written xz-compressed at `path` (its folder made if need be), through
  a temporary file renamed into place: a pack cut short is never left under the name."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(lzma.compress("".join(line + "\n" for line in lines).encode(), preset=9))
    os.chmod(tmp, 0o644)  # a result file, readable as any other (mkstemp's is owner-only)
    os.replace(tmp, path)
  finally:
    pathlib.Path(tmp).unlink(missing_ok=True)
  return path


def pack_lines(out_dir, prefix="") -> list[str]:
  """The JSON lines of a pack of every run folder under out_dir (`run_dirs`, `RUN_FILES`, no
  checkpoints): a line per file, {"run": prefix + "variant/seedK", "file", "rows"}; none when
  there is no run. Logged floats keep float32 precision (timings 4 digits), enough to rebuild
  every report figure."""
  lines = []
  for run in run_dirs(out_dir):
    for name in RUN_FILES:
      f = run / name
      if f.exists():
        rows = (
          read_metrics(run)
          if name == "metrics.jsonl"
          else read_diagnostics(run)
          if name == "diagnostics.jsonl"
          else [json.loads(f.read_text())]
        )
        lines.append(
          json.dumps(
            dict(run=f"{prefix}{run.parent.name}/{run.name}", file=name, rows=_compact(rows)),
            separators=(",", ":"),
          )
        )
  return lines


def pack_runs(out_dir, path) -> pathlib.Path:
  """Every run folder under out_dir (`pack_lines`) in one xz-compressed JSON-lines file at
  `path` (`write_pack`); `unpack_runs(path, OUT)` recreates them."""
  return write_pack(pack_lines(out_dir), path)


def pack_paths(paths) -> list:
  """The packs of `unpack_runs`'s argument: a list as it is, a path, or one string of
  comma-separated paths (`--runs A,B`)."""
  if isinstance(paths, (str, pathlib.Path)):
    return [q for q in str(paths).split(",") if q]
  return list(paths)


def pack_problem(path) -> str | None:
  """Why `path` cannot be a pack file, before it is read: "no such file", "a folder, not a
  pack file", "not a regular file" (a device such as /dev/null, a pipe), "cannot be read (…)"
  (the system's reason: a name too long, a folder on the way not readable); None when it is a
  regular file (whether it holds runs, `read_packs` says)."""
  p = pathlib.Path(path)
  try:
    if not p.exists():
      return "no such file"
    if p.is_dir():
      return "a folder, not a pack file"
    return None if p.is_file() else "not a regular file"
  except OSError as e:  # a name too long, a folder on the way that cannot be read
    return f"cannot be read ({e.strerror or e})"


def _rows_problem(name: str, rows: list) -> str | None:
  """What is wrong with one run file's rows in a pack, or None: a .json file is one object;
  a .jsonl file's rows are objects whose "step" is an int, rising from row to row, and whose
  numbers (loss, logits, …) are numbers or lists of them, not strings."""
  if name.endswith(".json"):
    return None if len(rows) == 1 and isinstance(rows[0], dict) else "not one JSON object"
  last = None
  for row in rows:
    step = row.get("step") if isinstance(row, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
      return f"a row without an int step: {str(row)[:60]}"
    if last is not None and step <= last:
      return f"steps not rising: {step} after {last}"
    last = step
    if name == "metrics.jsonl" and not isinstance(row.get("loss"), (int, float)):
      return f"step {step}: loss {row.get('loss')!r} is not a number"
    bad = [k for k, v in row.items() if isinstance(v, str)]
    if bad:
      return f"step {step}: {bad[0]}={row[bad[0]]!r} is not a number"
  return None


def read_packs(paths, rank=None) -> dict[str, dict]:
  """The runs of one `pack_runs` file or of several (`pack_paths`): {run: {"steps", "records",
  "pack", "key"}}, a run in several packs taken whole from the pack where it trained the most steps
  (the later pack on a tie): a run that failed to start on one device leaves an empty folder in
  its pack, and a run cut short and run again has more steps in the later pack. `rank` (a map
  of a run's records to a comparable key, e.g. the twin's `rounding_rank`) comes before the
  steps, after whether the run has a result (a step or a summary): a run of a superseded kind
  loses to a current one however far it trained, unless the current one never took a step.

  Raises FileNotFoundError naming a pack that does not exist, ValueError naming the pack when
  it is not a regular file (`pack_problem`), cannot be read as a pack (not xz, not JSON lines
  of runs) or holds a path outside its
  folder or a file that is not a run file."""
  found = {}  # run → the best so far
  for path in pack_paths(paths):
    if problem := pack_problem(path):
      error = FileNotFoundError if problem == "no such file" else ValueError
      raise error(f"pack {str(path)!r}: {problem}")
    records = {}
    try:
      for line in lzma.decompress(pathlib.Path(path).read_bytes()).decode().splitlines():
        if not line:  # a pack of no run (`write_pack`), or one from before it, is one "\n"
          continue
        rec = json.loads(line)
        run, name, rows = rec["run"], rec["file"], rec["rows"]
        if not (isinstance(run, str) and isinstance(rows, list)):
          raise TypeError(f"an entry {line[:60]!r}")
        where = pathlib.PurePosixPath(run)
        if where.is_absolute() or ".." in where.parts or name not in RUN_FILES:
          raise ValueError(f"{path}: unexpected entry {run}/{name}")
        if problem := _rows_problem(name, rows):
          raise TypeError(f"{run}/{name}: {problem}")
        records.setdefault(run, []).append(rec)
    except (
      OSError,
      lzma.LZMAError,
      EOFError,
      UnicodeDecodeError,
      json.JSONDecodeError,
      TypeError,
      KeyError,
    ) as e:
      raise ValueError(
        f"pack {str(path)!r} is not a pack of runs ({type(e).__name__}: {e})"
      ) from None
    for run, recs in records.items():
      steps = sum(len(r["rows"]) for r in recs if r["file"] == "metrics.jsonl")
      result = steps > 0 or any(r["file"] == "summary.json" for r in recs)  # not a failed start
      key = (result, rank(recs) if rank else (), steps)
      if run not in found or key >= found[run]["key"]:
        found[run] = dict(steps=steps, records=recs, pack=str(path), key=key)
  return found


def write_run(records, folder) -> pathlib.Path:
  """The files of one run of `read_packs` (its "records") written into `folder`."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  for rec in records:
    text = (
      json.dumps(rec["rows"][0], indent=1)
      if rec["file"].endswith(".json")
      else "".join(json.dumps(r) + "\n" for r in rec["rows"])
    )
    (folder / rec["file"]).write_text(text)
  return folder


def unpack_runs(paths, out_dir, rank=None) -> list[str]:
  """Recreates the run folders of one `pack_runs` file, or of several (a list, or one string of
  comma-separated paths: packs of several sessions), under out_dir; returns the runs. A run in
  several packs is taken whole from the pack where it trained the most steps, after `rank`
  (`read_packs`).

  Raises ValueError naming the pack (and the entry) when a pack cannot be read, holds a path
  outside out_dir or a file that is not a run file, FileNotFoundError naming a pack that does
  not exist; both before anything is written."""
  found = read_packs(paths, rank)
  for run, r in found.items():
    write_run(r["records"], pathlib.Path(out_dir) / run)
  return list(found)
