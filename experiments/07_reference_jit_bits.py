"""Would a jitted low-precision reference give the op-by-op reference's bits? (issue 17: the
references of the accuracy rule run op by op, seconds per golden case on a CPU.)

Question: for the shapes of tests/test_golden.py in bfloat16, float16 and float32, the time of the
op-by-op `reference_attention_vjp` against one jitted program of the same function, and
whether every bit of out, dQ, dK, dV agrees, with XLA's `xla_allow_excess_precision` on and off.
Command: python experiments/07_reference_jit_bits.py
Measured (this project's 2-core CPU, AMD EPYC AVX2, 2026-12-02, the suite's XLA_FLAGS):
op by op 1.9–3.5 s (bfloat16), 0.9–1.8 (float16), 0.7–1.3 (float32); jitted 0.2–1.0 s; the
bits agree in 6 of 8 bfloat16 shapes, 3 of 8 float16, 1 of 8 float32, the same with excess
precision on or off (docs/studies/suite-time.md).
Expected runtime: ~1.5 min on 2 cores (times include each first call's compiles).
"""

import os
import time

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="
).strip()  # as tests/conftest.py
os.environ.setdefault("PJRT_NPROC", "4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jax_flashstable.lab.shapes import Shape, make_inputs  # noqa: E402
from pallas_kernels import reference  # noqa: E402

SHAPES = (
  Shape(1, 200, 77, 2, 2, 64, causal=True),
  Shape(1, 77, 200, 4, 1, 32),
  Shape(1, 200, 200, 4, 2, 64, causal=True),
  Shape(1, 200, 200, 2, 2, 256),
  Shape(2, 17, 17, 2, 2, 32, causal=True),
  Shape(1, 100, 100, 2, 2, 96, causal=True),
  Shape(1, 128, 128, 2, 2, 128, causal=True),
  Shape(1, 1, 1, 2, 2, 64),
)


def vjp(q, k, v, do, causal, scale, dtype):
  out, back = jax.vjp(lambda q, k, v: reference._attention(q, k, v, causal, scale, dtype), q, k, v)
  return out, back(do.astype(out.dtype))


def main():
  for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
    for shape in SHAPES:
      q, k, v, do = make_inputs(shape, dtype, 0)
      t = time.perf_counter()
      eager = reference.reference_attention_vjp(q, k, v, do, causal=shape.causal, dtype=dtype)
      eager = jax.tree.leaves(jax.block_until_ready(eager))
      t_eager = time.perf_counter() - t
      line = f"{jnp.dtype(dtype).name:8} {shape}: op by op {t_eager:.2f} s"
      args = (q, k, v, do, shape.causal, shape.head_dim**-0.5, dtype)
      for excess in (True, False):
        t = time.perf_counter()
        compiled = (
          jax.jit(vjp, static_argnums=(4, 5, 6))
          .lower(*args)
          .compile(compiler_options={"xla_allow_excess_precision": excess})
        )
        jitted = jax.tree.leaves(jax.block_until_ready(compiled(*args[:4])))
        same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(eager, jitted))
        line += (
          f"; jitted (excess precision {excess}) {time.perf_counter() - t:.2f} s, same bits {same}"
        )
      print(line, flush=True)


if __name__ == "__main__":
  main()
