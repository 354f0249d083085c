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


def round_bf16(x):
  """x rounded to the nearest bfloat16 (ties to even), as float32: x.to(bf16).float()'s value,
  computed on the bits (add 0x7FFF + the lsb, clear the low 16 bits) as JAX's
  `policy.round_bf16`, so that no compiler can drop it. torch.compile drops the convert pair:
  torch 2.11's joint-graph pass `pointless_convert` rewrites a float32 → bf16 → float32 chain
  whose bf16 value has no other use to the float32 value, whatever `emulate_precision_casts`
  says; torch 2.12.0's pass is the same, 2.13 keeps the pair (each read from its wheel;
  2026-12-05, experiments/results/cpu-2026-12-05-twin-torch211).
  Exact for finite values, ±0, ±inf and overflow to ±inf; NaN comes back as it went in. Its
  gradient is the identity (`to_bf16`'s then is x.to(bf16)'s: the bf16 gradient widened)."""
  x = x.float()
  return _RoundBF16.apply(x) if x.requires_grad and torch.is_grad_enabled() else _round_bits(x)


def _round_bits(x):
  """`round_bf16` of float32 x, no gradient."""
  nan = torch.isnan(x)
  bits = torch.where(nan, 0, x.view(torch.int32))  # (NaN's bits could overflow the add)
  bits = bits + (0x7FFF + ((bits >> 16) & 1))
  return torch.where(nan, x, (bits & -0x10000).view(torch.float32))


class _RoundBF16(torch.autograd.Function):
  """`_round_bits` forward, the identity backward."""

  @staticmethod
  def forward(ctx, x):
    return _round_bits(x)

  @staticmethod
  def backward(ctx, grad):
    return grad


def to_bf16(x):
  """x as a bfloat16 tensor, rounded by `round_bf16`: a compiler that drops the convert pair
  of a later .float() still finds x's rounded value. Every float32 → bf16 rounding of the twin
  goes through it (or `round_bf16`)."""
  return round_bf16(x).to(BF)


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _convert_pairs(graph):
  """(outer, inner) for each convert(convert(x, d1), d2) in graph that torch 2.11's
  `pointless_convert` matches: d1, d2 among FLOATS and the inner convert with no other user
  (the pattern matcher's default)."""
  convert = torch.ops.prims.convert_element_type.default
  for node in list(graph.nodes):
    inner = node.args[0] if node.target is convert else None
    if (
      getattr(inner, "target", None) is convert
      and len(inner.users) == 1
      and inner.args[1] in FLOATS
      and node.args[1] in FLOATS
    ):
      yield node, inner


def drop_convert_pairs(graph):
  """torch 2.11's `pointless_convert` (its joint-graph pass, read from the 2.11.0 wheel), for a
  check on any torch version (as `torch._inductor.config.joint_custom_post_pass`):
  convert(convert(x, d1), d2) → convert(x, d2) for each pair `_convert_pairs` finds, the
  rounding to d1 dropped. Returns how many pairs it rewrote."""
  convert = torch.ops.prims.convert_element_type.default
  n = 0
  for node, inner in _convert_pairs(graph):
    with graph.inserting_before(node):
      repl = graph.call_function(convert, (inner.args[0], node.args[1]))
    repl.meta.update(node.meta)
    node.replace_all_uses_with(repl)
    graph.erase_node(node)
    n += 1
  graph.eliminate_dead_code()
  return n


def lossy_convert_pairs(graph) -> tuple[int, list]:
  """Of the pairs `drop_convert_pairs` (torch 2.11) would rewrite in a graph, those whose
  rounding matters: (how many pairs it would rewrite, [the lossy ones' nodes]). A pair is
  harmless when its first convert is lossless (x's dtype itself, or a widening: bf16 or f16 to
  f32 or f64, f32 to f64), or, rounding to bf16, when x is already a bf16 value
  (`round_bf16`'s last op: a `where` whose other branch is a bitcast view) or the pair feeds
  `round_bf16` alone (its three ops: isnan, the bitcast view, and the where that passes it on
  for NaN), which rounds x the same."""
  f16, bf16, f32, f64 = FLOATS
  widening = {(bf16, f32), (bf16, f64), (f16, f32), (f16, f64), (f32, f64)}
  aten = torch.ops.aten
  rounding = {aten.isnan.default, aten.view.dtype, aten.where.self}
  pairs = list(_convert_pairs(graph))
  lossy = []
  for node, inner in pairs:
    source, d1 = inner.args[0], inner.args[1]
    val = getattr(source, "meta", {}).get("val")
    lossless = val is not None and (val.dtype == d1 or (val.dtype, d1) in widening)
    rounded = (
      d1 == bf16
      and getattr(source, "target", None) is aten.where.self
      and getattr(source.args[2], "target", None) is aten.view.dtype
    )
    users = list(node.users)
    feeds_rounding = (
      d1 == bf16
      and len(users) == 3
      and {u.target for u in users} == rounding
      and all(u.args[1] is node for u in users if u.target is aten.where.self)
    )
    if not (lossless or rounded or feeds_rounding):
      lossy.append(node)
  return len(pairs), lossy


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
