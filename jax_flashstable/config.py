"""`AttentionConfig`: one frozen description of an attention choice, shared by the Flax module,
the GPT-2 model, the CLI and the experiments."""
from __future__ import annotations

import dataclasses

from pallas_kernels.policy import (BACKENDS, MOSAIC_GPU_BLOCK_K, MOSAIC_GPU_NUMERICS, NUMERICS,
                                   BlockSizes, Compensation)

IMPLEMENTATIONS = ("flash", "reference", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """How one attention layer computes softmax(scale·QKᵀ)V.

  implementation: "flash" (our Pallas kernels), "reference" (materialized, in
    `reference_dtype`), "xla" or "cudnn" (`jax.nn.dot_product_attention`).
  numerics: precision layout of the flash kernels ("fa2"); "stochastic" needs an `rng_key`
    per call (`attend(..., rng_key=)`; the GPT model folds one per step and layer).
  stabilize, beta, tie_tolerance: the compensation of Qiu & Yao 2025 (flash only).
  block_q, block_k: flash tile sizes (None: the kernel defaults).
  backend: the flash forward kernel, "triton" or "mosaic_gpu" (Hopper; see `flash_attention`).
  reference_dtype: "float32" or "bfloat16" for implementation="reference".
  """
  implementation: str = "flash"
  numerics: str = "fa2"
  stabilize: bool = False
  beta: float = 2.0
  tie_tolerance: float = 1e-3
  block_q: int | None = None
  block_k: int | None = None
  reference_dtype: str = "float32"
  backend: str = "triton"

  def __post_init__(self):
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"implementation={self.implementation!r} is not one of {IMPLEMENTATIONS}")
    if self.numerics not in NUMERICS:
      raise ValueError(f"numerics={self.numerics!r} is not one of {sorted(NUMERICS)}")
    if self.reference_dtype not in ("float32", "bfloat16"):
      raise ValueError(f"reference_dtype={self.reference_dtype!r} must be 'float32' or 'bfloat16'")
    if self.stabilize and self.implementation != "flash":
      raise ValueError(f"stabilize=True needs implementation='flash', got {self.implementation!r}")
    if self.backend not in BACKENDS:
      raise ValueError(f"backend={self.backend!r} must be 'triton' or 'mosaic_gpu'")
    if self.backend != "triton" and self.implementation != "flash":
      raise ValueError(f"backend={self.backend!r} needs implementation='flash', "
                       f"got {self.implementation!r}")
    if self.backend == "mosaic_gpu" and self.numerics not in MOSAIC_GPU_NUMERICS:
      raise ValueError(f"backend='mosaic_gpu' has numerics {MOSAIC_GPU_NUMERICS}, "
                       f"got numerics={self.numerics!r}")
    if self.backend == "mosaic_gpu" and self.block_k not in (None, *MOSAIC_GPU_BLOCK_K):
      raise ValueError(f"backend='mosaic_gpu' needs block_k 64 or 128, got block_k={self.block_k}")
    Compensation(beta=self.beta, tie_tolerance=self.tie_tolerance)   # validates
    if self.block_q is not None or self.block_k is not None:
      BlockSizes.default(64, self.block_q, self.block_k)              # validates

  @property
  def name(self) -> str:
    for preset, cfg in PRESETS.items():
      if cfg == self:
        return preset
    return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                    if getattr(self, f.name) != f.default)

  @classmethod
  def parse(cls, spec: str | "AttentionConfig") -> "AttentionConfig":
    """A preset name, or `preset:key=value,key=value` (e.g. "flash:stabilize=true,block_k=32")."""
    if isinstance(spec, AttentionConfig):
      return spec
    name, _, overrides = spec.partition(":")
    if name not in PRESETS:
      raise ValueError(f"unknown attention preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]
    if overrides:
      kw = {}
      types = {f.name: f.type for f in dataclasses.fields(cls)}
      for item in overrides.split(","):
        key, _, value = item.partition("=")
        if key not in types:
          raise ValueError(f"unknown AttentionConfig field {key!r} in {spec!r}")
        kw[key] = parse_field_value(key, value, types[key])
      cfg = dataclasses.replace(cfg, **kw)
    return cfg


def parse_field_value(key, text, type_name):
  """Text → a dataclass field's type ("bool", "int | None", "float", "str"); ValueError naming
  the key and the text when it does not parse."""
  t = str(type_name)
  try:
    if "bool" in t:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if "int" in t and "float" not in t:
      return None if text.lower() == "none" else int(text)
    if "float" in t:
      return float(text)
  except ValueError:
    raise ValueError(f"{key}={text!r} is not a valid {t}") from None
  return text


PRESETS = {
    "flash": AttentionConfig("flash"),
    "flash-stable": AttentionConfig("flash", stabilize=True),
    "reference-fp32": AttentionConfig("reference", reference_dtype="float32"),
    "reference-bf16": AttentionConfig("reference", reference_dtype="bfloat16"),
    "xla": AttentionConfig("xla"),
    "cudnn": AttentionConfig("cudnn"),
}
