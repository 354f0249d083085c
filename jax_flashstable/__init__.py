"""jax-flashstable: the numerics of BF16 flash attention, visible and verifiable.

The names a user needs, flat (imported on first use, so that `flashstable --help` and
`import jax_flashstable` stay fast):

  attention      flash_attention, reference_attention, reference_attention_vjp, AttentionStats,
                 AttentionConfig, attend, resolved_backend (`jax_flashstable.attention`)
  Flax           attention_fn, make_attention_fn (for nnx/linen multi-head attention)
  numerics       Numerics, Compensation, NUMERICS, get_numerics (`pallas_kernels.policy`)
  GPT-2          GPT, GPTConfig (`jax_flashstable.models.gpt2`)
  training       TrainConfig (`jax_flashstable.training.config`), train_and_evaluate
                 (`jax_flashstable.training.train`)
"""

import importlib

_EXPORTS = {
  "flash_attention": "jax_flashstable.attention.api",
  "reference_attention": "jax_flashstable.attention.api",
  "reference_attention_vjp": "jax_flashstable.attention.api",
  "AttentionStats": "jax_flashstable.attention.api",
  "resolved_backend": "jax_flashstable.attention.api",
  "AttentionConfig": "jax_flashstable.attention.config",
  "attend": "jax_flashstable.attention.flax_adapter",
  "attention_fn": "jax_flashstable.attention.flax_adapter",
  "make_attention_fn": "jax_flashstable.attention.flax_adapter",
  "Numerics": "pallas_kernels.policy",
  "Compensation": "pallas_kernels.policy",
  "NUMERICS": "pallas_kernels.policy",
  "get_numerics": "pallas_kernels.policy",
  "GPT": "jax_flashstable.models.gpt2",
  "GPTConfig": "jax_flashstable.models.gpt2",
  "TrainConfig": "jax_flashstable.training.config",
  "train_and_evaluate": "jax_flashstable.training.train",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'jax_flashstable' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
