"""The attention problems every part of the lab, the bench and the tests share: a `Shape` and
its seeded inputs (`make_inputs`)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from pallas_kernels.policy import boolean


@dataclasses.dataclass(frozen=True)
class Shape:
  """One attention problem; `name` labels it in reports."""

  batch: int
  q_len: int
  kv_len: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  causal: bool = False

  @classmethod
  def parse(cls, text: str, causal: bool | None = None) -> "Shape":
    """ "batch,len,heads,kv_heads,head_dim,causal" (causal: 0/1, causal/full, true/false) →
    Shape; with `causal` given, "batch,len,heads,kv_heads,head_dim" and the mask from it (the
    experiments' --shape beside --causal). ValueError naming the text when it is not that or
    the sizes do not make a problem; TypeError for a causal that is not a bool."""
    causal = boolean("causal", causal, none=True)
    grammar = "batch,len,heads,kv_heads,head_dim" + (",causal" if causal is None else "")
    try:
      fields = text.split(",")
      if causal is not None:
        fields.append("1" if causal else "0")
      b, n, h, hkv, d, c = fields
      if c.lower() not in ("0", "1", "causal", "full", "true", "false"):
        raise ValueError
      shape = cls(
        int(b), int(n), int(n), int(h), int(hkv), int(d), c.lower() in ("1", "causal", "true")
      )
    except ValueError:
      raise ValueError(f"shape {text!r} is not {grammar}") from None
    sizes = dict(
      batch=shape.batch,
      len=shape.q_len,
      heads=shape.num_heads,
      kv_heads=shape.num_kv_heads,
      head_dim=shape.head_dim,
    )
    if small := [f"{k}={v}" for k, v in sizes.items() if v < 1]:
      raise ValueError(f"shape {text!r}: {small[0]} (sizes are ≥ 1)")
    if shape.num_heads % shape.num_kv_heads:
      raise ValueError(
        f"shape {text!r}: heads={shape.num_heads} is not a multiple of "
        f"kv_heads={shape.num_kv_heads}"
      )
    return shape

  @property
  def name(self):
    c = "causal" if self.causal else "full"
    return (
      f"b{self.batch} q{self.q_len} kv{self.kv_len} h{self.num_heads}/{self.num_kv_heads}"
      f" d{self.head_dim} {c}"
    )


def make_inputs(shape: Shape, dtype, seed=0, scale=1.0):
  """query, key, value, d_out ~ N(0, scale²), rounded to `dtype` (jax arrays)."""
  rng = np.random.default_rng(seed)
  q_shape = (shape.batch, shape.q_len, shape.num_heads, shape.head_dim)
  kv_shape = (shape.batch, shape.kv_len, shape.num_kv_heads, shape.head_dim)
  return tuple(
    jnp.asarray(scale * rng.standard_normal(s), dtype)
    for s in (q_shape, kv_shape, kv_shape, q_shape)
  )
