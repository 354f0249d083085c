"""What the PyTorch-side scripts share: seeded inputs and writing a dump (torch + NumPy only)."""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "jax_flashstable" / "lab"))
from dumpfile import save_dump  # noqa: E402  (NumPy-only module; importing the package needs JAX)

BF = torch.bfloat16
NAMES = ("query", "key", "value", "d_out", "out", "d_query", "d_key", "d_value")


def shape_parser(description):
  """Arguments every script takes: the output path, the shape, causal, seed and device."""
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("out")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--heads", type=int, default=2)
  ap.add_argument("--len", type=int, default=256)
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--device", default="cpu")
  return ap


def make_inputs(a):
  """query, key, value, d_out [batch, heads, len, head_dim] bf16: seeded standard normals."""
  rng = np.random.default_rng(a.seed)
  shape = (a.batch, a.heads, a.len, a.head_dim)
  return tuple(
    torch.tensor(rng.standard_normal(shape), dtype=torch.float32).to(BF).to(a.device)
    for _ in range(4)
  )


def bits(x):
  return x.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def write_dump(path, tensors, lse=None, **attrs):
  """tensors: the bf16 tensors of NAMES in [batch, heads, len, dim]; lse float32 or None."""
  arrays = {n: bits(x) for n, x in tensors.items()}
  if lse is not None:
    arrays["lse"] = lse.detach().float().cpu().numpy()
  save_dump(path, arrays, layout="bhsd", dtypes={n: "bfloat16" for n in tensors}, attrs=attrs)
  print(f"wrote {path}")
