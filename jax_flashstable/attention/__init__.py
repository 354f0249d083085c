"""The public attention API: `flash_attention` and the references (`api`), `AttentionConfig`
(`config`: one grammar for naming an attention everywhere) and the Flax adapter
(`flax_adapter`: `attend`, `attention_fn`, `make_attention_fn`)."""

from jax_flashstable.attention.api import (
  AttentionStats,
  Kernels,
  flash_attention,
  reference_attention,
  reference_attention_vjp,
  resolved_backend,
)
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend, attention_fn, make_attention_fn

__all__ = [
  "AttentionConfig",
  "AttentionStats",
  "Kernels",
  "attend",
  "attention_fn",
  "flash_attention",
  "make_attention_fn",
  "reference_attention",
  "reference_attention_vjp",
  "resolved_backend",
]
