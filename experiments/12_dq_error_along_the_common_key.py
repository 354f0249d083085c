"""Is the (rowsum dS)·c term of Qiu & Yao 2025 (§4) a bias or noise in each precision layout?
Keys sharing a large component c (channel 0 of every key shifted by C_SHIFT, the queries by
Q_SHIFT there: ordinary logits, as in a trained layer whose keys drift together), random
elsewhere; causal, bf16 inputs, 64×64 tiles. For each layout: dQ's error against FP64 in
channel 0 (along c) — its signed sum over all rows (what a W_Q gradient accumulates), its rms
per row, its largest — beside the rms in the other channels. Noise sums to about rms·√rows; a
bias sums to about mean·rows. `stochastic` (O rounded to bf16 unbiasedly) over several rounding
keys; `+center` runs the backward at the keys less their mean, `+delta32` takes delta from the
float32 O. dO is drawn independently of O, so delta's share of the term averages to zero under
any rounding: the input measures the noise's size, and cannot show a bias from O's rounding.

    PYTHONPATH=. python3 experiments/12_dq_error_along_the_common_key.py   # CPU, ~40 s
"""

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from pallas_kernels.reference import reference_attention_vjp

B, T, H, D = 2, 512, 8, 16
C_SHIFT, Q_SHIFT = -30.0, 0.5
KEYS = 6  # rounding keys of the stochastic layout


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  q, k = (0.3 * rng.standard_normal((B, T, H, D)) for _ in range(2))
  k[..., 0] += C_SHIFT
  q[..., 0] += Q_SHIFT
  v, do = (rng.standard_normal((B, T, H, D)) for _ in range(2))
  return tuple(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v, do))


def d_query(spec, q, k, v, do, rng_key=None):
  config = AttentionConfig.parse(spec + ":block_q=64,block_k=64")
  _, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, config, causal=True, rng_key=rng_key), q, k, v)
  return np.asarray(vjp(do)[0], np.float64)


def row(name, err):
  along, other = err[..., 0], err[..., 1:]
  rms = lambda a: float(np.sqrt(np.mean(a**2)))  # noqa: E731
  return (
    f"| {name} | {along.sum():+.3f} | {rms(along):.2e} | {np.abs(along).max():.2e} | "
    f"{rms(other):.2e} |"
  )


def main():
  q, k, v, do = inputs()
  _, (exact, _, _) = reference_attention_vjp(q, k, v, do, causal=True, dtype=jnp.float64)
  rows = B * T * H
  print(
    f"# {jax.devices()[0].platform}, jax {jax.__version__}; {B}×{T}×{H}×d{D}, causal; "
    f"{rows} rows: noise of rms r sums to about r·{np.sqrt(rows):.0f}\n"
  )
  print("| layout | signed sum along c | rms along c | largest along c | rms elsewhere |")
  print("|---|---:|---:|---:|---:|")
  for spec in ("fa2", "fa2+center", "fa2+delta32", "paper", "paper+center"):
    print(row(spec, d_query(spec, q, k, v, do) - exact))
  for spec in ("stochastic", "stochastic+center", "stochastic+delta32"):
    for i in range(KEYS if spec == "stochastic" else 1):
      err = d_query(spec, q, k, v, do, jax.random.key(i)) - exact
      print(row(f"{spec} (rounding key {i})", err))


if __name__ == "__main__":
  main()
