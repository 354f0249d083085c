"""The two largest scores of each row in one reduction: the compensation's tie test without a
second pass over the tile (`policy.compensated_tile_max`).

"More than one score within tol of the row max" is "the second largest score, a duplicate of
the max counted, is ≥ max − tol". A top-2 summary (first, second) of a set of floats merges
exactly, with max and min only (`merge`, `policy.top2_merge`):

    (a1, a2) ⊕ (b1, b2) = (max(a1, b1), max(min(a1, b1), max(a2, b2)))

which is associative and commutative, so any reduction tree gives the same two values (for
inputs without NaN; NaN: `row_top2`).

What each Pallas lowering offers for a two-value reduction (jax 0.11.2):
- Triton: `tt.reduce` takes several operands and a combine region (Pallas uses it for argmax),
  but Pallas exposes no variadic reduction (no rule for `lax.reduce_p`). `row_top2` is a
  primitive whose Triton rule is one `tt.reduce` over (s, NaN) with `merge` as the region
  (built like Pallas' own `_reduction_lowering` for argmax): per score one max, one min and one
  max in registers, one round of warp shuffles carrying two values, instead of the max's
  reduction followed by a compare, a convert and an add per score and a second reduction that
  has to wait for the max.
- Mosaic GPU: only single-operand sum/max/min reductions (`FragmentedArray.reduce`), but static
  column slices aligned to the WGMMA layout's 8-column tiles are free (they select registers).
  `column_top2` halves the tile in registers — (max, min) of the two halves, then `merge` of
  halves — down to 8 columns: per score ≈ 2.5–2.75 max/min (block_k 64 / 128) instead of
  1 (max) + 3 (compare, convert, add). `lane_top2` (the forward's default,
  `MosaicGPUOptions.tie_lanes`) then merges the 8 columns' (first, second) pairs inside the
  thread and across a row's 4 lanes with shuffles carrying both values (an `inline_mgpu`
  block), so the tie test is one compare; without it, the count that remains runs over the 8
  columns' pairs.
On CPU (interpret mode) both are plain XLA: `row_top2` lowers to `jnp.max` and a variadic
`lax.reduce`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import mlir

from pallas_kernels.policy import top2_merge as merge

top2_p = jex_core.Primitive("flashstable_row_top2")
top2_p.multiple_results = True


def row_top2(s):
  """(first, second) of s [rows, n] float32 along the last axis, each [rows]: the row max and
  the largest of the rest, a second copy of the max counted. `first` is the kernel's
  `jnp.max(s, axis=-1)` bit for bit. One reduction in the Triton lowering (module docstring).
  NaN follows each platform's max, as the count rule's max and compares do: XLA (interpret
  mode) propagates it (first NaN, and `policy.tied_by_top2` says untied, as the count does),
  except that a jitted XLA CPU max over a wide tile may drop it (jax 0.11.2, a 64 × 64 tile:
  max 1.0 where a NaN sat beside two 1.0s, so the count says tied and top-2 untied; that row's
  outputs are NaN either way); the Triton lowering's max ignores NaN and second is the
  runner-up of the non-NaN scores (NaN when there are fewer than two), so the fa2 decision is
  the count's there too."""
  return tuple(top2_p.bind(s))


def _top2_impl(s):
  first = jnp.max(s, axis=-1)  # the same op as the plain row max
  pad = jnp.full_like(s, -jnp.inf)  # leaves (s, −inf)
  _, second = lax.reduce(
    (s, pad),
    (jnp.float32(-jnp.inf),) * 2,
    lambda a, b: merge((a[0], a[1]), (b[0], b[1])),
    (s.ndim - 1,),
  )
  return first, second


@top2_p.def_abstract_eval
def _top2_abstract(s):
  row = jax.core.ShapedArray(s.shape[:-1], s.dtype)
  return row, row


top2_p.def_impl(_top2_impl)
mlir.register_lowering(top2_p, mlir.lower_fun(_top2_impl, multiple_results=True))


def _top2_triton(ctx, s):
  """One `tt.reduce` over the leaves (s, NaN) whose region is `merge` in arith ops. first uses
  maxnumf, the op of Pallas' own max reduction (`jnp.max`), so first is the tile max the
  kernel took before. second = maxnumf(minimumf(a1, b1), maxnumf(a2, b2)): minimumf propagates
  NaN (PTX min.NaN) and maxnumf drops it, so second is the runner-up of the non-NaN scores and
  NaN when there are fewer than two — the count rule's decision on the GPU, where NaN counts
  nowhere. The NaN leaf (not −inf) lets the compiler fold maxnumf(a2, leaf) = a2: three ops
  per score inside a thread."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  from jax._src.lib.triton import dialect as tt_dialect

  f32 = ir.F32Type.get()
  nan = tt_dialect.splat(ir.RankedTensorType(s.type), arith.constant(f32, float("nan")))
  reduce_op = tt_dialect.ReduceOp([s, nan], len(ctx.avals_in[0].shape) - 1)
  entry = reduce_op.regions[0].blocks.append(f32, f32, f32, f32)
  with ir.InsertionPoint.at_block_begin(entry):
    a1, a2, b1, b2 = entry.arguments
    first = arith.maxnumf(a1, b1)
    second = arith.maxnumf(arith.minimumf(a1, b1), arith.maxnumf(a2, b2))
    tt_dialect.reduce_return([first, second])
  reduce_op.verify()
  return list(reduce_op.result)


def _register_triton():
  try:
    from jax._src.pallas.triton import lowering as tl
  except ImportError:  # a jaxlib without the Triton dialect: interpret mode only
    return
  tl.triton_lowering_rules.setdefault(top2_p, _top2_triton)


_register_triton()


def lane_top2(s):
  """`row_top2` inside a Mosaic GPU kernel (s: [rows, n] float32 in the WGMMA layout, rows a
  multiple of 64, n ≥ 16): `column_top2`'s halvings in registers down to 8 columns, then, per
  row, the thread's two columns merged and the row's 4 lanes by butterfly shuffles carrying
  both values (lane strides 1 and 2: two rounds of two independent shuffles, each followed by
  a `merge`). first is `jnp.max(s, axis=-1)` bit for bit (the same max.NaN.f32 instructions;
  max is exact, only the order of the pairs differs, which could at most flip the sign of a
  zero max: the same exp and α) and second the runner-up, so the tie test is one compare
  (`policy.tied_by_top2`): no chain of shuffles after the max's, and no compare, convert and
  add over 8 column groups. GPU only (`plgpu.inline_mgpu`); interpret mode takes `row_top2`,
  the same values; `_merge_lanes` runs on the CPU with its ops on NumPy in
  tests/test_top2.py."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  first, second = column_top2(s)
  row = plgpu.ShapeDtypeStruct((s.shape[0],), jnp.float32, layout=plgpu.Layout.WGMMA.reduce(1))
  merge_lanes = plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,) * 2, return_type=(row, row))
  return merge_lanes(_merge_lanes)(first, second)


def _merge_lanes(_, first, second):
  """(first, second) [rows, 8] → [rows] each, on Mosaic GPU FragmentedArrays (`lane_top2`)."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import vector
  from jax.experimental.mosaic.gpu import fragmented_array as fa, utils

  fmax = fa.FragmentedArray._lift_fast_instr("max.NaN.f32")  # FragmentedArray.max/min's
  fmin = fa.FragmentedArray._lift_fast_instr("min.NaN.f32")

  def pair_merge(a, b):  # `merge` on scalars
    return fmax(a[0], b[0]), fmax(fmin(a[0], b[0]), fmax(a[1], b[1]))

  def element(v, i):
    return vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))

  one = ir.VectorType.get((1,), ir.F32Type.get())
  out = ([], [])
  # a thread holds one vector<2xf32> (two adjacent columns) of the [rows, 8] summary per row
  # it owns, in the order of the row layout's registers (a single column tile)
  for f, g in zip(first.registers.flat, second.registers.flat, strict=True):
    pair = pair_merge((element(f, 0), element(g, 0)), (element(f, 1), element(g, 1)))
    for stride in (1, 2):  # the row's 4 lanes: WGMMA_LAYOUT's minor lane dimension
      pair = pair_merge(pair, tuple(utils.shfl_bfly(x, stride) for x in pair))
    for values, x in zip(out, pair):
      values.append(vector.broadcast(one, x))
  shape = fa.WGMMA_ROW_LAYOUT.registers_shape((first.shape[0],))
  return tuple(
    fa.FragmentedArray(
      _registers=np.array(values, dtype=object).reshape(shape),
      _layout=fa.WGMMA_ROW_LAYOUT,
      _is_signed=None,
    )
    for values in out
  )


def column_top2(s, width=8):
  """Top-2 summaries of column groups of s [rows, n] (n a power of two ≥ width): (first,
  second), each [rows, width], where column c summarises the columns ≡ c (mod width) of s.
  Halves the tile with static slices — Mosaic GPU's WGMMA layout slices at multiples of 8
  columns for free — and `merge`s the halves. Σ_c min(#{scores ≥ t in group c}, 2) =
  Σ_c [first_c ≥ t] + [second_c ≥ t], so a row has two scores ≥ t iff that sum is ≥ 2."""
  n = s.shape[-1]
  if n < width:
    raise ValueError(f"column_top2 needs at least width={width} columns, got {n}")
  if n == width:
    return s, jnp.full_like(s, -jnp.inf)
  half = n // 2
  lo, hi = s[:, :half], s[:, half:]
  first, second = jnp.maximum(lo, hi), jnp.minimum(lo, hi)
  while half > width:
    half //= 2
    first, second = merge((first[:, :half], second[:, :half]), (first[:, half:], second[:, half:]))
  return first, second
