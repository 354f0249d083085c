"""Dumps of PyTorch's scaled_dot_product_attention, one per SDPA backend, on the same seeded
inputs as `paper_fa2.py`: output and gradients in bf16, for `flashstable crosscheck`.

Backends: math (CPU and GPU), flash, efficient and cudnn (GPU; a backend the device or build
lacks is reported and skipped). Runs in a torch environment (no JAX):
  python torch_crosscheck/sdpa_dump.py OUTDIR --len 1024 --heads 4 --head-dim 64 --causal \\
      --device cuda [--backends math,flash,efficient,cudnn]
writes OUTDIR/sdpa_<backend>.npz; then, with JAX:  flashstable crosscheck OUTDIR/sdpa_flash.npz
"""

from __future__ import annotations

import pathlib
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import NAMES, make_inputs, shape_parser, write_dump  # noqa: E402

BACKENDS = dict(
  math=SDPBackend.MATH,
  flash=SDPBackend.FLASH_ATTENTION,
  efficient=SDPBackend.EFFICIENT_ATTENTION,
  cudnn=SDPBackend.CUDNN_ATTENTION,
)


def run(backend, q, k, v, do, causal):
  """(out, dQ, dK, dV) of SDPA restricted to one backend; raises RuntimeError if unavailable."""
  q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
  with sdpa_kernel([BACKENDS[backend]]):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(do)
  return out, q.grad, k.grad, v.grad


def main(argv=None):
  ap = shape_parser(__doc__.splitlines()[0])
  ap.add_argument("--backends", default="math,flash,efficient,cudnn")
  a = ap.parse_args(argv)
  out_dir = pathlib.Path(a.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  q, k, v, do = make_inputs(a)
  for backend in a.backends.split(","):
    if backend not in BACKENDS:
      raise SystemExit(f"unknown backend {backend!r}; choose from {sorted(BACKENDS)}")
    try:
      out, dq, dk, dv = run(backend, q, k, v, do, a.causal)
    except RuntimeError as e:  # no kernel for this device/dtype/shape
      print(f"skipped {backend}: {str(e).splitlines()[0]}")
      continue
    write_dump(
      out_dir / f"sdpa_{backend}.npz",
      dict(zip(NAMES, (q, k, v, do, out, dq, dk, dv))),
      producer=f"torch {torch.__version__} sdpa {backend} ({a.device})",
      causal=a.causal,
      softmax_scale=a.head_dim**-0.5,
      stabilize=False,
    )


if __name__ == "__main__":
  main()
