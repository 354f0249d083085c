"""`TrainConfig`: every setting of a training run, and its validation.

Light on purpose: importing this module imports no JAX, Flax or Optax (they are imported inside
the methods that need them), so that `flashstable --help`, whose training options are built
from TrainConfig's fields, starts in well under a second.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import tempfile

from jax_flashstable.checks import distinct, integer, random_seed
from jax_flashstable.xla_cpu import DETERMINISTIC_GPU_OPS, deterministic_gpu_ops, flag_set

WARNING_ACTIONS = ("off", "log", "checkpoint", "stop")
# the early warnings: "logit" (`train.EarlyWarning`: some layer's max logit grows ≥ 100× within
# 5 rows), "dq_error" (`train.DQErrorWarning`: warning_layer's dQ error ≥ 0.03, 2 rows running)
# and "dq_common" (the same on the error's part along each row's keys' mean)
WARNING_RULES = ("logit", "dq_error", "dq_common")
# Fields a resumed or repeated run may change: they decide when training stops and what is
# saved, not the trajectory (`steps` too when the cosine length is fixed by decay_steps), and
# `out_dir`: the folder is where the run lives (spelled `runs/r`, `runs/r/` or absolute, or
# moved), not part of what it is; `deterministic`: the order of a GPU's float sums, which
# without it does not repeat anyway.
RESUMABLE_FIELDS = (
  "max_seconds",
  "progress",
  "checkpoint_interval",
  "stop_after_explosion",
  "warning_action",
  "warning_rule",
  "warning_layer",
  "out_dir",
  "deterministic",
)


class ConfigError(ValueError):
  """A setting that cannot run: a value out of range, an unknown name, a path that is missing
  or cannot be written, or a run folder that holds another configuration. The message is one
  line naming the setting and its value (the CLI prints it as is, exit status 2)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Every setting of a training run (`train.train_and_evaluate`).

  Construction checks each value on its own (`ConfigError`, a ValueError, naming the field and
  the value); `validate()` also checks the names (model preset, GPTConfig overrides, attention
  specs), seq_len against the model's block_size, and the paths (data folder, out_dir).
  """

  model: str = "tiny"  # GPTConfig preset
  model_overrides: tuple = ()  # ((field, value), ...) applied to the preset
  attention: str = "fa2"  # AttentionConfig spec for every layer
  attention_overrides: tuple = ()  # ((layer, spec), ...), 0-based layer index
  data: str | None = None  # data folder; None = the embedded sample
  steps: int = 200  # optimizer steps
  batch_size: int = 8  # sequences per micro-batch
  grad_accum: int = 1  # micro-batches per step
  seq_len: int | None = None  # default: the model's block_size
  lr: float = 1e-3  # peak learning rate
  min_lr: float = 1e-5  # floor of the cosine decay
  warmup_steps: int = 20  # linear warmup from 0
  decay_steps: int | None = None  # cosine length incl. warmup; default `steps`
  weight_decay: float = 0.0
  beta1: float = 0.9
  beta2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0  # global-norm clipping (0: none, nanoGPT's convention)
  seed: int = 0  # init and data order
  eval_interval: int = 50  # steps between validation losses (0: only at the end)
  eval_batches: int = 4
  checkpoint_interval: int = 500  # steps between Orbax checkpoints (0: none)
  diag_interval: int = 0  # steps between diagnostics rows (0: off), `diagnostics.py`
  diag_rows: int = 64  # sampled rows per diagnostics call
  data_parallel: bool = False  # split each batch over all local devices (shard_map)
  stop_after_explosion: int = -1  # stop this many steps after an explosion (-1: never)
  warning_action: str = "log"  # on the early warning (warning_rule's, needs diag_interval):
  # "off", "log", "checkpoint" (and go on) or "stop" (after one)
  warning_rule: str = "logit"  # the early warning: one of WARNING_RULES
  warning_layer: int = 1  # the layer (0-based) the dQ rules watch (only it)
  max_seconds: float = 0.0  # stop (and checkpoint) this long after the start
  # (0: no limit)
  out_dir: str = "runs/train"
  progress: bool = True  # tqdm progress bar (where stderr is a terminal)
  # XLA's deterministic GPU ops (`xla_cpu.deterministic_gpu_ops`): a GPU run repeats bit for
  # bit; set before JAX starts (validate() does it when JAX has not). A CPU's runs repeat anyway.
  deterministic: bool = False

  def __post_init__(self):
    """Raises ConfigError for a value out of its range or of the wrong type (no imports, no
    files: `validate` checks names and paths)."""
    for name, low in (
      ("steps", 1),
      ("batch_size", 1),
      ("grad_accum", 1),
      ("seq_len", 1),
      ("warmup_steps", 0),
      ("decay_steps", 1),
      ("eval_interval", 0),
      ("eval_batches", 1),
      ("checkpoint_interval", 0),
      ("diag_interval", 0),
      ("diag_rows", 1),
      ("stop_after_explosion", -1),
      ("warning_layer", 0),
    ):
      value = getattr(self, name)
      if value is None and name in ("seq_len", "decay_steps"):
        continue
      object.__setattr__(self, name, integer(name, value, low, ConfigError))  # a NumPy int too
    object.__setattr__(self, "seed", random_seed("seed", self.seed, ConfigError))
    for name, low, high, closed in (
      ("lr", 0.0, math.inf, False),
      ("min_lr", 0.0, math.inf, True),
      ("weight_decay", 0.0, math.inf, True),
      ("beta1", 0.0, 1.0, True),
      ("beta2", 0.0, 1.0, True),
      ("eps", 0.0, math.inf, False),
      ("grad_clip", 0.0, math.inf, True),
      ("max_seconds", 0.0, math.inf, True),
    ):
      value = getattr(self, name)
      ok = (
        _is_number(value)
        and math.isfinite(value)
        and value < high
        and (value >= low if closed else value > low)
      )
      if not ok:
        bounds = f"{'≥' if closed else '>'} {low:g}" + (
          f" and < {high:g}" if high < math.inf else ""
        )
        hint = " (0: no clipping)" if name == "grad_clip" else ""
        raise ConfigError(f"{name}={value!r} must be a finite number {bounds}{hint}")
    if self.min_lr > self.lr:
      raise ConfigError(
        f"min_lr={self.min_lr!r} is above lr={self.lr!r} (the cosine decays from lr to "
        "min_lr: set min_lr at most lr)"
      )
    if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
      raise ConfigError(  # (`schedule` would lengthen it to warmup_steps + 1 unsaid)
        f"decay_steps={self.decay_steps!r} must be more than warmup_steps={self.warmup_steps!r}:"
        " the cosine's length counts the warmup (optax.warmup_cosine_decay_schedule)"
      )
    if self.warning_action not in WARNING_ACTIONS:
      raise ConfigError(f"warning_action={self.warning_action!r} is not one of {WARNING_ACTIONS}")
    if self.warning_rule not in WARNING_RULES:
      raise ConfigError(f"warning_rule={self.warning_rule!r} is not one of {WARNING_RULES}")
    if not self.diag_interval and (
      self.warning_rule != "logit" or self.warning_action in ("checkpoint", "stop")
    ):  # asked for, and nothing to watch: the warnings read the diagnostics rows
      chosen = (
        f"warning_rule={self.warning_rule!r}"
        if self.warning_rule != "logit"
        else f"warning_action={self.warning_action!r}"
      )
      raise ConfigError(f"{chosen} needs diag_interval > 0 (the diagnostics it reads), got 0")
    for name in ("model", "attention", "out_dir"):
      value = getattr(self, name)
      if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}={value!r} must be a non-empty string")
    if self.data is not None and (not isinstance(self.data, str) or not self.data):
      raise ConfigError(f"data={self.data!r} must be a folder path or None (the embedded sample)")
    for name in ("data_parallel", "progress", "deterministic"):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f"{name}={getattr(self, name)!r} must be True or False")
    for name in ("model_overrides", "attention_overrides"):
      pairs = getattr(self, name)
      if not isinstance(pairs, (tuple, list)) or not all(
        isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs
      ):
        raise ConfigError(f"{name}={pairs!r} must be a tuple of (key, value) pairs")
      distinct(name, [k for k, _ in pairs], ConfigError)

  def check_deterministic(self) -> None:
    """With `deterministic`, XLA's deterministic GPU ops on for this process, or about to be:
    `xla_cpu.deterministic_gpu_ops` adds the flag while JAX has not started. Whatever trains
    a TrainConfig calls this before anything that starts JAX (`validate` first, and the
    experiments' `instability.check_base`).

    Raises:
      ConfigError: JAX started on a GPU without the flag (XLA reads it once a process).
    """
    if self.deterministic and (why := deterministic_gpu_ops()):
      raise ConfigError(f"deterministic=True: {why}")

  def validate(self) -> "TrainConfig":
    """Checks what construction cannot without imports or files: first, with `deterministic`,
    that XLA's deterministic GPU ops are or will be on (`check_deterministic`); the model
    preset and its overrides, the attention specs (and that the device can run them: no cudnn
    under deterministic ops), seq_len ≤ the model's block_size, warning_layer a layer of the
    model under a dQ warning_rule, that the data folder exists and that out_dir can be
    written, and last (it imports JAX and starts its backend: XLA_FLAGS set later are not
    read) that each layer's attention runs in the model, at its compute_dtype and head_dim
    (`check_attention`: the checks of the attention's first call, on shapes alone). Returns
    self.

    Raises:
      ConfigError: naming the field and its value.
    """
    self.check_deterministic()  # first: before JAX starts
    try:
      mcfg = self.model_config()
    except ValueError as e:
      raise ConfigError(named_error(self, e)) from None
    if self.seq_len is not None and self.seq_len > mcfg.block_size:
      raise ConfigError(
        f"seq_len={self.seq_len} exceeds the context of model {self.model!r} "
        f"(block_size={mcfg.block_size}); use seq_len ≤ {mcfg.block_size}"
      )
    if self.warning_rule != "logit" and self.warning_layer >= mcfg.n_layer:
      raise ConfigError(
        f"warning_layer={self.warning_layer} is not a layer of model {self.model!r} "
        f"(n_layer={mcfg.n_layer}); warning_rule={self.warning_rule!r} watches it"
      )
    _check_device(self, mcfg)
    if self.data is not None and not pathlib.Path(self.data).is_dir():
      what = (
        " is a file, not a folder" if pathlib.Path(self.data).exists() else ": folder not found"
      )
      raise ConfigError(f"data={self.data!r}{what}")
    if self.data is not None:
      from jax_flashstable.training.data import holds_data

      if not holds_data(self.data):
        raise ConfigError(f"data={self.data!r}: holds neither train.bin[.xz] nor text files")
    check_output_dir(self.out_dir, "out_dir")
    for name, spec, config in _layer_attentions(self, mcfg):  # last: it starts JAX
      check_attention(f"{name}={spec!r}", config, self, mcfg)
    return self

  def model_config(self):
    """The GPTConfig of this run. Raises ValueError for an unknown preset, field or spec."""
    from jax_flashstable.attention.config import AttentionConfig
    from jax_flashstable.models.gpt2 import GPTConfig

    overrides = dict(self.model_overrides)
    overrides["attention"] = AttentionConfig.parse(self.attention)
    overrides["attention_overrides"] = tuple(
      (int(i), AttentionConfig.parse(s)) for i, s in self.attention_overrides
    )
    return GPTConfig.preset(self.model, **overrides)

  def schedule(self):
    import optax

    return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=self.lr,
      warmup_steps=self.warmup_steps,
      decay_steps=max(self.decay_steps or self.steps, self.warmup_steps + 1),
      end_value=self.min_lr,
    )


def _is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def named_error(cfg: TrainConfig, e: ValueError) -> str:
  """The model_config() error with the field it came from named first."""
  from jax_flashstable.attention.config import AttentionConfig

  for layer, spec in cfg.attention_overrides:
    try:
      AttentionConfig.parse(spec)
    except ValueError:
      return f"attention_overrides: layer {layer}={spec!r}: {e}"
  try:
    AttentionConfig.parse(cfg.attention)
  except ValueError:
    return f"attention={cfg.attention!r}: {e}"
  if "preset" in str(e):
    return f"model={cfg.model!r}: {e}"
  if "attention override" in str(e):
    return f"{overrides_text('attention_overrides', cfg.attention_overrides)}: {e}"
  return f"{overrides_text('model_overrides', cfg.model_overrides)} (model {cfg.model!r}): {e}"


def overrides_text(field: str, pairs) -> str:
  """A TrainConfig overrides field as the command line repeats its option, one item each:
  "field='key=value' field='key=value'" (an attention given as an AttentionConfig by its spec),
  which the CLI's messages turn into --layer-attention / --model-set."""
  spec = lambda v: v.name if hasattr(v, "flash_kwargs") else v  # an AttentionConfig: its spec
  return " ".join(f"{field}={f'{key}={spec(value)}'!r}" for key, value in pairs)


def _layer_attentions(cfg: TrainConfig, mcfg) -> list[tuple]:
  """(field as the errors name it, spec, AttentionConfig) of `attention` and of each layer
  override; `mcfg` is cfg's GPTConfig."""
  return [("attention", cfg.attention, mcfg.attention)] + [
    (f"attention_overrides: layer {i}", spec, c)
    for (i, spec), (_, c) in zip(cfg.attention_overrides, mcfg.attention_overrides)
  ]


def _check_device(cfg: TrainConfig, mcfg) -> None:
  """GPU-only attentions (cudnn, the Mosaic GPU forward) on another backend, and cudnn under
  XLA's deterministic GPU ops (`deterministic`, or the flag in XLA_FLAGS): fail now, not after
  tracing the model (or, for the latter, at the first step: with XLA's deterministic GPU ops
  the training step with XLA's cuDNN attention raised
  `IndexError: absl::container_internal::raw_hash_map<>::at` when run, jax 0.11.2, H200,
  2026-12-07, experiments/results/h200-2026-12-07h-targets-step-kernels; ours and xla ran)."""
  layers = _layer_attentions(cfg, mcfg)
  gpu_only = [
    (name, spec)
    for name, spec, c in layers
    if c.implementation == "cudnn" or c.backend == "mosaic_gpu"
  ]
  if gpu_only:
    import jax

    if jax.default_backend() != "gpu":
      name, spec = gpu_only[0]
      raise ConfigError(
        f"{name}={spec!r} needs a GPU; the default backend is {jax.default_backend()!r}"
      )
  cudnn = [(name, spec) for name, spec, c in layers if c.implementation == "cudnn"]
  if cudnn and (cfg.deterministic or flag_set(DETERMINISTIC_GPU_OPS)):  # on a GPU (above)
    name, spec = cudnn[0]
    why = "deterministic=True" if cfg.deterministic else f"XLA_FLAGS has {DETERMINISTIC_GPU_OPS}"
    raise ConfigError(
      f"{why} with {name}={spec!r}: XLA's cuDNN attention failed under its deterministic GPU "
      "ops (jax 0.11.2, gpt2-small on an H200: an IndexError at the first step); train it "
      "without them, or use another attention (fa2, xla)"
    )


def attention_error(config, mcfg, batch_size: int, seq_len: int) -> str | None:
  """Why the attention `config` (an AttentionConfig) cannot run as a layer of the GPT model
  `mcfg` (its compute_dtype, n_head, head_dim) on [batch_size, seq_len] sequences: the
  message (its first line) of the check its first call in the model would fail, found now on
  shapes alone (`jax.eval_shape`: nothing is built, compiled or run). Flash: `flash_attention`'s
  argument checks (`resolved_backend`: head_dim, the layout's and options' dtypes, the
  kernels' limits), no kernel traced; the others: `attend` traced (the inputs' checks,
  cuDNN's dtypes and shapes on a GPU). None when it runs, and for cudnn off a GPU
  (`_check_device` refuses it first). The one-line error is `check_attention`'s."""
  import math

  import jax
  import jax.numpy as jnp

  from jax_flashstable.attention.api import resolved_backend
  from jax_flashstable.attention.flax_adapter import attend

  if config.implementation == "cudnn" and jax.default_backend() != "gpu":
    return None
  # the model's call (`CausalSelfAttention`): q, k, v [batch, seq, n_head, head_dim] in
  # compute_dtype, causal, softmax_scale 1/√head_dim, a key per call where stochastic
  x = jax.ShapeDtypeStruct(
    (batch_size, seq_len, mcfg.n_head, mcfg.head_dim), jnp.dtype(mcfg.compute_dtype)
  )
  stochastic = config.implementation == "flash" and config.numerics == "stochastic"

  def call(q, k, v, rng_key):  # traced: abstract arrays, nothing computed
    if config.implementation == "flash":  # the kernels' checks only, no kernel traced
      resolved_backend(
        q,
        k,
        v,
        causal=True,
        softmax_scale=1.0 / math.sqrt(mcfg.head_dim),
        rng_key=rng_key if stochastic else None,
        **config.flash_kwargs(),
      )
    else:
      attend(q, k, v, config, causal=True)

  try:
    jax.eval_shape(call, x, x, x, jax.eval_shape(jax.random.key, 0))
  except (ValueError, TypeError, NotImplementedError) as e:  # the checks' kinds of error
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return None


def check_attention(
  what: str, config, cfg: TrainConfig, mcfg=None, error: type[Exception] = ConfigError
) -> None:
  """Raises `error` (ConfigError unless given) when the attention `config` cannot run as a
  layer of cfg's model (`attention_error`), in one line: `what` (e.g. "attention='stochastic'"),
  the model, its compute_dtype and head_dim, then the check's own message. `mcfg`: cfg's
  GPTConfig, when already built."""
  mcfg = cfg.model_config() if mcfg is None else mcfg
  why = attention_error(config, mcfg, cfg.batch_size, cfg.seq_len or mcfg.block_size)
  if why:
    raise error(
      f"{what} cannot run in model {cfg.model!r} (compute_dtype={mcfg.compute_dtype!r}, "
      f"head_dim={mcfg.head_dim}): {why}"
    )


def check_output_dir(path, name="out") -> pathlib.Path:
  """Raises ConfigError (one line naming `name` and the path) unless `path` is a folder this
  process can write into, or can be created; creates nothing (a probe folder is made and
  removed in the nearest existing ancestor). Returns the path."""
  p = pathlib.Path(path)
  if str(path) == "":
    raise ConfigError(f"{name}={str(path)!r} must name a folder")
  if p.exists() and not p.is_dir():
    raise ConfigError(f"{name}={str(path)!r} is a file, not a folder")
  ancestor = p.absolute()
  while not ancestor.exists():
    ancestor = ancestor.parent
  if not ancestor.is_dir():
    raise ConfigError(f"{name}={str(path)!r} cannot be created: {ancestor} is a file")
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".flashstable-probe-", dir=ancestor))
  except OSError as e:
    where = "is not writable" if ancestor == p.absolute() else f"cannot be created in {ancestor}"
    raise ConfigError(f"{name}={str(path)!r} {where} ({e.strerror})") from None
  return p
