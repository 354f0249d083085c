"""Forward flash-attention kernel for Hopper in Pallas Mosaic GPU (fa2 and fp32_out layouts).

The same numerics as `pallas_kernels.forward` (FlashAttention-2, Dao 2023, Alg. 1; every
rounding point is a `numerics.` call or `compensated_tile_max`, `pallas_kernels.policy`), laid
out the Hopper way of FlashAttention-3 (Shah et al. 2024, §3.1, warp specialisation):

- a work item is 128 query rows of one batch and head; a CTA per item, or (on a GPU wherever
  it fits, `MosaicGPUOptions.persistent`) one CTA an SM looping over the items; three
  warpgroups: two compute warpgroups own 64 query rows each (the M of one wgmma), the third
  only issues TMA copies: each item's Q tiles and its key/value tiles, into a ring of `stages`
  shared-memory slots (FlashAttention-3's producer/consumer split);
- per key tile, S = QKᵀ and the P̄V product are wgmma's with float32 accumulators in
  registers; the online softmax (and the compensation's tie count) runs in registers between
  them;
- a slot is refilled once both compute warpgroups have arrived on its "consumed" barrier.
- the two compute warpgroups take turns on the tensor cores (`MosaicGPUOptions.pingpong`, FlashAttention-3's
  ping-pong scheduling): one computes its softmax while the other's products run.

The key tile `block_k` is the numerics' tile (ties are detected per tile); `block_q` plays no
part in fa2's numerics (rows are independent), so the 2 × 64-row CTA is fixed here.
Scores of padded keys (≥ kv_len) and, when causal, of keys after the query are −inf; the
wrapper (`pallas_kernels.attention`) has padded head_dim and the sequences.
Differences from the Triton kernel, all in float32 values and none at a bf16 rounding point or
in the tie test: on the GPU the P̄V wgmma accumulates into α·acc (`MosaicGPUOptions.fused_pv`, FlashAttention-3's
order; the Triton kernel adds P̄V from its own accumulator; in interpret mode the unfused order
runs, where the compiler may contract α·acc + P̄V into an FMA), P̄ = 2^((S − m)·log₂e)
(`MosaicGPUOptions.exp2`, `policy.Numerics.exp_scores`: the max's P̄ is 1 exactly, at any
logit), the summation
order inside the two dots is the tensor core's (wgmma), exp2 and log are Mosaic GPU's fast
approximations (`approx_math`: ex2.approx / lg2.approx, subnormals flushed), and the compiler
may contract α·l + Σ into an FMA; so outputs may differ from the Triton kernel's by an ulp or
two (`tests/test_mosaic_gpu.py` bounds it; on the GPU it ran with the default options). wgmma's
shapes, registers and shared memory limit head_dim to 32, 64, 128 or 256 after padding and
block_k to 64 or 128, and 64 at head_dim 256 (`supported`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.policy import MOSAIC_GPU_BLOCK_K, MOSAIC_GPU_NUMERICS as NUMERICS
from pallas_kernels.policy import LOG2E, boolean, compensated_tile_max, pad_axis
from pallas_kernels.top2 import column_top2, lane_top2, row_top2

ROWS_PER_WG = 64  # wgmma's M for one warpgroup
COMPUTE_WGS = 2


@dataclasses.dataclass(frozen=True)
class MosaicGPUOptions:
  """Speed options of the Mosaic GPU forward (`flash_attention(mgpu_options=...)`). None of
  them moves a bf16 rounding point; `fused_pv`, `exp2`, `scale_in_exp2` (where on and c is not
  a power of two) and `rounded_scores` change float32 values (module
  docstring; scale_in_exp2 also a tie decision within about an ulp of its threshold), valid
  for fa2 and fp32_out, whose numerics hooks before the final rounding are identities.

  pingpong: the two compute warpgroups take turns on the tensor cores (FlashAttention-3,
    §3.1): one's softmax runs while the other's matrix products hold them. No arithmetic
    changes. None: on for a GPU, off in interpret mode, where the interpreter runs each
    warpgroup on a thread executing compiled code and, inside an outer jit on a 2-core CPU,
    the two warpgroups' rendezvous can starve of threads and hang (seen with a jitted
    forward+backward at 128 × 128); the tests turn it on for eager calls.
  fused_pv: the P̄V wgmma accumulates into α·acc (FlashAttention-3's order) instead of into its
    own accumulator added afterwards; saves a 64×head_dim float32 register tile and an add.
    GPU only (the interpreter cannot run a wgmma into an initialised accumulator).
  early_turn: with ping-pong, the turn is taken right after the QK wgmma is issued (as JAX's
    attention_mgpu does) rather than after its result is read.
  exp2: P̄ = 2^((S − m)·log₂e), a multiply before ex2 (`policy.exp_scores`), instead of
    exp(S − m).
  q_tiles_inner: the grid runs a head's query tiles one after another (Pallas's last grid
    axis is CUDA's x, launched first), so the CTAs resident together share one head's K and V
    in L2; with heads innermost ~64 heads' K/V (128 MiB at length 4096) were in flight. None
    (the default, `query_grid`): on without causal, off with it, where the query tiles
    outermost let `longest_first` order the whole grid (every head's longest tiles before any
    shorter one: FlashAttention-3's longest-processing-time-first over all heads, Shah et al.
    2024, §3) instead of each head's tiles. The same bits either way. Timed (H100, 2026-12-06,
    paired against cuDNN): causal +2.4% (16 × 1024 × 12 × d64, 60 pairs), +5.4% (8 × 2048 × 12
    × d64, 30 pairs), +3.7–5.3% (4 × 4096 × 16 × d128, 30 pairs, two runs); without causal
    −0.7% (16 × 1024 × 12 × d64). The forward's grid only: the backward's dQ kernel keeps its
    query tiles innermost (outermost it took 1.026–1.028× the time, causal 16 × 1024 × 12 ×
    d64, 30 pairs).
  opt_barrier: with ping-pong, the step's softmax results (α·acc, m, l, P̄ in 16 bits) pass
    an `optimization_barrier` before the warpgroup gives up its turn, so the compiler cannot
    sink their arithmetic past the arrive into the other warpgroup's turn (as JAX's
    attention_mgpu does at head_dim ≤ 128). No arithmetic changes.
  k_wait_in_pv: the wait for the next key tile is issued right after the P̄V wgmma, so it
    overlaps the product instead of following it (JAX's attention_mgpu); the first tile's
    before the loop. No arithmetic changes.
  longest_first: causal only: the grid takes a head's query tiles from the last to the first,
    so the tiles that visit the most key tiles start first and the short ones fill the tail
    (FlashAttention-3's scheduling of causal work, Shah et al. 2024, §3); each tile's
    arithmetic is unchanged. The same for the Mosaic GPU backward's dQ kernel (`query_tile`;
    its dK/dV kernel already starts with the longest key tiles). On by default since
    2026-12-05 (H200, 30 pairs, same bits: the causal forward +1.3% at d128 and +1.5% at d64
    paired, the backward 0.99× the time at d128, 1.006× at d64).
  overlap: each warpgroup's P̄V wgmma of step j runs beside its QKᵀ wgmma and softmax of step
    j + 1 (FlashAttention-3's intra-warpgroup overlap of GEMMs and softmax, Shah et al. 2024,
    §3.2, Alg. 2): both products are issued together, S of j + 1 is read as soon as it is
    done (`wgmma_accumulator_load(wait_n=1)`) and its softmax runs while P̄V is in flight;
    a prologue computes step 0's softmax, an epilogue the last P̄V. The same float32
    operations in the same order as without it (α·acc then + P̄V; the unfused order in
    interpret mode). Step j's P̄ in 16 bits stays live beside step j + 1's scores and P̄
    (by count about 150 of a thread's 232 registers at the peak at block_k 64 and head_dim
    128, about 220 at block_k 128: not yet checked by ptxas). It takes the turn and waits for
    the next key tile its own way: early_turn and k_wait_in_pv must be off (ValueError). Off
    by default until measured on the GPU.
  tie_lanes: with the compensation, the top-2 summary finished across the row's 4 lanes
    (`top2.row_top2`'s Mosaic GPU rule: two rounds of two shuffles carrying both values), so
    the tie test is one compare; off: `top2.column_top2`'s 8-column groups, the max's
    shuffles and then a count over the groups with shuffles of its own. The same decisions
    and the same max (`policy.tied_by_top2`). On: the same bits on the GPU and no slower
    (H100, 2026-12-05: +0.4–2.2% paired, the compensation's forward cost +5.2% → +4.0%).
  scale_in_exp2: with exp2 (ValueError without it), the softmax scale c moves into exp2's
    multiply (`policy.Numerics.exp_scores`): the row max, the compensation's tie test and shift
    (`policy.Compensation.unscaled`, its thresholds divided by c) and the running sums work on
    the unscaled QKᵀ, P̄ = 2^((QKᵀ − m)·k) with k = c·log₂e, and the m written out is m·c.
    (Until 2026-12-07 2^(QKᵀ·k − m·k), one FMA, FlashAttention-2's order: Dao 2023, its CUDA
    kernel's `scale_softmax_log2`; `exp_scores` says why not.) It saves the multiply of every score (32 of
    a compute thread's ~350 SASS instructions per key tile at block_k 64, head_dim 128:
    experiments/20_ptxas_report.py). Changes float32 values: no S = QKᵀ·c is rounded, so P̄'s
    exponent argument differs by float32 ulps, the written m where the compensation shifted
    by about a float32 ulp of the larger of the row's max and max_shift (max_shift / c is
    rounded), and a tie decision only for a score within about an ulp of max − tol; bf16
    rounding points stay where they are. Scales whose c·log₂e or thresholds over c are not
    normal float32 numbers are refused (`scale_in_exp2_refusal`). None (the default): on
    exactly where it changes no value (`resolve_scale_in_exp2`: c a power of two ≤ 1, as at
    head_dim 64 and 256 by default, where QKᵀ·c, the thresholds over c and m·c are exact), off
    elsewhere (at head_dim 128: opt-in, where it was faster); timed (H100, 2026-12-06, b4 × 4096 × 16 × d128, compensation on): +1.1%
    forward (causal +2.2%), +5.1% without the compensation. Its backward half (since 2026-12-06,
    evening; wherever it is on and the scale is a power of two ≤ 1, with rounded_scores:
    `backward_mgpu.unscaled_scores`): P from the unscaled QKᵀ, (QKᵀ − m/c − log l/c)·(c·log₂e)
    into ex2, the same bits as forming S, one multiply a score fewer in both backward kernels
    (d64: dK/dV 409 → 377 SASS instructions a tile, dQ 352 → 320); the backward 0.978× the time
    (H100, 2026-12-06, gpt2-small's 16 × 1024 × 12 × d64 causal, same bits).
  rounded_scores: the Mosaic GPU forward and backward form S = QKᵀ·c as PTX `mul.rn.f32`
    (`rounded_scores`; interpret mode: behind an optimization barrier), which no compiler
    contracts into S − m, so P̄ and P need no compare-and-select for their exponent to be
    exactly 0 at the row max (`policy.Numerics.max_gap`; the forward since 2026-12-07, where
    the contracted product had left the max's P̄ off 1 by up to ½ ulp(S)): two instructions a
    score fewer in both backward kernels (experiments/20_ptxas_report.py; not with single_lse,
    which has no select). Off: the plain product and `probs`' select, where NVPTX contracts
    the product into S − m (an FMA) away from the max, so P's float32 values there differ by
    ulps from the definition's fl(fl(QKᵀ·c) − m), which the option computes. On by default
    since its GPU tests and timing (H100, 2026-12-06: the backward alone 2.0% faster, causal
    2.2%, b4 × 4096 × 16 × d128; interpret mode: the same bits as off).
  persistent: the forward launches one CTA an SM (`persistent_ctas`) that loops over work
    items (a batch, head and 128 query rows each; `query_grid`'s order, `longest_first`
    included, dealt round-robin: `plgpu.nd_loop`), instead of a CTA per item. The producer
    warpgroup loads the next item's Q into a second buffer while the compute warpgroups finish
    the current one, and its first key and value tiles into the same ring, and O leaves
    through a buffer of its own, its write waited for (reads only) one item later: a CTA that
    waits for its first tiles and its writes left 13.7% and 3.8% of the compute warps' stall
    samples at gpt2-small's attention. Needs the second Q tile and O's buffer in shared memory
    (`smem_bytes`; set True where they do not fit: ValueError). No arithmetic changes (the
    same bits, GPU and interpret mode). None (the default, `resolve_persistent`): on for a GPU
    wherever it fits, off in interpret mode (as pingpong: fewer blocking threads on a small
    CPU) and where it does not fit (`smem_bytes` over `SMEM_BYTES`: e.g. head_dim 256; block_k
    128 at head_dim 128 with 3 tiles in flight, block_k 64 there with 5; at 2 and 4 they fill
    the 226 KiB exactly, as the wide step's 2 slots of 128 keys do). Timed (H100, 2026-12-06, experiments/11_mgpu_forward_ab.py, paired against
    cuDNN, same bits), against the non-persistent forward of the same tree, which had the
    slow barrier waits that `_load_item` describes (the forward before it, at the same
    shapes: 0.78× and 0.70–0.71×): gpt2-small's 16 × 1024 × 12 × d64 0.732× → 0.963× causal,
    0.678× → 0.824× full; b4 × 4096 × 16 × d128 0.617× → 0.725× full, 0.724× → 0.792× causal;
    the gpt2-small step 1.012× → 1.008× cuDNN's (`flashstable bench --targets`).
  wide_step: one loop step covers two of the numerics' 64-key tiles (block_k 64 only: 128 keys
    a step): one TMA copy each of K and V into a ring slot of 128 keys, one 64 × 128 QKᵀ wgmma
    and one K and one V barrier pair per step, then the online softmax and the P̄V product of
    each 64-key half in turn (`policy.compensated_tile_max`'s tie rule, α, P̄'s rounding: the
    tile of the numerics is still block_k; cuDNN's forward at head_dim 64 runs 64 × 128 tiles).
    What it saves is per-step work: the loop's control and barriers and a third of the QKᵀ
    wgmma instructions (experiments/20_ptxas_report.py, CPU, 2026-12-07: 816 SASS instructions
    a step against 2 × 439 at b4 × 4096 × 16 × d128 full, 678 against 2 × 369 at d64 causal). A half of
    padded or (causal) later keys only is an exact no-op for finite V (its max −inf, not a
    tie: α = 1, P̄ = 0; an inf in V at a key the 64-key loop never visits gives NaN, as in
    the Triton kernel, whose 128-row query tiles visit it too), so the padding to 128 keys
    (K and V are padded to a multiple of 128 where they are not) and a causal row block's
    extra half change no bit. The bits of S are the same if wgmma sums each element of a
    64 × 128 product as of a 64 × 64 one (tests/test_mosaic_gpu.py on the GPU; interpret
    mode: out and m the same bits, log l within float32 ulps of XLA's CPU exp2). Refused
    (ValueError) with block_k 128, at head_dim 256 (the scores' 64 more registers), where its
    slots do not fit shared memory (`wide_step_refusal`) and with overlap. None (the default,
    `resolve_wide_step`): on for a GPU wherever it runs and does not turn the persistent
    forward off (fp32_out at head_dim 128, or 3 K/V slots there, keep the persistent 64-key
    step), off in interpret mode and where it cannot. Timed (H100, 2026-12-07, experiments/11_mgpu_forward_ab.py, kernel time from the
    profiler, same bits; experiments/results/h100-2026-12-07c-wide-step): the forward's
    kernels 109.7 → 100.4 µs at gpt2-small's 16 × 1024 × 12 × d64 causal (cuDNN 90.9),
    1216 → 1062 µs at b4 × 4096 × 16 × d128 full (persistent there too: its 2 slots of 128
    keys fill the 226 KiB exactly; cuDNN 863); the gpt2-small step level with cuDNN's
    (five runs 0.999–1.011× its time, median 1.0007×; experiments/results/
    h100-2026-12-07d-wide-confirm).
  unit_alpha: α·acc is skipped by a warp whose 16 rows all kept their max (α = 1 exactly on
    each: `policy.Numerics.rescale`), where multiplying by 1 changes no bit: a compare per
    row, a warp vote and a branch around the accumulator's products (head_dim / 2 FMUL a
    thread: 64 of the d128 loop's 445 SASS instructions a 64-key tile, 32 of 369 at d64,
    experiments/20_ptxas_report.py), instead of the products on every tile. FlashAttention-4's
    conditional rescaling skips it below a threshold, which changes values; this skips only
    the identity. How often it skips depends on the data (the max moves in fewer tiles as a
    row goes on). GPU only (an inline block with `vote.sync`); interpret mode multiplies,
    the same values. Off by default: slower where timed (H100, 2026-12-07, kernel time,
    experiments/results/h100-2026-12-07c-wide-step): 109.7 → 115.2 µs at gpt2-small's d64
    causal; beside the wide step 100.4 → 103.3 µs there and 1062 → 1107 µs at d128 full.
  delta_in_dq: the backward's delta = rowsum(dO∘O) (minus the lse cotangent) computed by the
    dQ kernel from the dO tile it loads and its rows of O (read from global memory into
    registers), written beside m and log l for the dK/dV kernel, which then runs after it,
    instead of XLA's reduction over dO and O before both kernels (`Numerics.delta_by_head`).
    O's rows are read while Q, dO and the rows' statistics arrive. A float32 sum in the
    kernel's order (each thread's columns, then shuffles across the row's lanes), not XLA's:
    delta may differ by float32 ulps, and the gradients by a rounding to the input dtype
    (within one ulp of it where tested). None (the default): on for a GPU where it was timed,
    a padded head_dim up to 128 with O in the input dtype (`backward_mgpu.resolve_delta_in_dq`;
    not at 256 nor with fp32_out's float32 O, untimed), off elsewhere and in interpret mode.
    Timed (H100, 2026-12-07, the backward alone, paired against it off): 0.980× the time at
    gpt2-small's 16 × 1024 × 12 × d64 causal (30 pairs) and 0.993× at b4 × 4096 × 16 × d128
    causal (15 pairs), where its kernels alone took 1.037× (XLA's reduction before them is
    gone); experiments/results/h100-2026-12-07f-gpu-tests-delta-in-dq.
  o_by_tma: with delta_in_dq, the dQ kernel's rows of O come into shared memory by TMA with
    its Q, dO and rows' statistics (the producer's copies, onto the same barrier: a
    persistent kernel's next item's early, in its second slot) instead of from global memory
    into registers at the item's start, where the compute warpgroups waited for them: Nsight
    Compute's stall samples at gpt2-small's 16 × 1024 × 12 × d64 causal put 9% of the dQ
    kernel's compute warps' samples on the first use of O (H100, 2026-12-07,
    experiments/results/h100-2026-12-07j-stalls). The same values (the same loads of the same
    bits). None (the default): on wherever O's tiles fit the dQ kernel's shared memory beside
    its plan (`backward_mgpu.resolve_o_by_tma`); True is refused (one line) where they do not;
    unused without delta_in_dq.
  items_early: with persistent (the forward) and persistent_bwd (the backward), the producer
    issues an item's own tiles (the forward's Q; dQ: Q, dO, the rows' statistics and O;
    dK/dV: K and V) one item early, once the item before has issued its first ring tiles
    (`own_tiles_and_ring`), instead of after the item before's
    last key tiles, where the compute warps waited for them at gpt2-small's attention (H100,
    2026-12-07, Nsight Compute: the forward's 2.8% of their stall samples,
    experiments/results/h100-2026-12-07j-stalls; the dQ kernel's 3.6% with o_by_tma,
    h100-2026-12-07k-o-by-tma). The same bits (interpret mode; forward and backward with one
    CTA and two). Built 2026-12-07 on the CPU (ptxas: no spills, no inline barrier sleeps; the
    forward's d64 loop 743 SASS instructions against 738) and not yet run on a GPU (the
    session's device time spent): off until timed (`experiments/h200_items_early.sh`).
  persistent_bwd: the same for the backward's two kernels (`backward_mgpu.launch_plan`, each
    resolved on its own): dQ's work items (a batch, head and 128 query rows) with the next
    item's Q, dO and rows' statistics loaded early into a second slot, dK/dV's (a batch, head
    and 128 keys) with the next item's K and V; each item's gradient leaves through its own
    slot's tiles, which go back to the producer at the next item's start once the stores have
    read them; with causal the items are dealt tiles outermost, longest first
    (`backward_mgpu.item_order`). The same bits (interpret mode; the GPU). True lowers the
    backward's default tiles in flight to what fits (dQ 2 → 1 at head_dim 128 with
    center_keys: `backward_mgpu.default_stages`) and is refused where even one does
    not fit (head_dim 256; head_dim 128 with grouped heads' float32 partials). None (the
    default): on for a GPU at a padded head_dim up to 64 wherever the tiles in flight fit
    (`backward_mgpu.PERSISTENT_BWD_MAX_HEAD_DIM`), off above it and in interpret mode. Timed
    (H100, 2026-12-07, the backward alone, paired, same bits): 0.939× the time at
    gpt2-small's 16 × 1024 × 12 × d64 causal (30 pairs; 1.085× on 2026-12-06, before the
    causal items were dealt tiles outermost), but 1.015× at b4 × 4096 × 16 × d128 full and
    1.040× causal, where the persistent dK/dV spills (ptxas: 104 bytes); the gpt2-small step
    1.006× → 1.001× cuDNN's (`flashstable bench --targets`, one run each).
  The defaults are the ones that were faster on the H200 or H100, or no slower, except
  scale_in_exp2, faster too but on by default only where it changes no value; what each option
  measured, with command and date: docs/studies/speed.md ("The Mosaic GPU route"). Removed
  after timing: deferred_wait (the backward's accumulating products waited for with the next
  step's S; the same bits, 1.03–1.07× the backward's time, H100, 2026-12-06).
  """

  pingpong: bool | None = None
  fused_pv: bool = True
  early_turn: bool = False
  exp2: bool = True
  q_tiles_inner: bool | None = None
  opt_barrier: bool = False
  k_wait_in_pv: bool = False
  longest_first: bool = True
  overlap: bool = False
  tie_lanes: bool = True
  scale_in_exp2: bool | None = None
  rounded_scores: bool = True
  persistent: bool | None = None
  persistent_bwd: bool | None = None
  wide_step: bool | None = None
  unit_alpha: bool = False
  delta_in_dq: bool | None = None
  o_by_tma: bool | None = None
  items_early: bool = False

  def __post_init__(self):
    for field in dataclasses.fields(self):  # flags, not truthy values (or None, where resolved)
      name = field.name
      boolean(
        f"MosaicGPUOptions.{name}",
        getattr(self, name),
        name
        in (
          "pingpong",
          "scale_in_exp2",
          "q_tiles_inner",
          "persistent",
          "persistent_bwd",
          "wide_step",
          "delta_in_dq",
          "o_by_tma",
        ),
      )
    if self.overlap and (self.early_turn or self.k_wait_in_pv):
      on = [name for name in ("early_turn", "k_wait_in_pv") if getattr(self, name)]
      raise ValueError(
        "MosaicGPUOptions(overlap=True) takes the turn and waits for the next key tile its own "
        f"way: {' and '.join(f'{name}=True' for name in on)} must be False"
      )
    if self.overlap and self.wide_step:
      raise ValueError(
        "MosaicGPUOptions(overlap=True) runs one 64-key tile a step: wide_step must be False"
      )
    if self.scale_in_exp2 and not self.exp2:
      raise ValueError(
        "MosaicGPUOptions(scale_in_exp2=True) moves the softmax scale into exp2's multiply: "
        "exp2 must be True, got exp2=False"
      )


# Hopper's 227 KiB of shared memory per block, less room for the barriers (8 bytes each, 13 in
# the persistent wide step: Mosaic GPU puts them after the buffers). The forward reserves no
# reduction scratch (`REDUCTION_SCRATCH_BYTES`).
SMEM_BYTES = 227 * 1024 - 1024
# Mosaic GPU aligns each shared-memory buffer to 1 KiB (its own SMEM_ALIGNMENT, in
# jax._src.pallas.mosaic_gpu.core).
SMEM_ALIGNMENT = 1024
# Mosaic GPU's scratch for reductions across warps (`plgpu.CompilerParams`, 2 KiB by default):
# the forward's reductions are all along a row, inside a warp (its 4 lanes), and lower and
# compile without it (ptxas, CPU, 2026-12-07: the same SASS); its 2 KiB make room for the
# persistent wide step at head_dim 128 (`smem_bytes`: 226 KiB).
REDUCTION_SCRATCH_BYTES = 0


def smem_transforms(cols: int, itemsize: int):
  """Tiling and swizzle of a [rows, cols] shared-memory tile that wgmma and TMA use: rows of
  min(128, cols · itemsize) bytes swizzled (64 bytes for head_dim 32 in 2 bytes), in tiles of
  8 rows."""
  swizzle = min(128, cols * itemsize)
  return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


INTERPRET_CTAS = 2  # the persistent forward's CTAs in interpret mode
HOPPER_SMS = 132  # an H100 SXM's or H200's SMs: lowering for CUDA off a GPU (tests, ptxas)


def on_gpu_by_default(value: bool | None, interpret: bool) -> bool:
  """A `MosaicGPUOptions` field that None turns on for a GPU and off in interpret mode (where
  the tests run each way on purpose): `pingpong`, `delta_in_dq`."""
  return (not interpret) if value is None else value


def persistent_ctas(interpret: bool) -> int:
  """CTAs the persistent forward launches (`MosaicGPUOptions.persistent`): one per SM of the
  first GPU (its `core_count`), `HOPPER_SMS` where JAX has no GPU (lowering for CUDA on a
  CPU), `INTERPRET_CTAS` in interpret mode, so that the tests' small inputs give each CTA
  several work items."""
  if interpret:
    return INTERPRET_CTAS
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  return int(gpus[0].core_count) if gpus else HOPPER_SMS


def resolve_persistent(cfg, head_dim: int, stages: int, out_dtype):
  """cfg with `MosaicGPUOptions.persistent` resolved for the forward (`persistent_fits`: two
  Q tiles, O's own buffer and the ring, `smem_bytes`)."""
  block_k, keys = int(cfg.blocks.block_k), step_keys(cfg)
  wide = " and wide_step (128 keys a slot)" if keys != block_k else ""
  on = persistent_fits(
    cfg.mgpu.persistent,
    "persistent",
    cfg.interpret,
    smem_bytes(head_dim, keys, stages, out_dtype, True),
    f"head_dim={head_dim}, block_k={block_k}{wide} with num_stages={stages}: two Q tiles, O's "
    "own buffer and the ring",
  )
  return dataclasses.replace(cfg, mgpu=dataclasses.replace(cfg.mgpu, persistent=on))


def persistent_fits(
  chosen, name: str, interpret: bool, need: int, layout: str, limit: int | None = None
) -> bool:
  """Whether a Mosaic GPU kernel runs persistent, `chosen` being the `MosaicGPUOptions` field
  `name` (persistent, persistent_bwd) and its persistent layout needing `need` bytes of shared
  memory of the kernel's `limit` (None: the forward's `SMEM_BYTES`; the backward's its own): as set
  where True or False, True refused (ValueError, one line naming `layout`, what needs the
  room) where need exceeds limit; None: on for a GPU wherever it fits, off in interpret
  mode."""
  limit = SMEM_BYTES if limit is None else limit
  if chosen and need > limit:
    raise ValueError(
      f"MosaicGPUOptions({name}=True) at {layout} need {need / 1024:.1f} KiB of shared "
      f"memory, more than {limit / 1024:.0f} KiB"
    )
  if chosen is not None:
    return bool(chosen)
  return need <= limit and not interpret


def work_items(grid: dict, names, persistent: bool, steps, body):
  """Runs body(at, base, n) for each work item of this CTA: `at` the item's index along each
  axis of `grid` (a dict by name), n the CTA's count of items before it and base the ring's
  count of tiles before it (steps(at): the tiles an item passes through the CTA's ring; every
  item's pass through the same ring, in order). A CTA per item (the grid's axes, `launch`),
  or (persistent) one CTA an SM with the items in `names`' order (outermost first) dealt
  round-robin (`plgpu.nd_loop` over axis "sm"). Returns (the ring's count after the last item,
  the number of items), int32: what the producer's final waits need."""
  one = jnp.int32(1)
  if not persistent:
    at = {name: lax.axis_index(name) for name in names}
    zero = jnp.int32(0)
    body(at, zero, zero)
    return steps(at), one

  @plgpu.nd_loop(
    tuple(grid[n] for n in names), collective_axes="sm", init_carry=(jnp.int32(0),) * 2
  )
  def ends(info, carry):
    ring, count = carry
    at = dict(zip(names, info.index))
    body(at, ring, info.local_index)
    return ring + steps(at), count + one

  return ends


def cta_item(grid: dict, names, n):
  """A persistent CTA's work item n (its count of items before it, `work_items`' n): (`at`,
  whether the item exists), in `plgpu.nd_loop`'s order: the items of `grid` in `names`' order
  (outermost first) dealt round-robin over axis "sm", this CTA's n-th at flat index
  n·CTAs + its index. What a producer needs to load an item's tiles one item early."""
  flat = n * lax.axis_size("sm") + lax.axis_index("sm")
  exists = flat < math.prod(grid[name] for name in names)
  at = {}
  for name in reversed(names):
    at[name] = lax.rem(flat, jnp.int32(grid[name]))
    flat = lax.div(flat, jnp.int32(grid[name]))
  return at, exists


def load_own_tiles(m, copy, slots: int, item_free):
  """A persistent producer's copies of work item m's own tiles (copy(slot): the forward's Q,
  the dQ kernel's Q, dO, rows and O, dK/dV's K and V) into slot m mod `slots`, once item
  m − slots has released it (`item_free`)."""
  slot = slot_of(m, slots)
  pl.when(m >= slots)(lambda: plgpu.barrier_wait(item_free.at[slot]))
  copy(slot)


def after_first_tiles(j, n_steps, stages: int, after_fill) -> None:
  """In a producer's loop over an item's ring tiles, at tile j: after_fill() (if not None)
  once the ring's first min(stages, n_steps) tiles are issued (`own_tiles_and_ring`)."""
  if after_fill is not None:
    pl.when(j == jnp.minimum(n_steps, stages) - 1)(after_fill)


def own_tiles_and_ring(n, n_steps, current, own, item_tiles, ring) -> None:
  """A persistent producer's part of its work item n: the item's own tiles and its ring tiles.
  current(slot) copies this item's own tiles, own(at, slot) those of a `cta_item` item;
  item_tiles = (grid, names, slots, their free barrier, `MosaicGPUOptions.items_early`);
  ring(after_fill) issues the item's n_steps ring tiles, calling `after_first_tiles` at each.
  items_early off: this item's own tiles (`load_own_tiles`), then its ring. On: the first
  item's before its ring, and the next item's (this CTA's item n + 1, where it has one) once
  this item's first ring tiles are issued, at the end for an item of no steps: during this
  item, whose start (forward: the item before's last QKᵀ; backward: its stores done) is where
  the compute warpgroups release that slot, a whole item ahead of where they wait for them,
  not after the item before's last key tiles."""
  grid, names, slots, item_free, early = item_tiles
  # early, item n + 1's tiles wait for item n − 1's release: with one slot they would wait
  # for item n's own, which comes after n + 1's tiles are needed
  assert slots >= 2 or not early, slots
  if not early:
    load_own_tiles(n, current, slots, item_free)
    ring(None)
    return
  pl.when(n == 0)(lambda: load_own_tiles(n, current, slots, item_free))

  def next_own():
    at_next, exists = cta_item(grid, names, n + 1)
    copy = functools.partial(own, at_next)
    pl.when(exists)(lambda: load_own_tiles(n + 1, copy, slots, item_free))

  ring(next_own)
  pl.when(n_steps == 0)(next_own)


def slot_of(t, slots: int):
  """t mod slots (int32) for a count t ≥ 0 (a ring's tile, an item's), computed unsigned: the
  signed remainder's fix-up for a negative t cost 18 SASS instructions a step in the
  persistent dQ kernel's loop, where t = the ring's base + j is not known to be ≥ 0 (ptxas,
  experiment 20, 16 × 1024 × 12 × d64 causal: 337 against 319)."""
  return lax.rem(t.astype(jnp.uint32), jnp.uint32(slots)).astype(jnp.int32)


def last_waits(end, slots, *barriers):
  """A producer's final waits: the last `slots` uses of its barriers (of `end` uses, use t in
  slot t mod slots), each use's barriers in turn, so that every warpgroup observes every
  phase (the interpreter checks it at deallocation)."""

  @pl.loop(jnp.maximum(end - slots, 0), end)
  def _(t):
    slot = slot_of(t, slots)
    for barrier in barriers:
      plgpu.barrier_wait(barrier.at[slot])


def launch(grid: dict, names, persistent: bool, interpret: bool) -> dict:
  """`plgpu.kernel`'s grid arguments for `work_items`: a CTA per item of `grid` in `names`'
  order (outermost first), or (persistent) `persistent_ctas` CTAs on axis "sm", fewer where
  there are fewer items."""
  if persistent:
    return dict(
      grid=(min(math.prod(grid.values()), persistent_ctas(interpret)),), grid_names=("sm",)
    )
  return dict(grid=tuple(grid[name] for name in names), grid_names=tuple(names))


def step_keys(cfg) -> int:
  """Keys one step of the forward's loop covers (a ring slot's K and V tiles, the QKᵀ wgmma's
  N): block_k, or two tiles of it with `MosaicGPUOptions.wide_step`."""
  return int(cfg.blocks.block_k) * (2 if cfg.mgpu.wide_step else 1)


def wide_step_refusal(*, numerics: str, block_k: int, head_dim: int, dtype, stages: int):
  """Why `MosaicGPUOptions.wide_step` cannot run a call (None when it can): block_k 64 only
  (the numerics' tile, two of them a step), and a tile of 128 keys within `supported`'s
  limits (at head_dim 256 the 64 × 128 float32 scores exceed a thread's registers; the ring's
  slots of 128 keys in shared memory). Arguments as `supported`'s; head_dim the padded one."""
  if block_k != 64:
    return (
      f"MosaicGPUOptions(wide_step=True) with block_k={block_k}: two 64-key tiles a step, "
      "block_k 64 only"
    )
  why = supported(
    numerics=numerics, block_k=2 * block_k, head_dim=head_dim, dtype=dtype, num_stages=stages
  )
  return None if why is None else f"MosaicGPUOptions(wide_step=True) runs 128 keys a step: {why}"


def resolve_wide_step(
  options: MosaicGPUOptions,
  *,
  numerics: str,
  block_k: int,
  head_dim: int,
  dtype,
  stages: int,
  kv_len: int,
  out_dtype,
  interpret: bool,
) -> MosaicGPUOptions:
  """`options` with wide_step a bool. True: checked (ValueError with `wide_step_refusal`'s
  line). None (the default): on for a GPU wherever it runs (block_k 64, head_dim up to 128,
  its slots in shared memory, overlap off) and does not cost the persistent forward — unless
  persistent is False, not where the 64-key step's persistent layout fits and the wide step's
  does not (fp32_out's float32 O at head_dim 128; 3 K/V slots there): neither pairing is
  timed, and persistent=True must not be refused for an option the caller did not set —;
  off in interpret mode (as pingpong and persistent: the tests run each schedule on purpose)
  and elsewhere. Arguments as `wide_step_refusal`'s, head_dim the padded one; kv_len and
  out_dtype (the output's dtype, float32 for fp32_out) for each step's slots in flight
  (`slots_in_flight`) and O's buffer (`smem_bytes`)."""
  if options.wide_step is False:
    return options
  why = wide_step_refusal(
    numerics=numerics, block_k=block_k, head_dim=head_dim, dtype=dtype, stages=stages
  )
  if options.wide_step:
    if why is not None:
      raise ValueError(why)
    return options
  if why is not None or options.overlap or interpret:
    return dataclasses.replace(options, wide_step=False)
  if options.persistent is not False:  # the persistent layout: the 64-key step's, then ours

    def fits(keys):
      slots = slots_in_flight(kv_len, keys, stages)
      return smem_bytes(head_dim, keys, slots, out_dtype, persistent=True) <= SMEM_BYTES

    if fits(block_k) and not fits(2 * block_k):
      return dataclasses.replace(options, wide_step=False)
  return dataclasses.replace(options, wide_step=True)


def key_tiles(cfg) -> tuple[int, int]:
  """(the forward's loop steps, its key/value slots in flight): a step covers `step_keys`
  keys; steps of padding only are skipped (`slots_in_flight`)."""
  keys = step_keys(cfg)
  return -(-cfg.kv_len // keys), slots_in_flight(cfg.kv_len, keys, cfg.num_stages)


def slots_in_flight(kv_len: int, keys: int, stages: int) -> int:
  """The forward's key/value slots in flight for kv_len keys in loop steps of `keys`: `stages`
  (`KernelConfig.num_stages`), but no more than there are steps."""
  return int(min(stages, -(-kv_len // keys)))


def finish_stores():
  """A CTA's last TMA stores (shared → global memory): waits until they have read shared
  memory (`cp.async.bulk.wait_group.read 0`), not until their writes land, which they do by
  the kernel's end (CUTLASS's Hopper epilogues and JAX's own Mosaic GPU kernels end the same
  way). Waiting for the writes too cost the CTA an L1 invalidation after a global write's
  latency (`CCTL.IVALL`: 2.4–3.4% of the forward's, dQ's and dK/dV's stall samples at
  gpt2-small's attention, Nsight Compute, H100, 2026-12-06). No value changes."""
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def smem_bytes(head_dim: int, block_k: int, stages: int, out_dtype, persistent=False) -> int:
  """Shared memory the kernel allocates on a GPU: Q (reused for a 2-byte O), a ring of
  `stages` K and V tiles, a float32 O for fp32_out, and the rows' m and log(l); persistent
  (`MosaicGPUOptions.persistent`): two Q tiles and O in a buffer of its own; each buffer
  counted as Mosaic GPU allocates it, in whole KiB (`SMEM_ALIGNMENT`: m's and log l's 512
  bytes take 1 KiB each), so that `SMEM_BYTES` bounds what Mosaic GPU's own check at lowering
  sees, less the barriers. (Interpret mode adds a P̄ tile for the P̄V product's operand; it
  has no limit.)"""
  q = k = v = 2
  itemsize = jnp.dtype(out_dtype).itemsize
  o = itemsize * COMPUTE_WGS * ROWS_PER_WG * head_dim if itemsize == 4 or persistent else 0
  row = -(-4 * COMPUTE_WGS * ROWS_PER_WG // SMEM_ALIGNMENT) * SMEM_ALIGNMENT  # m, log l
  return (
    (2 if persistent else 1) * COMPUTE_WGS * ROWS_PER_WG * head_dim * q
    + stages * block_k * head_dim * (k + v)
    + o
    + 2 * row
  )


HEAD_DIMS = (32, 64, 128, 256)  # padded head_dim: head_dim 17–256


def supported(
  *,
  numerics: str,
  block_k=None,
  head_dim=None,
  dtype=None,
  return_stats=False,
  num_stages=None,
  delta_float32=False,
  sum_rounded_p=False,
) -> str | None:
  """Why the Mosaic GPU forward cannot run a call (None when it can, or when the arguments left
  None could still make it); head_dim is the padded one. Limits:
  - head_dim 32, 64, 128 or 256 after padding (head_dim 17–256): the P̄V wgmma's N is
    head_dim (a multiple of 8 up to 256) and the QKᵀ wgmma's K steps by 16; below 32 a row of
    Q, K or V is under the 64 bytes of the narrowest swizzle we use, and a padded 16 would
    buy nothing over 32 but another layout;
  - block_k 64 or 128 (the numerics' tile; wgmma's N of QKᵀ), and 64 at head_dim 256: the
    registers of a compute warpgroup's thread hold the 64×head_dim float32 O accumulator
    (head_dim / 2 registers), the 64×block_k float32 scores (block_k / 2) and P̄ in 16 bits
    (block_k / 4): 128 + 64 + 32 at head_dim 256 and block_k 128, with m, l and addresses
    beyond the 232 a thread is given (`set_max_registers`);
  - shared memory bounds block_k × stages (`smem_bytes`; fp32_out's float32 O at head_dim 256
    does not fit);
  - it writes out and the rows' m and log(l) only (no statistics, no float32 O beside a
    rounded one);
  - its row sum adds the float32 P̄ (no sum_rounded_p)."""
  if numerics not in NUMERICS:
    return f"numerics={numerics!r} (the Mosaic GPU forward has {', '.join(NUMERICS)})"
  if delta_float32:
    return "delta_float32=True (the Mosaic GPU forward writes no float32 O for delta)"
  if sum_rounded_p:
    return "sum_rounded_p=True (the Mosaic GPU forward's row sum adds the float32 P̄)"
  if return_stats:
    return "return_stats=True (the Mosaic GPU forward writes out, m and log(l) only)"
  if block_k is not None and block_k not in MOSAIC_GPU_BLOCK_K:
    return f"block_k={block_k} (the Mosaic GPU forward needs block_k 64 or 128)"
  if dtype is not None and jnp.dtype(dtype) not in (
    jnp.dtype(jnp.bfloat16),
    jnp.dtype(jnp.float16),
  ):
    return f"dtype={jnp.dtype(dtype)} (the Mosaic GPU forward needs bfloat16 or float16)"
  if head_dim is not None and head_dim not in HEAD_DIMS:
    return (
      f"head_dim={head_dim} after padding (the Mosaic GPU forward needs 32, 64, 128 or "
      "256: head_dim 17–256)"
    )
  if head_dim == 256 and block_k is not None and block_k > 64:
    return (
      f"block_k={block_k} at head_dim=256 (registers: the 64×256 float32 accumulator "
      "and a 64×128 score tile exceed a thread's 232; block_k 64 at head_dim 256)"
    )
  if num_stages is not None and not (
    isinstance(num_stages, (int, np.integer))
    and not isinstance(num_stages, bool)
    and 1 <= num_stages <= 8
  ):
    return f"num_stages={num_stages!r} (key/value tiles in flight: an int from 1 to 8)"
  out_dtype = jnp.float32 if numerics == "fp32_out" else dtype
  if None not in (head_dim, block_k, dtype):  # no num_stages would do: name the cause
    least = smem_bytes(head_dim, block_k, 1, out_dtype)
    if least > SMEM_BYTES:
      return (
        f"numerics={numerics!r} at head_dim={head_dim} (its float32 O and one key/value tile "
        f"need {least / 1024:.1f} KiB of shared memory, more than {SMEM_BYTES / 1024:.0f} KiB)"
      )
  if None not in (head_dim, block_k, num_stages, dtype):
    need = smem_bytes(head_dim, block_k, num_stages, out_dtype)
    if need > SMEM_BYTES:
      return (
        f"block_k={block_k} with num_stages={num_stages} at head_dim={head_dim}: "
        f"{need / 1024:.1f} KiB of shared memory, more than {SMEM_BYTES / 1024:.0f} KiB"
      )
  return None


def scale_in_exp2_refusal(softmax_scale: float, compensation) -> str | None:
  """Why `MosaicGPUOptions.scale_in_exp2` cannot run a call (None when it can): exp2's factor
  c·log₂e and each nonzero threshold of the compensation over c (`Compensation.unscaled`)
  must be normal float32 numbers; past that the factor overflows (α = 2^(0·inf) is NaN) or
  a threshold turns inf (every masked key a tie) or is flushed to 0 on the GPU. The default
  order has no such limit. softmax_scale: the checked one (a normal float32 > 0)."""
  values = {"softmax_scale·log₂e": softmax_scale * LOG2E}
  if compensation is not None:
    for name in ("tie_tolerance", "min_shift", "max_shift", "shift_above"):
      if getattr(compensation, name):
        values[f"{name}/softmax_scale"] = getattr(compensation, name) / softmax_scale
  tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
  for name, value in values.items():
    if not tiny <= abs(value) <= big:
      return (
        f"softmax_scale={softmax_scale!r} with MosaicGPUOptions(scale_in_exp2=True): {name} = "
        f"{value:.3g} is not a normal float32 number"
      )
  return None


def exact_scale(softmax_scale: float) -> bool:
  """Whether softmax_scale is a power of two ≤ 1: multiplying or dividing by it (and by c·log₂e
  against log₂e) is exact in float32's normal range, so `scale_in_exp2`'s orders change no
  value (`resolve_scale_in_exp2`; the backward's `backward_mgpu.unscaled_scores`)."""
  c = float(softmax_scale)
  return c <= 1.0 and math.frexp(c)[0] == 0.5  # (a negative c or 0: mantissa ≠ 0.5)


def resolve_scale_in_exp2(options: MosaicGPUOptions, softmax_scale: float, compensation):
  """`options` with scale_in_exp2 a bool. True: checked (ValueError with
  `scale_in_exp2_refusal`'s line). None: True exactly where it changes no value — exp2 on,
  softmax_scale a power of two ≤ 1 (so QKᵀ·c, each threshold over c and m·c are exact, and
  (QKᵀ − m)·(c·log₂e) is the default order's (fl(QKᵀ·c) − m·c)·log₂e rounded once: the same exp2 argument
  for scores in float32's normal range; tests/test_mosaic_gpu.py checks the bits at
  head_dim 64 and 256) and nothing refused — else False. Not above 1: there QKᵀ·c can
  overflow where QKᵀ does not, and the two orders' log l then differ (NaN against −inf, a
  review's probe at c = 2)."""
  if options.scale_in_exp2 is False:
    return options
  why = scale_in_exp2_refusal(softmax_scale, compensation)
  if options.scale_in_exp2:
    if why is not None:
      raise ValueError(why)
    return options
  exact = options.exp2 and why is None and exact_scale(softmax_scale)
  return dataclasses.replace(options, scale_in_exp2=bool(exact))


def rounded_scores(s, scale, interpret):
  """S = QKᵀ·c (`Numerics.scores` of fa2 and fp32_out) on a wgmma tile, rounded on its own:
  each product PTX `mul.rn.f32`, which is never contracted into the subtraction after it
  (NVPTX contracts `mul` + `sub` into an FMA even where the product has a second use), so
  S − m is exactly 0 at the row max: the forward's P̄ = 2^((S − m)·log₂e) is then 1 there at
  any logit, and the backward's `Numerics.probs` needs no select (`Numerics.max_gap`). The
  same values as the plain product, rounded once. In interpret mode the product passes an
  optimization barrier, which keeps XLA from contracting it (`MosaicGPUOptions.rounded_scores`)."""
  if interpret:
    return lax.optimization_barrier(s * scale)
  layout = plgpu.Layout.WGMMA
  out = plgpu.ShapeDtypeStruct(s.shape, jnp.float32, layout=layout)

  def body(_, x):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, vector
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    mul_rn = fa.FragmentedArray._lift_fast_instr("mul.rn.f32")
    c = arith.constant(ir.F32Type.get(), float(np.float32(scale)))
    return x._pointwise(lambda r: mul_rn(r, vector.broadcast(r.type, c)))

  return plgpu.inline_mgpu(arg_types=(layout,), return_type=out)(body)(s)


def on_hopper() -> bool:
  """Whether JAX's default device is a Hopper GPU (compute capability 9.0: wgmma is sm_90a
  only), the device `check_device` requires outside interpret mode."""
  dev = jax.devices()[0]
  return dev.platform == "gpu" and getattr(dev, "compute_capability", None) == "9.0"


def check_device(cfg) -> None:
  """Raises ValueError unless the kernel can run: interpret mode, or a Hopper GPU (wgmma is
  sm_90a only). Causal masks are refused on CUDA 12.8.0–12.9.0, whose ptxas miscompiles them
  (the guard of JAX's own `attention_mgpu`)."""
  if cfg.interpret:
    return
  dev = jax.devices()[0]
  cc = getattr(dev, "compute_capability", None)
  if dev.platform != "gpu" or cc != "9.0":
    raise ValueError(
      f"backend='mosaic_gpu' needs a Hopper GPU (compute capability 9.0) or "
      f"interpret=True; the default device is {dev.device_kind!r} "
      f"(compute capability {cc})"
    )
  if cfg.causal and (version := causal_miscompiled()) is not None:
    raise ValueError(
      f"backend='mosaic_gpu' with causal=True needs a CUDA runtime other than "
      f"12.8.0–12.9.0 (ptxas miscompiles it), got {version}"
    )


def causal_miscompiled() -> int | None:
  """The CUDA runtime version when it is one whose ptxas miscompiles causal masks
  (12.8.0–12.9.0, per JAX's own `attention_mgpu`), else None."""
  from jax._src.lib import cuda_versions

  version = cuda_versions.cuda_runtime_get_version() if cuda_versions else None
  return version if version is not None and 12080 <= version < 12091 else None


def rescaled(alpha, acc):
  """α·acc inside a Mosaic GPU kernel (alpha [rows] in the WGMMA row layout, acc [rows, n]
  float32 in the WGMMA layout), the products skipped by each warp whose rows all have α = 1
  (`MosaicGPUOptions.unit_alpha`): the same values as the plain product, in which 1·x = x."""
  row, tile = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA
  out = plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout=tile)
  return plgpu.inline_mgpu(arg_types=(row, tile), return_type=out)(_rescaled)(alpha, acc)


def _rescaled(_, alpha, acc):
  """`rescaled` on Mosaic GPU FragmentedArrays: this thread's rows' α compared with 1, the
  warp's vote (`vote.sync.all`), and α·acc (FragmentedArray's products, as the kernel's) in
  the branch taken where some row of the warp has α ≠ 1."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, nvvm, scf, vector
  from jax.experimental.mosaic.gpu import fragmented_array as fa

  f32, i1, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
  one = arith.constant(f32, 1.0)
  unit = arith.constant(i1, 1)
  for reg in alpha.registers.flat:
    for i in range(ir.VectorType(reg.type).shape[0]):
      x = vector.extract(reg, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
      unit = arith.andi(unit, arith.cmpf(arith.CmpFPredicate.OEQ, x, one))
  warp_unit = nvvm.vote_sync(arith.constant(i32, -1), unit, "all")
  regs = list(acc.registers.flat)
  branch = scf.IfOp(warp_unit, [r.type for r in regs], has_else=True)
  with ir.InsertionPoint(branch.then_block):
    scf.yield_(regs)
  with ir.InsertionPoint(branch.else_block):
    product = alpha.broadcast_in_dim(acc.shape, (0,), acc.layout) * acc
    scf.yield_(list(product.registers.flat))
  registers = np.array(list(branch.results), dtype=object).reshape(acc.registers.shape)
  return fa.FragmentedArray(_registers=registers, _layout=acc.layout, _is_signed=None)


def visited_key_tiles(row_end, n_tiles, keys, causal):
  """Key tiles of `keys` keys each (block_k; the forward's steps: `step_keys`) that a block of
  rows ending before row_end visits (causal: none past it)."""
  if not causal:
    return jnp.int32(n_tiles)
  return jnp.minimum(jnp.int32(n_tiles), pl.cdiv(row_end, jnp.int32(keys)))


def query_grid(cfg) -> tuple[str, str, str]:
  """The forward's grid axes' names, outermost first (a CTA per batch, head and query tile):
  the query tiles innermost where `MosaicGPUOptions.q_tiles_inner` resolves on (None: without
  causal), else outermost."""
  inner = cfg.mgpu.q_tiles_inner
  if inner is None:
    inner = not cfg.causal
  return ("batch", "heads", "q_tiles") if inner else ("q_tiles", "batch", "heads")


def query_tile(cfg, n_q_tiles, index=None):
  """The query tile of a CTA of a grid with axis "q_tiles" (n_q_tiles of them), or of work
  item `index` along that axis (the persistent forward's): the index, or with causal and
  `MosaicGPUOptions.longest_first` the last first, so that the tiles that visit the most key
  tiles start first (the forward's and the backward's dQ kernel's grids)."""
  q_tile = lax.axis_index("q_tiles") if index is None else index
  if cfg.causal and cfg.mgpu.longest_first:
    q_tile = n_q_tiles - 1 - q_tile
  return q_tile


def _forward_kernel(
  q_ref, k_ref, v_ref, o_ref, m_ref, log_l_ref, scoped, *, cfg, n_kv, group, stages, grid
):
  numerics, comp, block_k = cfg.numerics, cfg.compensation, int(cfg.blocks.block_k)
  keys = step_keys(cfg)  # a step's keys: one slot, one QKᵀ wgmma (`MosaicGPUOptions.wide_step`)
  halves = keys // block_k  # the numerics' tiles of a step, each its own softmax and P̄V
  (q_smem3, k_smem, v_smem, o_smem2, m_smem2, log_l_smem2, p_smem2), barriers = scoped
  k_ready, v_ready, q_ready, k_free, v_free, q_free, turn = barriers
  q_slots = q_smem3.shape[0]  # Q tiles in flight: 2 persistent (the next item's loads early)
  opts = cfg.mgpu
  pingpong = on_gpu_by_default(opts.pingpong, cfg.interpret)
  assert not numerics.paper, "the Mosaic GPU forward skips the paper layout's rounding hooks"
  # (the interpreter cannot run a wgmma into an initialised accumulator: fused_pv is GPU-only)
  early_turn, fused_pv = pingpong and opts.early_turn, opts.fused_pv and not cfg.interpret
  top2_ties = cfg.tie_method == "top2"
  # scale_in_exp2: the loop runs on the unscaled QKᵀ, the scale enters exp2's multiply
  exp_scale = cfg.softmax_scale if opts.scale_in_exp2 else 1.0
  exact_gap = opts.scale_in_exp2 or opts.rounded_scores  # S − m needs no select (`max_gap`)
  if opts.scale_in_exp2 and comp is not None:
    comp = comp.unscaled(cfg.softmax_scale)

  def rendezvous():  # both compute warpgroups arrive, then go on
    plgpu.barrier_arrive(turn)
    plgpu.barrier_wait(turn)

  wg = lax.axis_index("wg")
  cta_rows = COMPUTE_WGS * ROWS_PER_WG
  key_steps = lambda row_end: visited_key_tiles(row_end, n_kv, keys, cfg.causal)
  item_steps = lambda q_tile: key_steps((q_tile + 1) * cta_rows)  # a work item's steps

  def items(body):
    """Runs body(batch, head, q_tile, base, n) for each work item (a batch, head and query
    tile of 128 rows) of this CTA, in `query_grid`'s order (`work_items`)."""
    q_tile = lambda at: query_tile(cfg, grid["q_tiles"], at["q_tiles"])  # noqa: E731

    def item(at, base, n):
      body(at["batch"], at["heads"], q_tile(at), base, n)

    return work_items(
      grid, query_grid(cfg), opts.persistent, lambda at: item_steps(q_tile(at)), item
    )

  def _compute_item(batch, head, q_tile, base, n, *, m_smem, log_l_smem, p_smem):
    """One work item of a compute warpgroup: its 64 query rows against the item's key
    tiles, O, m and log(l) written out."""
    q_slot = slot_of(n, q_slots)
    q_smem = q_smem3.at[q_slot, wg]
    # a 2-byte O reuses Q's buffer (dead once the last QK wgmma has been read), unless the
    # kernel is persistent: there the producer refills it with a later item's Q
    o_smem = q_smem if o_smem2 is None else o_smem2.at[wg]
    row0 = q_tile * cta_rows + wg * ROWS_PER_WG
    cta_steps = item_steps(q_tile)
    ring = lambda j: slot_of(base + j, stages)  # noqa: E731  (step j's slot)
    if not opts.persistent:  # a CTA of one item: each compute warpgroup loads its own Q
      rows = pl.ds(row0, ROWS_PER_WG)  # (`_load_item`)
      plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, head], q_smem, q_ready.at[q_slot])
    plgpu.barrier_wait(q_ready.at[q_slot])
    steps = key_steps(row0 + ROWS_PER_WG)
    # steps below `unmasked` have neither padded keys nor (causal) keys after any row
    unmasked = jnp.int32(cfg.kv_len // keys)
    if cfg.causal:
      unmasked = jnp.minimum(unmasked, lax.div(row0 + 1, jnp.int32(keys)))

    def wait_next_k(j):  # k_wait_in_pv: during step j's P̄V, the keys of step j + 1
      # the condition and the slot computed here, outside any run_state: a constant closed over
      # by run_state (the non-causal `steps`, a Python int) comes out of its Mosaic GPU lowering
      # as a numpy value, not an ir.Value, and fails (jax 0.11.2; seen on the H200, 2026-12-03)
      more, slot = j + 1 < steps, ring(j + 1)

      def wait():
        pl.when(more)(lambda: plgpu.barrier_wait(k_ready.at[slot]))

      return wait

    def scores(s_tile):  # the QKᵀ accumulator, scaled (`Numerics.scores`) unless scale_in_exp2
      if opts.scale_in_exp2:
        return s_tile
      if opts.rounded_scores:  # S − m exactly 0 at the max: P̄ = 1 there (`rounded_scores`)
        return rounded_scores(s_tile, cfg.softmax_scale, cfg.interpret)
      return numerics.scores(s_tile, cfg.softmax_scale)

    def issue_qk(s_ref, slot):  # the QKᵀ wgmma of the keys in `slot`
      plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].transpose((1, 0)))

    def read_scores(slot, turn_at_issue=False):  # QKᵀ alone, waited for and scaled
      def qk(s_ref):
        issue_qk(s_ref, slot)
        if turn_at_issue:
          rendezvous()
        return s_ref[...]

      return scores(pl.run_scoped(qk, plgpu.ACC((ROWS_PER_WG, keys), jnp.float32)))

    def softmax(j, s, m_i, l_i, masked):
      """Key tile j's online softmax from its scores (block_k keys: a step's, or with
      wide_step a half's): (m, l, α, P̄ as the P̄V wgmma takes it)."""
      if masked:
        shape = (ROWS_PER_WG, block_k)
        q_pos = row0 + plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
        k_pos = j * block_k + plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
        # padded keys only where kv_len is not a multiple of a step's keys (the loop's steps
        # end at kv_len otherwise: a compare and a select a score fewer in the causal diagonal
        # tiles)
        keep = k_pos < cfg.kv_len if cfg.kv_len % keys else None
        if cfg.causal:
          causal = q_pos >= k_pos
          keep = causal if keep is None else jnp.logical_and(keep, causal)
        if keep is not None:
          s = jnp.where(keep, s, numerics.mask_value)  # −inf; key 0 is visible to every row
      # the tie rule from the row's top-2 (`lane_top2`: register slices, then shuffles carrying
      # both values), from 8-column groups' (tie_lanes off) or by counting (tie_method "count",
      # a second reduction over the tile): the same decisions
      lanes = row_top2 if cfg.interpret else lane_top2  # the same values
      top2 = (lanes if opts.tie_lanes else column_top2) if top2_ties else None
      m_tile, _ = compensated_tile_max(s, comp, top2=top2)
      m_new = jnp.maximum(m_i, m_tile)
      alpha = numerics.rescale(m_i, m_new, opts.exp2, exp_scale)  # 1 while the max stays, 0 first
      m_b = lax.broadcast_in_dim(m_new, s.shape, [0])
      p = numerics.exp_scores(s, m_b, opts.exp2, exp_scale, exact_gap)  # P̄, f32
      l_new = numerics.state(alpha * l_i + numerics.clamp_sum(jnp.sum(p, axis=1)))  # from f32 P̄
      return m_new, l_new, alpha, numerics.round_p(p, q_smem.dtype)

    def scaled(alpha, acc):  # α·acc (fused_pv: before the P̄V wgmma adds to it)
      if opts.unit_alpha and not cfg.interpret:  # skipped where α = 1 on a warp's rows
        return numerics.state(rescaled(alpha, acc))
      return numerics.state(lax.broadcast_in_dim(alpha, acc.shape, [0]) * acc)

    def pv_wait(slot):  # V in its slot and the turn taken (the other warpgroup's products too)
      plgpu.barrier_wait(v_ready.at[slot])
      if pingpong:
        plgpu.barrier_wait(turn)

    def pv_operand(p_in):  # P̄ as the P̄V wgmma reads it
      if p_smem is None:
        return p_in
      p_smem[...] = p_in  # interpret mode: wgmma's A operand from shared memory
      plgpu.commit_smem()
      return p_smem

    def add_pv(acc, alpha, pv):  # P̄V from its own accumulator: α·acc + P̄V (Triton's order)
      return numerics.state(scaled(alpha, acc) + numerics.pv(pv))

    def pv_step(acc, tiles, slot, wait_k=lambda: None):
      """The P̄V products of a step whose softmax is done: tiles [(α, P̄)], one per block_k
      keys of the slot's V (two with wide_step), in order, each as a step of block_k keys
      would: fused_pv, into acc (the first tile's α·acc already taken, a later one's after
      the product before it is done); else in its own accumulator, then α·acc + P̄V (the
      Triton kernel's order)."""
      pv_wait(slot)
      for h, (alpha, p_in) in enumerate(tiles):
        v_tile = v_smem.at[slot] if halves == 1 else v_smem.at[slot, pl.ds(h * block_k, block_k)]
        p_op = pv_operand(p_in)
        last = h == len(tiles) - 1

        def product(acc_ref, p_op=p_op, v_tile=v_tile, last=last):
          plgpu.wgmma(acc_ref, p_op, v_tile)
          if last:
            wait_k()

        if fused_pv:
          if h:
            acc = scaled(alpha, acc)
          acc = pl.run_state(product)(plgpu.ACC.init(acc))
        else:

          def pv(acc_ref, product=product):
            product(acc_ref)
            return acc_ref[...]

          acc = add_pv(acc, alpha, pl.run_scoped(pv, plgpu.ACC(acc.shape, jnp.float32)))
      plgpu.barrier_arrive(v_free.at[slot])
      return acc

    def hand_over(values):  # the softmax done: give the turn (ping-pong)
      if pingpong and opts.opt_barrier:  # the softmax's values complete before the arrive
        values = lax.optimization_barrier(values)
      if pingpong:
        plgpu.barrier_arrive(turn)  # softmax done ...
      return values

    def step(j, carry, masked):
      acc, m_i, l_i = carry
      slot = ring(j)
      wait_k = wait_next_k(j) if opts.k_wait_in_pv else (lambda: None)
      if not opts.k_wait_in_pv:
        plgpu.barrier_wait(k_ready.at[slot])

      s = read_scores(slot, early_turn)
      plgpu.barrier_arrive(k_free.at[slot])
      if pingpong and not early_turn:  # the other warpgroup's products run during this softmax
        rendezvous()
      alphas, ps = [], []
      for h in range(halves):  # the step's key tiles of the numerics, one after the other
        s_h = s if halves == 1 else s[:, h * block_k : (h + 1) * block_k]
        m_i, l_i, alpha, p_in = softmax(j * halves + h, s_h, m_i, l_i, masked)
        alphas.append(alpha)
        ps.append(p_in)
      if fused_pv:
        acc = scaled(alphas[0], acc)
      acc, m_i, l_i, ps, later = hand_over((acc, m_i, l_i, ps, alphas[1:]))
      acc = pv_step(acc, list(zip(alphas[:1] + later, ps)), slot, wait_k)
      return acc, m_i, l_i

    def overlapped_step(j, carry, masked):
      """P̄V of step j beside QKᵀ and the softmax of step j + 1 (`MosaicGPUOptions.overlap`):
      carry (acc, m, l, α, P̄) with step j's softmax done (fused_pv: acc already α·acc)."""
      acc, m_i, l_i, alpha, p_in = carry
      slot, nxt = ring(j), ring(j + 1)
      plgpu.barrier_wait(k_ready.at[nxt])
      pv_wait(slot)
      p_op = pv_operand(p_in)

      def products_then_softmax(s_ref, o_ref):
        issue_qk(s_ref, nxt)
        plgpu.wgmma(o_ref, p_op, v_smem.at[slot])
        s = scores(plgpu.wgmma_accumulator_load(s_ref, wait_n=1))  # P̄V still in flight
        plgpu.barrier_arrive(k_free.at[nxt])
        if pingpong:
          rendezvous()
        return hand_over(softmax(j + 1, s, m_i, l_i, masked))  # the turn given, P̄V running

      if fused_pv:  # the softmax leaves the accumulators' scope through refs of its own

        def fused(refs):
          s_ref, o_ref, *out_refs = refs
          for ref, value in zip(out_refs, products_then_softmax(s_ref, o_ref)):
            ref[...] = value

        zeros = plgpu.layout_cast(
          jnp.zeros((ROWS_PER_WG, block_k), jnp.float32), plgpu.Layout.WGMMA
        )
        _, acc, *nxt_softmax = pl.run_state(fused)(
          (plgpu.ACC.init(zeros), plgpu.ACC.init(acc), m_i, l_i, alpha, p_in)
        )
        plgpu.barrier_arrive(v_free.at[slot])
        m_new, l_new, alpha_new, p_new = nxt_softmax
        acc = scaled(alpha_new, acc)
      else:

        def unfused(s_ref, o_ref):
          return products_then_softmax(s_ref, o_ref), o_ref[...]

        (m_new, l_new, alpha_new, p_new), pv = pl.run_scoped(
          unfused,
          plgpu.ACC((ROWS_PER_WG, block_k), jnp.float32),
          plgpu.ACC(acc.shape, jnp.float32),
        )
        plgpu.barrier_arrive(v_free.at[slot])
        acc = add_pv(acc, alpha, pv)
      return acc, m_new, l_new, alpha_new, p_new

    d = q_smem.shape[-1]
    row = plgpu.Layout.WGMMA.reduce(1)
    init = (
      plgpu.layout_cast(jnp.zeros((ROWS_PER_WG, d), jnp.float32), plgpu.Layout.WGMMA),
      plgpu.layout_cast(jnp.full((ROWS_PER_WG,), -jnp.inf, jnp.float32), row),
      plgpu.layout_cast(jnp.zeros((ROWS_PER_WG,), jnp.float32), row),
    )
    mid = jnp.minimum(unmasked, steps)
    if pingpong:  # warpgroup 1 starts one turn behind
      pl.when(wg == 1)(rendezvous)
    if opts.overlap:  # step 0's scores and softmax, then P̄V(j) beside softmax(j + 1)
      plgpu.barrier_wait(k_ready.at[ring(0)])
      s = read_scores(ring(0))
      plgpu.barrier_arrive(k_free.at[ring(0)])
      if pingpong:
        rendezvous()
      # masked whether or not tile 0 needs it: the mask keeps a tile without masked keys whole
      m_i, l_i, alpha, p_in = hand_over(softmax(jnp.int32(0), s, init[1], init[2], True))
      acc = scaled(alpha, init[0]) if fused_pv else init[0]
      # step j + 1's softmax unmasked while j + 1 < mid, masked from there on
      split = jnp.maximum(mid, 1) - 1
      carry = lax.fori_loop(
        0, split, lambda j, c: overlapped_step(j, c, False), (acc, m_i, l_i, alpha, p_in)
      )
      acc, m_i, l_i, alpha, p_in = lax.fori_loop(
        split, steps - 1, lambda j, c: overlapped_step(j, c, True), carry
      )
      acc = pv_step(acc, [(alpha, p_in)], ring(steps - 1))
    else:
      if opts.k_wait_in_pv:  # the first step's keys; each later one's during the P̄V before it
        wait_next_k(jnp.int32(-1))()
      carry = lax.fori_loop(0, mid, lambda j, c: step(j, c, False), init)
      acc, m_i, l_i = lax.fori_loop(mid, steps, lambda j, c: step(j, c, True), carry)

    @pl.loop(steps, cta_steps)  # causal: free the slots the other warpgroup still reads
    def _drain(j):
      # a step's barriers in a step's order (every warpgroup sees every phase): with one
      # slot, waiting for V before the turns would wait on the other warpgroup's v_free,
      # which it gives only after this warpgroup's turn (a hang at num_stages=1)
      slot = ring(j)
      plgpu.barrier_wait(k_ready.at[slot])
      plgpu.barrier_arrive(k_free.at[slot])
      if pingpong:  # the first of the two turns of a step the other warpgroup still takes
        rendezvous()
        plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(v_ready.at[slot])
      if pingpong:  # ... and the second
        plgpu.barrier_wait(turn)
      plgpu.barrier_arrive(v_free.at[slot])

    plgpu.barrier_arrive(q_free.at[q_slot])  # the last QKᵀ read: Q's slot may be refilled
    if pingpong:  # warpgroup 0 ends one turn later, evening the count
      pl.when(wg == 0)(rendezvous)
    o = acc / lax.broadcast_in_dim(l_i, acc.shape, [0])  # final rescale once (FA2 §3.1.1)
    # the previous item's stores have read O's and the rows' buffers (none before the first)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    o_smem[...] = numerics.round_out(o, q_smem.dtype)
    # m (in S's units: scale_in_exp2 ran on the unscaled QKᵀ) and log(l) apart, natural log
    # (`Numerics.probs`)
    m_smem[...] = m_i * exp_scale if opts.scale_in_exp2 else m_i
    log_l_smem[...] = jnp.log(l_i)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[batch, pl.ds(row0, ROWS_PER_WG), head])
    rows_out = (batch, head, pl.ds(row0, ROWS_PER_WG))
    plgpu.copy_smem_to_gmem(m_smem, m_ref.at[rows_out])
    plgpu.copy_smem_to_gmem(log_l_smem, log_l_ref.at[rows_out])

  @pl.when(wg < COMPUTE_WGS)
  def _compute():
    plgpu.set_max_registers(232, action="increase")
    m_smem, log_l_smem = m_smem2.at[wg], log_l_smem2.at[wg]
    p_smem = None if p_smem2 is None else p_smem2.at[wg]
    items(functools.partial(_compute_item, m_smem=m_smem, log_l_smem=log_l_smem, p_smem=p_smem))
    finish_stores()

  def _load_item(batch, head, q_tile, base, n):
    """The producer's part of a work item: its key and value tiles into the ring; persistent,
    its Q tile (both warpgroups' rows) into Q's slot once the item q_slots before has freed it
    (`own_tiles_and_ring`: before the ring, or with `MosaicGPUOptions.items_early` one item
    early).
    A CTA of one item has its compute warpgroups load their Q themselves, as before the
    persistent kernel: with Q loaded here and no final wait for the Q releases
    (`_memory`'s `last_waits` on q_free, added later), ptxas (CUDA 13.0) addressed every barrier of the
    compute loop from ordinary registers and put each wait's retry inline, a NANOSLEEP after
    the first failed try (15–21 inline sleeps against 1; 453 SASS a key tile against 441),
    the likely cause of the 10% that forward lost (H100, 2026-12-06: 1.35–1.39 ms at b4 ×
    4096 × 16 × d128 against 1.25 ms before; not yet timed with the fix). Either change alone
    restores the uniform form (experiment 20): a fragile choice of ptxas's, which
    tests/test_bench.py checks where .venv-ptxas is set up."""

    def copy_q(b, h, tile, slot):  # an item's Q tile, both warpgroups' rows, into `slot`
      for w in range(COMPUTE_WGS):
        rows = pl.ds(tile * cta_rows + w * ROWS_PER_WG, ROWS_PER_WG)
        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem3.at[slot, w], q_ready.at[slot])

    def own(at, slot):  # `cta_item`'s item: its query tile mapped as `items` maps it
      copy_q(at["batch"], at["heads"], query_tile(cfg, grid["q_tiles"], at["q_tiles"]), slot)

    n_steps = item_steps(q_tile)
    kv_head = lax.div(head, jnp.int32(group))

    def ring(after_fill):
      @pl.loop(0, n_steps)
      def _load(j):
        t = base + j  # the ring's count of tiles
        slot = slot_of(t, stages)
        kv_rows = (batch, pl.ds(j * keys, keys), kv_head)

        @pl.when(t >= stages)  # the slot's previous tile must be consumed first
        def _():
          plgpu.barrier_wait(k_free.at[slot])

        plgpu.copy_gmem_to_smem(k_ref.at[kv_rows], k_smem.at[slot], k_ready.at[slot])

        @pl.when(t >= stages)
        def _():
          plgpu.barrier_wait(v_free.at[slot])

        plgpu.copy_gmem_to_smem(v_ref.at[kv_rows], v_smem.at[slot], v_ready.at[slot])
        after_first_tiles(j, n_steps, stages, after_fill)

    if not opts.persistent:  # the compute warpgroups load their own Q
      ring(None)
      return
    current = functools.partial(copy_q, batch, head, q_tile)
    item_tiles = (grid, query_grid(cfg), q_slots, q_free, opts.items_early)
    own_tiles_and_ring(n, n_steps, current, own, item_tiles, ring)

  @pl.when(wg == COMPUTE_WGS)
  def _memory():
    plgpu.set_max_registers(40, action="decrease")
    end, count = items(_load_item)

    last_waits(count, q_slots, q_free)  # the last Q tiles' release
    last_waits(end, stages, k_free, v_free)  # the last tiles' consumption


def flash_forward_mgpu(q, k, v, cfg):
  """Runs the Mosaic GPU forward on padded [batch, len, heads, head_dim] arrays.

  Same contract as `pallas_kernels.forward.flash_forward` without statistics and the float32
  O: returns (out [batch, q_len_p, heads, d] in the layout's output dtype, row_max and
  log(row_sum) [batch, heads, q_len_p] float32 natural log, (), None). q_len_p is padded here to a multiple of 128 and sliced back.
  On CPU (cfg.interpret) it runs in Pallas' GPU interpret mode (slow; small shapes only).
  `pallas_kernels.attention.kernel_config` has checked the call against `supported`.
  """
  batch, q_len_p, num_heads, d = q.shape
  kv_len_p, num_kv_heads = k.shape[1], k.shape[2]
  block_k = int(cfg.blocks.block_k)
  if kv_len_p % block_k:
    raise ValueError(f"padded kv length {kv_len_p} is not a multiple of block_k={block_k}")
  keys = step_keys(cfg)  # wide_step: slots of 2·block_k keys, the last one's padding masked
  k, v = (pad_axis(x, 1, -(-kv_len_p // keys) * keys) for x in (k, v))
  if cfg.mgpu.scale_in_exp2 is None:  # a config not made by `kernel_config`: resolved here
    mgpu = resolve_scale_in_exp2(cfg.mgpu, cfg.softmax_scale, cfg.compensation)
    cfg = dataclasses.replace(cfg, mgpu=mgpu)
  cta_rows = COMPUTE_WGS * ROWS_PER_WG
  rows = -(-q_len_p // cta_rows) * cta_rows
  q = pad_axis(q, 1, rows)
  n_kv, stages = key_tiles(cfg)
  swizzled = smem_transforms(d, 2)  # Q, K, V: rows of head_dim 2-byte elements
  out_dtype = jnp.dtype(cfg.numerics.output_dtype(q.dtype))
  grid = dict(batch=batch, heads=num_heads, q_tiles=rows // cta_rows)  # the work items

  cfg = resolve_persistent(cfg, d, stages, out_dtype)  # ValueError: persistent does not fit
  persistent = cfg.mgpu.persistent
  q_slots = 2 if persistent else 1

  def entry(q_ref, k_ref, v_ref, o_ref, m_ref, log_l_ref):
    smem = (
      plgpu.SMEM((q_slots, COMPUTE_WGS, ROWS_PER_WG, d), q.dtype, transforms=swizzled),
      plgpu.SMEM((stages, keys, d), k.dtype, transforms=swizzled),
      plgpu.SMEM((stages, keys, d), v.dtype, transforms=swizzled),
      None  # a 2-byte O goes out through Q's buffer, unless persistent
      if out_dtype.itemsize == 2 and not persistent
      else plgpu.SMEM(
        (COMPUTE_WGS, ROWS_PER_WG, d),
        out_dtype,
        transforms=smem_transforms(d, out_dtype.itemsize),
      ),
      plgpu.SMEM((COMPUTE_WGS, ROWS_PER_WG), jnp.float32),
      plgpu.SMEM((COMPUTE_WGS, ROWS_PER_WG), jnp.float32),
      # P̄ for the P̄V wgmma: a register operand on the GPU; the interpreter's wgmma reads
      # both operands from shared memory (same values, one more copy)
      plgpu.SMEM(
        (COMPUTE_WGS, ROWS_PER_WG, block_k), q.dtype, transforms=smem_transforms(block_k, 2)
      )
      if cfg.interpret
      else None,
    )
    ready = plgpu.Barrier(num_barriers=stages)
    free = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages)
    per_slot = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=q_slots)  # a copy or
    pl.run_scoped(  # an arrival per warpgroup
      lambda *scoped: _forward_kernel(
        q_ref,
        k_ref,
        v_ref,
        o_ref,
        m_ref,
        log_l_ref,
        (scoped[0], scoped[1:]),
        cfg=cfg,
        n_kv=n_kv,
        group=num_heads // num_kv_heads,
        stages=stages,
        grid=grid,
      ),
      smem,
      ready,
      ready,
      per_slot,  # Q's: ready ...
      free,
      free,
      per_slot,  # ... and free
      plgpu.Barrier(num_arrivals=COMPUTE_WGS),  # the ping-pong's turn
      collective_axes="wg",
    )

  interpret = None
  if cfg.interpret:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    interpret = InterpretGPUParams()
  launch_args = launch(grid, query_grid(cfg), persistent, cfg.interpret)  # `items`
  row = jax.ShapeDtypeStruct((batch, num_heads, rows), jnp.float32)
  out, m, log_l = plgpu.kernel(
    entry,
    out_type=(jax.ShapeDtypeStruct(q.shape[:3] + (d,), out_dtype), row, row),
    **launch_args,
    num_threads=COMPUTE_WGS + 1,
    thread_name="wg",
    compiler_params=plgpu.CompilerParams(
      approx_math=True, reduction_scratch_bytes=REDUCTION_SCRATCH_BYTES
    ),
    interpret=interpret,
  )(q, k, v)
  return out[:, :q_len_p], m[:, :, :q_len_p], log_l[:, :, :q_len_p], (), None
