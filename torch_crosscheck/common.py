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
  torch 2.11's joint-graph pass `pointless_convert` rewrites every float32 → bf16 → float32
  chain to the float32 value, whatever `emulate_precision_casts` says (torch 2.13 keeps it;
  2026-12-05, experiments/results/cpu-2026-12-05-twin-torch211). Exact for finite values,
  ±inf and overflow to ±inf; NaN comes back as it went in. Its gradient is the identity, as
  the convert pair's (x + (r − x), r − x held constant: exactly r, by Sterbenz's lemma)."""
  x = x.float()
  nan = torch.isnan(x)
  bits = torch.where(nan, 0, x.detach().view(torch.int32))  # (NaN's bits could overflow)
  bits = bits + (0x7FFF + ((bits >> 16) & 1))
  r = torch.where(nan, x.detach(), (bits & -0x10000).view(torch.float32))
  if not x.requires_grad:
    return r
  return torch.where(torch.isinf(x), r, x + (r - x.detach()))


def to_bf16(x):
  """x as a bfloat16 tensor, rounded by `round_bf16`: a compiler that drops the convert pair
  of a later .float() still finds x's rounded value. Every float32 → bf16 rounding of the twin
  goes through it (or `round_bf16`)."""
  return round_bf16(x).to(BF)


def drop_convert_pairs(graph, keep_rounded=False):
  """What torch 2.11's `pointless_convert` does to a graph, for a check on any torch version
  (as `torch._inductor.config.joint_custom_post_pass`): convert(convert(x, d1), d2) → convert(x,
  d2) for floating d1, d2, the rounding to d1 dropped. keep_rounded: not where x is a `where`
  (`round_bf16`'s last op: x is a bf16 value, so dropping the pair would change nothing but
  the graph, and with it Inductor's fusions and float32 summation orders). Returns how many
  pairs it rewrote."""
  convert = torch.ops.prims.convert_element_type.default
  n = 0
  for node in list(graph.nodes):
    inner = node.args[0] if node.target is convert else None
    if getattr(inner, "target", None) is convert and node.args[1].is_floating_point:
      source = inner.args[0]
      if keep_rounded and getattr(source, "target", None) is torch.ops.aten.where.self:
        continue
      if inner.args[1].is_floating_point:
        with graph.inserting_before(node):
          repl = graph.call_function(convert, (source, node.args[1]))
        repl.meta.update(node.meta)
        node.replace_all_uses_with(repl)
        graph.erase_node(node)
        n += 1
  graph.eliminate_dead_code()
  return n


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
