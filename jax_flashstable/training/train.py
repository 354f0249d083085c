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
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.training.data import Dataset
from jax_flashstable.models.gpt2 import GPT, GPTConfig, count_params, flops_per_token, loss_fn
from jax_flashstable.results import run_meta

def peak_flops():
  """Dense bf16 peak of the default device for MFU: 989 TFLOP/s on H100/H200 (datasheet);
  None elsewhere (MFU is then not reported)."""
  kind = getattr(jax.devices()[0], "device_kind", "")
  return 989e12 if ("H100" in kind or "H200" in kind) else None


class NonFiniteError(RuntimeError):
  """Raised when a step produces a non-finite loss or gradient."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  model: str = "tiny"                 # GPTConfig preset
  model_overrides: tuple = ()         # ((field, value), ...) applied to the preset
  attention: str = "fa2"              # AttentionConfig spec for every layer
  attention_overrides: tuple = ()     # ((layer, spec), ...), 0-based layer index
  data: str | None = None             # data folder; None = the embedded sample
  steps: int = 200                    # optimizer steps
  batch_size: int = 8                 # sequences per micro-batch
  grad_accum: int = 1                 # micro-batches per step
  seq_len: int | None = None          # default: the model's block_size
  lr: float = 1e-3                    # peak learning rate
  min_lr: float = 1e-5                # floor of the cosine decay
  warmup_steps: int = 20              # linear warmup from 0
  decay_steps: int | None = None      # cosine length incl. warmup; default `steps`
  weight_decay: float = 0.0
  beta1: float = 0.9
  beta2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0              # global-norm clipping
  seed: int = 0                       # init and data order
  eval_interval: int = 50             # steps between validation losses (0: only at the end)
  eval_batches: int = 4
  checkpoint_interval: int = 0        # steps between Orbax checkpoints (0: none)
  diag_interval: int = 0              # steps between diagnostics rows (0: off), `diagnostics.py`
  diag_rows: int = 64                 # sampled rows per diagnostics call
  data_parallel: bool = False         # split each batch over all local devices (shard_map)
  stop_after_explosion: int = -1      # stop this many steps after an explosion (-1: never)
  warning_action: str = "log"         # on the early warning (`EarlyWarning`, needs diag_interval):
                                      # "off", "log", "checkpoint" (and go on) or "stop" (after one)
  max_seconds: float = 0.0            # stop (and checkpoint) this long after the start (0: no limit)
  out_dir: str = "runs/train"
  progress: bool = True               # tqdm progress bar

  def model_config(self) -> GPTConfig:
    overrides = dict(self.model_overrides)
    overrides["attention"] = AttentionConfig.parse(self.attention)
    overrides["attention_overrides"] = tuple(
        (int(i), AttentionConfig.parse(s)) for i, s in self.attention_overrides)
    return GPTConfig.preset(self.model, **overrides)

  def schedule(self):
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=self.lr, warmup_steps=self.warmup_steps,
        decay_steps=max(self.decay_steps or self.steps, self.warmup_steps + 1), end_value=self.min_lr)


def make_optimizer(cfg: TrainConfig):
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(cfg.schedule(), b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps,
                  weight_decay=cfg.weight_decay, mask=decay_mask))


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
        if rng_key is not None:                  # a different stream per shard
          rng_key = jax.random.fold_in(rng_key, jax.lax.axis_index("data"))
        return jax.lax.pmean(fn(params, xs, ys, rng_key), "data")
      return jax.shard_map(body, mesh=mesh, in_specs=(P(), batch_spec, batch_spec, P()),
                           out_specs=P(), check_vma=False)

    def loss_and_grads(params, xs, ys, rng_key):
      return sharded(per_shard, P(None, "data"))(params, xs, ys, rng_key)

    def eval_loss(params, x, y, rng_key=None):               # evaluation, split the same way
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

  return (jax.jit(train_step, donate_argnums=0),
          jax.jit(eval_loss))


# Fields a resumed or repeated run may change: they decide when training stops and what is
# saved, not the trajectory (`steps` too when the cosine length is fixed by decay_steps).
RESUMABLE_FIELDS = ("max_seconds", "progress", "checkpoint_interval", "stop_after_explosion",
                    "warning_action")
WARNING_ACTIONS = ("off", "log", "checkpoint", "stop")


def config_changes(out_dir, cfg: TrainConfig) -> dict:
  """{field: (stored, new)} for each field that would change the trajectory of the run stored
  in out_dir (its config.json) if it were resumed or reused with `cfg`; {} when there is none
  or nothing is stored. Fields a stored config lacks (older versions) are not compared."""
  path = pathlib.Path(out_dir) / "config.json"
  if not path.exists():
    return {}
  old = json.loads(path.read_text()).get("train", {})
  new = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))   # as config.json has it
  free = set(RESUMABLE_FIELDS)
  if old.get("decay_steps") is not None and new["decay_steps"] is not None:
    free.add("steps")
  return {k: (old[k], v) for k, v in new.items()
          if k not in free and k in old and not _same_setting(k, old[k], v)}


def _same_setting(field, old, new) -> bool:
  """Equal values; attention specs compare as the configs they name (a run stored with an
  older spelling of the same attention is the same run)."""
  if old == new:
    return True
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


def _checkpoint_manager(out_dir):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(pathlib.Path(out_dir).resolve() / "checkpoints",
                               options=ocp.CheckpointManagerOptions(max_to_keep=2))


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
    self.recent = (self.recent + [loss])[-self.window:]
    smooth = sum(self.recent) / len(self.recent)
    if step > self.warmup_steps and smooth > self.factor * self.running:
      self.step = step
    elif len(self.recent) == self.window:
      self.running = min(self.running, smooth)
    return self.step


class EarlyWarning:
  """Fed the diagnostics rows in order (`diagnostics.diagnose`: per layer and head the max
  attention logit of sampled rows); `step` is the first diagnostics step, after `start`, at
  which some layer's max logit reaches `factor` × its median over that layer's previous
  `window` rows: the onset of the logit runaway of Qiu & Yao 2025 (§4), which comes with a
  jump of σ(W_Q) and a collapse of the attention entropy.

  The factor 50 was calibrated on the anchor-b128 runs, where it separates the exploding runs
  from the compensated ones with a margin each way and warns ahead of every explosion
  (docs/studies/instability-anchor-b128.md; `experiment.instability` reports it per run).
  """

  def __init__(self, start: int, factor: float = 50.0, window: int = 5):
    self.start, self.factor, self.window = start, factor, window
    self.history, self.step, self.layer = [], None, None

  def update(self, step, max_logit) -> int | None:
    """max_logit: [layers][heads] (a diagnostics row's "max_logit"). Returns the warning step
    once it has fired (None before)."""
    if self.step is not None:
      return self.step
    layers = [max(heads) for heads in max_logit]
    if step > self.start and len(self.history) >= self.window:
      for i, x in enumerate(layers):
        past = sorted(h[i] for h in self.history[-self.window:])
        median = past[len(past) // 2] if len(past) % 2 else 0.5 * (past[len(past) // 2 - 1] + past[len(past) // 2])
        if math.isfinite(x) and median > 0 and x >= self.factor * median:
          self.step, self.layer = step, i
          return step
    self.history.append(layers)
    return None


def warning_step(diagnostics_rows, start: int) -> tuple[int | None, int | None]:
  """`EarlyWarning` over a whole run's diagnostics rows: (warning step, layer) or (None, None)."""
  monitor = EarlyWarning(start)
  for row in diagnostics_rows:
    if "max_logit" in row:
      monitor.update(row["step"], row["max_logit"])
  return monitor.step, monitor.layer


def explosion_step(losses, warmup_steps, factor=2.0, window=10):
  """`ExplosionMonitor` over a whole run's (step, loss) pairs: the explosion step or None."""
  monitor = ExplosionMonitor(warmup_steps, factor, window)
  for step, loss in losses:
    monitor.update(step, loss)
  return monitor.step


def train_and_evaluate(cfg: TrainConfig, dataset: Dataset | None = None) -> dict:
  """Trains, logs to `out_dir/metrics.jsonl`, returns a summary dict.

  Stops early `stop_after_explosion` steps after an explosion (`ExplosionMonitor`) or after
  `max_seconds` of wall time from the call (setup and compilation included; checkpointing
  there when checkpoints are on); the summary's
  `stopped` says which ("explosion", "time" or None).
  Resumes from the latest checkpoint in `out_dir` if there is one, and raises ValueError if
  that run's configuration differs in anything but `RESUMABLE_FIELDS`. On a non-finite loss or
  gradient it stops and raises `NonFiniteError` naming the step and the last finite
  checkpoint (checkpoints are written only from finite states).
  """
  import orbax.checkpoint as ocp
  t_start = time.perf_counter()                    # max_seconds counts setup and compilation too
  if cfg.warning_action not in WARNING_ACTIONS:
    raise ValueError(f"warning_action={cfg.warning_action!r} is not one of {WARNING_ACTIONS}")
  out = pathlib.Path(cfg.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  mcfg = cfg.model_config()
  seq_len = cfg.seq_len or mcfg.block_size
  data = dataset or Dataset(cfg.data, mcfg.vocab_size)
  model, graphdef, params, tx, opt_state = init_state(cfg)
  n_params = count_params(params)
  mesh = None
  if cfg.data_parallel:
    from jax_flashstable.training.parallel import data_mesh
    mesh = data_mesh()
    if cfg.batch_size % mesh.size:
      raise ValueError(f"batch_size={cfg.batch_size} is not a multiple of the {mesh.size} devices")
  train_step, eval_step = make_steps(graphdef, tx, mesh)
  schedule = cfg.schedule()
  place = lambda a, axis: a
  if mesh is not None:
    from jax_flashstable.training.parallel import replicate, shard_batch
    place = lambda a, axis: shard_batch(mesh, a, axis)
    params, opt_state = replicate(mesh, (params, opt_state))   # before a restore: it takes this sharding
  # Several hosts: every process trains, process 0 writes the logs (checkpoints are collective).
  log_dir = out if jax.process_index() == 0 else None
  mngr = _checkpoint_manager(out) if cfg.checkpoint_interval else None
  start = 0
  if mngr is not None and mngr.latest_step() is not None:
    if changes := config_changes(out, cfg):
      raise ValueError(f"{out} holds a checkpoint of another configuration "
                       f"({describe_changes(changes)}); use another out_dir or delete it")
    target = dict(params=params, opt_state=opt_state)
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(target))
    params, opt_state, start = restored["params"], restored["opt_state"], mngr.latest_step()
  with open(log_dir / "config.json" if log_dir else os.devnull, "w") as f:
    json.dump(dict(train=dataclasses.asdict(cfg), n_params=n_params, data=str(data.folder),
                   backend=jax.default_backend(), device=run_meta()["device"],
                   device_count=jax.device_count() if cfg.data_parallel else 1),
              f, indent=1, default=str)

  step_key, eval_key = jax.random.split(jax.random.key(cfg.seed))   # for stochastic rounding

  def evaluate(params):
    losses = [eval_step(params, *(place(a, 0) for a in data.batch("val", 1234, i, cfg.batch_size,
                                                                   seq_len)),
                        jax.random.fold_in(eval_key, i)) for i in range(cfg.eval_batches)]
    return float(np.mean([float(l) for l in losses]))

  tokens_per_step = cfg.batch_size * cfg.grad_accum * seq_len
  flops_step = flops_per_token(mcfg, n_params, seq_len) * tokens_per_step
  peak = peak_flops()
  if peak and mesh is not None:
    peak *= mesh.size                                              # MFU over all the devices
  bar = None
  if cfg.progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=cfg.steps, initial=start, desc=f"{cfg.attention}", leave=False)
  state, summary = (params, opt_state), {}
  monitor, stopped = ExplosionMonitor(cfg.warmup_steps), None
  warning = EarlyWarning(start=cfg.warmup_steps)
  kept = [r for r in read_metrics(out) if r["step"] <= start] if start else []   # resumed rows
  for r in kept:
    monitor.update(r["step"], r["loss"])
  power = None
  if not cfg.diag_interval and not start and log_dir:
    (log_dir / "diagnostics.jsonl").unlink(missing_ok=True)    # no stale rows from an older run
  if cfg.diag_interval:
    from jax_flashstable.training import diagnostics
    power = diagnostics.init_power_state(mcfg, jax.random.key(cfg.seed))
    power = diagnostics.converge_power_state(graphdef, params, power)   # params: as (re)started
    diag_path = log_dir / "diagnostics.jsonl" if log_dir else pathlib.Path(os.devnull)
    kept_diag = [r for r in _read_jsonl(diag_path) if r["step"] <= start] if start else []
    diag_path.write_text("".join(json.dumps(r) + "\n" for r in kept_diag))
    for r in kept_diag:
      warning.update(r["step"], r["max_logit"])
  metrics_path = log_dir / "metrics.jsonl" if log_dir else pathlib.Path(os.devnull)
  with open(metrics_path, "w") as log:                 # a fresh run, or rows up to the checkpoint
    log.writelines(json.dumps(r) + "\n" for r in kept)
    for step in range(start + 1, cfg.steps + 1):
      xy = [data.batch("train", cfg.seed, step * cfg.grad_accum + j, cfg.batch_size, seq_len)
            for j in range(cfg.grad_accum)]
      xs, ys = (np.stack(a) for a in zip(*xy))
      t0 = time.perf_counter()
      state, m = train_step(state, place(xs, 1), place(ys, 1), jax.random.fold_in(step_key, step))
      m = {k: float(v) for k, v in m.items()}                        # syncs the device
      dt = time.perf_counter() - t0
      row = dict(step=step, lr=float(schedule(step - 1)), step_time_s=dt,
                 tokens_per_s=tokens_per_step / dt, **m)
      if peak:
        row["mfu"] = flops_step / dt / peak
      finite = math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
      if finite and (step == cfg.steps or (cfg.eval_interval and step % cfg.eval_interval == 0)):
        row["val_loss"] = evaluate(state[0])
      log.write(json.dumps(row) + "\n")
      log.flush()
      if finite and cfg.diag_interval and step % cfg.diag_interval == 0:
        t_diag = time.perf_counter()
        d, power = diagnostics.diagnose(graphdef, state[0], xs[0], ys[0], power, cfg.diag_rows,
                                        jax.random.fold_in(jax.random.key(cfg.seed), step))
        drow = diagnostics.to_row(step, d)                              # syncs the device
        drow["diag_time_s"] = time.perf_counter() - t_diag             # its cost, vs step_time_s
        with open(diag_path, "a") as f:
          f.write(json.dumps(drow) + "\n")
        if cfg.warning_action != "off" and warning.step is None and warning.update(step, drow["max_logit"]):
          note = (f"early warning at step {step}: layer {warning.layer}'s max attention logit "
                  f"jumped ≥{warning.factor:g}× (EarlyWarning); {cfg.warning_action}")
          (bar.write if bar is not None else print)(note)
          if cfg.warning_action in ("checkpoint", "stop"):
            mngr = mngr or _checkpoint_manager(out)
            if mngr.latest_step() != step:
              mngr.save(step, args=ocp.args.StandardSave(dict(params=state[0], opt_state=state[1])))
          if cfg.warning_action == "stop":
            stopped = "warning"
      if bar is not None:
        bar.set_postfix(loss=f"{m['loss']:.3f}", gnorm=f"{m['grad_norm']:.2f}")
        bar.update(1)
      if not finite:
        last = mngr.latest_step() if mngr is not None else None
        if mngr is not None:
          mngr.wait_until_finished()
        raise NonFiniteError(f"non-finite loss or gradient at step {step} (loss={m['loss']}, "
                             f"grad_norm={m['grad_norm']}); last finite checkpoint: "
                             f"{'step ' + str(last) if last is not None else 'none'} in {out}")
      summary = row
      exploded = monitor.update(step, m["loss"])
      if stopped:                                  # the early warning's "stop"
        pass
      elif exploded is not None and 0 <= cfg.stop_after_explosion <= step - exploded:
        stopped = "explosion"
      elif cfg.max_seconds and time.perf_counter() - t_start > cfg.max_seconds and step < cfg.steps:
        stopped = "time"
      due = cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0
      if mngr is not None and (due or stopped == "time") and mngr.latest_step() != step:
        mngr.save(step, args=ocp.args.StandardSave(dict(params=state[0], opt_state=state[1])))
      if stopped:
        break
  if bar is not None:
    bar.close()
  if mngr is not None:
    mngr.wait_until_finished()
  summary = dict(summary, n_params=n_params, stopped=stopped, warning_step=warning.step,
                 explosion_step=monitor.step)                  # fed every logged loss, resumed too
  return summary


def _read_jsonl(path) -> list[dict]:
  path = pathlib.Path(path)
  if not path.exists():
    return []
  with open(path) as f:
    lines = f.read().splitlines()
  rows = []
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if i < len(lines) - 1:              # only a last line cut by a killed process is dropped
        raise
  return rows


def read_metrics(out_dir) -> list[dict]:
  """The rows of out_dir/metrics.jsonl (one per step)."""
  return _read_jsonl(pathlib.Path(out_dir) / "metrics.jsonl")


def read_diagnostics(out_dir) -> list[dict]:
  """The rows of out_dir/diagnostics.jsonl (one per diagnostics step)."""
  return _read_jsonl(pathlib.Path(out_dir) / "diagnostics.jsonl")
