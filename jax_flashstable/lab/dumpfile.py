"""The tensor dump format shared with PyTorch (NumPy only: the PyTorch side imports this file
directly, without JAX).

A dump is one `.npz` file:
- `__meta__`: a JSON string {"format": "flashstable-dump/1", "layout": "bshd" or "bhsd",
  "tensors": {name: {"dtype": "bfloat16" | "float16" | "float32", "shape": [...]}},
  "attrs": {...}} — `layout` is the axis order of every 4-D tensor: [batch, seq, heads, dim]
  (JAX, `jax.nn.dot_product_attention`) or [batch, heads, seq, dim] (PyTorch SDPA);
- one array per tensor: bfloat16 stored as its uint16 bit patterns, float16/float32 as is, so
  every bit survives.
Names used by the tools: query, key, value, d_out (inputs), out, lse, d_query, d_key, d_value.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np

FORMAT = "flashstable-dump/1"
LAYOUTS = ("bshd", "bhsd")


def _to_layout(x, src, dst):
  if src == dst or x.ndim != 4:
    return x
  return np.swapaxes(x, 1, 2)  # bshd <-> bhsd


def save_dump(path, tensors, *, layout="bshd", attrs=None, dtypes=None):
  """Writes `tensors` ({name: array}) to `path` (.npz).

  bfloat16 arrays may be given as ml_dtypes.bfloat16 arrays, or as uint16 bit patterns with
  `dtypes[name] = "bfloat16"` (what a NumPy-only writer such as the PyTorch side has).
  """
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
  dtypes = dict(dtypes or {})
  arrays, meta = {}, dict(format=FORMAT, layout=layout, tensors={}, attrs=attrs or {})
  for name, x in tensors.items():
    x = np.asarray(x)
    dtype = dtypes.get(name) or ("bfloat16" if x.dtype.name == "bfloat16" else x.dtype.name)
    if dtype not in ("bfloat16", "float16", "float32"):
      raise TypeError(f"tensor {name!r} has unsupported dtype {dtype}")
    arrays[name] = x.view(np.uint16) if dtype == "bfloat16" else x
    meta["tensors"][name] = dict(dtype=dtype, shape=list(x.shape))
  np.savez(path, __meta__=np.asarray(json.dumps(meta)), **arrays)


STORED = {"bfloat16": np.uint16, "float16": np.float16, "float32": np.float32}  # as in the file


def _meta_problem(meta, arrays) -> str | None:
  """What is wrong with a dump's __meta__ against its arrays ({name: stored array}), or None."""
  if not isinstance(meta, dict):
    return "__meta__ is not a JSON object"
  if meta.get("format") != FORMAT:
    return f"unknown dump format {meta.get('format')!r} (expected {FORMAT!r})"
  if meta.get("layout") not in LAYOUTS:
    return f"layout={meta.get('layout')!r} is not one of {LAYOUTS}"
  if not isinstance(meta.get("attrs", {}), dict):
    return f"attrs={meta['attrs']!r} is not a JSON object"
  tensors = meta.get("tensors")
  if not isinstance(tensors, dict):
    return "__meta__ has no tensors object"
  for name, info in tensors.items():
    if name not in arrays:
      return f"tensor {name!r} is in __meta__ but not in the file"
    dtype, shape = (info.get("dtype"), info.get("shape")) if isinstance(info, dict) else (None,) * 2
    if dtype not in STORED:
      return f"tensor {name!r} has dtype {dtype!r}, not one of {', '.join(STORED)}"
    x = arrays[name]
    if x.dtype != STORED[dtype] or list(x.shape) != shape:
      bits = " (bfloat16 is stored as uint16 bits)" if dtype == "bfloat16" else ""
      return (
        f"tensor {name!r} is stored as {x.dtype}{list(x.shape)}, __meta__ says {dtype}{shape}{bits}"
      )
  return None


def load_dump(path, *, layout="bshd", as_bits=False):
  """(tensors, attrs): 4-D tensors in `layout`. bfloat16 comes back as ml_dtypes.bfloat16, or
  as uint16 bits with `as_bits=True` (no ml_dtypes needed). Raises ValueError in one line for
  a file that is not a dump or whose __meta__ does not describe its arrays."""
  if not zipfile.is_zipfile(path):  # (numpy would try it as a pickle)
    raise ValueError(f"{path} is not a readable dump (not an .npz: no zip archive)")
  try:
    with np.load(path) as f:
      if "__meta__" not in f:
        raise ValueError(f"{path} is not a flashstable dump (no __meta__)")
      meta = json.loads(str(f["__meta__"]))
      arrays = {name: f[name] for name in f.files if name != "__meta__"}
  except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:  # not .npz, JSON, pickled
    if str(e).startswith(f"{path} is not"):
      raise
    raise ValueError(f"{path} is not a readable dump ({type(e).__name__}: {e})") from None
  if problem := _meta_problem(meta, arrays):
    raise ValueError(f"{path}: {problem}")
  out = {}
  for name, info in meta["tensors"].items():
    x = arrays[name]
    if info["dtype"] == "bfloat16" and not as_bits:
      import ml_dtypes

      x = x.view(ml_dtypes.bfloat16)
    out[name] = _to_layout(x, meta["layout"], layout)
  return out, meta.get("attrs", {})
