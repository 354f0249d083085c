"""backend="mosaic_gpu" (the Hopper kernels, `pallas_kernels.forward_mgpu` and
`backward_mgpu`), run on CPU in Pallas' GPU interpret mode (which simulates their warpgroups,
TMA copies and barriers): against FP64, against the Triton kernels they must match, and their
refusals."""

import dataclasses
import itertools
import re
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.forward_mgpu as fm
from jax_flashstable import flash_attention, reference_attention, resolved_backend
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.lab.accuracy import TENSORS, bf16_ulp, compare, ulp_at_scale
from jax_flashstable.lab.shapes import Shape, make_inputs


def _skip_if_causal_refused(causal):
  """On a GPU with CUDA 12.8.0–12.9.0 the kernel refuses causal masks (`check_device`)."""
  if causal and jax.default_backend() == "gpu" and (version := fm.causal_miscompiled()):
    pytest.skip(f"causal refused on CUDA runtime {version}")


def _tied(shape, dtype, seed):
  """Inputs on a coarse grid, so that many rows have tied maxima within a key tile."""
  q, k, v, do = make_inputs(shape, dtype, seed)
  return (jnp.round(q * 2) / 2).astype(dtype), (jnp.round(k * 2) / 2).astype(dtype), v, do


# Interpret mode's cost is the simulated CTAs × key tiles × heads: each case is as small as
# what it checks allows (two query CTAs of 128 rows with the second partial, partial last key
# tiles, more key tiles than stages, q_len > kv_len under the causal mask).
_FORWARD_CASES = {
  "partial-tile": (Shape(2, 130, 140, 2, 2, 64), jnp.bfloat16, "fa2", {}),
  "mqa-causal-d128": (Shape(1, 150, 100, 2, 1, 128, causal=True), jnp.bfloat16, "fa2", {}),
  "gqa-causal": (Shape(1, 100, 100, 4, 2, 64, causal=True), jnp.bfloat16, "fa2", {}),  # 2 kv heads
  "f16-causal-3stages": (  # the second query CTA visits 4 key tiles: more than 3 stages
    Shape(1, 200, 200, 2, 1, 64, causal=True),
    jnp.float16,
    "fa2",
    dict(num_stages=3),
  ),
  "fp32_out-d96": (Shape(1, 90, 90, 2, 2, 96), jnp.bfloat16, "fp32_out", {}),  # padded to 128
  "short": (Shape(1, 40, 20, 2, 2, 64), jnp.bfloat16, "fa2", dict(num_stages=4)),  # < 64
  "block_k128-1stage": (
    Shape(1, 150, 260, 2, 1, 64, causal=True),
    jnp.bfloat16,
    "fa2",
    dict(block_k=128, num_stages=1),
  ),
}
# every case with the compensation; without it every case on a GPU, the two cheapest in
# interpret mode (the suite's time on a 2-core CPU)
_PLAIN_ON_CPU = ("fp32_out-d96", "short")


@pytest.mark.parametrize(
  "shape,dtype,numerics,extra,stabilize",
  [
    pytest.param(*case, stabilize, id=f"{'stable' if stabilize else 'plain'}-{name}")
    for stabilize in (False, True)
    for name, case in _FORWARD_CASES.items()
    if stabilize or jax.default_backend() == "gpu" or name in _PLAIN_ON_CPU
  ],
)
def test_mosaic_gpu_matches_triton_forward(shape, dtype, numerics, extra, stabilize):
  """The Triton kernel's rounding points, with float32 differences (exp2; on the GPU also
  fused_pv): the outputs agree to one ulp of the output dtype in interpret mode (the float32
  summation order of a row sum may differ by an FMA; two on the GPU, whose Mosaic exp/log are
  approximations), and so do the gradients (to one bf16 ulp at their scale: the Mosaic GPU
  backward from the Mosaic GPU forward's out, m and log l, the Triton one from Triton's).
  num_stages changes nothing but speed. The Mosaic GPU results also pass the FP64 rule
  (err ≤ 2·err(standard attention in the dtype) + 1 ulp + `sum_ulp`, `compare`) in every tensor."""
  _skip_if_causal_refused(shape.causal)
  q, k, v, do = _tied(shape, dtype, 3)
  assert resolved_backend(q, k, v, backend="mosaic_gpu", numerics=numerics) == (
    "mosaic_gpu",
    "mosaic_gpu",
  )
  turns = fm.MosaicGPUOptions(pingpong=True)  # eager calls: the GPU's schedule
  kw = dict(
    causal=shape.causal, stabilize=stabilize, numerics=numerics, block_k=extra.get("block_k")
  )
  ulps = 1 if jax.default_backend() == "cpu" else 2
  dtype_ulp = lambda b: (
    bf16_ulp(b)
    if dtype == jnp.bfloat16
    else np.spacing(np.abs(b).astype(np.float16)).astype(np.float64)
  )

  def run(backend, **more):
    out, vjp = jax.vjp(
      lambda q, k, v: flash_attention(q, k, v, backend=backend, **kw, **more), q, k, v
    )
    return (out,) + vjp(do.astype(out.dtype))

  mgpu, triton = (
    run("mosaic_gpu", num_stages=extra.get("num_stages"), mgpu_options=turns),
    run("triton"),
  )
  assert mgpu[0].dtype == triton[0].dtype and mgpu[0].shape == triton[0].shape
  for name, a, b in zip(TENSORS, mgpu, triton):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), name
    ulp = dtype_ulp(b)
    if name != "out":  # an ulp of O moves delta, so every gradient element: one ulp
      ulp = ulp_at_scale(b)  # at the tensor's scale (the bound the FP64 tests use per ulp)
    assert np.all(np.abs(a - b) <= ulps * ulp + 1e-12), (name, np.abs(a - b).max())
  c = compare(q, k, v, do, result=(mgpu[0], mgpu[1:]), **kw)
  assert all(c.passes().values()), {t: (c.flash[t], c.standard[t]) for t in TENSORS}
  if stabilize:  # the compensation fired: on tied rows the uncompensated output lies beyond
    # the tolerance above from the compensated one, so the Mosaic GPU output, within it, is
    # the compensated one (the plain output from Triton: an interpreted Mosaic GPU forward
    # costs 2–4 s a case on a 2-core CPU)
    plain = flash_attention(q, k, v, backend="triton", **dict(kw, stabilize=False))
    plain, out = np.asarray(plain, np.float64), np.asarray(triton[0], np.float64)
    gap = np.abs(plain - out)
    larger = np.maximum(np.abs(out), np.abs(plain))
    assert np.any(gap > 2 * ulps * dtype_ulp(larger) + 1e-12), gap.max()


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(numerics="paper"), "numerics='paper'"),
    (dict(return_stats=True), "return_stats"),
    (dict(block_k=32), "block_k=32"),
    (dict(block_k=256), "block_k=256"),
    (dict(num_stages=0), "num_stages=0"),
    (dict(num_stages=2.5), "num_stages=2.5"),
    (
      dict(block_k=128, num_stages=4),
      r"block_k=128 with num_stages=4 at head_dim=128: \d+\.\d KiB",
    ),
    (dict(backend="cuda"), "backend='cuda'"),
    (  # persistent: a second Q tile and O's own buffer do not fit beside this ring
      dict(
        kv_len=384, block_k=128, num_stages=3, mgpu_options=fm.MosaicGPUOptions(persistent=True)
      ),
      r"^MosaicGPUOptions\(persistent=True\) at head_dim=128, block_k=128 with num_stages=3: "
      r"two Q tiles, O's own buffer and the ring need 290\.0 KiB of shared memory, more than 226",
    ),
    (  # wide_step: two 64-key tiles of the numerics a step
      dict(block_k=128, mgpu_options=fm.MosaicGPUOptions(wide_step=True)),
      r"^MosaicGPUOptions\(wide_step=True\) with block_k=128: two 64-key tiles a step",
    ),
    (
      dict(num_stages=4, mgpu_options=fm.MosaicGPUOptions(wide_step=True)),
      r"^MosaicGPUOptions\(wide_step=True\) runs 128 keys a step: block_k=128 with "
      r"num_stages=4 at head_dim=128: 290\.0 KiB of shared memory, more than 226 KiB$",
    ),
    (
      dict(
        kv_len=384,
        num_stages=3,
        mgpu_options=fm.MosaicGPUOptions(wide_step=True, persistent=True),
      ),
      r"^MosaicGPUOptions\(persistent=True\) at head_dim=128, block_k=64 and wide_step \(128 "
      r"keys a slot\) with num_stages=3: two Q tiles, O's own buffer and the ring need 290\.0",
    ),
    (  # exp2's factor c·log₂e overflows float32
      dict(softmax_scale=3e38, mgpu_options=fm.MosaicGPUOptions(scale_in_exp2=True)),
      r"^softmax_scale=3e\+38 with MosaicGPUOptions\(scale_in_exp2=True\): softmax_scale·log₂e",
    ),
    (  # the compensation's max_shift / c overflows float32 (the default order takes both)
      dict(
        softmax_scale=5e-38, stabilize=True, mgpu_options=fm.MosaicGPUOptions(scale_in_exp2=True)
      ),
      r"^softmax_scale=5e-38 with .*: max_shift/softmax_scale = 4e\+38 is not a normal float32",
    ),
  ],
)
def test_mosaic_gpu_refusals_name_the_value(kwargs, match):
  kwargs = dict(kwargs)
  kv_len = kwargs.pop("kv_len", 256)  # 384: 3 steps of 128 keys, room for 3 slots
  q, k, v, _ = make_inputs(Shape(1, 256, kv_len, 1, 1, 128), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match=match):
    flash_attention(q, k, v, **{"backend": "mosaic_gpu", **kwargs})


def test_mosaic_gpu_refuses_small_head_dim_and_float32():
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 16), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match="head_dim=16 after padding"):
    flash_attention(q, k, v, backend="mosaic_gpu")
  q, k, v, _ = make_inputs(Shape(1, 256, 256, 1, 1, 192), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match=r"block_k=128 at head_dim=256 \(registers"):
    flash_attention(q, k, v, backend="mosaic_gpu", block_k=128)
  for stages in (None, 1):  # no num_stages fits fp32_out's float32 O at 256: named the cause
    with pytest.raises(ValueError, match=r"^[^\n]*numerics='fp32_out' at head_dim=256 .*KiB"):
      flash_attention(q, k, v, backend="mosaic_gpu", numerics="fp32_out", num_stages=stages)
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 64), jnp.float32, 0)
  with pytest.raises(ValueError, match="dtype=float32"):
    flash_attention(q, k, v, backend="mosaic_gpu")


def test_flax_attention_config_selects_the_mosaic_gpu_forward():
  _skip_if_causal_refused(True)
  q, k, v, _ = make_inputs(Shape(1, 70, 70, 4, 2, 64, causal=True), jnp.bfloat16, 4)
  cfg = AttentionConfig.parse("fa2+comp+mgpu")
  out = attend(q, k, v, cfg, causal=True)
  direct = flash_attention(q, k, v, causal=True, stabilize=True, backend="mosaic_gpu")
  assert np.array_equal(np.asarray(out), np.asarray(direct))
  gold = reference_attention(q, k, v, causal=True, dtype=jnp.float64)
  assert np.abs(np.asarray(out, np.float64) - gold).max() < 2e-2


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU has no Hopper to refuse")
def test_mosaic_gpu_without_interpret_needs_a_hopper_gpu():
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 64), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match="needs a Hopper GPU"):
    flash_attention(q, k, v, backend="mosaic_gpu", interpret=False)


@pytest.mark.parametrize(
  "change, causal",
  [
    (dict(pingpong=(False, True)), False),
    (dict(pingpong=(False, True)), True),
    (
      dict(longest_first=(False, True), opt_barrier=(False, True), k_wait_in_pv=(False, True)),
      True,
    ),
    (dict(num_stages=(2, 1)), True),
    (dict(k_wait_in_pv=(False, True)), False),
    (dict(overlap=(False, True)), False),
    (dict(overlap=(False, True), opt_barrier=(False, True)), True),
    (dict(overlap=(False, True), num_stages=(2, 1)), True),
    (dict(tie_lanes=(False, True)), False),
    (dict(tie_lanes=(False, True)), True),
    (dict(q_tiles_inner=(True, None)), True),
    (dict(persistent=(False, True)), False),
    (dict(persistent=(False, True)), True),
    (dict(persistent=(False, True), num_stages=(2, 1)), True),
    (dict(persistent=(False, True), num_stages=(3, 3)), True),
    (dict(persistent=(False, True), overlap=(False, True)), True),
    (dict(persistent=(False, True), items_early=(False, True)), False),
    (dict(persistent=(False, True), items_early=(False, True), num_stages=(2, 1)), True),
    (dict(persistent=(False, True), items_early=(False, True), ctas=2), True),
    (dict(wide_step=(False, True)), False),
    (dict(wide_step=(False, True)), True),
    (dict(wide_step=(False, True), num_stages=(2, 1)), True),
    (dict(wide_step=(False, True), persistent=(False, True)), True),
    (dict(unit_alpha=(False, True), wide_step=(False, True)), True),
  ],
  ids=[
    "pingpong-full",
    "pingpong-causal",
    "longest_first+opt_barrier+k_wait_in_pv-causal",
    "one-stage-causal",
    "k_wait_in_pv-full",
    "overlap-full",
    "overlap+opt_barrier-causal",
    "overlap-one-stage-causal",
    "tie_lanes-full",
    "tie_lanes-causal",
    "query_tiles_outermost-causal",
    "persistent-full",
    "persistent-causal",
    "persistent-one-stage-causal",
    "persistent-three-stages-causal",
    "persistent+overlap-causal",
    "persistent+items_early-full",
    "persistent+items_early-one-stage-causal",
    "persistent+items_early-causal-2-ctas",
    "wide_step-full",
    "wide_step-causal",
    "wide_step-one-stage-causal",
    "wide_step+persistent-causal",
    "unit_alpha+wide_step-causal",
  ],
)
def test_mosaic_gpu_schedules_are_the_same_function(change, causal, monkeypatch):
  """The ping-pong schedule orders the warpgroups, longest_first the causal query tiles,
  opt_barrier the compiler's placement of the softmax, k_wait_in_pv where the next key tile
  is waited for and num_stages how many key/value tiles are in flight, not the arithmetic:
  with or without them the output is bit-identical (interpret mode, whose barriers hang or
  fail on a wait without its arrival; on the GPU the same instructions run). The shape has two
  query tiles of 128 rows, the second partial (longest_first swaps a 2-tile and a 1-tile row
  of the causal grid), and four 64-key tiles through the ring, the last partly padding; causal
  rows of the first tile stop early and drain the rest, which with one slot hung before
  2026-12-03 (the drain waited for V before the turns; found by a review). `overlap` runs its
  unfused order here (the interpreter cannot run a wgmma into an initialised accumulator):
  its fused path, and any arrival that comes too early (a race the interpreter's synchronous
  wgmmas cannot show), only the GPU checks; that the overlapped loop ran at all, its read of
  the scores with one wgmma left in flight says. `tie_lanes` (the compensation's top-2 finished
  across lanes) decides the same ties as the 8-column groups: the inputs tie in most tiles; on
  the GPU its shuffles run (`top2.lane_top2`), in interpret mode `row_top2`. `q_tiles_inner`
  None (the default) puts a causal grid's query tiles outermost (`forward_mgpu.query_grid`):
  the grid's order, not its work; that the grid changed, the traced program says.
  `persistent` runs the four work items (2 heads × 2 query tiles, of 4 and 2 key tiles under
  causal) in one CTA (`persistent_ctas` set to 1, on the GPU too; `ctas` 2 in one case): the ring's position and
  the ping-pong's turns carry on from one item to the next (with 3 slots an item starts at a
  slot other than 0), Q's two slots alternate and are refilled after their `q_free` (items 2
  and 3), O's stores are waited for before the next item's, and the last Q tiles' releases
  are waited for at the end (the interpreter checks every phase was observed); one slot and
  the overlapped loop too; with `items_early` each next item's Q copied during the item
  before (`forward_mgpu.own_tiles_and_ring`), in one CTA and in two (`ctas`: each CTA's
  next item is every other one, `forward_mgpu.cta_item`)."""
  _skip_if_causal_refused(causal)
  on_gpu = jax.default_backend() == "gpu"
  q, k, v, _ = _tied(Shape(1, 150, 200, 2, 1, 64, causal=causal), jnp.bfloat16, 5)
  change = dict(change)
  ctas = change.pop("ctas", 1)
  if "persistent" in change:  # every work item in one CTA (or `ctas`)
    monkeypatch.setattr(fm, "persistent_ctas", lambda interpret: ctas)

  def attend(which):
    chosen = {name: values[which] for name, values in change.items()}
    stages = chosen.pop("num_stages", None)
    options = fm.MosaicGPUOptions(**({"pingpong": True} | chosen))
    return lambda q: flash_attention(
      q,
      k,
      v,
      causal=causal,
      stabilize=True,
      backend="mosaic_gpu",
      num_stages=stages,
      mgpu_options=options,
    )

  assert np.array_equal(np.asarray(attend(0)(q)), np.asarray(attend(1)(q)))
  if "overlap" in change:  # the overlapped loop: S read with the P̄V wgmma in flight
    traced = [str(jax.make_jaxpr(attend(which))(q)).count("wait_n=1") for which in (0, 1)]
    assert traced[0] == 0 and traced[1] > 0, traced
  if {"q_tiles_inner", "persistent"} & set(change):  # another grid reaches the kernel
    traced = [str(jax.make_jaxpr(attend(which))(q)) for which in (0, 1)]
    assert traced[0] != traced[1]
  if on_gpu and "tie_lanes" in change:  # its inline block ran (the shuffles, not row_top2)
    traced = [str(jax.make_jaxpr(attend(which))(q)).count("_merge_lanes") for which in (0, 1)]
    assert traced[0] == 0 and traced[1] > 0, traced


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the limit is a GPU's shared memory")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mosaic_gpu_forward_at_the_shared_memory_limit_is_the_same_function(causal):
  """The forward's layouts that fill `SMEM_BYTES` exactly (226 KiB at head_dim 128, persistent
  by default there since the forward reserves no reduction scratch: block_k 128 with 2 K/V
  tiles in flight, block_k 64 with 4, the wide step with 2 slots of 128 keys; and a CTA an
  item with 3 and 6) give out, m and log l bit for bit as the one-tile, non-persistent forward
  of the same block_k, the compensation on inputs with tied maxima."""
  from pallas_kernels import attention
  from pallas_kernels.forward_mgpu import flash_forward_mgpu
  from pallas_kernels.policy import Compensation, get_numerics

  _skip_if_causal_refused(causal)
  length, d = 1024, 128
  q, k, v, _ = _tied(Shape(1, length, length, 4, 4, d, causal=causal), jnp.bfloat16, 5)

  def forward(block_k, stages, **options):
    cfg = attention.kernel_config(
      q_len=length,
      kv_len=length,
      head_dim=d,
      dtype=jnp.bfloat16,
      softmax_scale=d**-0.5,
      causal=causal,
      numerics=get_numerics("fa2"),
      compensation=Compensation(),
      interpret=False,
      backend="mosaic_gpu",
      block_k=block_k,
      num_stages=stages,
      mgpu_options=fm.MosaicGPUOptions(**options),
    )
    slots = fm.key_tiles(cfg)[1]
    persistent = fm.resolve_persistent(cfg, d, slots, jnp.bfloat16).mgpu.persistent
    keys = fm.step_keys(cfg)
    need = fm.smem_bytes(d, keys, slots, jnp.bfloat16, persistent)
    return [np.asarray(x) for x in flash_forward_mgpu(q, k, v, cfg)[:3]], persistent, need

  base = {bk: forward(bk, 1, persistent=False, wide_step=False)[0] for bk in (64, 128)}
  for block_k, stages, options, persistent in [
    (128, 2, {}, True),
    (64, 4, {}, True),
    (64, 2, dict(wide_step=True), True),
    (128, 3, dict(persistent=False), False),
    (64, 6, dict(persistent=False), False),
  ]:
    got, on, need = forward(block_k, stages, **options)
    assert on is persistent and need <= fm.SMEM_BYTES, (block_k, stages, options, need)
    for a, b in zip(got, base[block_k]):
      np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize(
  "q_len, kv_len, causal, stabilize",
  [
    (150, 150, False, True),
    (70, 192, False, True),
    (200, 200, True, True),
    (130, 260, True, False),
  ],
  ids=["full-odd-tiles", "full-half-of-padding", "causal", "causal-plain-q<kv"],
)
def test_mosaic_gpu_wide_step_is_the_same_function(q_len, kv_len, causal, stabilize):
  """`MosaicGPUOptions.wide_step` (a step of 128 keys: one K/V slot, one 64 × 128 QKᵀ, then
  the softmax and P̄V of each 64-key half) gives the default's out and m bit for bit, and log l
  on the GPU (interpret mode: within 2 float32 ulps; XLA's CPU exp2 of the same arguments
  can differ by an ulp between the two programs, which the bf16 P̄ of out hides and l's
  float32 sum shows; exp2=False there gives the same bits), the compensation on inputs with
  tied maxima in most tiles: at kv_len 150 (three 64-key tiles: the second step's second
  half is padding only, an exact no-op that the 64-key loop skips), 192 (the same with a
  partial first half: the padded keys masked though kv_len is a multiple of 64), causal (the
  first warpgroup's rows 0–63 meet keys 64–127, all after them, in the first step) and causal
  with more keys than queries; that the wide step ran, the traced program's 64 × 128 score
  tile and the steps (`key_tiles`: 128 keys each) say. On the GPU the same checks the
  128-wide wgmma's sums (fused_pv and ping-pong on both sides there)."""
  from pallas_kernels import attention
  from pallas_kernels.forward_mgpu import flash_forward_mgpu
  from pallas_kernels.policy import Compensation, get_numerics

  _skip_if_causal_refused(causal)
  shape = Shape(1, q_len, kv_len, 2, 1, 64, causal=causal)
  q, k, v, _ = _tied(shape, jnp.bfloat16, 4)

  def forward(wide_step):
    cfg = attention.kernel_config(
      q_len=q_len,
      kv_len=kv_len,
      head_dim=64,
      dtype=jnp.bfloat16,
      softmax_scale=0.125,
      causal=causal,
      numerics=get_numerics("fa2"),
      compensation=Compensation() if stabilize else None,
      interpret=jax.default_backend() != "gpu",
      backend="mosaic_gpu",
      mgpu_options=fm.MosaicGPUOptions(pingpong=True, wide_step=wide_step),
    )
    pad = lambda x, n: attention.pad_axis(x, 1, -(-n // 64) * 64)  # noqa: E731 (the wrapper's)
    run = lambda q, k, v: flash_forward_mgpu(pad(q, q_len), pad(k, kv_len), pad(v, kv_len), cfg)
    traced = str(jax.make_jaxpr(run)(q, k, v))
    assert fm.key_tiles(cfg)[0] == -(-kv_len // (128 if wide_step else 64))
    return [np.asarray(x) for x in run(q, k, v)[:3]], traced

  (base, plain), (wide, traced) = forward(False), forward(True)
  for a, b in zip(wide[:2], base[:2]):  # out, m
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
  if jax.default_backend() == "gpu":
    np.testing.assert_array_equal(wide[2], base[2])
  else:
    np.testing.assert_array_max_ulp(wide[2], base[2], maxulp=2)
  assert "f32[64,128]" in traced and "f32[64,128]" not in plain
  if stabilize:  # the compensation fired somewhere, so its per-64-key rule was exercised
    s = np.einsum("bqhd,bkhd->bhqk", *(np.asarray(x, np.float32) for x in (q, k[:, :, [0, 0]])))
    s = np.float32(0.125) * s
    if causal:
      s = np.where(np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None], s, -np.inf)
    m = base[1][:, :, :q_len]
    assert np.any(m != s.max(-1)), "no row shifted: the inputs do not test the tie rule"


def test_mosaic_gpu_wide_step_refusals_name_the_value():
  """wide_step at head_dim 256 (registers) and with the overlapped loop: one-line errors."""
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 256), jnp.bfloat16, 0)
  why = (
    r"^MosaicGPUOptions\(wide_step=True\) runs 128 keys a step: block_k=128 at head_dim=256 \(reg"
  )
  with pytest.raises(ValueError, match=why):
    flash_attention(q, k, v, backend="mosaic_gpu", mgpu_options=fm.MosaicGPUOptions(wide_step=True))
  with pytest.raises(ValueError, match=r"overlap=True\) runs one 64-key tile a step"):
    fm.MosaicGPUOptions(overlap=True, wide_step=True)


def test_mosaic_gpu_jitted_forward_backward_matches_eager():
  """A jitted forward+backward (what `flashstable bench` and training run; the Mosaic GPU
  backward) finishes, equals the eager one, and a second run gives the same bits (no atomics:
  the backward is repeatable); block_k and num_stages may be NumPy integers."""
  q, k, v, do = make_inputs(Shape(1, 128, 128, 2, 2, 64), jnp.bfloat16, 6)
  f = lambda q, k, v: flash_attention(
    q, k, v, backend="mosaic_gpu", block_k=np.int32(64), num_stages=np.int64(2)
  )

  def fwd_bwd(q, k, v, do):
    out, vjp = jax.vjp(f, q, k, v)
    return (out,) + vjp(do)

  jitted = jax.jit(fwd_bwd)
  first, again = jitted(q, k, v, do), jitted(q, k, v, do)
  for a, b, c in zip(first, again, fwd_bwd(q, k, v, do)):
    a, b, c = (np.asarray(x).view(np.uint16) for x in (a, b, c))
    assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize(
  "head_dim, causal, overlap, scale",
  [(64, True, False, None), (64, False, True, None), (128, False, False, None)]
  + [(128, True, False, 0.5)],
  ids=["d64-causal", "d64-overlap", "d128", "d128-causal-scale0.5"],
)
def test_mosaic_gpu_scale_in_exp2_moves_only_float32_values(head_dim, causal, overlap, scale):
  """`MosaicGPUOptions.scale_in_exp2` (the max, the compensation and exp2's multiply on the unscaled
  QKᵀ) against the default, compensation on, on inputs with
  tied maxima in most tiles; with `overlap` on both sides its own loop's path. At head_dim 64
  the scale 1/8 is a power of two, so no product by it or by c·log₂e rounds differently and
  the forward's out, m and log l are the default's bit for bit, as at any power-of-two scale
  ≤ 1 (a given 0.5 at head_dim 128; `resolve_scale_in_exp2`) (fails if the scale is applied
  twice or not at all, to the scores, α or the written m, or max_shift is left in S's units:
  the shift's clip at 20 would bind at 2.5 of S; the other thresholds:
  `tests/test_compensation.py`). At head_dim 128 (c = 128^−½): out within one bf16 ulp of the
  default; m equal on rows the compensation left alone (the max of a monotone rounding is the
  rounding of the max) and elsewhere within two float32 ulps of the larger of the row's max
  and max_shift (the shift's threshold over c is rounded; where a negative max and the shift
  cancel, that error is all of a small m), log l within a few float32 ulps, and the FP64 rule
  holds for out and, through the backward, for every gradient."""
  from pallas_kernels import attention
  from pallas_kernels.forward_mgpu import flash_forward_mgpu
  from pallas_kernels.policy import Compensation, get_numerics

  _skip_if_causal_refused(causal)
  shape = Shape(1, 128, 192, 2, 1, head_dim, causal=causal)
  q, k, v, do = _tied(shape, jnp.bfloat16, 9)
  scale = head_dim**-0.5 if scale is None else scale

  def forward(scale_in_exp2):
    cfg = attention.kernel_config(
      q_len=shape.q_len,
      kv_len=shape.kv_len,
      head_dim=head_dim,
      dtype=jnp.bfloat16,
      softmax_scale=scale,
      causal=causal,
      numerics=get_numerics("fa2"),
      compensation=Compensation(),
      interpret=jax.default_backend() != "gpu",
      backend="mosaic_gpu",
      mgpu_options=fm.MosaicGPUOptions(pingpong=True, scale_in_exp2=scale_in_exp2, overlap=overlap),
    )
    return [np.asarray(x, np.float64) for x in flash_forward_mgpu(q, k, v, cfg)[:3]]

  (out0, m0, log_l0), (out, m, log_l) = forward(False), forward(True)
  s = np.einsum("bqhd,bkhd->bhqk", *(np.asarray(x, np.float32) for x in (q, k[:, :, [0, 0]])))
  s = (s * np.float32(scale)).astype(np.float32)
  if causal:
    s = np.where(np.arange(192)[None, :] <= np.arange(128)[:, None], s, -np.inf)
  shifted = m0 != s.max(-1)  # rows whose last max the compensation moved
  assert 0 < shifted.sum() < shifted.size, shifted.sum()
  if math.frexp(scale)[0] == 0.5:  # a power of two
    for a, b in ((out, out0), (m, m0), (log_l, log_l0)):
      np.testing.assert_array_equal(a, b)
    return
  assert np.all(np.abs(out - out0) <= bf16_ulp(out0)), np.abs(out - out0).max()
  np.testing.assert_array_equal(m[~shifted], m0[~shifted])
  scale_of_m = np.maximum(np.abs(s.max(-1)), Compensation().max_shift).astype(np.float32)
  assert np.all(np.abs(m - m0) <= 2 * np.spacing(scale_of_m)), np.abs(m - m0).max()
  assert np.all(np.abs(log_l - log_l0) <= 8 * np.spacing(np.abs(log_l0).astype(np.float32)) + 1e-7)
  kw = dict(causal=causal, stabilize=True, backend="mosaic_gpu")
  f = lambda q, k, v: flash_attention(
    q, k, v, **kw, mgpu_options=fm.MosaicGPUOptions(pingpong=True, scale_in_exp2=True)
  )
  result, vjp = jax.vjp(f, q, k, v)
  c = compare(
    q, k, v, do, result=(result, vjp(do.astype(result.dtype))), causal=causal, stabilize=True
  )
  assert all(c.passes().values()), {t: (c.flash[t], c.standard[t]) for t in TENSORS}


def test_mosaic_gpu_scale_in_exp2_by_default_only_where_it_changes_no_value():
  """`MosaicGPUOptions()` leaves scale_in_exp2 None and the config resolves it
  (`forward_mgpu.resolve_scale_in_exp2`): on for a power-of-two softmax_scale (head_dim 64's
  default 1/8, 256's 1/16, a given 0.5), where the test above finds the default's bits; off for
  128^−½, 0.1 and 2.0 (above 1), with exp2 off, and where `scale_in_exp2_refusal` would refuse (2^−126 with
  the compensation: max_shift over it is past float32); an explicit True there raises its
  line, an explicit False stays off."""
  from pallas_kernels import attention
  from pallas_kernels.policy import Compensation, get_numerics

  def resolved(head_dim, scale=None, comp=None, **options):
    cfg = attention.kernel_config(
      q_len=64,
      kv_len=64,
      head_dim=head_dim,
      dtype=jnp.bfloat16,
      softmax_scale=head_dim**-0.5 if scale is None else scale,
      causal=False,
      numerics=get_numerics("fa2"),
      compensation=comp,
      interpret=True,
      backend="mosaic_gpu",
      mgpu_options=fm.MosaicGPUOptions(**options),
    )
    return cfg.mgpu.scale_in_exp2

  assert fm.MosaicGPUOptions().scale_in_exp2 is None
  assert resolved(64) is True and resolved(256, comp=Compensation()) is True
  assert resolved(128, scale=0.5) is True and resolved(128, scale=2.0) is False  # (above 1:
  # QKᵀ·c can overflow where QKᵀ does not)
  assert resolved(128) is False and resolved(64, scale=0.1) is False
  assert resolved(64, exp2=False) is False and resolved(64, scale_in_exp2=False) is False
  assert resolved(64, scale=2.0**-126) is True  # no threshold to divide: nothing refused
  assert resolved(64, scale=2.0**-126, comp=Compensation()) is False
  with pytest.raises(ValueError, match=r"^softmax_scale=1.17\d*e-38 with .*max_shift/softmax"):
    resolved(64, scale=2.0**-126, comp=Compensation(), scale_in_exp2=True)


def _off_and_on(cfg, option):
  """cfg with the `MosaicGPUOptions` flag `option` off, and on."""
  return tuple(
    dataclasses.replace(cfg, mgpu=dataclasses.replace(cfg.mgpu, **{option: on}))
    for on in (False, True)
  )


def _assert_same_bits(ours, theirs, names=("dq", "dk", "dv")):
  """Each gradient of `ours` bit for bit that of `theirs` (float32 views; neither all zero)."""
  for name, a, b in zip(names, ours, theirs):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.abs(b).max() > 0 and np.array_equal(a, b), (name, np.abs(a - b).max())


def _residuals(shape, dtype, numerics="fa2", center_keys=False, seed=0):
  """Padded inputs, the Triton forward's out, m and log(l), and the config of a Mosaic GPU
  call: both backwards get the same residuals, so any difference is the backward's own."""
  from pallas_kernels import attention
  from pallas_kernels.forward import flash_forward
  from pallas_kernels.policy import get_numerics, pad_axis

  q, k, v, do = _tied(shape, dtype, seed)
  cfg = attention.kernel_config(
    q_len=shape.q_len,
    kv_len=shape.kv_len,
    head_dim=shape.head_dim,
    dtype=dtype,
    softmax_scale=shape.head_dim**-0.5,
    causal=shape.causal,
    numerics=get_numerics(numerics).with_options(center_keys=center_keys),
    compensation=None,
    interpret=jax.default_backend() != "gpu",
    backend="mosaic_gpu",
    group=shape.num_heads // shape.num_kv_heads,
  )
  assert cfg.backend_bwd == "mosaic_gpu"
  b = cfg.blocks
  lq = -(-shape.q_len // max(b.block_q, b.block_q_bwd)) * max(b.block_q, b.block_q_bwd)
  lk = -(-shape.kv_len // max(b.block_k, b.block_k_bwd)) * max(b.block_k, b.block_k_bwd)
  q, do = pad_axis(q, 1, lq), pad_axis(do, 1, lq)
  k, v = pad_axis(k, 1, lk), pad_axis(v, 1, lk)
  out, m, log_l, _, _ = flash_forward(q, k, v, dataclasses.replace(cfg, backend="triton"))
  return (q, k, v, out, m, log_l, do.astype(out.dtype)), cfg


@pytest.mark.parametrize(
  "shape,dtype,numerics,center_keys,lse",
  [
    # MQA; rows and keys 192–255 all padding: their warpgroups compute nothing (`_skip_steps`)
    (Shape(1, 150, 150, 2, 1, 64, causal=True), jnp.bfloat16, "fa2", False, True),
    (Shape(1, 200, 90, 2, 2, 128, causal=True), jnp.bfloat16, "fa2", False, False),  # q > kv
    (Shape(1, 70, 200, 2, 2, 64), jnp.float16, "fp32_out", True, False),  # q_len < kv_len
    (Shape(1, 150, 140, 2, 1, 256, causal=True), jnp.bfloat16, "fa2", False, True),  # parts
    (Shape(1, 90, 130, 2, 2, 256), jnp.float16, "fa2", False, False),  # fp32_out: no d256
  ],
  ids=[
    "mqa-causal-d64-lse",
    "causal-d128",
    "f16-fp32_out-center_keys",
    "mqa-causal-d256-lse",
    "f16-d256",
  ],
)
def test_mosaic_gpu_backward_matches_triton_backward(shape, dtype, numerics, center_keys, lse):
  """Given the same forward residuals, the Mosaic GPU backward's dQ, dK, dV are the Triton
  backward's. In interpret mode (the same rounding points, tiles of 64 and summation order) bit
  for bit on the CPU these tests were written on; on an AVX2 one (AMD EPYC, 2026-12-01)
  99.6–100% of entries are and the rest are one-ulp rounding flips of small entries (at most
  0.016 ulp of the input dtype at the tensor's scale: XLA's CPU code generation contracts
  float32 multiply-adds differently in the two interpreted programs, which moves an entry
  across a rounding boundary), so the CPU assertion is ≥ 99% identical and every entry within
  1/16 ulp at scale: an indexing or masking fault moves whole ulps at scale (dropping one
  query–key product moved dK by 1.7–113 ulps in a reviewer's trial). The Triton backward runs
  with the Mosaic GPU one's tiles of 64 (its default above head_dim 128 is 32, another
  summation order). At head_dim 256 the dK/dV kernel sums Sᵀ and dPᵀ over its two parts of 128
  columns, a float32 order of its own: a flipped rounding of P or dS there moves a dK or dV
  entry by up to a quarter ulp at scale (measured 2026-12-05, float16), so there they are held
  to half an ulp and ≥ 98% identical. On the GPU within 2 ulps of the input dtype at each
  tensor's scale (wgmma accumulation order, Mosaic's approximate exp). An lse cotangent enters
  both the same way."""
  _skip_if_causal_refused(shape.causal)
  from pallas_kernels.backward import flash_backward
  from pallas_kernels.backward_mgpu import flash_backward_mgpu

  args, cfg = _residuals(shape, dtype, numerics, center_keys)
  d_lse = jnp.asarray(np.random.default_rng(1).standard_normal(args[4].shape), jnp.float32) / 8
  tiles = dataclasses.replace(cfg.blocks, block_q_bwd=64, block_k_bwd=64)  # the Mosaic GPU's
  # the Triton backward with those tiles: 1 stage at 256 (as it passed on an H100, 2026-12-05)
  stages = 1 if shape.head_dim > 128 else 2
  triton = dataclasses.replace(
    cfg, backend="triton", backend_bwd="triton", blocks=tiles, num_stages_bwd=stages
  )
  for lse_cotangent in (None, d_lse) if lse else (None,):
    ours = flash_backward_mgpu(*args, cfg, lse_cotangent)
    theirs = flash_backward(*args, triton, lse_cotangent)
    _assert_triton_backward(ours, theirs, shape, dtype)


def _assert_triton_backward(ours, theirs, shape, dtype):
  """The Mosaic GPU backward's (dq, dk, dv) against the Triton backward's with the same tiles
  (`test_mosaic_gpu_backward_matches_triton_backward` says why these bounds)."""
  for name, a, b, n in zip(
    ("dq", "dk", "dv"), ours, theirs, (shape.q_len, shape.kv_len, shape.kv_len)
  ):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    # the real rows (padded query rows' dQ is cut off by the wrapper, not masked here)
    a, b = np.asarray(a[:, :n], np.float64), np.asarray(b[:, :n], np.float64)
    assert np.isfinite(a).all() and np.abs(b).max() > 0, name
    if jax.default_backend() == "cpu":  # bit for bit but for XLA's CPU code generation
      parts = shape.head_dim > 128 and name != "dq"  # dK, dV: Sᵀ summed over two parts
      assert np.mean(a == b) >= (0.98 if parts else 0.99), (name, np.mean(a == b))
      bound = ulp_at_scale(b, dtype=dtype) / (2 if parts else 16)
      assert np.abs(a - b).max() <= bound, (name, np.abs(a - b).max(), bound)
    else:
      bound = 2 * ulp_at_scale(b, dtype=dtype)
      assert np.abs(a - b).max() <= bound, (name, np.abs(a - b).max())


@pytest.mark.parametrize(
  "shape,dtype,numerics,center_keys",
  [
    (Shape(1, 150, 200, 2, 1, 64, causal=True), jnp.bfloat16, "fa2", False),  # GQA, masks
    (Shape(1, 70, 250, 2, 2, 128), jnp.float16, "fp32_out", True),  # padded keys
  ],
  ids=["gqa-causal-d64", "f16-fp32_out-center_keys-d128"],
)
def test_mosaic_gpu_backward_dq_key_tile_of_128_is_tritons_block_k_bwd_128(
  shape, dtype, numerics, center_keys
):
  """`KernelConfig.block_k_dq_mgpu=128` (the dQ kernel's key tile) is the Triton backward with
  block_k_bwd=128: dQ's float32 sums per 128 keys, within the bounds of
  `test_mosaic_gpu_backward_matches_triton_backward`; dK and dV (the other kernel) bit for bit
  as with the default tile. Its tiles in flight are `default_stages`' for that tile
  (stages_bwd_mgpu=None; with the centred keys at head_dim 128 dQ's ring holds 1 tile of 128
  where `kernel_config` set 2 for tiles of 64). A third value is refused in one line naming it."""
  _skip_if_causal_refused(shape.causal)
  from pallas_kernels.backward import flash_backward
  from pallas_kernels.backward_mgpu import flash_backward_mgpu

  args, cfg = _residuals(shape, dtype, numerics, center_keys)
  assert args[1].shape[1] % 128 == 0  # the Triton backward's key tiles cover the padded keys
  wide = dataclasses.replace(cfg, block_k_dq_mgpu=128, stages_bwd_mgpu=None)
  tiles = dataclasses.replace(cfg.blocks, block_q_bwd=64, block_k_bwd=128)
  triton = dataclasses.replace(
    cfg, backend="triton", backend_bwd="triton", blocks=tiles, num_stages_bwd=2
  )
  ours = flash_backward_mgpu(*args, wide)
  _assert_triton_backward(ours, flash_backward(*args, triton), shape, dtype)
  _assert_same_bits(ours[1:], flash_backward_mgpu(*args, cfg)[1:], names=("dk", "dv"))
  with pytest.raises(ValueError, match=r"^block_k_dq_mgpu=96: .*64 or 128$"):
    flash_backward_mgpu(*args, dataclasses.replace(cfg, block_k_dq_mgpu=96))


def test_mosaic_gpu_backward_longest_first_is_the_same_function():
  """`MosaicGPUOptions.longest_first` reverses the causal dQ kernel's query tiles (the last,
  which visits the most key tiles, first): dQ, dK and dV are bit-identical with and without it,
  and the option reaches the dQ kernel (its index arithmetic is in the traced program; a
  reversed row block paired with unreversed rows would move whole rows of dQ). Three query
  tiles of 128 rows, the last partial."""
  _skip_if_causal_refused(True)
  from pallas_kernels.backward_mgpu import flash_backward_mgpu
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  args, cfg = _residuals(Shape(1, 300, 300, 2, 1, 64, causal=True), jnp.bfloat16)
  plain, reversed_ = (
    dataclasses.replace(cfg, mgpu=MosaicGPUOptions(longest_first=on)) for on in (False, True)
  )
  texts = [
    str(jax.make_jaxpr(lambda *a, c=c: flash_backward_mgpu(*a, c))(*args))
    for c in (plain, reversed_)
  ]
  assert texts[0] != texts[1]
  _assert_same_bits(flash_backward_mgpu(*args, reversed_), flash_backward_mgpu(*args, plain))


@pytest.mark.parametrize(
  "shape,dtype,numerics,center_keys,persistent,lse_cotangent,o_by_tma,by_tma",
  [
    (Shape(1, 300, 200, 4, 2, 64, causal=True), jnp.bfloat16, "fa2", False, False, True, None, True),
    (Shape(1, 300, 200, 4, 2, 64, causal=True), jnp.bfloat16, "fa2", False, False, True, False, False),
    # float32 O at head_dim 128 beside the centred keys' ring: 225.5 KiB of 224, so from global
    # memory; at 64 without them by TMA
    (Shape(1, 200, 300, 2, 2, 128), jnp.float16, "fp32_out", True, False, False, None, False),
    (Shape(1, 200, 300, 2, 2, 64), jnp.float16, "fp32_out", False, False, False, None, True),
    (Shape(2, 130, 130, 2, 1, 32, causal=True), jnp.bfloat16, "fa2", False, True, False, None, True),
  ],
  ids=[
    "gqa-causal-d64-lse",
    "gqa-causal-d64-lse-o-from-global",
    "f16-fp32_out-center_keys-d128",
    "f16-fp32_out-d64",
    "mqa-causal-d32-persistent",
  ],
)  # fmt: skip
def test_mosaic_gpu_backward_delta_in_dq(
  shape, dtype, numerics, center_keys, persistent, lse_cotangent, o_by_tma, by_tma, monkeypatch
):
  """`MosaicGPUOptions.delta_in_dq`: the dQ kernel sums rowsum(dO∘O) from its dO tile and its
  rows of O (fp32_out: the float32 O), subtracts the lse cotangent (given here to one case, as
  a direct call can) and writes delta beside m and log l for the dK/dV kernel, which then runs
  after it: the rows it is given carry no delta, so gradients equal to XLA's delta's show dK/dV
  read the dQ kernel's (read as given, dK is off by 0.1–8). The kernel's float32 row sum runs
  in its own order: in interpret mode (XLA's CPU reduce of a [64, head_dim] tile) 99% of the
  gradients' entries are XLA's delta's bits and all within 1/16 ulp of the input dtype at
  their scale (every entry at head_dim 64 and 128); on the GPU within one ulp. O's rows by
  TMA with Q and dO (`o_by_tma`, the default where they fit: float32 O too) or from global
  memory (set off, or where they do not fit), the traced kernel's TMA copies showing which
  (O's one more traced in a CTA an item, two persistent). Odd lengths (a
  warpgroup of padding rows, a partial key tile), grouped heads, and the persistent dQ kernel
  with every item in one CTA (`persistent_ctas` set to 1: its items' rows in alternating
  slots), where interpret mode's race detector and its check that every copy out completed
  catch a slot reused before the previous item's rows have left it (TMA copies run at once in
  interpret mode, so the values alone cannot show it)."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  from pallas_kernels import backward_mgpu
  from pallas_kernels import forward_mgpu as fm
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  on_gpu = jax.default_backend() == "gpu"
  if persistent:
    monkeypatch.setattr(fm, "persistent_ctas", lambda interpret: 1)
    if not on_gpu:
      races = lambda cfg: InterpretGPUParams(detect_races=True) if cfg.interpret else None  # noqa: E731
      monkeypatch.setattr(backward_mgpu, "_interpret_params", races)
      interpret_pallas_call.reset_gpu_interpret_mode_state()

  _skip_if_causal_refused(shape.causal)
  args, cfg = _residuals(shape, dtype, numerics, center_keys)
  d_lse = None
  if lse_cotangent:
    rows = args[4].shape  # m's: [batch, heads, q_len_p]
    d_lse = jnp.asarray(np.random.default_rng(1).standard_normal(rows), jnp.float32)
  xla, in_dq = (
    dataclasses.replace(
      cfg, mgpu=MosaicGPUOptions(delta_in_dq=on, persistent_bwd=persistent, o_by_tma=o_by_tma)
    )
    for on in (False, True)
  )
  d = args[0].shape[-1]
  (_, stages), (_, persistent_dq) = backward_mgpu.launch_plan(
    in_dq, d, shape.num_heads // shape.num_kv_heads
  )
  assert backward_mgpu.resolve_o_by_tma(in_dq, d, stages, persistent_dq) is by_tma
  copies = [  # the dQ kernel's TMA copies in, traced: O's one more a warpgroup by TMA
    str(
      jax.make_jaxpr(lambda *a, c=c: backward_mgpu.flash_backward_mgpu(*a, c, d_lse))(*args)
    ).count("copy_gmem_to_smem")
    for c in (
      in_dq,
      dataclasses.replace(in_dq, mgpu=dataclasses.replace(in_dq.mgpu, o_by_tma=False)),
    )
  ]
  # (a CTA an item: each compute warpgroup copies its own rows, one O copy traced; persistent:
  # the producer copies each warpgroup's, two)
  assert copies[0] - copies[1] == (by_tma and (2 if persistent else 1)), copies
  got = backward_mgpu.flash_backward_mgpu(*args, in_dq, d_lse)
  if persistent and not on_gpu:
    assert not interpret_pallas_call.get_races().races_found
  want = backward_mgpu.flash_backward_mgpu(*args, xla, d_lse)
  for name, a, b in zip(("dq", "dk", "dv"), got, want):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ulp, err = ulp_at_scale(b, dtype=dtype), np.abs(a - b).max()
    if on_gpu:
      assert err <= ulp, (name, err)
    else:
      assert err <= ulp / 16 and np.mean(a == b) >= 0.99, (name, err, np.mean(a == b))


@pytest.mark.parametrize(
  "shape,numerics,center_keys,stages,ctas",
  [
    (Shape(1, 300, 200, 2, 1, 64, causal=True), "fa2", False, None, 1),
    (Shape(1, 300, 200, 2, 1, 64, causal=True), "fa2", False, None, 2),
    (Shape(1, 300, 200, 2, 1, 64), "fa2", False, (1, 3), 1),
    (Shape(1, 200, 300, 2, 2, 64, causal=True), "fp32_out", True, (3, 1), 1),
    (Shape(1, 150, 300, 2, 1, 256, causal=True), "fa2", False, (1, 1), 1),
  ],
  ids=[
    "mqa-causal",
    "mqa-causal-2-ctas",
    "mqa-full-stages-1-3",
    "f16-fp32_out-center_keys-causal-stages-3-1",
    "mqa-causal-d256-parts",
  ],
)
def test_mosaic_gpu_backward_persistent_is_the_same_function(
  shape, numerics, center_keys, stages, ctas, monkeypatch
):
  """`MosaicGPUOptions.persistent_bwd`, the backward kernels persistent: every work item in one CTA
  (`persistent_ctas` set to 1; one case 2 CTAs, each with every other item; and with
  `items_early`, whose producer finds the next item by `forward_mgpu.cta_item`, under the
  race detector; 2 heads × 3 query tiles of 128 rows for dQ, the last with a
  warpgroup of padding rows only; 2 heads × 2 tiles of 128 keys for dK/dV) gives dQ, dK and
  dV bit for bit as a CTA per item: the ring's position carried from item to item (with 3
  slots an item starts elsewhere than slot 0; with 1 every tile waits for the one before),
  each item's rows (dQ: Q, dO and the statistics; dK/dV: K and V) loaded into alternating
  slots by the producer and released after the item's store has read them (the interpreter
  checks at the end that every barrier phase was observed); causal items of different
  lengths; the centred keys' third ring; at head_dim 256 (`parts`) one K/V tile shared by
  both warpgroups, each storing its part of dK and dV over it. The traced programs differ
  (a grid over "sm"). Interpret mode has no shared-memory limit: there `SMEM_BYTES` is lifted
  for head_dim 256, whose two tiles of Q and dO a warpgroup do not fit a GPU's dQ kernel."""
  _skip_if_causal_refused(shape.causal)
  from pallas_kernels import backward_mgpu
  from pallas_kernels.backward_mgpu import flash_backward_mgpu

  if shape.head_dim == 256:
    if jax.default_backend() == "gpu":
      pytest.skip("head_dim 256: the persistent dQ kernel does not fit a GPU's shared memory")
    monkeypatch.setattr(backward_mgpu, "SMEM_BYTES", 1 << 30)

  args, cfg = _residuals(
    shape, jnp.float16 if numerics == "fp32_out" else jnp.bfloat16, numerics, center_keys
  )
  monkeypatch.setattr(fm, "persistent_ctas", lambda interpret: ctas)
  plain, persistent = (
    dataclasses.replace(
      cfg,
      mgpu=dataclasses.replace(cfg.mgpu, persistent_bwd=on),
      stages_bwd_mgpu=stages or cfg.stages_bwd_mgpu,
    )
    for on in (False, True)
  )
  d, group = args[0].shape[3], shape.num_heads // shape.num_kv_heads
  assert backward_mgpu.launch_plan(plain, d, group)[1] == (False, False)
  assert backward_mgpu.launch_plan(persistent, d, group)[1] == (True, True)
  calls, order = [], backward_mgpu.item_order  # each kernel deals by `item_order`, its body
  monkeypatch.setattr(  # and its launch (a hard-coded order would move no value)
    backward_mgpu, "item_order", lambda c, tiles, p: calls.append((tiles, p)) or order(c, tiles, p)
  )
  texts = []
  for c in (plain, persistent):
    calls.clear()
    texts.append(str(jax.make_jaxpr(lambda *a, c=c: flash_backward_mgpu(*a, c))(*args)))
    on = c is persistent
    assert set(calls) == {("kv_tiles", on), ("q_tiles", on)}, calls
    assert min(map(calls.count, set(calls))) >= 2, calls  # the kernel's deal and its launch
  assert texts[0] != texts[1]
  want = flash_backward_mgpu(*args, plain)
  _assert_same_bits(flash_backward_mgpu(*args, persistent), want)
  # `items_early`: the same bits, a program that copies each item's own tiles at two places
  # (the first item's, the next one's), and no race where the interpreter looks for them
  early = dataclasses.replace(
    persistent, mgpu=dataclasses.replace(persistent.mgpu, items_early=True)
  )
  copies = [
    str(jax.make_jaxpr(lambda *a, c=c: flash_backward_mgpu(*a, c))(*args)).count(
      "copy_gmem_to_smem"
    )
    for c in (early, persistent)
  ]
  assert copies[0] > copies[1], copies
  if jax.default_backend() != "gpu":
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    races = lambda c: InterpretGPUParams(detect_races=True) if c.interpret else None  # noqa: E731
    monkeypatch.setattr(backward_mgpu, "_interpret_params", races)
    interpret_pallas_call.reset_gpu_interpret_mode_state()
  _assert_same_bits(flash_backward_mgpu(*args, early), want)
  if jax.default_backend() != "gpu":
    assert not interpret_pallas_call.get_races().races_found


@pytest.mark.parametrize("tiles", ["kv_tiles", "q_tiles"])
def test_mosaic_gpu_backward_persistent_causal_order_balances_the_ctas(tiles):
  """The persistent backward deals its items round-robin in `item_order`'s order: at
  gpt2-small's attention (16 × 12 heads, 8 tiles of 128 a head, 132 CTAs) with causal, each
  CTA's work (its items' steps, from the causal definition: dK/dV's key tile i sees the
  query tiles from i on, dQ's query tile i the key tiles up to i, longest_first's last query
  tile first): the busiest CTA's within 8% of the mean (1.069×: 56 steps against 52.4, a
  dynamic scheduler's greedy deal of the CTA-an-item order reaching 1.089×); the CTA-an-item
  order dealt the same way gives the busiest 1.375× the mean (the slowdown measured on the
  GPU, 1.085× the backward's time)."""
  from pallas_kernels.backward_mgpu import item_order

  sizes, n, ctas = dict(batch=16, heads=12), 8, 132
  sizes[tiles] = n
  steps = (lambda i: n - i) if tiles == "kv_tiles" else (lambda i: (n - 1 - i) + 1)

  def work(names):
    per_cta = np.zeros(ctas)
    for k, index in enumerate(np.ndindex(*(sizes[a] for a in names))):
      per_cta[k % ctas] += steps(index[names.index(tiles)])
    return per_cta.max() / per_cta.mean()

  causal = types.SimpleNamespace(causal=True)
  assert work(item_order(causal, tiles, persistent=True)) <= 1.08
  assert work(item_order(causal, tiles, persistent=False)) >= 1.3  # lopsided when dealt
  assert item_order(types.SimpleNamespace(causal=False), tiles, True)[-1] == tiles


def test_mosaic_gpu_backward_persistent_true_fits_its_tiles_or_is_refused():
  """`MosaicGPUOptions(persistent_bwd=True)` with the default tiles in flight: at head_dim 128
  the dK/dV kernel's two query tiles fit beside two items' K and V (2 × 64 + 2 × 32.75 KiB),
  and with the centred keys dQ's two key tiles are lowered to one
  (`backward_mgpu.default_stages`); with grouped heads (float32 partials) not even one dK/dV
  tile does, and `kernel_config` refuses it in one line naming the kernel and its numbers,
  before any kernel runs, while the forward alone (persistent=True) still runs there. None
  (the default) turns each kernel on where it fits up to head_dim 64
  (`backward_mgpu.PERSISTENT_BWD_MAX_HEAD_DIM`: both here at 64, none at 128, where it was
  slower) and off in interpret mode; False leaves both off."""
  from pallas_kernels import attention, backward_mgpu
  from pallas_kernels.policy import get_numerics

  def config(persistent, group=1, forward=None, head_dim=128, interpret=False):
    return attention.kernel_config(
      q_len=1024,
      kv_len=1024,
      head_dim=head_dim,
      dtype=jnp.bfloat16,
      softmax_scale=128**-0.5,
      causal=False,
      numerics=get_numerics("fa2"),
      compensation=None,
      interpret=interpret,
      backend="mosaic_gpu",
      group=group,
      mgpu_options=fm.MosaicGPUOptions(persistent=forward, persistent_bwd=persistent),
    )

  assert config(None).stages_bwd_mgpu == (2, 2)
  cfg = config(True)
  assert cfg.stages_bwd_mgpu == (2, 2)
  assert backward_mgpu.launch_plan(cfg, 128, 1) == ((2, 2), (True, True))
  assert fm.MosaicGPUOptions().persistent_bwd is None
  assert backward_mgpu.launch_plan(config(None), 128, 1) == ((2, 2), (False, False))
  assert backward_mgpu.launch_plan(config(None, head_dim=64), 64, 1) == ((2, 2), (True, True))
  off = config(None, head_dim=64, interpret=True)
  assert backward_mgpu.launch_plan(off, 64, 1) == ((2, 2), (False, False))
  assert backward_mgpu.launch_plan(config(False), 128, 1) == ((2, 2), (False, False))
  with pytest.raises(
    ValueError,
    match=r"^MosaicGPUOptions\(persistent_bwd=True\) at head_dim=128, group=2 with the dK/dV "
    r"kernel's 1 query tile in flight: two tiles of K and V, the float32 partials and the ring "
    r"need 224\.\d KiB",
  ):
    config(True, group=2)
  assert config(False, group=2, forward=True).mgpu.persistent
  # what persistent_bwd=True lowers: dQ's key tiles with the centred keys' third ring
  assert backward_mgpu.default_stages(128, 1, True) == (2, 2)
  assert backward_mgpu.default_stages(128, 1, True, persistent=True) == (2, 1)
  assert backward_mgpu.default_stages(64, persistent=True) == (2, 2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_query_grid_puts_causal_query_tiles_outermost_unless_told(causal):
  """`forward_mgpu.query_grid`: q_tiles_inner None resolves by causal (full: a head's query
  tiles innermost, for L2; causal: outermost, so longest_first orders the whole grid); True and
  False are obeyed either way."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions, query_grid

  def names(inner):
    return query_grid(
      types.SimpleNamespace(causal=causal, mgpu=MosaicGPUOptions(q_tiles_inner=inner))
    )

  inner, outer = ("batch", "heads", "q_tiles"), ("q_tiles", "batch", "heads")
  assert names(None) == (outer if causal else inner)
  assert (names(True), names(False)) == (inner, outer)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mosaic_gpu_backward_rounded_scores_moves_only_float32_values(causal):
  """`MosaicGPUOptions.rounded_scores` (S rounded on its own, P without the select) against
  the plain product and the select, same residuals. Interpret mode, where S passes an
  optimization barrier: dQ, dK and dV bit for bit, since the definition's S − m is exactly what
  the select wrote (fails without the barrier: XLA contracts S into S − m). On the GPU (PTX
  mul.rn.f32 against NVPTX's FMA away from the max): within one bf16 ulp at their scale."""
  _skip_if_causal_refused(causal)
  from pallas_kernels.backward_mgpu import flash_backward_mgpu

  args, cfg = _residuals(Shape(1, 256, 256, 2, 1, 128, causal=causal), jnp.bfloat16, seed=4)
  plain, rounded = _off_and_on(cfg, "rounded_scores")
  ours, theirs = flash_backward_mgpu(*args, rounded), flash_backward_mgpu(*args, plain)
  for name, a, b in zip(("dq", "dk", "dv"), ours, theirs):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.abs(b).max() > 0 and np.isfinite(a).all(), name
    if jax.default_backend() != "gpu":
      assert np.array_equal(a, b), name
    else:
      assert np.all(np.abs(a - b) <= ulp_at_scale(b) + 1e-12), (name, np.abs(a - b).max())


def test_mosaic_gpu_backward_unscaled_scores_are_the_same_function():
  """At a power-of-two softmax_scale ≤ 1 (head_dim 64: 1/8) the backward forms P from the
  unscaled QKᵀ (`backward_mgpu.unscaled_scores`: (QKᵀ − m/c − log l/c)·c, on the GPU one
  multiply by c·log₂e into ex2), which is the definition's exponent bit for bit: dQ, dK and dV
  equal those of scale_in_exp2=False, which forms S = QKᵀ·c (interpret mode and GPU; causal,
  GQA, odd lengths; fails if m or log l is left in S's units or c is dropped). The rule: on
  only there, off at head_dim 128's 1/√128, at c = 2, without rounded_scores or with
  scale_in_exp2=False."""
  from pallas_kernels.backward_mgpu import flash_backward_mgpu, unscaled_scores

  args, cfg = _residuals(Shape(1, 300, 300, 4, 2, 64, causal=True), jnp.bfloat16, seed=5)
  plain, unscaled = _off_and_on(cfg, "scale_in_exp2")
  assert unscaled_scores(unscaled) and not unscaled_scores(plain)
  for off in (
    dataclasses.replace(unscaled, softmax_scale=128**-0.5),
    dataclasses.replace(unscaled, softmax_scale=2.0),
    dataclasses.replace(unscaled, mgpu=dataclasses.replace(unscaled.mgpu, rounded_scores=False)),
  ):
    assert not unscaled_scores(off)
  _assert_same_bits(flash_backward_mgpu(*args, unscaled), flash_backward_mgpu(*args, plain))


def test_max_gap_without_the_select_differs_only_where_s_and_m_are_the_same_infinity():
  """`Numerics.max_gap(rounded=True)` (S − m, for an S rounded on its own) against the select
  `where(S == m, 0, S − m)` over ±0, subnormals, normals, the largest float32, ±inf and NaN for
  both: equal values (±0 where S = m, NaN where either is NaN), except S = m = ±inf (NaN
  against 0), which needs an overflowed QKᵀ, whose row's log l is NaN, so P is NaN either way."""
  from pallas_kernels.policy import get_numerics

  f32 = np.finfo(np.float32)
  edge = np.array(
    [0.0, -0.0, f32.smallest_subnormal, -f32.smallest_subnormal, 1.5, -2.25, f32.max, -f32.max]
    + [np.inf, -np.inf, np.nan],
    np.float32,
  )
  s, m = (jnp.asarray(x) for x in np.meshgrid(edge, edge, indexing="ij"))
  numerics = get_numerics("fa2")
  gap = np.asarray(numerics.max_gap(s, m, rounded=True))
  selected = np.asarray(numerics.max_gap(s, m))
  same_infinity = np.isinf(np.asarray(s)) & (np.asarray(s) == np.asarray(m))
  assert same_infinity.sum() == 2 and np.isnan(gap[same_infinity]).all()
  # equal as values (S − m is −0 for S = −0, m = +0, where the select writes +0: the same
  # exp); NaN where either is NaN
  assert np.array_equal(gap[~same_infinity], selected[~same_infinity], equal_nan=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mosaic_gpu_backward_mask_leaves_out_only_conditions_true_on_every_visited_tile(causal):
  """`backward_mgpu._valid` drops the real-key compare where kv_len is a multiple of the keys'
  span and the real-query compare where q_len is a multiple of the queries' tile: on every
  position the kernels visit (keys up to kv_len rounded up to the span, queries up to q_len
  rounded up to the tile) it equals the full rule (real key, real query, causal), for lengths
  that are and are not multiples (fails if a condition is dropped where it can be false)."""
  import types

  from pallas_kernels.backward_mgpu import _valid

  for kv_len, q_len, key_span, query_span in [
    (256, 256, 128, 64), (200, 256, 128, 64), (256, 200, 128, 64), (192, 130, 64, 64),
    (130, 192, 64, None), (128, 128, 64, None),
  ]:  # fmt: skip
    cfg = types.SimpleNamespace(kv_len=kv_len, q_len=q_len, causal=causal)
    keys = np.arange(-(-kv_len // key_span) * key_span)
    queries = np.arange(-(-q_len // (query_span or 64)) * (query_span or 64))
    q_pos, k_pos = (jnp.asarray(x) for x in np.meshgrid(queries, keys, indexing="ij"))
    full = (k_pos < kv_len) & ((q_pos < q_len) if query_span else True)
    full = full & (q_pos >= k_pos) if causal else full
    got = _valid(q_pos, k_pos, cfg, key_span, query_span)
    dropped_all = kv_len % key_span == 0 and (query_span is None or q_len % query_span == 0)
    assert (got is None) == (dropped_all and not causal), (kv_len, q_len, got)
    got = jnp.ones_like(full) if got is None else got
    np.testing.assert_array_equal(np.asarray(got), np.asarray(full), err_msg=str(cfg))


def test_mosaic_gpu_backward_stages_are_lowered_to_what_fits(monkeypatch):
  """A measured row asking more tiles than fit is lowered per kernel to the most that fit:
  4 of each at head_dim 128 → dK/dV 4 (199,680 bytes), dQ with the centred keys 3 (4 would
  take 263,680 of the 229,376 bytes), dK/dV with grouped heads 2 (their float32 partials)."""
  from pallas_kernels import backward_mgpu

  monkeypatch.setattr(backward_mgpu, "STAGES_BY_HEAD_DIM", {128: (4, 4)})
  assert backward_mgpu.default_stages(128) == (4, 4)
  assert backward_mgpu.default_stages(128, center_keys=True) == (4, 3)
  assert backward_mgpu.default_stages(128, group=2) == (2, 4)
  smem, dq, dkv = backward_mgpu.SMEM_BYTES, backward_mgpu._dq_bytes, backward_mgpu._dkv_bytes
  assert dq(128, 3, True) <= smem < dq(128, 4, True)  # the boundaries themselves
  assert dkv(128, 2, 2) <= smem < dkv(128, 3, 2)


def test_mosaic_gpu_backward_refuses_set_stages_that_do_not_fit():
  """`KernelConfig.stages_bwd_mgpu` set to more tiles than a kernel's shared memory holds is
  refused in one line naming the value, the kernel and the most that fit, before any kernel
  runs (not lowered); None takes `default_stages` for the dQ key tile. At head_dim 128 with
  grouped heads dK/dV holds 2 (its float32 partials); with the centred keys and dQ key tiles of
  128 dQ holds 1 (`kernel_config` set 2, for tiles of 64); at head_dim 256 a dQ key tile of
  128 does not fit once."""
  from pallas_kernels import attention
  from pallas_kernels.backward_mgpu import _stages, flash_backward_mgpu
  from pallas_kernels.policy import get_numerics

  def config(head_dim, group=1, center_keys=False, **fields):
    cfg = attention.kernel_config(
      **dict(q_len=64, kv_len=64, head_dim=head_dim, dtype=jnp.bfloat16, softmax_scale=0.1),
      **dict(causal=False, compensation=None, interpret=True, backend="mosaic_gpu"),
      numerics=get_numerics("fa2").with_options(center_keys=center_keys),
      group=group,
    )
    assert cfg.backend_bwd == "mosaic_gpu"
    return dataclasses.replace(cfg, **fields)

  def backward(cfg, head_dim, group=1):  # raises before any kernel runs
    q = jnp.zeros((1, 64, 2 * group, head_dim), jnp.bfloat16)
    k = jnp.zeros((1, 64, 2, head_dim), jnp.bfloat16)
    rows = jnp.zeros((1, 2 * group, 64), jnp.float32)
    return flash_backward_mgpu(q, k, k, q, rows, rows, q, cfg)

  grouped = config(128, group=2)
  assert grouped.stages_bwd_mgpu == (2, 2) == _stages(grouped, 128, 2)
  assert _stages(dataclasses.replace(grouped, stages_bwd_mgpu=1), 128, 2) == (1, 1)
  with pytest.raises(
    ValueError,
    match=r"^stages_bwd_mgpu=\(3, 2\): the dK/dV kernel fits at most 2 tiles in flight at "
    r"head_dim=128, group=2$",
  ):
    backward(dataclasses.replace(grouped, stages_bwd_mgpu=(3, 2)), 128, group=2)
  wide = config(128, center_keys=True, block_k_dq_mgpu=128)
  assert wide.stages_bwd_mgpu == (2, 2)  # `kernel_config`'s, for dQ key tiles of 64
  with pytest.raises(
    ValueError,
    match=r"^stages_bwd_mgpu=\(2, 2\): the dQ kernel fits at most 1 tile in flight at "
    r"head_dim=128, block_k_dq_mgpu=128, center_keys=True$",
  ):
    backward(wide, 128)
  assert _stages(dataclasses.replace(wide, stages_bwd_mgpu=None), 128, 1) == (2, 1)
  with pytest.raises(
    ValueError,
    match=r"^head_dim=256, block_k_dq_mgpu=128: the Mosaic GPU backward's dQ kernel needs "
    r"257\.5 KiB of shared memory with one tile in flight, more than 224 KiB$",
  ):
    backward(config(256, block_k_dq_mgpu=128, stages_bwd_mgpu=None), 256)
  for bad in (0, (0, 1), 9, "2"):  # malformed: named as the field
    with pytest.raises(ValueError, match=rf"^stages_bwd_mgpu={re.escape(repr(bad))}: "):
      _stages(dataclasses.replace(grouped, stages_bwd_mgpu=bad), 128, 2)


def test_mosaic_gpu_backward_falls_back_to_triton_where_it_cannot_run():
  """Where the Mosaic GPU backward cannot run the call (e.g. centred keys at head_dim 256: the
  dQ kernel's shared memory) the Triton backward runs after the Mosaic GPU forward;
  `supported` says why, and `kernel_config` asks it with the stages the backward would run."""
  from pallas_kernels import backward_mgpu
  from pallas_kernels.attention import kernel_config, supported
  from pallas_kernels.backward_mgpu import default_stages
  from pallas_kernels.policy import get_numerics

  bwd = lambda **kw: supported("mosaic_gpu", backward=True, **{"numerics": "fa2", **kw})
  assert "head_dim=16" in bwd(head_dim=16)
  assert [default_stages(d) for d in (32, 64, 128, 256)] == [(2, 2), (2, 2), (2, 2), (2, 1)]
  assert default_stages(128, group=2) == (2, 2)  # 3 would not fit: dK/dV's float32 partials
  assert default_stages(256, group=2) == (1, 1)
  assert default_stages(128, center_keys=True) == (2, 2)  # dQ asks 2 (3 would fit)
  assert bwd(head_dim=256, num_stages=1, group=4) is None
  assert bwd(head_dim=256, num_stages=(2, 1)) is None
  assert "KiB of shared memory" in bwd(head_dim=256, num_stages=2)
  assert "KiB of shared memory" in bwd(head_dim=256, num_stages=(2, 1), group=2)
  assert "center_keys=True at head_dim=256" in bwd(head_dim=256, center_keys=True)
  # the dQ kernel's key tile counted as the kernels count it: `supported` allows exactly the
  # stages and tiles that `_stages` runs (at head_dim 256 the tile of 128 holds no K/V tile)
  why = lambda **kw: backward_mgpu.supported(numerics="fa2", **kw)
  assert why(head_dim=256, block_k_dq=128).startswith("block_k_dq_mgpu=128 at head_dim=256")
  assert (
    why(block_k_dq=96) == "block_k_dq_mgpu=96: the Mosaic GPU dQ kernel's key tile is 64 or 128"
  )
  for d, bk, stages, center in itertools.product(
    (32, 64, 128, 256), (64, 128), (1, 2, 3, (3, 1), (1, 4)), (False, True)
  ):
    run = types.SimpleNamespace(
      numerics=types.SimpleNamespace(center_keys=center), block_k_dq_mgpu=bk, stages_bwd_mgpu=stages
    )
    try:
      backward_mgpu._stages(run, d, 1)
      runs = True
    except ValueError:
      runs = False
    allowed = why(head_dim=d, num_stages=stages, block_k_dq=bk, center_keys=center) is None
    assert allowed == runs, (d, bk, stages, center)
  cfg = lambda **kw: kernel_config(
    **{
      **dict(q_len=256, kv_len=256, head_dim=256, dtype=jnp.bfloat16, softmax_scale=0.1),
      **dict(causal=False, compensation=None, interpret=True, backend="mosaic_gpu"),
      **kw,
    }
  )
  plain = cfg(numerics=get_numerics("fa2"), group=2)
  assert (plain.backend_bwd, plain.stages_bwd_mgpu) == ("mosaic_gpu", (1, 1))
  centred = cfg(numerics=get_numerics("fa2").with_options(center_keys=True))
  assert (centred.backend, centred.backend_bwd, centred.stages_bwd_mgpu) == (
    "mosaic_gpu",
    "triton",
    None,
  )
  assert plain.num_stages_bwd == centred.num_stages_bwd == 2  # the Triton backward's, an int
  for bad in ((2,), (0, 1), True, (2, 1.0), 9):  # one integer 1–8 or a pair of them
    assert f"num_stages={bad!r} (the Mosaic GPU backward's tiles" in bwd(num_stages=bad), bad
  assert bwd(head_dim=256, num_stages=np.int64(1)) is None
  assert "numerics='paper'" in bwd(numerics="paper")
  assert "dtype=float32" in bwd(dtype=jnp.float32)
  assert "KiB of shared memory" in bwd(head_dim=128, num_stages=4, group=2)
  assert (
    bwd(
      numerics="fp32_out", head_dim=128, dtype=jnp.float16, num_stages=2, group=4, center_keys=True
    )
    is None
  )


@pytest.mark.parametrize(
  "shape,dtype,numerics",
  [
    (Shape(1, 90, 150, 2, 1, 20, causal=True), jnp.bfloat16, "fa2"),  # padded to 32
    (Shape(1, 100, 70, 2, 2, 32), jnp.float16, "fp32_out"),
    (Shape(1, 80, 140, 2, 1, 192, causal=True), jnp.bfloat16, "fa2"),  # padded to 256
  ],
  ids=["d20-causal", "f16-fp32_out-d32", "d192-causal-mqa"],
)
def test_mosaic_gpu_head_dims_32_to_256(shape, dtype, numerics):
  """head_dim 17–256 (padded to 32 … 256): the Mosaic GPU forward matches the Triton one to an
  ulp of the output dtype, its gradients (the Mosaic GPU backward, at 256 in two parts) to an
  ulp at their scale, and they pass the FP64 rule, compensation on."""
  _skip_if_causal_refused(shape.causal)
  q, k, v, do = _tied(shape, dtype, 9)
  kw = dict(causal=shape.causal, numerics=numerics, stabilize=True)
  assert tuple(resolved_backend(q, k, v, backend="mosaic_gpu", **kw)) == ("mosaic_gpu",) * 2
  ulps = 1 if jax.default_backend() == "cpu" else 2

  def run(backend):
    out, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, backend=backend, **kw), q, k, v)
    return (out,) + vjp(do.astype(out.dtype))

  mgpu = run("mosaic_gpu")
  for name, a, b in zip(TENSORS, mgpu, run("triton")):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), name
    if name == "out":  # an ulp of the input dtype, also for fp32_out's float32 O
      ulp = (
        bf16_ulp(b)
        if dtype == jnp.bfloat16
        else np.spacing(np.abs(b).astype(np.float16)).astype(np.float64)
      )
    else:
      ulp = ulp_at_scale(b, dtype=dtype)
    assert np.all(np.abs(a - b) <= ulps * ulp + 1e-12), (name, np.abs(a - b).max())
  c = compare(q, k, v, do, result=(mgpu[0], mgpu[1:]), **kw)
  assert all(c.passes().values()), {t: (c.flash[t], c.standard[t]) for t in TENSORS}
