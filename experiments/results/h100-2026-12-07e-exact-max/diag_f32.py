"""Float32 accuracy on the GPU, decomposed: one case index per process."""

import sys, zlib, json
import numpy as np, jax.numpy as jnp

sys.path.insert(0, ".")
from tests.test_golden import CASES, S  # run from the repo root
from jax_flashstable.lab.accuracy import compare, TENSORS
from jax_flashstable.lab.shapes import make_inputs
from jax_flashstable.attention.api import flash_attention

extra = [
  (S(1, 128, 128, 2, 2, 128), jnp.float32),
  (S(1, 77, 200, 2, 2, 256), jnp.float32),
  (S(1, 200, 200, 2, 2, 256, causal=True), jnp.float32),
  (S(1, 1, 1, 2, 2, 32), jnp.float32),
  (S(1, 200, 200, 2, 2, 64, causal=True), jnp.float32),
]
cases = [c for c in CASES if c[1] == jnp.float32] + extra
i = int(sys.argv[1])
shape, dtype = cases[i]
q, k, v, do = make_inputs(shape, dtype, zlib.crc32(shape.name.encode()) % 1000)
rows = {}
for mode in ("gpu",):
  kw = dict(interpret=True) if mode == "interpret" else {}
  c = compare(q, k, v, do, causal=shape.causal, **kw)
  p = c.passes()
  rows[mode] = {
    t: dict(
      flash=c.flash[t].max,
      std=c.standard[t].max,
      fmean=c.flash[t].mean,
      smean=c.standard[t].mean,
      ulp=c.ulp[t],
      sum_ulp=c.sum_ulp[t],
      ok=p[t],
      ratio=c.flash[t].max / (2 * c.standard[t].max + c.ulp[t] + c.sum_ulp[t]),
    )
    for t in TENSORS
  }
# lse error of the GPU forward against FP64
out, st = flash_attention(q, k, v, causal=shape.causal, return_stats=True)
lse = np.asarray(st[0], np.float64).transpose(0, 2, 1)
q64, k64 = (np.asarray(x, np.float64) for x in (q, k))
g = shape.num_heads // shape.num_kv_heads
k64 = np.repeat(k64, g, axis=2)
s = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(shape.head_dim)
if shape.causal:
  ql, kl = shape.q_len, shape.kv_len
  mask = np.tril(np.ones((ql, kl), bool))
  s = np.where(mask, s, -np.inf)
m = s.max(-1)
lse64 = m + np.log(np.exp(s - m[..., None]).sum(-1))
ok = np.isfinite(lse64)
rows["lse_err"] = float(np.abs(lse - lse64)[ok].max())
rows["lse_ulp"] = float(np.spacing(np.float32(np.abs(lse64[ok]).max())))
print(json.dumps({"case": f"{shape.name} {dtype.__name__}", **rows}))
