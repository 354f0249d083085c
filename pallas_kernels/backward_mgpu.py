"""Backward flash-attention kernels for Hopper in Pallas Mosaic GPU (fa2 and fp32_out layouts).

The Triton backward's numerics (`pallas_kernels.backward`; FlashAttention-2, Dao 2023, Alg. 2;
every rounding point a `numerics.` call, `pallas_kernels.policy`) laid out the Hopper way of
FlashAttention-3 (Shah et al. 2024, §3; warp specialisation as in `forward_mgpu`):

- two kernels, no atomics (the library promises bitwise repeatable gradients; FlashAttention-3
  accumulates dQ across CTAs with float atomics, which are not), like the Triton backward:
  dK/dV — one CTA per (128 keys, batch, query head; 64 at head_dim 256, below) looping over
  query tiles — and dQ — one CTA per (128 query rows, batch, head) looping over key tiles;
- each CTA has two compute warpgroups of 64 rows (the M of one wgmma) and a producer
  warpgroup that streams the other side's tiles by TMA into a ring of `stages` shared-memory
  slots, refilled once every compute warpgroup has arrived on the slot's "free" barrier (2 tiles in
  flight, 3 for dK/dV at head_dim 128, or as many as fit each kernel's shared memory:
  `default_stages`); a warpgroup whose keys or rows are all padding computes nothing
  (`_skip_steps`);
- dK/dV works on the transposed problem, as JAX's `attention_mgpu` does: Sᵀ = K Qᵀ and
  dPᵀ = V dOᵀ are wgmma's with the keys as rows, so Pᵀ and dSᵀ are register operands of
  dV += Pᵀ dO and dK += dSᵀ Q with no transpose; the rows' m, log l and delta arrive per query
  tile as [3, block_q] float32 (one TMA) and broadcast along the columns; at head_dim 256 dK
  and dV do not fit a warpgroup's registers, so the CTA's two compute warpgroups share one tile
  of 64 keys and each accumulates 128 of their columns (`parts`: the tiles are kept as parts
  of 128 columns, Sᵀ and dPᵀ summed over them), and after the loop they meet on a "done"
  barrier before writing over K and V;
- dQ: S = Q Kᵀ, dP = dO Vᵀ, dQ += dS K (or the centred keys, `dq_keys`) with dS in registers;
- persistent (`MosaicGPUOptions.persistent_bwd`, where it fits: `launch_plan`): one CTA an SM
  looping over either kernel's work items (`forward_mgpu.work_items`), the producer loading
  the next item's own tiles (dQ: Q, dO, the rows' statistics; dK/dV: K and V) into a second
  slot and the ring carried from item to item; the same arithmetic.
- On the GPU each step issues the S and dP wgmma's back to back and reads S while dP runs
  (`wgmma_accumulator_load(wait_n=parts)`); the dK, dV and dQ products accumulate in the wgmma
  accumulators (FlashAttention-3's order; float32 summation order only).

Rounding points, as the Triton backward: S = `numerics.scores`; P = `numerics.probs(s, m,
log l)` (m and log l kept apart) with the mask applied by a select after it; dP =
`numerics.dp`; dS = `numerics.dscores(P, dP, delta)` and the mask; `round_p` before the dV
product, `round_ds` before the dQ and dK products; dQ's keys `dq_keys` (center_keys); one
`round_grad` at the end; grouped heads' float32 partials summed by `sum_group` in XLA in a
fixed order. delta (− the lse cotangent) is XLA's, from the forward's O (`numerics.delta`).

Interpret mode (CPU): the interpreter's wgmma reads both operands from shared memory and
cannot accumulate into an initialised accumulator, so there P and dS go through shared memory
and each product lands in a fresh accumulator that is then added (`numerics.accumulate`, the
Triton kernels' order) — the same values, by another path; the GPU's register operands,
fused accumulation and the early read of S are tested on the GPU only.
Tiles: 64 rows per warpgroup; dK/dV takes query tiles of `DKV_BLOCK_Q`, dQ key tiles of
`DQ_BLOCK_K`; in fa2 and fp32_out they change float32 summation order only.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.forward_mgpu import (
  exact_scale,
  finish_stores,
  after_first_tiles,
  last_waits,
  launch,
  own_tiles_and_ring,
  on_gpu_by_default,
  persistent_fits,
  query_tile,
  resolve_scale_in_exp2,
  rounded_scores,
  slot_of,
  smem_transforms,
  visited_key_tiles,
  work_items,
)
from pallas_kernels.policy import LOG2E, pad_axis
from pallas_kernels.policy import MOSAIC_GPU_NUMERICS as NUMERICS

ROWS = 64  # wgmma's M: rows per compute warpgroup
COMPUTE_WGS = 2  # a CTA's (three: the same bits, 1.07–1.56× the time; H100, 2026-12-06)
DKV_BLOCK_Q = 64  # dK/dV: query rows per step
DQ_BLOCK_K = 64  # dQ: keys per step (`dq_block_k`)
DQ_BLOCK_KS = (64, 128)  # the dQ key tiles it can run (`KernelConfig.block_k_dq_mgpu`)
MAX_HEAD_DIM = 256  # padded; the forward's widest (`forward_mgpu.HEAD_DIMS`)
PART = 128  # the widest dK and dV a warpgroup accumulates: 2 × 64 × 128 float32 in registers
# Registers per thread (setmaxnreg), FlashAttention-3's split: 2 × 128 × 240 + 128 × 24 ≤ 64 Ki.
# At head_dim 128 a dK/dV thread holds dK and dV (128), the Sᵀ or Pᵀ and dPᵀ tiles (2 × 32),
# Pᵀ and dSᵀ in 16 bits (2 × 16) and its 16 query columns of m, log l and delta; above 128
# (`parts`) the same, for its part of dK's and dV's columns; a dQ thread at head_dim 256 holds
# dQ (128), S and dP (2 × 32), dS in 16 bits (16) and its rows' m, log l and delta.
COMPUTE_REGISTERS, PRODUCER_REGISTERS = 240, 24
# Hopper's 227 KiB of shared memory per block, less 3 KiB: room for the barriers and for what
# `_dkv_bytes` and `_dq_bytes` do not round up to Mosaic GPU's 1 KiB a buffer (at most 1.05 KiB
# in 45 lowered configurations, 2026-12-07; the backward has no reductions, so its reduction
# scratch, 2 KiB by default, is not allocated).
SMEM_BYTES = 227 * 1024 - 3 * 1024


def parts(head_dim: int) -> tuple[int, int]:
  """(parts, width): the dK/dV kernel keeps head_dim's columns as `parts` tiles of `width`
  (≤ `PART`) in shared memory. Above 128 (head_dim 256: two parts) its two compute warpgroups
  share one tile of 64 keys, each accumulating one part of dK's and dV's columns (both compute
  the whole Sᵀ and dPᵀ, summed over the parts: 1.5× the dK/dV kernel's products), instead of a
  tile of 64 keys each."""
  width = min(head_dim, PART)
  return head_dim // width, width


def _dkv_bytes(head_dim: int, stages: int, group: int, slots: int = 1) -> int:
  """dK/dV's shared memory: the compute warpgroups' K and V (64 keys each, or 64 for both above
  head_dim 128: `parts`; `slots` items' of them: 2 persistent), a ring of `stages` tiles of
  Q, dO and the rows' statistics, and (grouped heads: float32 partials) a float32 output tile
  per warpgroup."""
  n_parts, width = parts(head_dim)
  keys = ROWS if n_parts > 1 else COMPUTE_WGS * ROWS
  return (
    slots * keys * head_dim * 2 * 2
    + stages * DKV_BLOCK_Q * (head_dim * 2 * 2 + 3 * 4)
    + (COMPUTE_WGS * ROWS * width * 4 if group > 1 else 0)
  )


def dq_block_k(cfg) -> int:
  """The dQ kernel's key tile: `KernelConfig.block_k_dq_mgpu`, else `DQ_BLOCK_K` (`dq_tile`).
  128 halves the steps (a wgmma of 128 keys for S, dP and dQ += dS K: at head_dim 64 566 SASS instructions
  a step of 128 keys against 2 × 318 of 64, no spills; ptxas 13.0, experiments/20_ptxas_report.py,
  2026-12-06). On the GPU the same bits (the fused wgmma sums dQ over the keys in the same
  order either way) and no faster (H100, 2026-12-06: 0.994× against 0.978× with 64 at
  gpt2-small's shape, 1.016× and 1.004× at d128 full and causal), so 64 stays; in interpret
  mode dQ's per-tile float32 sum spans 128 keys, as the Triton backward's block_k_bwd=128.
  ValueError naming anything else."""
  return dq_tile(cfg.block_k_dq_mgpu)


def dq_tile(block_k_dq) -> int:
  """A dQ key tile as asked (`KernelConfig.block_k_dq_mgpu`): None is `DQ_BLOCK_K`; one of
  `DQ_BLOCK_KS`, else a one-line ValueError naming it."""
  bk = DQ_BLOCK_K if block_k_dq is None else block_k_dq
  if isinstance(bk, bool) or bk not in DQ_BLOCK_KS:
    raise ValueError(f"block_k_dq_mgpu={bk!r}: the Mosaic GPU dQ kernel's key tile is 64 or 128")
  return bk


def _dq_bytes(
  head_dim: int,
  stages: int,
  center_keys: bool,
  block_k: int = DQ_BLOCK_K,
  slots: int = 1,
  o_itemsize: int = 0,
) -> int:
  """dQ's shared memory: each warpgroup's Q, dO and rows' statistics (`slots` items' of them:
  2 persistent), with `o_itemsize` its rows of O too (`resolve_o_by_tma`: 2, or 4 for
  fp32_out's float32 O; 0 none), and a ring of `stages` tiles of K and V (and the centred
  keys) of `block_k` keys."""
  ring = block_k * head_dim * 2 * (3 if center_keys else 2)
  rows = ROWS * (head_dim * (2 * 2 + o_itemsize) + 3 * 4)
  return slots * COMPUTE_WGS * rows + stages * ring


STAGES_RULE = (
  "the Mosaic GPU backward's tiles in flight are one integer 1–8 or a pair of them (dK/dV's, dQ's)"
)


def _per_kernel(stages) -> tuple[int, int]:
  """Tiles in flight as (dK/dV's, dQ's), from one count for both or the pair (`STAGES_RULE`).
  Raises ValueError naming anything else."""
  pair = (stages, stages) if isinstance(stages, numbers.Integral) else stages
  if not (
    isinstance(pair, (tuple, list))
    and len(pair) == 2
    and all(
      isinstance(n, numbers.Integral) and not isinstance(n, bool) and 1 <= n <= 8 for n in pair
    )
  ):
    raise ValueError(f"stages={stages!r}: {STAGES_RULE}")
  return int(pair[0]), int(pair[1])


def smem_bytes(
  head_dim: int, stages, group: int = 1, center_keys: bool = False, block_k: int = DQ_BLOCK_K
) -> int:
  """The larger of the two kernels' shared memory (bytes) with `stages` tiles in flight (one
  count for both kernels or (dK/dV's, dQ's)) and the dQ kernel's key tile `block_k` (`_needs`,
  as `default_stages` and `_stages` count it)."""
  need_dkv, need_dq = _needs(head_dim, group, center_keys, block_k)
  dkv, dq = _per_kernel(stages)
  return max(need_dkv(dkv), need_dq(dq))


# (dK/dV's query tiles, dQ's key tiles) in flight where `STAGES_BY_HEAD_DIM` has no row
STAGES = (2, 2)
# Measured rows (paired A/B, the backward alone, same bits: `experiments/18_mgpu_backward_stages_ab.py`);
# none now. head_dim 128 had (3, 2) from one H200 on 2026-12-05 (0.975x the time of (2, 2)
# full, 0.993x causal, the kernel before the ring's restructure); on the kernel of 2026-12-06
# (3, 2) takes 1.07x the time of (2, 2) full (one H100, 10 pairs: (2, 2) 0.935x), and ptxas
# says why (experiment 20, sm_90a): with three query tiles the dK/dV loop spills (56/92 B,
# loads inside the loop; 499/514 SASS a step against 443 and none; causal 522 with a spill
# load against 463). At 64 (gpt2-small's attention, causal) 3 and 4 were no faster (1.005x,
# 1.011x, H200, 2026-12-05).
STAGES_BY_HEAD_DIM: dict[int, tuple[int, int]] = {}

# `MosaicGPUOptions.persistent_bwd=None` runs the backward's kernels persistent (where they fit)
# up to this padded head_dim. Measured (the backward alone, paired, same bits, H100,
# 2026-12-07, experiments/results/h100-2026-12-07-bwd-stages): 0.939x the time at gpt2-small's
# 16 x 1024 x 12 x d64 causal (30 pairs), but 1.015x at b4 x 4096 x 16 x d128 full and 1.040x
# causal (10 pairs), where the persistent dK/dV kernel spills (ptxas: 104/136 bytes).
PERSISTENT_BWD_MAX_HEAD_DIM = 64


def default_stages(
  head_dim: int,
  group: int = 1,
  center_keys: bool = False,
  block_k: int = DQ_BLOCK_K,
  persistent: bool = False,
) -> tuple[int, int]:
  """The tiles in flight the backward runs with, (dK/dV's, dQ's): `STAGES_BY_HEAD_DIM`'s row
  for the (padded) head_dim or `STAGES`, each lowered to what fits that kernel's shared memory
  with the dQ kernel's key tile `block_k` (`dq_block_k`; head_dim 256: dK/dV 2, dQ 1; head_dim
  128 with grouped heads, whose float32 partials take dK/dV's room: 2 and 2; 256 with grouped
  heads: 1 and 1); persistent (`MosaicGPUOptions.persistent_bwd=True`), to what fits beside two
  items' tiles (`launch_plan`; at head_dim 128 dQ 1 with center_keys or dQ key tiles of 128).
  persistent_bwd=None takes the tiles of a CTA an item, and `launch_plan` runs each kernel
  persistent only where those fit beside two items' tiles."""
  wants = STAGES_BY_HEAD_DIM.get(head_dim, STAGES)
  slots = 2 if persistent else 1
  need_dkv, need_dq = _needs(head_dim, group, center_keys, block_k, slots)
  return _fit(wants[0], need_dkv), _fit(wants[1], need_dq)


def _needs(head_dim: int, group: int, center_keys: bool, block_k: int, slots: int = 1):
  """(dK/dV's, dQ's) shared memory in bytes, each a function of that kernel's tiles in flight
  (`slots` items' own tiles: 2 persistent)."""
  return (
    lambda n: _dkv_bytes(head_dim, n, group, slots),
    lambda n: _dq_bytes(head_dim, n, center_keys, block_k, slots),
  )


def _fit(want: int, need) -> int:
  """The most tiles in flight, at most `want`, whose shared memory need(n) fits (1 if none)."""
  return next((n for n in range(want, 0, -1) if need(n) <= SMEM_BYTES), 1)


def _stages(cfg, head_dim: int, group: int) -> tuple[int, int]:
  """The tiles in flight the two kernels run, (dK/dV's, dQ's), at padded head_dim with
  group = num_heads // num_kv_heads: `KernelConfig.stages_bwd_mgpu` as set (one count or a
  pair, `STAGES_RULE`; `kernel_config` sets `default_stages`), or where None `default_stages`
  for the dQ kernel's key tile (`dq_block_k`). Raises ValueError in one line where a kernel's
  shared memory does not hold one tile in flight, or a set count more than it holds (naming
  the value and the most that fit); never lowers a set count."""
  center_keys, bk = cfg.numerics.center_keys, dq_block_k(cfg)
  centred = ", center_keys=True" if center_keys else ""
  kernels = tuple(
    zip(
      ("dK/dV", "dQ"),
      (
        f"head_dim={head_dim}, group={group}",
        f"head_dim={head_dim}, block_k_dq_mgpu={bk}{centred}",
      ),
      _needs(head_dim, group, center_keys, bk),
    )
  )
  for kernel, at, need in kernels:
    if need(1) > SMEM_BYTES:
      raise ValueError(
        f"{at}: the Mosaic GPU backward's {kernel} kernel needs {need(1) / 1024:.1f} KiB of "
        f"shared memory with one tile in flight, more than {SMEM_BYTES / 1024:.0f} KiB"
      )
  if cfg.stages_bwd_mgpu is None:
    return default_stages(head_dim, group, center_keys, bk, bool(cfg.mgpu.persistent_bwd))
  try:
    stages = _per_kernel(cfg.stages_bwd_mgpu)
  except ValueError:
    raise ValueError(f"stages_bwd_mgpu={cfg.stages_bwd_mgpu!r}: {STAGES_RULE}") from None
  for n, (kernel, at, need) in zip(stages, kernels):
    if need(n) > SMEM_BYTES:
      most = _fit(n, need)
      raise ValueError(
        f"stages_bwd_mgpu={cfg.stages_bwd_mgpu!r}: the {kernel} kernel fits at most {most} "
        f"{'tiles' if most > 1 else 'tile'} in flight at {at}"
      )
  return stages


def launch_plan(cfg, head_dim: int, group: int):
  """((dK/dV's, dQ's) tiles in flight, (dK/dV's, dQ's) `MosaicGPUOptions.persistent_bwd`) of a call
  at padded head_dim with group = num_heads // num_kv_heads: `_stages`, each at most the
  kernel's steps (dK/dV's query tiles, dQ's key tiles), and each kernel's persistence resolved
  where its persistent layout fits shared memory (`forward_mgpu.persistent_fits`: two items'
  K and V for dK/dV; two items' Q, dO and rows for dQ); None only up to head_dim
  `PERSISTENT_BWD_MAX_HEAD_DIM` (64), off above it. Raises ValueError (one line) as
  `_stages` does and where persistent_bwd=True does not fit a kernel; `attention.kernel_config`
  calls it for persistent_bwd=True, so that happens before any kernel runs."""
  stages_dkv, stages_dq = _stages(cfg, head_dim, group)
  bk, center = dq_block_k(cfg), cfg.numerics.center_keys
  n_q, n_kv = steps(cfg)
  stages_dkv, stages_dq = int(max(1, min(stages_dkv, n_q))), int(max(1, min(stages_dq, n_kv)))
  persistent = cfg.mgpu.persistent_bwd
  if persistent is None and head_dim > PERSISTENT_BWD_MAX_HEAD_DIM:
    persistent = False  # measured slower there
  chosen = (persistent, "persistent_bwd", cfg.interpret)
  persistent_dkv = persistent_fits(
    *chosen,
    _dkv_bytes(head_dim, stages_dkv, group, slots=2),
    f"head_dim={head_dim}, group={group} with the dK/dV kernel's {_tiles(stages_dkv, 'query')} "
    f"in flight: two tiles of K and V{', the float32 partials' if group > 1 else ''} and the ring",
    SMEM_BYTES,
  )
  persistent_dq = persistent_fits(
    *chosen,
    _dq_bytes(head_dim, stages_dq, center, bk, slots=2),
    f"head_dim={head_dim} with the dQ kernel's {_tiles(stages_dq, 'key')} in flight: two "
    "tiles of Q, dO and rows a warpgroup and the ring",
    SMEM_BYTES,
  )
  return (stages_dkv, stages_dq), (persistent_dkv, persistent_dq)


# `MosaicGPUOptions.delta_in_dq=None` is on (for a GPU) up to this padded head_dim, with O in
# the input dtype: where it was timed (H100, 2026-12-07, h100-2026-12-07f-gpu-tests-delta-in-dq:
# the backward 0.980x at gpt2-small's d64 causal, 0.993x at d128 causal). Untimed at 256 and with
# fp32_out's float32 O, whose rows it holds in registers beside the dO tile.
DELTA_IN_DQ_MAX_HEAD_DIM = 128


def resolve_delta_in_dq(cfg, head_dim: int) -> bool:
  """`MosaicGPUOptions.delta_in_dq` of a call at padded head_dim, None resolved: on for a GPU
  up to `DELTA_IN_DQ_MAX_HEAD_DIM` with O in the input dtype, off elsewhere and in interpret
  mode (`forward_mgpu.on_gpu_by_default`)."""
  on = cfg.mgpu.delta_in_dq
  if on is None and (head_dim > DELTA_IN_DQ_MAX_HEAD_DIM or cfg.numerics.out_float32):
    return False
  return on_gpu_by_default(on, cfg.interpret)


def resolve_o_by_tma(cfg, head_dim: int, stages_dq: int, persistent_dq: bool) -> bool:
  """`MosaicGPUOptions.o_by_tma` of a call at padded head_dim whose dQ kernel runs `stages_dq`
  key tiles in flight, persistent or not (`launch_plan`): False without `resolve_delta_in_dq`;
  None resolved on where the rows of O (`slots` items' of each warpgroup) fit the dQ kernel's
  shared memory beside that plan. Raises ValueError (one line) for o_by_tma=True where they do
  not."""
  on = cfg.mgpu.o_by_tma
  if on is False or not resolve_delta_in_dq(cfg, head_dim):
    return False
  itemsize = 4 if cfg.numerics.out_float32 else 2
  slots = 2 if persistent_dq else 1
  need = _dq_bytes(head_dim, stages_dq, cfg.numerics.center_keys, dq_block_k(cfg), slots, itemsize)
  if need <= SMEM_BYTES:
    return True
  if on:
    items = "two items'" if persistent_dq else "its"
    raise ValueError(
      f"MosaicGPUOptions(o_by_tma=True) at head_dim={head_dim}: the dQ kernel's "
      f"{_tiles(stages_dq, 'key')} in flight and {items} Q, dO, O and rows need "
      f"{need / 1024:.1f} KiB of shared memory, more than {SMEM_BYTES / 1024:.0f} KiB "
      "(o_by_tma=None reads O from global memory there)"
    )
  return False


def steps(cfg) -> tuple[int, int]:
  """(dK/dV's query tiles, dQ's key tiles): each backward kernel's steps a work item, the
  unpadded length over its tile (tiles of padding only are skipped)."""
  return -(-cfg.q_len // DKV_BLOCK_Q), -(-cfg.kv_len // dq_block_k(cfg))


def _tiles(n: int, what: str) -> str:
  return f"{n} {what} tile{'s' if n > 1 else ''}"


def supported(
  *,
  numerics: str,
  head_dim=None,
  dtype=None,
  num_stages=None,
  group=None,
  center_keys=False,
  sum_rounded_p=False,
  block_k_dq=None,
) -> str | None:
  """Why the Mosaic GPU backward cannot run a call (None when it can, or when the arguments
  left None could still make it); head_dim is the padded one, group = num_heads //
  num_kv_heads, block_k_dq the dQ kernel's key tile (`KernelConfig.block_k_dq_mgpu`; None:
  `DQ_BLOCK_K`). It runs after the Mosaic GPU forward (`attention.kernel_config`; else the
  Triton backward does). Limits: the layouts of the Mosaic GPU forward, bfloat16/float16, its
  head_dims (32–256; above 128 in `parts`), the dQ key tile (`DQ_BLOCK_KS`), shared memory
  (`smem_bytes`, as `_stages` counts it; num_stages: one count for both kernels or (dK/dV's,
  dQ's); at head_dim 256 no `center_keys`)."""
  if numerics not in NUMERICS:
    return f"numerics={numerics!r} (the Mosaic GPU backward has {', '.join(NUMERICS)})"
  if sum_rounded_p:  # its P is the float32 P̄'s (`Numerics.probs` without the input dtype)
    return "sum_rounded_p=True (the Mosaic GPU backward forms P from the float32 P̄)"
  if dtype is not None and jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return f"dtype={jnp.dtype(dtype)} (the Mosaic GPU backward needs bfloat16 or float16)"
  if head_dim is not None and not (32 <= head_dim <= MAX_HEAD_DIM):
    return (
      f"head_dim={head_dim} after padding (the Mosaic GPU backward has head_dim 32–{MAX_HEAD_DIM})"
    )
  try:
    bk = dq_tile(block_k_dq)
  except ValueError as e:
    return str(e)
  if head_dim is not None:  # no num_stages would do: name the cause
    least = smem_bytes(head_dim, 1, group or 1, center_keys, bk)
    if least > SMEM_BYTES:
      cause = "center_keys=True" if center_keys else f"group={group or 1}"
      if smem_bytes(head_dim, 1, group or 1, center_keys) <= SMEM_BYTES:  # the dQ key tile's
        cause = f"block_k_dq_mgpu={bk}"
      return (
        f"{cause} at head_dim={head_dim} (the Mosaic GPU backward needs {least / 1024:.1f} KiB "
        f"of shared memory with one tile in flight, more than {SMEM_BYTES / 1024:.0f} KiB)"
      )
  if num_stages is not None:
    try:
      _per_kernel(num_stages)
    except ValueError:
      return f"num_stages={num_stages!r} ({STAGES_RULE})"
  if None not in (head_dim, num_stages):
    need = smem_bytes(head_dim, num_stages, group or 1, center_keys, bk)
    if need > SMEM_BYTES:
      return (
        f"num_stages={num_stages} at head_dim={head_dim}: the Mosaic GPU backward needs "
        f"{need / 1024:.1f} KiB of shared memory, more than {SMEM_BYTES / 1024:.0f} KiB"
      )
  return None


def _acc_dot(a, b, shape):
  """a @ b into a fresh float32 accumulator, read back (waits for it)."""

  def run(acc_ref):
    plgpu.wgmma(acc_ref, a, b)
    return acc_ref[...]

  return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _dot_parts(a, b, shape):
  """Σ over the parts of a[p] @ b[p]ᵀ into fresh float32 accumulators, added in part order
  (interpret mode)."""
  out = _acc_dot(a.at[0], b.at[0].transpose((1, 0)), shape)
  for p in range(1, a.shape[0]):
    out = out + _acc_dot(a.at[p], b.at[p].transpose((1, 0)), shape)
  return out


def _interpret_params(cfg):
  if not cfg.interpret:
    return None
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  return InterpretGPUParams()


def _row_slice(rows_smem, r, layout):
  return plgpu.load(rows_smem.at[r], layout=layout)


def _iota(tile, dim):
  return plgpu.broadcasted_iota(jnp.int32, tile, dim, layout=plgpu.Layout.WGMMA)


def _valid(q_pos, k_pos, cfg, key_span, query_span=None):
  """True where a score counts (`forward.score_mask`): a real key, (query_span given) a real
  query, (causal) key ≤ query; None where every score of the kernel's tiles counts. A
  condition is left out where it holds for every tile the kernel visits: real keys where
  kv_len is a multiple of key_span (the keys one CTA or warpgroup takes, so no tile reaches
  past kv_len), real queries where q_len is a multiple of query_span (a compare and a select a
  score fewer in the causal diagonal's tiles)."""
  conditions = []
  if cfg.kv_len % key_span:
    conditions.append(k_pos < cfg.kv_len)
  if query_span is not None and cfg.q_len % query_span:
    conditions.append(q_pos < cfg.q_len)
  if cfg.causal:
    conditions.append(q_pos >= k_pos)
  return functools.reduce(jnp.logical_and, conditions) if conditions else None


def unscaled_scores(cfg) -> bool:
  """Whether the GPU backward forms P from the unscaled QKᵀ (`_probs_and_dscores`): with
  `rounded_scores`, `scale_in_exp2` resolved on (`forward_mgpu.resolve_scale_in_exp2`) and a
  softmax_scale c that is a power of two ≤ 1, where it changes no value."""
  c = cfg.softmax_scale
  if not (cfg.mgpu.rounded_scores and exact_scale(c)) or cfg.numerics.single_lse:
    return False
  return bool(resolve_scale_in_exp2(cfg.mgpu, c, cfg.compensation).scale_in_exp2)


def _probs_and_dscores(s, dp, m, log_l, delta, cfg, valid=None):
  """P and dS of one tile of QKᵀ and dO Vᵀ products, float32, 0 where not `valid` (None:
  nothing masked) — the Triton backward's `_probs_and_dscores`, on wgmma tiles (either
  orientation: m, log l and delta come broadcast to the tile). With
  `MosaicGPUOptions.rounded_scores` S is rounded on its own (`forward_mgpu.rounded_scores`)
  and P has no select."""
  numerics, scale = cfg.numerics, cfg.softmax_scale
  if unscaled_scores(cfg):
    # c = 2^−e: u = (QKᵀ − m/c) − log l / c is (S − m − log l)/c exactly (m/c, log l/c and
    # the differences scaled by a power of two; S − m is 0 at the row max), so u·c is the
    # definition's exponent bit for bit, and on the GPU 2^(u·(c·log₂e)) is the ex2 of its
    # exp, fl(fl(S − m − log l)·log₂e), c·log₂e exact: S's multiply of every score gone
    # (`MosaicGPUOptions.scale_in_exp2`'s backward half)
    u = (s - m * (1.0 / scale)) - log_l * (1.0 / scale)
    p = jnp.exp(u * scale) if cfg.interpret else jnp.exp2(u * (scale * LOG2E))
  elif not cfg.mgpu.rounded_scores or numerics.single_lse:  # (single_lse: no select to drop)
    p = numerics.probs(numerics.scores(s, scale), m, log_l)
  else:
    assert not numerics.paper, "the Mosaic GPU backward's scores are fa2's and fp32_out's"
    s = rounded_scores(s, scale, cfg.interpret)
    p = numerics.probs(s, m, log_l, rounded=True)
  if valid is None:
    return p, numerics.dscores(p, numerics.dp(dp), delta, scale)
  p = jnp.where(valid, p, 0.0)
  return p, jnp.where(valid, numerics.dscores(p, numerics.dp(dp), delta, scale), 0.0)


def _store(smem, value, dst):
  """value → a shared-memory tile → its place in global memory (TMA; not waited for)."""
  smem[...] = value
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, dst)


def _ring_loads(base, n_steps, stages, free, load, after_fill=None):
  """A producer's loads of one work item: load(j, slot) issues the item's step j's TMA copies
  into ring slot (base + j) mod stages (base: the ring's count of tiles before the item) once
  every compute warpgroup has freed that slot's previous tile; after_fill() as
  `forward_mgpu.after_first_tiles` says."""

  @pl.loop(0, n_steps)
  def _load(j):
    t = base + j
    slot = slot_of(t, stages)

    @pl.when(t >= stages)  # the slot's previous tile must be consumed first
    def _():
      plgpu.barrier_wait(free.at[slot])

    load(j, slot)
    after_first_tiles(j, n_steps, stages, after_fill)


def _load_item(at, base, n, n_steps, ring, load, item_tiles, own):
  """A producer's part of work item n (`work_items`' body): its ring tiles load(j, slot)
  (`_ring_loads`, ring = (stages, free barrier)) and, persistent (item_tiles not None: (grid,
  names, slots, their free barrier, `MosaicGPUOptions.items_early`)), its own tiles, own(at,
  slot) (dQ: each warpgroup's Q, dO, rows' statistics and O; dK/dV: its K and V), by
  `forward_mgpu.own_tiles_and_ring` (with items_early the persistent dQ kernel's warps waited
  3.6% of their samples less, Nsight Compute at gpt2-small's attention, H100, 2026-12-07)."""
  stages, free = ring
  run = functools.partial(_ring_loads, base, n_steps, stages, free, load)  # run(after_fill)
  if item_tiles is None:
    run(None)
    return
  own_tiles_and_ring(n, n_steps, functools.partial(own, at), own, item_tiles, run)


def _release(slots, item_free, n):
  """A compute warpgroup gives work item n's slot (its own tiles, through which its gradients
  left) back to the producer, once those stores have read it (`finish_stores`)."""
  finish_stores()
  plgpu.barrier_arrive(item_free.at[slot_of(n, slots)])


def _roles(wg, items, compute_item, load_item, persistent, item_slots, ring):
  """A backward CTA's two roles over its work items (`items`: `forward_mgpu.work_items`): the
  compute warpgroups run compute_item(at, base, n) on each, then give the last item's slot
  back (persistent) or wait for their stores; the producer runs load_item(at, base, n) on
  each, then waits for the last items' releases (item_slots: the slots and their barrier;
  persistent) and the last tiles' consumption (ring: the stages and the "free" barrier),
  `forward_mgpu.last_waits`."""

  @pl.when(wg < COMPUTE_WGS)
  def _compute():
    plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
    _, count = items(compute_item)
    if persistent:
      _release(*item_slots, count - 1)
    else:
      finish_stores()

  @pl.when(wg == COMPUTE_WGS)
  def _memory():
    plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
    end, count = items(load_item)
    if persistent:
      last_waits(count, *item_slots)
    last_waits(end, *ring)


def item_order(cfg, tiles: str, persistent: bool) -> tuple[str, str, str]:
  """A backward kernel's work items' axes, outermost first (`tiles`: "kv_tiles" for dK/dV,
  "q_tiles" for dQ). A head's tiles innermost, so that the CTAs resident together share its
  Q and dO (dK/dV) or K and V (dQ) in L2 (dQ's tiles outermost took 1.026–1.028× the
  backward's time, causal 16 × 1024 × 12 × d64, H100, 2026-12-06). Persistent with causal,
  the tiles outermost: the items are dealt round-robin in this order, and with the tiles
  innermost each CTA would get the same tile positions again and again, whose causal work
  differs (gpt2-small's 8 key tiles over 132 CTAs: tiles 0 and 4 to one CTA, 3 and 7 to
  another, twice its work: H100, 2026-12-06, the persistent backward 1.085× the time of the
  CTA-an-item one); outermost, every head's longest tiles come first (dK/dV's first key
  tiles; dQ's last query tiles, `forward_mgpu.query_tile`'s longest_first), as the causal
  forward's `forward_mgpu.query_grid` (FlashAttention-3's longest-processing-time-first,
  Shah et al. 2024, §3). The order moves no float32 sum."""
  if persistent and cfg.causal:
    return (tiles, "batch", "heads")
  return ("batch", "heads", tiles)


def _skip_steps(start, end, stages, readies, free):
  """Steps [start, end) of a warpgroup with no work in them (rows or keys all padding, or past
  a causal row's last key tile): it waits for each step's tile (every warpgroup observes
  every phase of the `readies` barriers) and frees it, without computing."""

  @pl.loop(start, end)
  def _(t):
    slot = slot_of(t, stages)
    for ready in readies:
      if ready is not None:
        plgpu.barrier_wait(ready.at[slot])
    plgpu.barrier_arrive(free.at[slot])


# --- dK, dV ---------------------------------------------------------------------------------


def _columns(index, part, n_parts, width):
  """A ref's index tuple with (several parts) the last axis cut to columns `part` · width on."""
  return index if n_parts == 1 else (*index, pl.ds(part * width, width))


def _dkv_kernel(
  q_ref,
  k_ref,
  v_ref,
  do_ref,
  rows_ref,
  dk_ref,
  dv_ref,
  scoped,
  *,
  cfg,
  n_q,
  group,
  stages,
  grid,
  persistent,
):
  numerics, dtype, scale, bq = cfg.numerics, q_ref.dtype, cfg.softmax_scale, DKV_BLOCK_Q
  smem, barriers = scoped
  k_smem3, v_smem3, q_smem, do_smem, rows_smem, out_smem2, p_smem2, ds_smem2 = smem
  k_ready, v_ready, q_ready, do_ready, rows_ready, free, done, kv_free = barriers
  wg = lax.axis_index("wg")
  # the shared-memory tiles are [parts, rows, width]: one part up to head_dim 128, each
  # warpgroup with keys of its own; above it (`parts`) one tile of keys, a part each; K and V
  # in `slots` of them (2 persistent: the next item's load early)
  n_parts, width, slots = q_smem.shape[1], q_smem.shape[-1], k_smem3.shape[0]
  shared = n_parts > 1
  kv_tiles = 1 if shared else COMPUTE_WGS  # K/V tiles of 64 keys a CTA
  key_span = ROWS if shared else COMPUTE_WGS * ROWS  # the keys of one CTA
  fused = not cfg.interpret

  def span(at):
    """(the item's first key, its first query tile, its steps): causal, query tiles that end
    before the item's first key see none of its keys; an item of padding keys has no step."""
    cta_key0 = at["kv_tiles"] * key_span
    first = lax.div(cta_key0, jnp.int32(bq)) if cfg.causal else jnp.int32(0)
    n_steps = jnp.maximum(jnp.int32(n_q) - first, 0)
    return cta_key0, first, jnp.where(cta_key0 >= cfg.kv_len, 0, n_steps)

  names = item_order(cfg, "kv_tiles", persistent)
  items = lambda body: work_items(grid, names, persistent, lambda at: span(at)[2], body)  # noqa: E731

  def load_kv(at, slot, w):
    """K and V of warpgroup w's 64 keys (shared: the CTA's) of item `at` into `slot`."""
    key0 = at["kv_tiles"] * key_span + w * ROWS
    keys = (at["batch"], pl.ds(key0, ROWS), lax.div(at["heads"], jnp.int32(group)))
    ready = slot * kv_tiles + w
    for p in range(n_parts):
      cols = _columns(keys, p, n_parts, width)
      plgpu.copy_gmem_to_smem(k_ref.at[cols], k_smem3.at[slot, w, p], k_ready.at[ready])
      plgpu.copy_gmem_to_smem(v_ref.at[cols], v_smem3.at[slot, w, p], v_ready.at[ready])

  def compute_item(at, base, n):
    """A compute warpgroup's part of work item `at`: dK and dV of its 64 keys (shared: its
    part of their columns) over the item's query tiles (ring count `base` on)."""
    batch, head = at["batch"], at["heads"]
    cta_key0, first, n_steps = span(at)
    kv_slot = slot_of(n, slots)
    # this warpgroup's K and V: [parts, ROWS, width]; shared, the CTA's, at a traced 0 (run_state
    # cannot carry a constant index of a ref it closes over: Mosaic GPU's lowering, jax 0.11.2)
    mine = wg * 0 if shared else wg
    part = wg if shared else 0  # the part of dK's and dV's columns it accumulates
    k_smem, v_smem = k_smem3.at[kv_slot, mine], v_smem3.at[kv_slot, mine]
    key0 = cta_key0 + (0 if shared else wg * ROWS)
    if persistent:  # the item before's slot, once its stores (issued just before) have read it
      pl.when(n > 0)(lambda: _release(slots, kv_free, n - 1))
    elif shared:  # one copy of the tile, by the first warpgroup
      pl.when(wg == 0)(lambda: load_kv(at, kv_slot, 0))
    else:
      load_kv(at, kv_slot, wg)
    plgpu.barrier_wait(k_ready.at[kv_slot * kv_tiles + mine])
    plgpu.barrier_wait(v_ready.at[kv_slot * kv_tiles + mine])
    tile = (ROWS, bq)
    col = plgpu.Layout.WGMMA.reduce(0)  # a per-query vector along the columns

    def elementwise(s, dp, slot, i, masked):
      """Pᵀ and dSᵀ (keys × queries) of one step, rounded for their products."""
      m, log_l, delta = (
        lax.broadcast_in_dim(_row_slice(rows_smem.at[slot], r, col), tile, [1]) for r in range(3)
      )
      q_pos, k_pos = i * bq + _iota(tile, 1), key0 + _iota(tile, 0)
      valid = _valid(q_pos, k_pos, cfg, key_span, query_span=bq) if masked else None
      p, ds = _probs_and_dscores(s, dp, m, log_l, delta, cfg, valid)
      return numerics.round_p(p, dtype), numerics.round_ds(ds, dtype)

    def step(t, carry, masked):
      dk, dv = carry
      i = first + t
      slot = slot_of(base + t, stages)
      q_slot, do_slot = q_smem.at[slot], do_smem.at[slot]
      if fused:

        def products(refs):
          dk_acc, dv_acc = refs

          def scoped_step(s_acc, dp_acc):
            plgpu.barrier_wait(q_ready.at[slot])
            for p in range(n_parts):  # Sᵀ = K Qᵀ
              plgpu.wgmma(s_acc, k_smem.at[p], q_slot.at[p].transpose((1, 0)))
            plgpu.barrier_wait(do_ready.at[slot])
            for p in range(n_parts):  # dPᵀ = V dOᵀ
              plgpu.wgmma(dp_acc, v_smem.at[p], do_slot.at[p].transpose((1, 0)))
            plgpu.barrier_wait(rows_ready.at[slot])
            s = plgpu.wgmma_accumulator_load(s_acc, wait_n=n_parts)  # while dPᵀ runs
            dp = dp_acc[...]
            p_in, ds_in = elementwise(s, dp, slot, i, masked)
            plgpu.wgmma(dv_acc, p_in, do_slot.at[part])  # dV += Pᵀ dO
            plgpu.wgmma(dk_acc, ds_in, q_slot.at[part])  # dK += dSᵀ Q

          pl.run_scoped(scoped_step, plgpu.ACC(tile, jnp.float32), plgpu.ACC(tile, jnp.float32))

        dk, dv = pl.run_state(products)((plgpu.ACC.init(dk), plgpu.ACC.init(dv)))
      else:  # interpret mode: operands from shared memory, fresh accumulators
        plgpu.barrier_wait(q_ready.at[slot])
        plgpu.barrier_wait(do_ready.at[slot])
        plgpu.barrier_wait(rows_ready.at[slot])
        s, dp = (_dot_parts(a, b, tile) for a, b in ((k_smem, q_slot), (v_smem, do_slot)))
        p_in, ds_in = elementwise(s, dp, slot, i, masked)
        p_smem, ds_smem = p_smem2.at[wg], ds_smem2.at[wg]
        p_smem[...] = p_in
        ds_smem[...] = ds_in
        plgpu.commit_smem()
        dv = numerics.accumulate(dv, _acc_dot(p_smem, do_slot.at[part], (ROWS, width)))
        dk = numerics.accumulate(dk, _acc_dot(ds_smem, q_slot.at[part], (ROWS, width)))
      plgpu.barrier_arrive(free.at[slot])
      return dk, dv

    # Steps [0, a) and [b, n_steps) need the mask (the causal diagonal; padded queries in the
    # last tile); [a, b) do not, unless this warpgroup has padded keys.
    diagonal_end = pl.cdiv(key0 + ROWS - 1, jnp.int32(bq)) if cfg.causal else first
    a = jnp.clip(diagonal_end - first, 0, n_steps)
    b = jnp.clip(jnp.int32(cfg.q_len // bq) - first, a, n_steps)
    b = jnp.where(key0 + ROWS > cfg.kv_len, a, b)
    # a warpgroup whose keys are all padding (a CTA's span past kv_len) computes no step
    end = jnp.where(key0 >= cfg.kv_len, 0, n_steps)
    a, b = jnp.minimum(a, end), jnp.minimum(b, end)
    zeros = plgpu.layout_cast(jnp.zeros((ROWS, width), jnp.float32), plgpu.Layout.WGMMA)
    carry = lax.fori_loop(0, a, lambda t, c: step(t, c, True), (zeros, zeros))
    carry = lax.fori_loop(a, b, lambda t, c: step(t, c, False), carry)
    dk, dv = lax.fori_loop(b, end, lambda t, c: step(t, c, True), carry)
    _skip_steps(base + end, base + n_steps, stages, (q_ready, do_ready, rows_ready), free)

    out_dtype = dk_ref.dtype
    dk = numerics.round_grad(dk, scale, out_dtype)
    dv = numerics.round_grad(dv, scale, out_dtype, scaled=False)
    rows_out = _columns((batch, pl.ds(key0, ROWS), head), part, n_parts, width)
    if out_smem2 is None:  # a 2-byte dK, dV: K's and V's buffers are free now
      if shared:  # once the other warpgroup's products are done with them
        plgpu.barrier_arrive(done)
        plgpu.barrier_wait(done)
      _store(k_smem.at[part], dk, dk_ref.at[rows_out])
      _store(v_smem.at[part], dv, dv_ref.at[rows_out])
    else:  # float32 partials (grouped heads): one buffer in turn
      _store(out_smem2.at[wg], dk, dk_ref.at[rows_out])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      _store(out_smem2.at[wg], dv, dv_ref.at[rows_out])

  def load_item(at, base, n):
    """The producer's part of a work item: its query tiles (Q, dO, the rows' statistics) into
    the ring; persistent, its K and V into their slot (`_load_item`)."""
    batch, head = at["batch"], at["heads"]
    _, first, n_steps = span(at)

    def load(t, slot):
      rows = pl.ds((first + t) * bq, bq)
      for p in range(n_parts):
        cols = _columns((batch, rows, head), p, n_parts, width)
        plgpu.copy_gmem_to_smem(q_ref.at[cols], q_smem.at[slot, p], q_ready.at[slot])
        plgpu.copy_gmem_to_smem(do_ref.at[cols], do_smem.at[slot, p], do_ready.at[slot])
      plgpu.copy_gmem_to_smem(
        rows_ref.at[batch, head, :, rows], rows_smem.at[slot], rows_ready.at[slot]
      )

    def own(at, slot):  # an item's K and V
      for w in range(kv_tiles):
        load_kv(at, slot, w)

    item_tiles = (grid, names, slots, kv_free, cfg.mgpu.items_early) if persistent else None
    _load_item(at, base, n, n_steps, (stages, free), load, item_tiles, own)

  _roles(wg, items, compute_item, load_item, persistent, (slots, kv_free), (stages, free))


def _dkv(q, k, v, do, rows, cfg, stages, persistent):
  batch, q_len_p, num_heads, d = q.shape
  kv_len_p, num_kv_heads = k.shape[1], k.shape[2]
  group = num_heads // num_kv_heads
  out_dtype = jnp.dtype(q.dtype if group == 1 else jnp.float32)
  n_q = steps(cfg)[0]
  n_parts, width = parts(d)
  kv_tiles = 1 if n_parts > 1 else COMPUTE_WGS  # K and V tiles of 64 keys (`_dkv_kernel`)
  slots = 2 if persistent else 1  # items' K and V in shared memory (`launch_plan`)
  kv_shape = (slots, kv_tiles, n_parts, ROWS, width)
  sw = smem_transforms(width, 2)

  def entry(q_ref, k_ref, v_ref, do_ref, rows_ref, dk_ref, dv_ref):
    smem = (
      plgpu.SMEM(kv_shape, k.dtype, transforms=sw),
      plgpu.SMEM(kv_shape, v.dtype, transforms=sw),
      plgpu.SMEM((stages, n_parts, DKV_BLOCK_Q, width), q.dtype, transforms=sw),
      plgpu.SMEM((stages, n_parts, DKV_BLOCK_Q, width), do.dtype, transforms=sw),
      plgpu.SMEM((stages, 3, DKV_BLOCK_Q), jnp.float32),
      None
      if out_dtype.itemsize == 2
      else plgpu.SMEM(
        (COMPUTE_WGS, ROWS, width), jnp.float32, transforms=smem_transforms(width, 4)
      ),
      *(
        (
          plgpu.SMEM(
            (COMPUTE_WGS, ROWS, DKV_BLOCK_Q), q.dtype, transforms=smem_transforms(DKV_BLOCK_Q, 2)
          ),
        )
        * 2
        if cfg.interpret
        else (None, None)
      ),
    )
    kv_ready = plgpu.Barrier(num_arrivals=n_parts, num_barriers=slots * kv_tiles)  # a copy a part
    ready = plgpu.Barrier(num_arrivals=n_parts, num_barriers=stages)
    free = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages)
    pl.run_scoped(
      lambda *scoped: _dkv_kernel(
        q_ref,
        k_ref,
        v_ref,
        do_ref,
        rows_ref,
        dk_ref,
        dv_ref,
        (scoped[0], scoped[1:]),
        cfg=cfg,
        n_q=n_q,
        group=group,
        stages=stages,
        grid=grid,
        persistent=persistent,
      ),
      smem,
      kv_ready,
      kv_ready,
      ready,
      ready,
      plgpu.Barrier(num_barriers=stages),  # the rows' statistics: one copy
      free,
      plgpu.Barrier(num_arrivals=COMPUTE_WGS) if n_parts > 1 else None,  # `done`
      plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=slots),  # K and V's slots: free
      collective_axes="wg",
    )

  grid = dict(batch=batch, heads=num_heads, kv_tiles=kv_len_p // (kv_tiles * ROWS))
  names = item_order(cfg, "kv_tiles", persistent)
  out = jax.ShapeDtypeStruct((batch, kv_len_p, num_heads, d), out_dtype)
  return plgpu.kernel(
    entry,
    out_type=(out, out),
    **launch(grid, names, persistent, cfg.interpret),
    num_threads=COMPUTE_WGS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(approx_math=True),
    interpret=_interpret_params(cfg),
  )(q, k, v, do, rows)


# --- dQ -------------------------------------------------------------------------------------


def _dq_kernel(
  q_ref, k_ref, v_ref, do_ref, rows_ref, *refs, cfg, n_kv, group, stages, grid, persistent, with_o
):  # with_o: delta here from O (`resolve_delta_in_dq`), whose rows come by TMA where `o_smem3`
  refs = list(refs)
  kd_ref = refs.pop(0) if cfg.numerics.center_keys else None
  o_ref = refs.pop(0) if with_o else None  # delta from dO and O here (`resolve_delta_in_dq`)
  dq_ref, rows_out_ref = refs[0], (refs[1] if o_ref is not None else None)
  scoped = refs[-1]
  numerics, dtype, scale, bk = cfg.numerics, q_ref.dtype, cfg.softmax_scale, dq_block_k(cfg)
  smem, barriers = scoped
  q_smem3, do_smem3, rows_smem3, o_smem3, k_smem, v_smem, kd_smem, ds_smem2 = smem
  rows_ready, k_ready, v_ready, kd_ready, free, rows_free = barriers
  wg = lax.axis_index("wg")
  slots = q_smem3.shape[0]  # each item's Q, dO and rows: 2 slots persistent (the next loads early)
  fused = not cfg.interpret
  key_steps = lambda row_end: visited_key_tiles(row_end, n_kv, bk, cfg.causal)
  cta_row0 = lambda at: query_tile(cfg, grid["q_tiles"], at["q_tiles"]) * (COMPUTE_WGS * ROWS)

  def cta_steps(at):  # the key tiles of a work item (128 rows; causal: longest_first)
    row0 = cta_row0(at)
    return jnp.where(row0 >= cfg.q_len, 0, key_steps(row0 + COMPUTE_WGS * ROWS))

  names = item_order(cfg, "q_tiles", persistent)
  items = lambda body: work_items(grid, names, persistent, cta_steps, body)  # noqa: E731

  def load_rows(at, slot, w):
    """Warpgroup w's Q, dO and rows' statistics of item `at` (and its rows of O,
    `MosaicGPUOptions.o_by_tma`) into `slot`: three (four) copies onto one barrier."""
    row0 = cta_row0(at) + w * ROWS
    mine = (at["batch"], pl.ds(row0, ROWS), at["heads"])
    ready = rows_ready.at[slot * COMPUTE_WGS + w]
    plgpu.copy_gmem_to_smem(q_ref.at[mine], q_smem3.at[slot, w], ready)
    plgpu.copy_gmem_to_smem(do_ref.at[mine], do_smem3.at[slot, w], ready)
    if o_smem3 is not None:
      plgpu.copy_gmem_to_smem(o_ref.at[mine], o_smem3.at[slot, w], ready)
    plgpu.copy_gmem_to_smem(
      rows_ref.at[at["batch"], at["heads"], :, pl.ds(row0, ROWS)], rows_smem3.at[slot, w], ready
    )

  def compute_item(at, base, n):
    """A compute warpgroup's part of work item `at`: its 64 rows against the item's key tiles
    (ring count `base` on), dQ written out through Q's tile."""
    slot = slot_of(n, slots)
    q_smem, do_smem, rows_smem = (
      q_smem3.at[slot, wg],
      do_smem3.at[slot, wg],
      rows_smem3.at[slot, wg],
    )
    row0 = cta_row0(at) + wg * ROWS
    if persistent:  # the item before's slot, once its store (issued just before) has read it
      pl.when(n > 0)(lambda: _release(slots, rows_free, n - 1))
    else:  # a CTA of one item: each warpgroup loads its own rows
      load_rows(at, slot, wg)
    mine = (at["batch"], pl.ds(row0, ROWS), at["heads"])
    if o_ref is not None and o_smem3 is None:  # its rows of O, from global memory while Q,
      o_rows = plgpu.load(o_ref.at[mine], layout=plgpu.Layout.WGMMA, optimized=False)  # dO, ...
    plgpu.barrier_wait(rows_ready.at[slot * COMPUTE_WGS + wg])
    d = q_smem.shape[-1]
    tile = (ROWS, bk)
    row = plgpu.Layout.WGMMA.reduce(1)
    if o_smem3 is not None:  # ... or with them (o_by_tma)
      o_rows = plgpu.load(o_smem3.at[slot, wg], layout=plgpu.Layout.WGMMA)
    if o_ref is not None:  # delta = rowsum(dO∘O) − the lse cotangent (row 2), written out
      delta = numerics.delta(plgpu.load(do_smem, layout=plgpu.Layout.WGMMA), o_rows)
      delta = delta - _row_slice(rows_smem, 2, row)
      rows_smem.at[2][...] = delta
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(
        rows_smem, rows_out_ref.at[at["batch"], at["heads"], :, pl.ds(row0, ROWS)]
      )
    m, log_l, delta = (
      lax.broadcast_in_dim(_row_slice(rows_smem, r, row), tile, [0]) for r in range(3)
    )
    # a warpgroup whose rows are all padding (a CTA's span past q_len) computes no step
    steps = jnp.where(row0 >= cfg.q_len, 0, key_steps(row0 + ROWS))
    # key tiles below `unmasked` have neither padded keys nor (causal) keys after any row
    unmasked = jnp.int32(cfg.kv_len // bk)
    if cfg.causal:
      unmasked = jnp.minimum(unmasked, lax.div(row0 + 1, jnp.int32(bk)))

    def elementwise(s, dp, j, masked):
      """dS of one step, rounded for its product (padded query rows are not masked: their
      dQ rows are cut off by the wrapper)."""
      valid = _valid(row0 + _iota(tile, 0), j * bk + _iota(tile, 1), cfg, bk) if masked else None
      return numerics.round_ds(_probs_and_dscores(s, dp, m, log_l, delta, cfg, valid)[1], dtype)

    def step(j, dq, masked):
      slot = slot_of(base + j, stages)
      k_slot, v_slot = k_smem.at[slot], v_smem.at[slot]
      kd_slot = k_slot if kd_smem is None else kd_smem.at[slot]
      if fused:

        def products(dq_acc):
          def scoped_step(s_acc, dp_acc):
            plgpu.barrier_wait(k_ready.at[slot])
            plgpu.wgmma(s_acc, q_smem, k_slot.transpose((1, 0)))  # S = Q Kᵀ
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.wgmma(dp_acc, do_smem, v_slot.transpose((1, 0)))  # dP = dO Vᵀ
            s = plgpu.wgmma_accumulator_load(s_acc, wait_n=1)  # while dP runs
            ds_in = elementwise(s, dp_acc[...], j, masked)
            if kd_smem is not None:
              plgpu.barrier_wait(kd_ready.at[slot])
            plgpu.wgmma(dq_acc, ds_in, kd_slot)  # dQ += dS K

          pl.run_scoped(scoped_step, plgpu.ACC(tile, jnp.float32), plgpu.ACC(tile, jnp.float32))

        dq = pl.run_state(products)(plgpu.ACC.init(dq))
      else:  # interpret mode: operands from shared memory, fresh accumulators
        plgpu.barrier_wait(k_ready.at[slot])
        plgpu.barrier_wait(v_ready.at[slot])
        if kd_smem is not None:
          plgpu.barrier_wait(kd_ready.at[slot])
        s = _acc_dot(q_smem, k_slot.transpose((1, 0)), tile)
        dp = _acc_dot(do_smem, v_slot.transpose((1, 0)), tile)
        ds_smem = ds_smem2.at[wg]
        ds_smem[...] = elementwise(s, dp, j, masked)
        plgpu.commit_smem()
        dq = numerics.accumulate(dq, _acc_dot(ds_smem, kd_slot, (ROWS, d)))
      plgpu.barrier_arrive(free.at[slot])
      return dq

    mid = jnp.minimum(unmasked, steps)
    zeros = plgpu.layout_cast(jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA)
    dq = lax.fori_loop(0, mid, lambda j, c: step(j, c, False), zeros)
    dq = lax.fori_loop(mid, steps, lambda j, c: step(j, c, True), dq)

    # causal: free the slots the other warpgroups still read
    _skip_steps(base + steps, base + cta_steps(at), stages, (k_ready, v_ready, kd_ready), free)
    _store(q_smem, numerics.round_grad(dq, scale, dq_ref.dtype), dq_ref.at[mine])  # Q is dead

  def load_item(at, base, n):
    """The producer's part of a work item: its key and value tiles into the ring; persistent,
    its rows (Q, dO, statistics, O) into their slot (`_load_item`)."""
    kv_head = lax.div(at["heads"], jnp.int32(group))

    def load(j, slot):
      keys = (at["batch"], pl.ds(j * bk, bk), kv_head)
      plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[slot], k_ready.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[slot], v_ready.at[slot])
      if kd_smem is not None:
        plgpu.copy_gmem_to_smem(kd_ref.at[keys], kd_smem.at[slot], kd_ready.at[slot])

    def own(at, slot):  # each warpgroup's rows
      for w in range(COMPUTE_WGS):
        load_rows(at, slot, w)

    item_tiles = (grid, names, slots, rows_free, cfg.mgpu.items_early) if persistent else None
    _load_item(at, base, n, cta_steps(at), (stages, free), load, item_tiles, own)

  _roles(wg, items, compute_item, load_item, persistent, (slots, rows_free), (stages, free))


def _dq(q, k, v, do, rows, kd, cfg, stages, persistent, o=None):
  """dQ (and with `o`, `MosaicGPUOptions.delta_in_dq`: (dQ, the rows with delta written in);
  O's rows by TMA where `resolve_o_by_tma`)."""
  batch, q_len_p, num_heads, d = q.shape
  num_kv_heads = k.shape[2]
  group = num_heads // num_kv_heads
  bk = dq_block_k(cfg)
  n_kv = steps(cfg)[1]
  assert n_kv * bk <= k.shape[1], (n_kv, bk, k.shape)  # no key tile reads past the array
  sw = smem_transforms(d, 2)
  center = kd is not None
  slots = 2 if persistent else 1  # items' Q, dO and rows in shared memory (`launch_plan`)
  o_by_tma = o is not None and resolve_o_by_tma(cfg, d, stages, persistent)

  extra = ([kd] if center else []) + ([o] if o is not None else [])

  def entry(q_ref, k_ref, v_ref, do_ref, rows_ref, *refs):
    smem = (
      plgpu.SMEM((slots, COMPUTE_WGS, ROWS, d), q.dtype, transforms=sw),
      plgpu.SMEM((slots, COMPUTE_WGS, ROWS, d), do.dtype, transforms=sw),
      plgpu.SMEM((slots, COMPUTE_WGS, 3, ROWS), jnp.float32),
      plgpu.SMEM(
        (slots, COMPUTE_WGS, ROWS, d), o.dtype, transforms=smem_transforms(d, o.dtype.itemsize)
      )
      if o_by_tma
      else None,
      plgpu.SMEM((stages, bk, d), k.dtype, transforms=sw),
      plgpu.SMEM((stages, bk, d), v.dtype, transforms=sw),
      plgpu.SMEM((stages, bk, d), k.dtype, transforms=sw) if center else None,
      plgpu.SMEM((COMPUTE_WGS, ROWS, bk), q.dtype, transforms=smem_transforms(bk, 2))
      if cfg.interpret
      else None,
    )
    ready = plgpu.Barrier(num_barriers=stages)
    free = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages)
    pl.run_scoped(
      lambda *scoped: _dq_kernel(
        q_ref,
        k_ref,
        v_ref,
        do_ref,
        rows_ref,
        *refs,
        (scoped[0], scoped[1:]),
        cfg=cfg,
        n_kv=n_kv,
        group=group,
        stages=stages,
        grid=grid,
        persistent=persistent,
        with_o=o is not None,
      ),
      smem,
      # Q, dO, rows (and O): 3 (4) copies
      plgpu.Barrier(num_arrivals=4 if o_by_tma else 3, num_barriers=slots * COMPUTE_WGS),
      ready,
      ready,
      ready if center else None,
      free,
      plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=slots),  # the rows' slots: free
      collective_axes="wg",
    )

  grid = dict(batch=batch, heads=num_heads, q_tiles=q_len_p // (COMPUTE_WGS * ROWS))
  names = item_order(cfg, "q_tiles", persistent)
  out_type = jax.ShapeDtypeStruct(q.shape, q.dtype)
  if o is not None:
    out_type = (out_type, jax.ShapeDtypeStruct(rows.shape, rows.dtype))
  return plgpu.kernel(
    entry,
    out_type=out_type,
    **launch(grid, names, persistent, cfg.interpret),
    num_threads=COMPUTE_WGS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(approx_math=True),
    interpret=_interpret_params(cfg),
  )(q, k, v, do, rows, *extra)


def _pad_to(x, axis, multiple):
  """x zero-padded along `axis` to the next multiple of `multiple` (`policy.pad_axis`)."""
  return pad_axis(x, axis, -(-x.shape[axis] // multiple) * multiple)


def flash_backward_mgpu(q, k, v, o, m, log_l, do, cfg, d_lse=None):
  """The Mosaic GPU backward on padded [batch, len, heads, head_dim] arrays; returns (dq, dk,
  dv) as `pallas_kernels.backward.flash_backward` does (same arguments). The sequences are
  padded here to the CTAs' 128 rows (the keys also to a multiple of the dQ key tile,
  `dq_block_k`) and sliced back; padded keys and queries are masked, and a warpgroup whose
  rows or keys are all padding computes nothing. Tiles in flight: `_stages` (ValueError where
  `KernelConfig.stages_bwd_mgpu` asks more than shared memory holds, before any kernel runs).
  `pallas_kernels.attention.kernel_config` has checked the call against `supported`.
  """
  batch, q_len_p, num_heads, d = q.shape
  kv_len_p, num_kv_heads = k.shape[1], k.shape[2]
  group = num_heads // num_kv_heads
  (stages_dkv, stages_dq), (persistent_dkv, persistent_dq) = launch_plan(cfg, d, group)
  cta = COMPUTE_WGS * ROWS
  do = cfg.numerics.d_out(do, q.dtype)
  in_dq = resolve_delta_in_dq(cfg, d)  # delta from the dQ kernel, which then runs first
  if in_dq:  # row 2: the lse cotangent, which the dQ kernel subtracts from rowsum(dO∘O)
    delta = jnp.zeros_like(m) if d_lse is None else d_lse.astype(jnp.float32)
  else:
    delta = cfg.numerics.delta_by_head(do, o, d_lse)  # [batch, heads, q_len_p]
  rows = jnp.stack([m, log_l, delta], axis=2)  # [batch, heads, 3, q_len_p]
  qp, dop, rows = _pad_to(q, 1, cta), _pad_to(do, 1, cta), _pad_to(rows, 3, cta)
  keys = math.lcm(cta, dq_block_k(cfg))  # dK/dV's CTAs and dQ's key tiles stay inside
  kp, vp = _pad_to(k, 1, keys), _pad_to(v, 1, keys)
  kd = _pad_to(cfg.numerics.dq_keys(k, cfg.kv_len), 1, keys) if cfg.numerics.center_keys else None
  if in_dq:
    dq, rows = _dq(qp, kp, vp, dop, rows, kd, cfg, stages_dq, persistent_dq, _pad_to(o, 1, cta))
  dk, dv = _dkv(qp, kp, vp, dop, rows, cfg, stages_dkv, persistent_dkv)
  dk, dv = dk[:, :kv_len_p], dv[:, :kv_len_p]
  if group > 1:
    dk = cfg.numerics.sum_group(dk.reshape(batch, kv_len_p, num_kv_heads, group, d), q.dtype)
    dv = cfg.numerics.sum_group(dv.reshape(batch, kv_len_p, num_kv_heads, group, d), q.dtype)
  if in_dq:  # dK/dV after dQ: it reads dQ's rows
    return dq[:, :q_len_p], dk, dv
  if cfg.interpret:  # dQ after dK/dV: XLA could otherwise run the two interpreted kernels
    qp, dk, dv = lax.optimization_barrier((qp, dk, dv))  # at once, six blocking warpgroups
  dq = _dq(qp, kp, vp, dop, rows, kd, cfg, stages_dq, persistent_dq)[:, :q_len_p]
  return dq, dk, dv
