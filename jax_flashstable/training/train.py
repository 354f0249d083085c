"""Training GPT-2 with Optax: one jitted, donated update; metrics, checkpoints, resumption.

`train_and_evaluate(TrainConfig(...))` is the entry point (the CLI and tests call it).
AdamW (β1 0.9, β2 0.95; weight decay on ≥2-D weights only, as nanoGPT), linear warmup then
cosine decay to `min_lr`, global-norm clipping, gradient accumulation over `grad_accum`
micro-batches inside the same jit. Parameters float32, matmuls bfloat16 (`gpt2.py`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_flashstable import interrupts
from jax_flashstable.checks import integer
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.training.config import (  # noqa: F401 (WARNING_ACTIONS: re-exported)
  RESUMABLE_FIELDS,
  WARNING_ACTIONS,
  ConfigError,
  TrainConfig,
)
from jax_flashstable.training.data import Dataset
from jax_flashstable.models.gpt2 import GPT, count_params, flops_per_token, loss_fn
from jax_flashstable.results import run_meta
from jax_flashstable.xla_cpu import DETERMINISTIC_GPU_OPS, flag_set


def peak_flops():
  """Dense bf16 peak of the default device for MFU: 989 TFLOP/s on H100/H200 (datasheet);
  None elsewhere (MFU is then not reported)."""
  kind = getattr(jax.devices()[0], "device_kind", "")
  return 989e12 if ("H100" in kind or "H200" in kind) else None


class NonFiniteError(RuntimeError):
  """Raised when a step produces a non-finite loss or gradient."""


class CheckpointError(RuntimeError):
  """A run folder holds checkpoints and none of them can be read; nothing is moved or written
  then (starting afresh would overwrite the run's logs)."""


class TrainingInterrupted(KeyboardInterrupt):
  """Ctrl-C stopped training after saving a checkpoint; the message says which step was saved,
  where, and how to resume. A KeyboardInterrupt, so that a script stops as on any Ctrl-C."""


def make_optimizer(cfg: TrainConfig):
  """AdamW after global-norm clipping at `grad_clip` (0: no clipping, nanoGPT's convention)."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
    optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
    optax.adamw(
      cfg.schedule(),
      b1=cfg.beta1,
      b2=cfg.beta2,
      eps=cfg.eps,
      weight_decay=cfg.weight_decay,
      mask=decay_mask,
    ),
  )


def make_steps(graphdef, tx, mesh=None):
  """(train_step, eval_step): pure functions of (params, opt_state) and token arrays.

  With a `mesh` (`parallel.data_mesh`), the batch is split over its "data" axis and the loss
  and gradients of each shard are computed inside `jax.shard_map` — so the Pallas kernels run
  per shard on local data — then averaged with `pmean`; parameters and optimizer state stay
  replicated and the update runs once, under the same jit. Evaluation is split the same way.
  Place inputs with `parallel.replicate` / `parallel.shard_batch` (batch axis 1 for training,
  0 for evaluation).
  """

  def model_loss(params, x, y, rng_key=None):
    return loss_fn(nnx.merge(graphdef, params), x, y, rng_key=rng_key)

  def loss_and_grads(params, xs, ys, rng_key):
    def micro(acc, ixy):
      i, x, y = ixy
      key = None if rng_key is None else jax.random.fold_in(rng_key, i)
      loss, grads = jax.value_and_grad(model_loss)(params, x, y, key)
      return jax.tree.map(jnp.add, acc, (loss, grads)), None

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = jax.lax.scan(micro, zero, (jnp.arange(xs.shape[0]), xs, ys))
    return jax.tree.map(lambda a: a / xs.shape[0], (loss, grads))

  eval_loss = model_loss
  if mesh is not None:
    from jax.sharding import PartitionSpec as P

    per_shard = loss_and_grads

    def sharded(fn, batch_spec):
      def body(params, xs, ys, rng_key):
        if rng_key is not None:  # a different stream per shard
          rng_key = jax.random.fold_in(rng_key, jax.lax.axis_index("data"))
        return jax.lax.pmean(fn(params, xs, ys, rng_key), "data")

      return jax.shard_map(
        body, mesh=mesh, in_specs=(P(), batch_spec, batch_spec, P()), out_specs=P(), check_vma=False
      )

    def loss_and_grads(params, xs, ys, rng_key):
      return sharded(per_shard, P(None, "data"))(params, xs, ys, rng_key)

    def eval_loss(params, x, y, rng_key=None):  # evaluation, split the same way
      return sharded(model_loss, P("data"))(params, x, y, rng_key)

  def train_step(state, xs, ys, rng_key=None):
    """state = (params, opt_state); xs, ys [grad_accum, batch, seq] int32; rng_key: the
    step's key for numerics="stochastic" layers (folded per micro-batch, shard and layer)."""
    params, opt_state = state
    loss, grads = loss_and_grads(params, xs, ys, rng_key)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(loss=loss, grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(params))
    return (params, opt_state), metrics

  return (jax.jit(train_step, donate_argnums=0), jax.jit(eval_loss))


# The fields a step function depends on (model, attention, optimizer, schedule, sharding); runs
# that agree on them share one jitted step, so a second run in a process compiles nothing new.
STEP_FIELDS = (
  "model",
  "model_overrides",
  "attention",
  "attention_overrides",
  "lr",
  "min_lr",
  "warmup_steps",
  "weight_decay",
  "beta1",
  "beta2",
  "eps",
  "grad_clip",
  "data_parallel",
)
_SHARED_STEPS: dict = {}


def step_key(cfg: TrainConfig) -> tuple:
  """What `shared_steps` keys a step on: `STEP_FIELDS` and the schedule's length."""
  return tuple(getattr(cfg, f) for f in STEP_FIELDS) + (cfg.decay_steps or cfg.steps,)


def shared_steps(cfg: TrainConfig, graphdef, tx, mesh=None):
  """`make_steps(graphdef, tx, mesh)` for `cfg`, made once per process for each setting of
  `STEP_FIELDS` and the schedule's length (the 8 newest kept): the same jitted functions, and so
  the same compiled programs, for every run that agrees on them."""
  key = step_key(cfg)
  if key not in _SHARED_STEPS:
    if len(_SHARED_STEPS) >= 8:
      _SHARED_STEPS.pop(next(iter(_SHARED_STEPS)))
    _SHARED_STEPS[key] = make_steps(graphdef, tx, mesh)
  return _SHARED_STEPS[key]


def deterministic_ops_so_far(out_dir, start: int) -> bool:
  """Whether every step of the run in out_dir, to `start` (resumed there) and from it on in
  this process, ran with XLA's deterministic GPU ops (`DETERMINISTIC_GPU_OPS` in XLA_FLAGS, as
  `TrainConfig.deterministic` sets it or the caller did): config.json's `deterministic_ops`, so
  that a run resumed with the flag after steps without it does not read as deterministic. A
  resumed run whose config.json is missing or lacks the key (older versions did not record
  it) counts as without."""
  now = flag_set(DETERMINISTIC_GPU_OPS)
  path = pathlib.Path(out_dir) / "config.json"
  if not start:
    return now
  return now and path.exists() and bool(json.loads(path.read_text()).get("deterministic_ops"))


def config_changes(out_dir, cfg: TrainConfig) -> dict:
  """{field: (stored, new)} for each field that would change the trajectory of the run stored
  in out_dir (its config.json) if it were resumed or reused with `cfg`; {} when there is none
  or nothing is stored. Fields a stored config lacks (older versions) are not compared; nor is
  out_dir (`RESUMABLE_FIELDS`: the folder is where the run lives, however it is spelled), and a
  data folder compares as the folder it names (`runs/d`, `runs/d/` and its absolute path)."""
  path = pathlib.Path(out_dir) / "config.json"
  if not path.exists():
    return {}
  stored = json.loads(path.read_text())
  old = stored.get("train", {})
  new = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))  # as config.json has it
  free = set(RESUMABLE_FIELDS)
  if old.get("decay_steps") is not None and new["decay_steps"] is not None:
    free.add("steps")
  changes = {
    k: (old[k], v)
    for k, v in new.items()
    if k not in free and k in old and not _same_setting(k, old[k], v)
  }
  if "data" in changes and _same_folder(stored.get("data_path"), new["data"]):
    del changes["data"]  # a relative path given from another working directory
  return changes


def _same_folder(a, b) -> bool:
  """Both name the same existing folder (or the same absolute path)."""
  if a is None or b is None:
    return False
  try:
    return os.path.samefile(a, b)
  except OSError:
    return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


def _same_setting(field, old, new) -> bool:
  """Equal values; attention specs compare as the configs they name (a run stored with an
  older spelling of the same attention is the same run), data folders as folders."""
  if old == new:
    return True
  if field == "data":
    return _same_folder(old, new)
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    try:
      if field == "attention":
        return AttentionConfig.parse(old) == AttentionConfig.parse(new)
      if field == "attention_overrides":
        norm = lambda pairs: sorted((int(i), AttentionConfig.parse(s)) for i, s in pairs)
        return norm(old) == norm(new)
    except (ValueError, TypeError):
      return False
  return False


def describe_changes(changes: dict) -> str:
  return ", ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in changes.items())


def stored_values(changes: dict) -> str:
  """The stored values of `changes` as field=value: the settings that would match the run."""
  return ", ".join(f"{k}={old!r}" for k, (old, _) in changes.items())


def _checkpoint_manager(out_dir):
  import orbax.checkpoint as ocp

  return ocp.CheckpointManager(
    pathlib.Path(out_dir).resolve() / "checkpoints",
    options=ocp.CheckpointManagerOptions(max_to_keep=2),
  )


def _first_line(e: BaseException, limit=200) -> str:
  """`Type: first line` of the root cause of `e` (TensorStore's OUT_OF_RANGE, not Orbax's
  wrapper), cut at `limit` characters."""
  while e.__cause__ is not None:
    e = e.__cause__
  text = (str(e).strip().splitlines() or [""])[0]
  return f"{type(e).__name__}: {text[:limit]}{'…' if len(text) > limit else ''}"


def restore_checkpoint(out_dir, target, log=print):
  """(restored, step, manager) from the newest readable checkpoint in out_dir/checkpoints, or
  (None, None, manager) when it holds none. A newer checkpoint that cannot be read (a truncated
  or damaged file) is moved into out_dir/checkpoints_damaged/ (kept, not deleted) and one line
  through `log` names its step, where it went and the step used instead.

  Raises:
    CheckpointError: there are checkpoints and none can be read; nothing is moved then.
  """
  import orbax.checkpoint as ocp

  folder = pathlib.Path(out_dir).resolve() / "checkpoints"
  mngr = _checkpoint_manager(out_dir)
  failed = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = mngr.restore(step, args=ocp.args.StandardRestore(target))
    except Exception as e:  # Orbax and TensorStore raise Exception, ValueError, OSError…
      failed.append((step, _first_line(e)))
      continue
    if failed:
      mngr.close()
      damaged = pathlib.Path(out_dir).resolve() / "checkpoints_damaged"
      moved = [_move_aside(folder / str(s), damaged) for s, _ in failed]
      mngr = _checkpoint_manager(out_dir)
      log(
        f"checkpoint{'s' * (len(failed) > 1)} of step {', '.join(str(s) for s, _ in failed)} "
        f"in {folder} cannot be read ({failed[0][1]}); moved to "
        f"{', '.join(map(str, moved))}; resuming from step {step}"
      )
    return restored, step, mngr
  mngr.close()
  if failed:
    raise CheckpointError(
      f"no checkpoint in {folder} can be read (step "
      f"{', '.join(str(s) for s, _ in failed)}: {failed[0][1]}); the folder is "
      f"left as it is; to train afresh, use another out_dir"
    )
  return None, None, _checkpoint_manager(out_dir)


def _move_aside(path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
  """Moves `path` into `folder` under its own name (name.1, name.2, … if taken)."""
  folder.mkdir(parents=True, exist_ok=True)
  dest, n = folder / path.name, 0
  while dest.exists():
    n += 1
    dest = folder / f"{path.name}.{n}"
  shutil.move(str(path), str(dest))
  return dest


def init_state(cfg: TrainConfig):
  model = GPT(cfg.model_config(), rngs=nnx.Rngs(cfg.seed))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = make_optimizer(cfg)
  return model, graphdef, params, tx, tx.init(params)


class ExplosionMonitor:
  """Fed (step, loss) in order; `step` is the first step whose loss is non-finite, or, after
  warmup, whose trailing mean loss over `window` steps exceeds `factor` × the running minimum
  of that mean (the mean keeps the batch-to-batch noise of small batches from reading as an
  explosion). The criterion of issue 6: loss > 2× its running minimum after warmup."""

  def __init__(self, warmup_steps, factor=2.0, window=10):
    self.warmup_steps, self.factor, self.window = warmup_steps, factor, window
    self.running, self.recent, self.step = math.inf, [], None

  def update(self, step, loss):
    """Returns the explosion step once one has been seen (None before)."""
    if self.step is not None:
      return self.step
    if not math.isfinite(loss):
      self.step = step
      return step
    self.recent = (self.recent + [loss])[-self.window :]
    smooth = sum(self.recent) / len(self.recent)
    if step > self.warmup_steps and smooth > self.factor * self.running:
      self.step = step
    elif len(self.recent) == self.window:
      self.running = min(self.running, smooth)
    return self.step


class EarlyWarning:
  """Fed the diagnostics rows in order (`diagnostics.diagnose`: per layer and head the max
  attention logit of sampled rows); `step` is the first diagnostics step, after `start`, at
  which some layer's max logit reaches `factor` × its lowest value over that layer's previous
  `window` rows from `start` on: the logit runaway of Qiu & Yao 2025 (§4), which comes with a
  jump of σ(W_Q) and a collapse of the attention entropy, whether as one jump or as a steady
  climb. Rows before `start` (warmup) are not a baseline.

  Calibrated on the anchor-b128 runs of 2026-11-30 to 2026-12-02 (H200, diagnostics every 100
  steps; 10 explosions, 12 runs without one) and judged on the same runs: before their
  explosion the exploding runs' layer 1 grew ≥ 184× within 5 rows, the others (compensated,
  fa2, cuDNN, the mechanism options) ≤ 39×, so 100 leaves a margin of 1.8× and 2.6×. The rule
  it replaced (≥ 50× the median of the previous 5 rows) missed a climb of 3–5× per row
  (paper+delta32 seed 29). At the anchor recipe (batch 32, every 250 steps) it fires with the
  runaway, not before it (docs/studies/instability-anchor-b128.md#the-early-warning-recalibrated).
  """

  reads = "max_logit"  # the diagnostics row's field that `update` takes

  def __init__(self, start: int, factor: float = 100.0, window: int = 5):
    self.start, self.factor, self.window = start, factor, window
    self.history, self.step, self.layer = [], None, None

  def describe(self) -> str:
    """The rule in words, for reports and logs."""
    return (
      f"a layer's max attention logit ≥ {self.factor:g}× its lowest over its previous "
      f"{self.window} diagnostics rows, after step {self.start}"
    )

  def update(self, step, max_logit) -> int | None:
    """max_logit: [layers][heads] (a diagnostics row's "max_logit"). Returns the warning step
    once it has fired (None before)."""
    if self.step is not None:
      return self.step
    layers = [max(heads) for heads in max_logit]
    if step > self.start and len(self.history) >= self.window:
      for i, x in enumerate(layers):
        lowest = min(h[i] for h in self.history[-self.window :])
        if math.isfinite(x) and lowest > 0 and x >= self.factor * lowest:
          self.step, self.layer = step, i
          return step
    if step >= self.start:
      self.history.append(layers)
    return None


class DQErrorWarning:
  """The bias mechanism's own size as a warning (Qiu & Yao 2025, §4; the mechanism study,
  docs/studies/instability-anchor-b128.md#the-dq-error-warns-earlier-than-the-logits): fed the
  diagnostics rows in order, `step` is the first diagnostics step, after `start`, that ends
  `rows` consecutive rows in which layer `watch`'s dQ error is ≥ `threshold`. The dQ error
  (`diagnostics.dq_error`, a row's "dq_err" [layers][heads], the field `reads` names) is the
  rms error of the layer's dQ against FP32 attention's, relative to the exact dQ's (no unit),
  here the largest over heads; NaN heads are skipped (an infinite error counts), and a row
  whose heads are all NaN leaves the count as it was. `layer` is None until it fires, then
  `watch` (as `EarlyWarning.layer` names the layer that fired). The (rowsum dS)·c term grows
  dQ's error before it grows the logits.

  Calibrated on the 21 anchor-b128 runs with dQ diagnostics (H200, 2026-12-02/03, every 100
  steps, runaway: layer 1's max logit > 240, the provisional threshold) and judged on the same
  runs: it warned in all 16 runs with an explosion or a runaway, and on none of the 4 finished
  calm ones (cuDNN + center 21, 24, 25; fa2 + lse 21, whose layer 1 reached 0.027 in two rows
  running, drifting up over training: a thin margin; cuDNN 21, a runaway, had 0.027 in two
  rows 900 steps before its runaway). One of the 16, paper + comp 30, crossed 240 only just
  (247); at 480 it is a false alarm. Out of sample (2026-12-03, cuDNN and cuDNN + center at
  seeds 26 and 27): it warned at 1,500 in both cuDNN runs, 300 and 400 steps before their
  runaways, and on neither calm centred run (≤ 0.022); at seed 28 it warned cuDNN at 1,300,
  1,300 steps before its runaway, and the centred run at 700, which stayed calm (its dQ error
  up to 0.116): the first false alarm.

  `reads="dq_common"` reads the error's part along each row's keys' mean, away from its exact
  dQ, instead (`diagnostics.dq_error_along`, logged since 2026-12-04): where the (rowsum dS)·c
  term lies, and not an error that only scales a row's dQ (the paper layout's literal
  compensation switching rows off: with the keys centred, two false alarms of "dq_err",
  2026-12-04). The separation is partial where keys vary off that error's directions
  (docs/training.md, "The early warning"). Same threshold and rows, not yet calibrated on runs.

  Raises:
    ValueError: `rows` < 1, a threshold that is not a finite number ≥ 0, or `reads` not one of
      DQ_FIELDS, naming it.
  """

  # the diagnostics fields it reads (not the warning_rule names "dq_error", "dq_common")
  DQ_FIELDS = {"dq_err": "dQ error", "dq_common": "dQ error along each row's keys' mean"}

  def __init__(
    self, start: int, threshold: float = 0.03, rows: int = 2, layer: int = 1, reads="dq_err"
  ):
    rows = integer("rows", rows, 1)
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold >= 0):
      raise ValueError(f"threshold={threshold!r} must be a finite number ≥ 0")
    if reads not in self.DQ_FIELDS:
      raise ValueError(f"reads={reads!r} must be one of {tuple(self.DQ_FIELDS)}")
    self.start, self.threshold, self.rows, self.watch = start, threshold, rows, layer
    self.reads = reads
    self.run, self.step, self.layer = 0, None, None

  def describe(self) -> str:
    """The rule in words, for reports and logs."""
    return (
      f"layer {self.watch}'s {self.DQ_FIELDS[self.reads]} against FP32 attention's dQ, "
      f"relative to the exact dQ's size, largest head, ≥ {self.threshold:g} in {self.rows} "
      f"diagnostics rows running, after step {self.start}"
    )

  def update(self, step, dq_err) -> int | None:
    """dq_err: [layers][heads] (a diagnostics row's field `reads`). Returns the warning step
    once it has fired (None before). Raises IndexError for a `watch` beyond the row's layers."""
    if self.step is not None or step <= self.start:
      return self.step
    heads = [x for x in dq_err[self.watch] if x == x]  # NaN heads skipped; inf counts
    if not heads:
      return None
    self.run = self.run + 1 if max(heads) >= self.threshold else 0
    if self.run >= self.rows:
      self.step, self.layer = step, self.watch
    return self.step


def early_warning(cfg: TrainConfig) -> EarlyWarning | DQErrorWarning:
  """The run's early warning, as `cfg.warning_rule` names it (config.WARNING_RULES)."""
  return {
    "logit": lambda: EarlyWarning(cfg.warmup_steps),
    "dq_error": lambda: DQErrorWarning(cfg.warmup_steps, layer=cfg.warning_layer),
    "dq_common": lambda: DQErrorWarning(
      cfg.warmup_steps, layer=cfg.warning_layer, reads="dq_common"
    ),
  }[cfg.warning_rule]()


def warning_step(
  diagnostics_rows, start: int, rule=EarlyWarning, **options
) -> tuple[int | None, int | None]:
  """A warning rule (`EarlyWarning`, `DQErrorWarning`) over a whole run's diagnostics rows:
  (warning step, layer) or (None, None). Rows without the field the rule reads (runs made
  before it was logged) are skipped."""
  monitor = replay(rule(start, **options), diagnostics_rows)
  return monitor.step, monitor.layer


def replay(monitor, diagnostics_rows):
  """`monitor` (a warning rule's instance) fed the rows, in order, that hold the field it
  reads (rows of runs made before it was logged are skipped). Returns `monitor`."""
  for row in diagnostics_rows:
    if row.get(monitor.reads) is not None:
      monitor.update(row["step"], row[monitor.reads])
  return monitor


def explosion_step(losses, warmup_steps, factor=2.0, window=10):
  """`ExplosionMonitor` over a whole run's (step, loss) pairs: the explosion step or None."""
  monitor = ExplosionMonitor(warmup_steps, factor, window)
  for step, loss in losses:
    monitor.update(step, loss)
  return monitor.step


def load_dataset(cfg: TrainConfig, dataset: Dataset | None = None) -> Dataset:
  """The run's Dataset (`dataset`, or the one `cfg.data` names), with every token file checked
  once (`data.load_tokens`) and each split longer than seq_len + 1 tokens.

  Raises:
    ConfigError: naming the data folder, for a missing or malformed token file, an id beyond
      the model's vocabulary, or a split too short for seq_len.
  """
  mcfg = cfg.model_config()
  seq_len = cfg.seq_len or mcfg.block_size
  name = f"data={cfg.data!r}" if cfg.data is not None else "the embedded sample"
  if dataset is None:
    try:
      dataset = Dataset(cfg.data, mcfg.vocab_size)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError(f"{name}: {e}") from None
  for split in ("train", "val"):
    n = len(getattr(dataset, split))
    if n <= seq_len + 1:
      raise ConfigError(
        f"{name}: the {split} split has {n} tokens, too few for seq_len={seq_len} (at least "
        f"{seq_len + 2})"
      )
  return dataset


def has_checkpoints(out: pathlib.Path) -> bool:
  """Whether out/checkpoints holds a step's checkpoint (readable or not)."""
  folder = out / "checkpoints"
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def train_and_evaluate(cfg: TrainConfig, dataset: Dataset | None = None, log=print) -> dict:
  """Trains, logs to `out_dir/metrics.jsonl`, returns a summary dict (the last metrics row,
  n_params, stopped, warning_step, explosion_step).

  Resumes from the newest readable checkpoint in `out_dir` if there is one
  (`restore_checkpoint`: a damaged newer one is moved into checkpoints_damaged/, said in one
  line through `log`), whatever `checkpoint_interval` is now. A run whose checkpoint has
  reached `steps` is not trained again: the summary is its last metrics row, with
  `already_finished=True`.
  Stops early `stop_after_explosion` steps after an explosion (`ExplosionMonitor`) or after
  `max_seconds` of wall time from the call (setup and compilation included; checkpointing
  there when checkpoints are on); the summary's `stopped` says which ("explosion", "time",
  "warning" or None). Checkpoints every `checkpoint_interval` steps, and at the last step when
  the run has a checkpoint (so that its final state is kept and a rerun trains nothing).
  Ctrl-C stops at the end of the current step (a second Ctrl-C: at once), saves a checkpoint
  of the last completed step and raises `TrainingInterrupted`; the same call resumes there.

  Raises:
    ConfigError: a setting `TrainConfig.validate` refuses, data that cannot be used
      (`load_dataset`), an out_dir that cannot be created, or an out_dir holding a checkpoint
      of another configuration (one differing in anything but `RESUMABLE_FIELDS`).
    CheckpointError: out_dir holds checkpoints and none can be read.
    NonFiniteError: a non-finite loss or gradient, naming the step and the last finite
      checkpoint (checkpoints are written only from finite states).
    TrainingInterrupted: Ctrl-C (or any KeyboardInterrupt in the loop), after the checkpoint.
  """
  import orbax.checkpoint as ocp

  t_start = time.perf_counter()  # max_seconds counts setup and compilation too
  cfg.validate()
  out = pathlib.Path(cfg.out_dir)
  resuming = has_checkpoints(out)
  if resuming and (changes := config_changes(out, cfg)):
    raise ConfigError(
      f"{out} holds a checkpoint of another configuration "
      f"({describe_changes(changes)}); to resume it, use its settings "
      f"({stored_values(changes)}); to train this configuration, use another "
      f"out_dir"
    )
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"out_dir={cfg.out_dir!r} cannot be created ({e.strerror})") from None
  mcfg = cfg.model_config()
  seq_len = cfg.seq_len or mcfg.block_size
  data = load_dataset(cfg, dataset)
  model, graphdef, params, tx, opt_state = init_state(cfg)
  n_params = count_params(params)
  mesh = None
  if cfg.data_parallel:
    from jax_flashstable.training.parallel import data_mesh

    mesh = data_mesh()
    if cfg.batch_size % mesh.size:
      raise ConfigError(
        f"batch_size={cfg.batch_size} is not a multiple of the {mesh.size} "
        f"devices (data_parallel=True)"
      )
  place = lambda a, axis: a
  if mesh is None:
    # committed to their device, as a restored checkpoint's arrays are: jit keys its programs
    # on that too, so a run resumed in the same process (the tests, run_matrix) reuses the
    # step and evaluation of the fresh run instead of compiling both again
    params, opt_state = jax.tree.map(lambda a: jax.device_put(a, a.sharding), (params, opt_state))
  else:
    from jax_flashstable.training.parallel import replicate, shard_batch

    place = lambda a, axis: shard_batch(mesh, a, axis)
    params, opt_state = replicate(
      mesh, (params, opt_state)
    )  # before a restore: it takes this sharding
  # Several hosts: every process trains, process 0 writes the logs (checkpoints are collective).
  log_dir = out if jax.process_index() == 0 else None
  mngr, start = None, 0
  if resuming:
    restored, step, mngr = restore_checkpoint(out, dict(params=params, opt_state=opt_state), log)
    if restored is not None:
      params, opt_state, start = restored["params"], restored["opt_state"], step
  bar, state, summary, stopped = None, (params, opt_state), {}, None
  done = state_step = start  # the last step logged with finite values / whose state `state` is
  try:  # from here on, Ctrl-C saves and the manager is closed in the end
    kept = [r for r in read_metrics(out) if r["step"] <= start] if start else []  # resumed rows
    monitor, warning = ExplosionMonitor(cfg.warmup_steps), early_warning(cfg)
    for r in kept:
      monitor.update(r["step"], r["loss"])
    kept_diag = [r for r in read_diagnostics(out) if r["step"] <= start] if start else []
    if cfg.warning_action != "off":  # as a fresh run would
      replay(warning, kept_diag)
    if start >= cfg.steps:  # finished before: report it, train nothing
      return dict(
        kept[-1] if kept else dict(step=start),
        n_params=n_params,
        stopped=None,
        warning_step=warning.step,
        warning_rule=cfg.warning_rule,
        explosion_step=monitor.step,
        already_finished=True,
      )
    train_step, eval_step = shared_steps(cfg, graphdef, tx, mesh)
    schedule = cfg.schedule()
    # (where the logs are written: process 0 rewrites config.json just below)
    deterministic_ops = deterministic_ops_so_far(out, start) if log_dir else None
    with open(log_dir / "config.json" if log_dir else os.devnull, "w") as f:
      json.dump(
        dict(
          train=dataclasses.asdict(cfg),
          deterministic_ops=deterministic_ops,
          n_params=n_params,
          data=str(data.folder),
          data_path=str(pathlib.Path(cfg.data).resolve()) if cfg.data else None,
          backend=jax.default_backend(),
          device=run_meta()["device"],
          device_count=jax.device_count() if cfg.data_parallel else 1,
        ),
        f,
        indent=1,
        default=str,
      )

    step_key, eval_key = jax.random.split(jax.random.key(cfg.seed))  # for stochastic rounding

    def evaluate(params):
      losses = [
        eval_step(
          params,
          *(place(a, 0) for a in data.batch("val", 1234, i, cfg.batch_size, seq_len)),
          jax.random.fold_in(eval_key, i),
        )
        for i in range(cfg.eval_batches)
      ]
      return float(np.mean([float(l) for l in losses]))

    def save(step, state):
      nonlocal mngr
      mngr = mngr or _checkpoint_manager(out)
      if mngr.latest_step() != step:
        mngr.save(step, args=ocp.args.StandardSave(dict(params=state[0], opt_state=state[1])))

    tokens_per_step = cfg.batch_size * cfg.grad_accum * seq_len
    flops_step = flops_per_token(mcfg, n_params, seq_len) * tokens_per_step
    peak = peak_flops()
    if peak and mesh is not None:
      peak *= mesh.size  # MFU over all the devices
    if cfg.progress:
      from tqdm.auto import tqdm

      # disable=None: no bar where stderr is not a terminal (a log file, a device's output)
      bar = tqdm(total=cfg.steps, initial=start, desc=f"{cfg.attention}", leave=False, disable=None)
    power = None
    if not cfg.diag_interval and not start and log_dir:
      (log_dir / "diagnostics.jsonl").unlink(missing_ok=True)  # no stale rows from an older run
    if cfg.diag_interval:
      from jax_flashstable.training import diagnostics

      power = diagnostics.init_power_state(mcfg, jax.random.key(cfg.seed))
      power = diagnostics.converge_power_state(graphdef, params, power)  # params: as (re)started
      diag_path = log_dir / "diagnostics.jsonl" if log_dir else pathlib.Path(os.devnull)
      diag_path.write_text("".join(json.dumps(r) + "\n" for r in kept_diag))
    metrics_path = log_dir / "metrics.jsonl" if log_dir else pathlib.Path(os.devnull)
    with interrupts.deferred() as stop_requested, open(metrics_path, "w") as log_file:
      log_file.writelines(json.dumps(r) + "\n" for r in kept)  # a fresh run, or rows up to start
      for step in range(start + 1, cfg.steps + 1):
        xy = [
          data.batch("train", cfg.seed, step * cfg.grad_accum + j, cfg.batch_size, seq_len)
          for j in range(cfg.grad_accum)
        ]
        xs, ys = (np.stack(a) for a in zip(*xy))
        t0 = time.perf_counter()
        state, m = train_step(state, place(xs, 1), place(ys, 1), jax.random.fold_in(step_key, step))
        state_step = step
        m = {k: float(v) for k, v in m.items()}  # syncs the device
        dt = time.perf_counter() - t0
        row = dict(
          step=step,
          lr=float(schedule(step - 1)),
          step_time_s=dt,
          tokens_per_s=tokens_per_step / dt,
          **m,
        )
        if peak:
          row["mfu"] = flops_step / dt / peak
        finite = math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
        if finite and (step == cfg.steps or (cfg.eval_interval and step % cfg.eval_interval == 0)):
          row["val_loss"] = evaluate(state[0])
        log_file.write(json.dumps(row) + "\n")
        log_file.flush()
        if finite:
          done = step
        if finite and cfg.diag_interval and step % cfg.diag_interval == 0:
          t_diag = time.perf_counter()
          d, power = diagnostics.diagnose(
            graphdef,
            state[0],
            xs[0],
            ys[0],
            power,
            cfg.diag_rows,
            jax.random.fold_in(jax.random.key(cfg.seed), step),
          )
          drow = diagnostics.to_row(step, d)  # syncs the device
          drow["diag_time_s"] = time.perf_counter() - t_diag  # its cost, vs step_time_s
          with open(diag_path, "a") as f:
            f.write(json.dumps(drow) + "\n")
          if (
            cfg.warning_action != "off"
            and warning.step is None
            and warning.update(step, drow[warning.reads])
          ):
            note = (
              f"early warning at step {step} in layer {warning.layer} "
              f"({type(warning).__name__}: {warning.describe()}); {cfg.warning_action}"
            )
            (bar.write if bar is not None else print)(note)
            if cfg.warning_action in ("checkpoint", "stop"):
              save(step, state)
            if cfg.warning_action == "stop":
              stopped = "warning"
        if bar is not None:
          bar.set_postfix(loss=f"{m['loss']:.3f}", gnorm=f"{m['grad_norm']:.2f}")
          bar.update(1)
        if not finite:
          last = mngr.latest_step() if mngr is not None else None
          raise NonFiniteError(
            f"non-finite loss or gradient at step {step} (loss={m['loss']}, "
            f"grad_norm={m['grad_norm']}); last finite checkpoint: "
            f"{'step ' + str(last) if last is not None else 'none'} in {out}"
          )
        summary = row
        exploded = monitor.update(step, m["loss"])
        if stopped:  # the early warning's "stop"
          pass
        elif exploded is not None and 0 <= cfg.stop_after_explosion <= step - exploded:
          stopped = "explosion"
        elif (
          cfg.max_seconds and time.perf_counter() - t_start > cfg.max_seconds and step < cfg.steps
        ):
          stopped = "time"
        due = cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0
        if due or (stopped == "time" and (cfg.checkpoint_interval or mngr is not None)):
          save(step, state)
        if stopped:
          break
        if stop_requested.is_set():
          raise KeyboardInterrupt
    if mngr is not None and mngr.latest_step() is not None and done > mngr.latest_step():
      save(done, state)  # the final state of a run that checkpoints
  except KeyboardInterrupt:
    # the state of the last completed step, unless the interrupt came inside a step after its
    # input state was donated to it (a second Ctrl-C, or a KeyboardInterrupt raised elsewhere)
    intact = done == state_step and not any(
      getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state)
    )
    if intact and done > 0:
      save(done, state)
    last = mngr.latest_step() if mngr is not None else None
    raise TrainingInterrupted(_interrupt_message(out, done if intact else None, last)) from None
  finally:
    if bar is not None:
      bar.close()
    if mngr is not None:
      mngr.wait_until_finished()  # no async save left behind a raised error
      mngr.close()
  summary = dict(
    summary,
    n_params=n_params,
    stopped=stopped,
    warning_step=warning.step,
    warning_rule=cfg.warning_rule,
    explosion_step=monitor.step,
  )  # fed every logged loss, resumed too
  return summary


def _interrupt_message(out, saved, last) -> str:
  """One line: the step saved (or the last checkpoint) and how to resume."""
  folder = pathlib.Path(out).resolve() / "checkpoints"
  resume = "to resume, rerun the same command (same out_dir and settings)"
  if saved:
    return f"interrupted after step {saved}: checkpoint of step {saved} in {folder}; {resume}"
  if last is not None:
    return (
      f"interrupted inside a step, whose state is lost; the last checkpoint is step {last} "
      f"in {folder}; {resume}"
    )
  return "interrupted before the first step finished; nothing to save (a rerun starts afresh)"


def _read_jsonl(path) -> list[dict]:
  """The rows of a JSON-lines log ([] when there is none); a last line cut by a killed process
  is dropped. Raises ValueError naming the file and the line for any other line that is not
  JSON, or a file that is not UTF-8 text."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not a JSON-lines log (not text: byte {e.start})") from None
  rows = []
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as e:
      if i < len(lines) - 1:  # only a last line cut by a killed process is dropped
        raise ValueError(f"{path}: line {i + 1} is not JSON ({e.msg})") from None
  return rows


def read_metrics(out_dir) -> list[dict]:
  """The rows of out_dir/metrics.jsonl (one per step)."""
  return _read_jsonl(pathlib.Path(out_dir) / "metrics.jsonl")


def read_diagnostics(out_dir) -> list[dict]:
  """The rows of out_dir/diagnostics.jsonl (one per diagnostics step)."""
  return _read_jsonl(pathlib.Path(out_dir) / "diagnostics.jsonl")
