"""Does centring the keys by their mean over the whole sequence (`+center`) leave a bias term
when the keys' common component drifts along the sequence? A causal row sees only the keys up to
it, whose mean differs from the global one by a drift-dependent amount d_i; the (rowsum dS)·c term
of Qiu & Yao 2025 (§4) then survives as (rowsum dS)·d_i. The common-keys input of
tests/test_mechanism.py (q = 1 in channel 0, keys at −480 there) at 128 positions and 4 heads,
with channel 0 of the keys rising linearly by DRIFT over the sequence: dQ's largest error against
FP64 for XLA's attention, our fa2 and fa2 + center, beside naive bf16 attention; causal, and as a
control without the mask, where every row sees every key and the global mean is each row's own.

    PYTHONPATH=. python3 experiments/10_centring_drift.py
"""

from jax_flashstable.xla_cpu import plain_dots

plain_dots()  # `compare`'s CPU references in plain float32 dots, before JAX starts

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.lab.accuracy import compare

T, H, D = 128, 4, 16
SPECS = ("xla", "fa2", "fa2+center")


def inputs(drift, seed=0):
  rng = np.random.default_rng(seed)
  q, k = (0.1 * rng.standard_normal((1, T, H, D)) for _ in range(2))
  q[..., 0] = 1.0
  k[..., 0] = -480.0 + drift * np.arange(T)[None, :, None] / T
  v, do = (rng.standard_normal((1, T, H, D)) for _ in range(2))
  return tuple(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v, do))


def main():
  print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}; T={T}, heads={H}, head_dim={D}")
  print("| mask | drift | naive bf16 | " + " | ".join(SPECS) + " |")
  print("|---|---:|---:|" + "---:|" * len(SPECS))
  for causal in (True, False):
    for drift in (0.0, 15.0, 60.0, 240.0):
      q, k, v, do = inputs(drift)
      cells, naive = [], None
      for spec in SPECS:
        cfg = AttentionConfig.parse(spec)
        f = lambda q, k, v: attend(q, k, v, cfg, causal=causal)
        out, vjp = jax.vjp(f, q, k, v)
        c = compare(q, k, v, do, causal=causal, result=(out, vjp(do)))
        naive = c.standard["d_query"].max
        cells.append(f"{c.flash['d_query'].max:.3g}")
      mask = "causal" if causal else "none"
      print(f"| {mask} | {drift:g} | {naive:.3g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
