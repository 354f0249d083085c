"""Forward and all three gradients against the FP64 golden value (CPU: interpret mode)."""

import zlib

import jax.numpy as jnp
import pytest

from jax_flashstable.lab.accuracy import TENSORS, compare, compare_to_golden, flash_vjp
from jax_flashstable.lab.shapes import Shape, make_inputs

S = Shape
# Lengths 1, 17, 128, 200 and q_len ≠ kv_len, GQA/MQA, head_dim 32/64/128/256 and a padded 96.
CASES = [
  (S(1, 1, 1, 2, 2, 64), jnp.bfloat16),
  (S(2, 17, 17, 2, 2, 32, causal=True), jnp.bfloat16),
  (S(1, 128, 128, 2, 2, 128, causal=True), jnp.bfloat16),
  (S(1, 200, 200, 4, 2, 64, causal=True), jnp.bfloat16),
  (S(1, 200, 200, 2, 2, 256), jnp.bfloat16),
  (S(1, 77, 200, 4, 1, 32), jnp.bfloat16),
  (S(1, 200, 77, 2, 2, 64, causal=True), jnp.bfloat16),
  (S(1, 100, 100, 2, 2, 96, causal=True), jnp.bfloat16),
  (S(1, 50, 50, 2, 2, 64), jnp.float16),
  (S(1, 1, 1, 2, 1, 32, causal=True), jnp.float32),
  (S(1, 17, 17, 4, 2, 64), jnp.float32),
  (S(1, 128, 128, 2, 1, 128), jnp.float32),
  (S(1, 77, 200, 2, 2, 256, causal=True), jnp.float32),
  (S(1, 200, 77, 4, 2, 32), jnp.float32),
]


@pytest.mark.parametrize("stabilize", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("shape,dtype", CASES, ids=[f"{s.name} {d.__name__}" for s, d in CASES])
def test_against_fp64(shape, dtype, stabilize):
  c = compare_to_golden(
    shape, dtype, seed=zlib.crc32(shape.name.encode()) % 1000, stabilize=stabilize
  )
  assert all(c.passes().values()), {
    t: (c.flash[t], c.standard[t], c.ulp[t], c.sum_ulp[t]) for t in TENSORS
  }


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_rule_rejects_a_wrong_kernel(dtype):
  """The rule (`Comparison.passes`, its slack `sum_ulp` included) can fail: a flash result with
  a softmax_scale 10% off (bf16) or 0.1% off (float32) is flagged in every tensor."""
  shape = S(1, 64, 64, 2, 2, 64, causal=True)
  q, k, v, do = make_inputs(shape, dtype, 3)
  off = 0.9 if dtype == jnp.bfloat16 else 0.999
  wrong = flash_vjp(q, k, v, do, causal=True, softmax_scale=off / 8)
  c = compare(q, k, v, do, causal=True, result=wrong)
  assert not any(c.passes().values()), {t: (c.flash[t].max, c.standard[t].max) for t in TENSORS}
