"""The bias mechanism's two inputs (tests/test_mechanism.py) through the implementations that are
not ours, with and without `+center`: dQ, dK, dV and O against FP64, beside naive attention in the
inputs' dtype (the suite's rule). On a GPU this includes cuDNN (`jax.nn.dot_product_attention`),
whose backward takes delta from the rounded O (head_dim 16 only: cuDNN needs a multiple of 8).

    PYTHONPATH=. python3 experiments/08_mechanism_other_kernels.py
"""

import pathlib
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_mechanism import common_keys, nine  # noqa: E402

from jax_flashstable.attention.config import AttentionConfig  # noqa: E402
from jax_flashstable.attention.flax_adapter import attend  # noqa: E402
from jax_flashstable.lab.accuracy import compare  # noqa: E402

SPECS = ["xla", "xla+center", "fa2", "fa2+center"]
if jax.default_backend() == "gpu":
  SPECS = ["cudnn", "cudnn+center"] + SPECS

print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}")
print("| input | attention | tensor | max error | naive max error | within the rule |")
print("|---|---|---|---:|---:|---|")
for case in (common_keys, nine):
  (q, k, v, do), causal = case()
  for spec in SPECS if case is common_keys else [s for s in SPECS if "cudnn" not in s]:
    cfg = AttentionConfig.parse(spec)
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, cfg, causal=causal), q, k, v)
    c = compare(q, k, v, do, causal=causal, result=(out, vjp(do)))
    ok = c.passes()
    for t in c.flash:
      print(
        f"| {case.__name__} | {spec} | {t} | {c.flash[t].max:.3g} | {c.standard[t].max:.3g} | {ok[t]} |",
        flush=True,
      )
