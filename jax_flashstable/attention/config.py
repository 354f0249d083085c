"""`AttentionConfig`: one frozen description of an attention choice, and the one grammar that
names it everywhere (the Flax module, the GPT-2 model, `flashstable train --attention`,
`--layer-attention`, the experiment's variants, the bench's implementations).

    SPEC     := NAME ("+" MODIFIER)* [":" FIELD "=" VALUE ("," FIELD "=" VALUE)*]
    NAME     := a preset (`PRESETS`): fa2, paper, fp32_out, stochastic (our flash kernels in
                that precision layout, `pallas_kernels.policy`), reference-fp32,
                reference-bf16 (materialized attention), xla, cudnn
                (`jax.nn.dot_product_attention`)
    MODIFIER := comp (stabilize=true: the compensation of Qiu & Yao 2025), mgpu
                (backend=mosaic_gpu: our Hopper kernels, explicitly), triton
                (backend=triton: the Triton kernels, explicitly), delta32
                (delta_float32=true), center (center_keys=true), lse (single_lse=true:
                the production kernels' P = exp(S − lse) in the backward), guard (guard_shift=true:
                the paper layout's compensation with the clipped shift), rsum
                (sum_rounded_p=true: the row sum l adds P̄ as the P̄V dot takes it); flash
                only, but center, which every implementation takes ("cudnn+center")
    FIELD    := any field of AttentionConfig but mgpu_options, or any field of
                `pallas_kernels.forward_mgpu.MosaicGPUOptions` (the Mosaic GPU kernels' speed
                options, gathered into `mgpu_options`: "fa2+comp:items_early=true")

For example "paper+comp", "fa2+comp+mgpu:block_k=128", "fa2:tie_tolerance=0.01",
"fa2+comp:items_early=true". A flash spec
without +mgpu or +triton has backend="auto": the Mosaic GPU kernels on a Hopper GPU where they
support the call, else Triton (`flash_attention`).
`AttentionConfig.name` is the shortest spec of a config (`parse(config.name) == config`).
Older spellings still parse, with a FutureWarning naming the new one (`ALIASES`, and the
bench's "flash:<layout>[+stabilize][@block_k]", "flash-mgpu:…" and "mgpu:<layout>[@block_k]").
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings

from jax_flashstable.checks import distinct
from pallas_kernels.policy import (
  BACKENDS,
  NUMERICS,
  BlockSizes,
  Compensation,
  boolean,
  check_shift_options,
  get_numerics,
  shown,
)
from pallas_kernels.forward_mgpu import MosaicGPUOptions

IMPLEMENTATIONS = ("flash", "reference", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """How one attention layer computes softmax(scale·QKᵀ)V.

  implementation: "flash" (our Pallas kernels), "reference" (materialized, in
    `reference_dtype`), "xla" or "cudnn" (`jax.nn.dot_product_attention`, JAX's numerics:
    for "xla" on a GPU float32 dots at JAX's default precision, TF32, and in bf16 dS rounded
    before dS·K, the bias mechanism's rank-one dQ error: docs/api.md).
  numerics: precision layout of the flash kernels (`pallas_kernels.policy.NUMERICS`);
    "stochastic" needs an `rng_key` per call (`attend(..., rng_key=)`; the GPT model folds one
    per step and layer).
  stabilize, beta, tie_tolerance: the compensation of Qiu & Yao 2025 (flash only).
  guard_shift: the paper layout's compensation with the clipped shift of the other layouts
    instead of the paper's literal one (`flash_attention`); paper + stabilize only.
  max_shift: the cap of the clipped shift (None: 20, 6 for float16; `flash_attention`).
  shift_above: the compensation shifts only tied tiles whose |max| is at least this (0: every
    tied tile; `flash_attention`).
  delta_float32, center_keys: backward options of the flash kernels that remove one piece of
    the bias mechanism each (`flash_attention`); single_lse: the backward's P from one float32
    lse per row, as production kernels form it. center_keys also serves the other
    implementations ("cudnn+center"): `attend` keeps their output and runs their backward at
    the keys less their mean, so their dQ is formed from centred keys too
    (`pallas_kernels.policy.centered_keys`).
  sum_rounded_p: the forward's row sum l adds the P̄ the P̄V dot takes (`flash_attention`).
  block_q, block_k: flash tile sizes (None: the kernel defaults).
  backend: the flash kernels, "auto" (default: Mosaic GPU on a Hopper GPU where it supports
    the call, else Triton), "triton" or "mosaic_gpu" (Hopper; see `flash_attention`).
  reference_dtype: "float32" or "bfloat16" for implementation="reference".
  mgpu_options: the Mosaic GPU kernels' speed options (`MosaicGPUOptions`, flash only; None:
    their defaults, which an all-default `MosaicGPUOptions()` becomes). None of them moves a
    bf16 rounding point (`flash_attention`); in a spec each is a FIELD of its own
    ("fa2+comp:items_early=true"), so that the training step and the bench can time one
    against the defaults. ValueError where no kernel of the config reads them (backend
    "triton", or "auto" where it runs Triton: `supported`).

  Raises ValueError naming the field for a value no attention accepts; whether a kernel
  supports a combination is checked by `pallas_kernels.attention.supported`.
  """

  implementation: str = "flash"
  numerics: str = "fa2"
  stabilize: bool = False
  beta: float = 2.0
  tie_tolerance: float = 1e-3
  delta_float32: bool = False
  center_keys: bool = False
  single_lse: bool = False
  sum_rounded_p: bool = False
  guard_shift: bool = False
  max_shift: float | None = None
  shift_above: float = 0.0
  block_q: int | None = None
  block_k: int | None = None
  reference_dtype: str = "float32"
  backend: str = "auto"
  mgpu_options: MosaicGPUOptions | None = None

  def __post_init__(self):
    if self.mgpu_options is not None and not isinstance(self.mgpu_options, MosaicGPUOptions):
      raise TypeError(
        f"mgpu_options must be a MosaicGPUOptions or None, got {shown(self.mgpu_options)}"
      )
    if self.mgpu_options == MosaicGPUOptions():  # one value for the defaults: name round-trips
      object.__setattr__(self, "mgpu_options", None)
    for f in dataclasses.fields(self):  # flags are bools, not truthy values ("no" is truthy)
      if f.type in ("bool", bool):
        boolean(f.name, getattr(self, f.name))
    if not isinstance(self.implementation, str) or self.implementation not in IMPLEMENTATIONS:
      raise ValueError(
        f"implementation={shown(self.implementation)} is not one of {IMPLEMENTATIONS}"
      )
    get_numerics(self.numerics)  # ValueError naming anything but a layout's name
    if not isinstance(self.reference_dtype, str) or self.reference_dtype not in (
      "float32",
      "bfloat16",
    ):
      raise ValueError(f"reference_dtype={self.reference_dtype!r} must be 'float32' or 'bfloat16'")
    if self.backend not in BACKENDS:
      raise ValueError(f"backend={self.backend!r} must be one of {BACKENDS}")
    if self.implementation != "reference" and self.reference_dtype != "float32":
      raise ValueError(
        f"reference_dtype={self.reference_dtype!r} needs implementation='reference', "
        f"got {self.implementation!r}"
      )
    if self.implementation != "flash":
      flash_only = [
        f.name
        for f in dataclasses.fields(self)
        if f.name in _FLASH_FIELDS
        and f.name not in _ANY_IMPLEMENTATION
        and getattr(self, f.name) != f.default
      ]
      if flash_only:
        raise ValueError(
          f"{', '.join(self._items(flash_only, repr))} needs implementation='flash', got "
          f"{self.implementation!r}"
        )
      return
    cap = check_shift_options(
      self.numerics, self.stabilize, self.guard_shift, self.max_shift, shift_above=self.shift_above
    )
    Compensation(  # validates
      beta=self.beta,
      tie_tolerance=self.tie_tolerance,
      shift_above=self.shift_above,
      **({} if cap is None else dict(max_shift=cap)),
    )
    if self.block_q is not None or self.block_k is not None:
      BlockSizes.default(64, self.block_q, self.block_k)  # validates
    from pallas_kernels.attention import supported

    limits = dict(
      numerics=self.numerics,
      block_k=self.block_k,
      delta_float32=self.delta_float32,
      center_keys=self.center_keys,
      sum_rounded_p=self.sum_rounded_p,
    )
    if why := supported(self.backend, **limits):
      raise ValueError(f"backend={self.backend!r} does not support {why}")
    if self.mgpu_options is not None and (
      self.backend == "triton" or (why := supported("mosaic_gpu", **limits))
    ):  # options no kernel of this config reads: an A/B of them would time nothing
      runs = (
        "backend='triton'"
        if self.backend == "triton"
        else f"backend='auto', which runs Triton for {why}"
      )
      raise ValueError(
        f"{', '.join(_option_items(self.mgpu_options, repr))}: Mosaic GPU options, unused with "
        f"{runs}; leave them out"
      )

  def flash_kwargs(self) -> dict:
    """The keyword arguments of `flash_attention` this config stands for."""
    return {
      f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in _FLASH_FIELDS
    }

  @property
  def name(self) -> str:
    """The shortest spec of this config: a preset, its modifiers, then the fields that still
    differ (e.g. "paper+comp:block_q=512,block_k=512")."""
    best = None
    for preset, base in PRESETS.items():
      mods = [
        m
        for m in MODIFIERS
        if base.implementation == "flash" or set(MODIFIERS[m]) <= set(_ANY_IMPLEMENTATION)
      ]
      for n in range(len(mods) + 1):
        for chosen in itertools.combinations(mods, n):
          try:
            cand = dataclasses.replace(
              base, **{k: v for m in chosen for k, v in MODIFIERS[m].items()}
            )
          except ValueError:  # a combination no kernel runs
            continue
          diff = [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(cand, f.name)
          ]
          key = (len(diff), n)
          if best is None or key < best[0]:
            best = (key, preset, chosen, diff)
    _, preset, chosen, diff = best
    text = "".join([preset, *(f"+{m}" for m in chosen)])
    items = self._items(diff, _format_value)
    return text + (":" + ",".join(items) if items else "")

  def _items(self, names, form) -> list[str]:
    """ "FIELD=VALUE" for each of these fields, the value by form (`_format_value` as a spec
    writes it, repr for an error message); mgpu_options as its options that differ from their
    defaults, each a FIELD of its own."""
    return [
      item
      for n in names
      for item in (
        _option_items(self.mgpu_options, form)
        if n == "mgpu_options"
        else [f"{n}={form(getattr(self, n))}"]
      )
    ]

  @classmethod
  def parse(cls, spec: str | "AttentionConfig") -> "AttentionConfig":
    """A SPEC of the module's grammar → AttentionConfig. Raises ValueError naming the part of
    the spec that is wrong."""
    if isinstance(spec, AttentionConfig):
      return spec
    if not isinstance(spec, str) or not spec:
      raise ValueError(f"an attention spec must be a non-empty string, got {spec!r}")
    given, spec = spec, _translate_old(spec)
    head, colon, overrides = spec.partition(":")
    if colon and not overrides:
      raise ValueError(f"{spec!r} ends in ':' with no FIELD=VALUE after it")
    name, *mods = head.split("+")
    older = name in ALIASES  # e.g. "flash:numerics=paper,…" (runs stored before 2026-11-30)
    if name in ALIASES:
      new = ALIASES[name]
      name, mods = new.split("+")[0], new.split("+")[1:] + mods
    if name not in PRESETS:
      raise ValueError(f"unknown attention {name!r} in {spec!r}; presets: {', '.join(PRESETS)}")
    kw, set_by = {}, {}  # each field set once: by one modifier or one FIELD=VALUE

    def setting(key, value, by):
      if key in set_by:
        raise ValueError(f"{set_by[key]} and {by} both set {key} in {spec!r}")
      kw[key], set_by[key] = value, by

    for mod in mods:
      if mod not in MODIFIERS:
        raise ValueError(
          f"unknown modifier '+{mod}' in {spec!r}; modifiers: "
          f"{', '.join('+' + m for m in MODIFIERS)}"
        )
      if f"+{mod}" in set_by.values():
        raise ValueError(f"modifier '+{mod}' twice in {spec!r}")
      for key, value in MODIFIERS[mod].items():
        setting(key, value, f"+{mod}")
    types = {f.name: f.type for f in dataclasses.fields(cls) if f.name != "mgpu_options"}
    option_types = {f.name: f.type for f in dataclasses.fields(MosaicGPUOptions)}
    for item in overrides.split(",") if overrides else ():
      key, eq, value = item.partition("=")
      if key in option_types and eq:  # a Mosaic GPU option, gathered into mgpu_options below
        setting(key, parse_field_value(key, value, option_types[key]), f"{key}={value}")
        continue
      if key not in types or not eq:
        raise ValueError(
          f"{item!r} in {spec!r} is not FIELD=VALUE with a field of AttentionConfig "
          f"({', '.join(types)}) or of MosaicGPUOptions ({', '.join(option_types)})"
        )
      if key in _PRESET_FIELDS and not older:  # the preset's name is where they are set
        raise ValueError(
          f"{item!r} in {spec!r}: the preset sets {key} (name the preset instead, e.g. "
          f"{', '.join(PRESETS)})"
        )
      setting(key, parse_field_value(key, value, types[key]), f"{key}={value}")
    options = {key: kw.pop(key) for key in option_types if key in kw}
    if options:
      try:
        kw["mgpu_options"] = MosaicGPUOptions(**options)
      except (TypeError, ValueError) as e:
        raise ValueError(f"{e} (in {spec!r})") from None
    config = dataclasses.replace(PRESETS[name], **kw)
    if spec != given or head.split("+")[0] in ALIASES:  # an older spelling
      warnings.warn(
        f"attention {given!r} is now spelled {config.name!r}", FutureWarning, stacklevel=2
      )
    return config


# A spec's FIELD is a field of AttentionConfig or of MosaicGPUOptions (`parse`): never both.
assert not {f.name for f in dataclasses.fields(AttentionConfig)} & {
  f.name for f in dataclasses.fields(MosaicGPUOptions)
}, "a MosaicGPUOptions field named as an AttentionConfig field: a spec could not tell them apart"

# Fields a preset's name sets (every combination of them has a preset: `PRESETS`), never a
# FIELD=VALUE: "paper:numerics=fa2" would be fa2 under paper's name.
_PRESET_FIELDS = ("implementation", "numerics", "reference_dtype")

_FLASH_FIELDS = (
  "numerics",
  "stabilize",
  "beta",
  "tie_tolerance",
  "delta_float32",
  "center_keys",
  "single_lse",
  "sum_rounded_p",
  "guard_shift",
  "max_shift",
  "shift_above",
  "block_q",
  "block_k",
  "backend",
  "mgpu_options",
)


# Flash fields every implementation takes: center_keys (outside the flash kernels, `attend`
# runs the implementation's backward at the keys less their mean).
_ANY_IMPLEMENTATION = ("center_keys",)


def _option_items(options: MosaicGPUOptions | None, form) -> list[str]:
  """ "FIELD=VALUE" for each Mosaic GPU option that differs from its default, the value by
  form (`AttentionConfig._items`)."""
  default = MosaicGPUOptions()
  return [
    f"{f.name}={form(getattr(options, f.name))}"
    for f in dataclasses.fields(MosaicGPUOptions)
    if options is not None and getattr(options, f.name) != getattr(default, f.name)
  ]


def _format_value(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def parse_field_value(key, text, type_name):
  """Text → a dataclass field's type ("bool", "int | None", "bool | None", "float", "str";
  "none" for a type with None); ValueError naming the key and the text when it does not
  parse."""
  t = str(type_name)
  if "None" in t and text.lower() == "none":
    return None
  try:
    if "bool" in t:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if "int" in t and "float" not in t:
      if not re.fullmatch(r"[+-]?[0-9]+", text):  # int() would also take "64_0" (640)
        raise ValueError
      return int(text)
    if "float" in t:
      return float(text)
  except ValueError:
    raise ValueError(f"{key}={text!r} is not a valid {t}") from None
  return text


def split_specs(text: str, option: str = "--attention") -> list[str]:
  """A comma-separated list of specs → the specs. A FIELD=VALUE item continues the spec before
  it ("fa2:block_q=64,block_k=64,xla" → ["fa2:block_q=64,block_k=64", "xla"]). Raises
  ValueError, naming `option`, for an empty list, an empty item ("fa2,,paper") or a spec
  given twice ("fa2,fa2")."""
  specs = []
  for item in text.split(","):
    if not item.strip():
      raise ValueError(f"{option} {text!r}: {'empty' if not text.strip() else 'an empty item'}")
    if specs and "=" in item and ":" not in item:
      specs[-1] += "," + item
    else:
      specs.append(item)
  return distinct(f"{option} {text!r}", specs)


PRESETS = {
  **{layout: AttentionConfig("flash", numerics=layout) for layout in NUMERICS},
  "reference-fp32": AttentionConfig("reference", reference_dtype="float32"),
  "reference-bf16": AttentionConfig("reference", reference_dtype="bfloat16"),
  "xla": AttentionConfig("xla"),
  "cudnn": AttentionConfig("cudnn"),
}
MODIFIERS = {
  "comp": dict(stabilize=True),
  "mgpu": dict(backend="mosaic_gpu"),
  "triton": dict(backend="triton"),
  "delta32": dict(delta_float32=True),
  "center": dict(center_keys=True),
  "lse": dict(single_lse=True),
  "guard": dict(guard_shift=True),
  "rsum": dict(sum_rounded_p=True),
}
# Older spellings → their spec now (parse warns with FutureWarning).
ALIASES = {"flash": "fa2", "flash-stable": "fa2+comp", "fp32-reference": "reference-fp32"}


def _translate_old(spec: str) -> str:
  """The bench's former names ("flash:<layout>[+stabilize][@block_k]", "flash-mgpu:…") and
  --overhead-layouts' ("mgpu:<layout>[@block_k]") → specs of the grammar; anything else
  unchanged."""
  m = re.fullmatch(
    r"(?P<prefix>flash:|flash-mgpu:|mgpu:)(?P<layout>\w+)"
    r"(?P<stab>\+stabilize)?(?:@(?P<bk>\d+))?(?P<stab2>\+stabilize)?",
    spec,
  )
  if m is None or m["layout"] not in NUMERICS:
    return spec
  new = m["layout"] + ("+comp" if m["stab"] or m["stab2"] else "")
  new += "+mgpu" if m["prefix"] != "flash:" else ""
  return new + (f":block_k={m['bk']}" if m["bk"] else "")
