"""The GPU kernels lower for CUDA on any machine (JAX cross-lowering: `.lower(lowering_platforms=
("cuda",))`): the Pallas Triton kernels to Triton IR for an H200 (sm_90), the Mosaic GPU kernels
to Mosaic GPU MLIR (wgmma, TMA). On a CPU this is the check, short of a GPU, that the code the
GPU will compile passes the Pallas lowerings' rules (layouts, tile alignment, supported
primitives); what ptxas and the hardware then do is only tested on the GPU."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from jax_flashstable import flash_attention
from pallas_kernels.attention import kernel_config
from pallas_kernels.backward import flash_backward
from pallas_kernels.forward import flash_forward
from pallas_kernels.forward_mgpu import MosaicGPUOptions, flash_forward_mgpu
from pallas_kernels.policy import Compensation, get_numerics


@pytest.fixture
def triton_modules(monkeypatch):
  """Lower Pallas Triton calls for an H200 without one; collect the Triton modules' text."""
  from jax._src.pallas.triton import gpu_info, pallas_call_registration as pcr

  monkeypatch.setattr(
    pcr.gpu_info_lib,
    "get_gpu_info",
    lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200),
  )
  modules = []
  lower = pcr.lowering.lower_jaxpr_to_triton_module

  def recording(*args, **kwargs):
    result = lower(*args, **kwargs)
    modules.append(result.module.operation.get_asm())
    return result

  monkeypatch.setattr(pcr.lowering, "lower_jaxpr_to_triton_module", recording)
  return modules


def _cfg(
  numerics="fa2",
  backend="triton",
  head_dim=128,
  causal=True,
  stabilize=True,
  interpret=False,
  length=256,
  softmax_scale=0.1,
  **kw,
):
  return kernel_config(
    q_len=length,
    kv_len=length,
    head_dim=head_dim,
    dtype=jnp.bfloat16,
    softmax_scale=softmax_scale,
    causal=causal,
    numerics=get_numerics(numerics),
    compensation=Compensation() if stabilize else None,
    interpret=interpret,
    backend=backend,
    **kw,
  )


def _lower_for_cuda(f, *args):
  return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _qkv(head_dim=128, heads=2, kv_heads=2):
  q = jnp.zeros((1, 256, heads, head_dim), jnp.bfloat16)
  k = jnp.zeros((1, 256, kv_heads, head_dim), jnp.bfloat16)
  return q, k, k


TWO_VALUE_REDUCE = re.compile(r'"tt\.reduce"\(%\w+, %\w+\)')


@pytest.mark.parametrize(
  "numerics,blocks",
  [("fa2", {}), ("paper", dict(block_q=256, block_k=256))],
  ids=["fa2", "paper-subtiles"],
)
def test_triton_forward_ties_in_one_two_value_reduction(triton_modules, numerics, blocks):
  """With the compensation, the forward's tie rule is one tt.reduce of two operands (the row's
  top-2); with tie_method="count" there is none (a max, then a sum)."""
  cfg = _cfg(numerics, **blocks)
  _lower_for_cuda(lambda q, k, v: flash_forward(q, k, v, cfg)[:3], *_qkv())
  _lower_for_cuda(
    lambda q, k, v: flash_forward(q, k, v, dataclasses.replace(cfg, tie_method="count"))[:3],
    *_qkv(),
  )
  top2, count = triton_modules
  assert len(TWO_VALUE_REDUCE.findall(top2)) == 1 and "arith.minimumf" in top2
  assert not TWO_VALUE_REDUCE.findall(count)


def test_triton_backward_lowers(triton_modules):
  cfg = _cfg(backend="triton")
  q, k, v = _qkv(heads=4)
  rows = jnp.zeros((1, 4, 256), jnp.float32)
  _lower_for_cuda(lambda q, k, v: flash_backward(q, k, v, q, rows, rows, q, cfg), q, k, v)
  assert len(triton_modules) == 2  # dK/dV and dQ


@pytest.mark.parametrize(
  "head_dim,block_k,causal",
  [(64, 64, True), (128, 128, False), (128, 64, True), (32, 128, True), (256, 64, False)],
)
@pytest.mark.parametrize("tie_method", ["top2", "count"])
def test_mosaic_gpu_forward_lowers(head_dim, block_k, causal, tie_method):
  cfg = dataclasses.replace(
    _cfg(backend="mosaic_gpu", head_dim=head_dim, causal=causal, block_k=block_k),
    tie_method=tie_method,
  )
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(head_dim))
  assert "wgmma" in text and "cp.async.bulk.tensor" in text
  # S = QKᵀ·c as PTX mul.rn.f32 (softmax_scale 0.1: no scale_in_exp2), which no compiler
  # contracts into S − m, so the max's P̄ = 2^((S − m)·log₂e) is 1 (`rounded_scores`)
  assert cfg.mgpu.rounded_scores and not cfg.mgpu.scale_in_exp2 and "mul.rn.f32" in text


def test_mosaic_gpu_forward_rounds_the_scores_on_their_own_only_where_formed():
  """Without `MosaicGPUOptions.rounded_scores` the plain product (the max's P̄ then comes
  from `max_gap`'s select); at a power-of-two scale (scale_in_exp2) no S is formed at all."""
  for options, scale in ((dict(rounded_scores=False), 0.1), ({}, 0.125)):
    cfg = _cfg(
      backend="mosaic_gpu",
      head_dim=64,
      softmax_scale=scale,
      mgpu_options=MosaicGPUOptions(**options),
    )
    assert cfg.mgpu.scale_in_exp2 is (scale == 0.125)
    text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(64))
    assert "wgmma" in text and "mul.rn.f32" not in text, (options, scale)


@pytest.mark.parametrize(
  "early_turn, causal",
  [(False, True), (True, True), (False, False)],
  ids=["causal", "early_turn-causal", "full"],
)
def test_mosaic_gpu_forward_lowers_with_the_schedule_options(early_turn, causal):
  """The speed options off by default (opt_barrier, k_wait_in_pv, longest_first, early_turn)
  lower for CUDA as the defaults do: the GPU's compiler gets the same kinds of instructions.
  Non-causal too: there the number of key steps is a Python int, which k_wait_in_pv's wait
  closed over inside run_state and the Mosaic GPU lowering refused ("Shaped arrays must be
  represented by ir.Values, got: 4"; on the H200 2026-12-03, then here)."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  options = MosaicGPUOptions(
    pingpong=True, early_turn=early_turn, opt_barrier=True, k_wait_in_pv=True, longest_first=True
  )
  cfg = _cfg(backend="mosaic_gpu", head_dim=128, causal=causal, block_k=64, mgpu_options=options)
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(128))
  assert "wgmma" in text and "cp.async.bulk.tensor" in text


@pytest.mark.parametrize(
  "causal, overlap, items_early",
  [(True, False, False), (False, True, False), (True, False, True)],
  ids=["causal", "full-overlap", "causal-items-early"],
)
def test_mosaic_gpu_persistent_forward_lowers(causal, overlap, items_early):
  """`MosaicGPUOptions.persistent` lowers for CUDA: one CTA an SM (`HOPPER_SMS` here, with no
  GPU) looping over the work items (`plgpu.nd_loop`, the ring's position its carry), the
  producer loading each item's Q beside its key and value tiles, the O stores waited for
  (reads only) one item later; with `items_early` the next item's Q during the item before.
  (ptxas compiles it for sm_90a with no spills: experiment 20, 2026-12-06; items_early
  2026-12-07.)"""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  options = MosaicGPUOptions(
    pingpong=True, persistent=True, overlap=overlap, items_early=items_early
  )
  cfg = _cfg(backend="mosaic_gpu", head_dim=64, causal=causal, block_k=64, mgpu_options=options)
  q, k, v = _qkv(64, heads=136)  # 272 work items: more than a CTA each
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], q, k, v)
  assert "wgmma" in text and "cp.async.bulk.tensor" in text


@pytest.mark.parametrize(
  "block_k, causal, opt_barrier",
  [(64, True, False), (64, False, True), (128, True, True)],
  ids=["bk64-causal", "bk64-full-opt_barrier", "bk128-causal-opt_barrier"],
)
def test_mosaic_gpu_forward_lowers_with_overlap(block_k, causal, opt_barrier):
  """`MosaicGPUOptions.overlap` (FlashAttention-3's intra-warpgroup overlap) lowers for CUDA:
  its GPU path, which interpret mode does not run, issues two wgmmas into two accumulators in
  one `run_state` (the P̄V one initialised with α·acc), reads the scores with one wgmma left
  in flight (`wgmma.wait_group.sync.aligned 1`) and carries the softmax out of that scope
  through refs of its own."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  options = MosaicGPUOptions(pingpong=True, overlap=True, opt_barrier=opt_barrier)
  cfg = _cfg(
    backend="mosaic_gpu", head_dim=128, causal=causal, block_k=block_k, mgpu_options=options
  )
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(128))
  assert "wgmma" in text and "cp.async.bulk.tensor" in text
  assert "wgmma.wait_group.sync.aligned 1;" in text


@pytest.mark.parametrize("block_k, causal", [(64, False), (128, True)])
@pytest.mark.parametrize("option", ["tie_lanes", "scale_in_exp2"])
def test_mosaic_gpu_forward_lowers_with_the_compensation_options(block_k, causal, option):
  """The options that change the compensation's code lower for CUDA, with and without it:
  `tie_lanes` (the top-2 finished by shuffles across a row's lanes, `top2.lane_top2`, an
  `inline_mgpu` block that interpret mode does not run, present with the compensation only)
  and `scale_in_exp2` (the scale in exp2's multiply, the compensation's thresholds divided by it;
  its values: `tests/test_mosaic_gpu.py`, the multiplies it saves:
  experiments/20_ptxas_report.py)."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  q = _qkv(128)
  mgpu_options = MosaicGPUOptions(pingpong=True, **{option: True})
  blocks = {}  # stabilize -> inline_mgpu blocks in the traced forward
  for stabilize in (True, False):
    cfg = _cfg(
      backend="mosaic_gpu",
      causal=causal,
      block_k=block_k,
      stabilize=stabilize,
      mgpu_options=mgpu_options,
    )
    forward = lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3]  # noqa: B023
    blocks[stabilize] = str(jax.make_jaxpr(forward)(*q)).count("inline_mgpu")
    text = _lower_for_cuda(forward, *q)
    assert "wgmma" in text and "cp.async.bulk.tensor" in text
  # inline_mgpu blocks: the lane merge's with the compensation only (tie_lanes, the default),
  # rounded_scores' S = QKᵀ·c wherever S is formed (not with scale_in_exp2)
  assert blocks[True] > blocks[False], blocks
  assert (blocks[False] > 0) == (option != "scale_in_exp2"), blocks


def test_overlap_refuses_the_options_it_replaces():
  """overlap takes the turn and waits for the next key tile its own way: with early_turn or
  k_wait_in_pv it is refused in one line naming them, and scale_in_exp2 without exp2; the fields are bools and mgpu_options the dataclass, each refused in one line otherwise."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  for other in ("early_turn", "k_wait_in_pv"):  # the one set, and only it, named
    with pytest.raises(ValueError, match=r"^MosaicGPUOptions\(overlap=True\)") as e:
      MosaicGPUOptions(overlap=True, **{other: True})
    assert str(e.value).endswith(f"way: {other}=True must be False"), str(e.value)
  with pytest.raises(ValueError, match=r"early_turn=True and k_wait_in_pv=True must be False$"):
    MosaicGPUOptions(overlap=True, early_turn=True, k_wait_in_pv=True)
  with pytest.raises(ValueError, match=r"^MosaicGPUOptions\(scale_in_exp2=True\).*exp2=False"):
    MosaicGPUOptions(scale_in_exp2=True, exp2=False)
  # every field a bool (pingpong, scale_in_exp2: or None), not a truthy value;
  # flash_attention takes the dataclass or None
  bad_values = (("pingpong", "no"), ("exp2", 1), ("tie_lanes", None), ("overlap", "x"))
  for field, bad in bad_values + (("scale_in_exp2", 1), ("rounded_scores", None)):
    with pytest.raises(TypeError, match=rf"^MosaicGPUOptions\.{field} must be a bool"):
      MosaicGPUOptions(**{field: bad})
  q = jnp.zeros((1, 16, 2, 16), jnp.bfloat16)
  for bad in ({"pingpong": False}, "fast"):
    with pytest.raises(TypeError, match="^mgpu_options must be a MosaicGPUOptions or None, got"):
      flash_attention(q, q, q, mgpu_options=bad)


def _lower_backward(
  head_dim, causal=True, group=1, center_keys=False, softmax_scale=0.1, fields=None, **options
):
  """The Mosaic GPU backward (its GPU path, which interpret mode does not run) lowered for
  CUDA at q_len 200, kv_len 250 with `MosaicGPUOptions` fields `options` over the defaults
  and `KernelConfig` fields `fields`: (its config, the lowered text)."""
  from pallas_kernels.backward_mgpu import flash_backward_mgpu
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  cfg = kernel_config(
    q_len=200,
    kv_len=250,
    head_dim=head_dim,
    dtype=jnp.bfloat16,
    softmax_scale=softmax_scale,
    causal=causal,
    numerics=get_numerics("fa2").with_options(center_keys=center_keys),
    compensation=None,
    interpret=False,
    backend="mosaic_gpu",
    group=group,
    mgpu_options=MosaicGPUOptions(**options),
  )
  assert cfg.backend_bwd == "mosaic_gpu"
  cfg = dataclasses.replace(cfg, **(fields or {}))
  q, k, v = _qkv(head_dim, heads=2 * group, kv_heads=2)
  rows = jnp.zeros((1, 2 * group, 256), jnp.float32)
  return cfg, _lower_for_cuda(
    lambda q, k, v: flash_backward_mgpu(q, k, v, q, rows, rows, q, cfg), q, k, v
  )


@pytest.mark.parametrize(
  "head_dim,causal,group,center_keys",
  [(128, True, 1, False), (64, False, 2, True), (32, True, 4, False), (256, True, 1, False)]
  + [(256, False, 2, False)],
  ids=["d128-causal", "d64-gqa-center_keys", "d32-causal-gqa4", "d256-causal", "d256-gqa"],
)
def test_mosaic_gpu_backward_lowers(head_dim, causal, group, center_keys):
  """The GPU path of the Mosaic GPU backward (register operands of wgmma, accumulation in the
  wgmma accumulators, the early read of S, 240/24 registers, with rounded_scores S as PTX
  mul.rn.f32), which interpret mode does not run, lowers through Mosaic GPU to NVVM: two
  kernels, dK/dV and dQ."""
  cfg, text = _lower_backward(head_dim, causal, group, center_keys)
  _assert_two_backward_kernels(text)
  # S = QKᵀ·c as PTX mul.rn.f32 with `MosaicGPUOptions.rounded_scores` (the default; no
  # compiler contracts it into S − m); off, the plain product
  assert cfg.mgpu.rounded_scores and "mul.rn.f32" in text
  _, text = _lower_backward(head_dim, causal, group, center_keys, rounded_scores=False)
  assert "mul.rn.f32" not in text
  # at a power-of-two scale ≤ 1 no S is formed (`backward_mgpu.unscaled_scores`): no mul.rn
  cfg, text = _lower_backward(head_dim, causal, group, center_keys, softmax_scale=0.125)
  assert cfg.mgpu.rounded_scores and cfg.mgpu.scale_in_exp2 and "mul.rn.f32" not in text


@pytest.mark.parametrize("o_by_tma", [None, False])
@pytest.mark.parametrize(
  "head_dim,causal,group,options",
  [
    (64, True, 1, {}),
    (128, False, 2, {}),
    (64, True, 1, dict(persistent_bwd=True)),
    (64, True, 1, dict(persistent_bwd=True, items_early=True)),
  ],
  ids=["d64-causal", "d128-gqa", "d64-causal-persistent", "d64-causal-persistent-items-early"],
)
def test_mosaic_gpu_backward_lowers_with_delta_in_dq(head_dim, causal, group, options, o_by_tma):
  """`MosaicGPUOptions.delta_in_dq` (the dQ kernel takes its rows of O by TMA with Q and dO,
  `o_by_tma`, or from global memory into wgmma-layout registers, sums rowsum(dO∘O) across each
  row's lanes and writes the rows out for dK/dV) lowers for CUDA: two kernels, either way
  (the default, `o_by_tma=None`, resolves to the TMA where O's rows fit), persistent with the
  producer's item tiles one item early too (`items_early`). ptxas (experiment 20,
  2026-12-07, CUDA 13.0): no spills in the dQ kernel at gpt2-small's 16 × 1024 × 12 × d64
  causal and at 4 × 4096 × 16 × d128 causal; its loops over key tiles 319 → 334 and 472 → 475
  SASS instructions at d64 (O from global memory)."""
  from pallas_kernels.backward_mgpu import launch_plan, resolve_o_by_tma

  cfg, text = _lower_backward(
    head_dim, causal, group, delta_in_dq=True, o_by_tma=o_by_tma, **options
  )
  assert cfg.mgpu.delta_in_dq
  _assert_two_backward_kernels(text)
  (_, stages), (_, persistent) = launch_plan(cfg, head_dim, group)
  assert resolve_o_by_tma(cfg, head_dim, stages, persistent) is (o_by_tma is None)


def test_o_by_tma_resolves_where_os_rows_fit_and_true_is_refused_where_they_do_not():
  """`MosaicGPUOptions.o_by_tma=None` resolves on wherever delta_in_dq is on and the dQ
  kernel's shared memory holds its rows of O beside its plan (`backward_mgpu._dq_bytes`:
  slots × 2 warpgroups × 64 rows × head_dim × O's itemsize more), off without delta_in_dq;
  True where they do not fit is refused in one line by `kernel_config`, before any kernel."""
  from pallas_kernels import backward_mgpu as bm

  def config(head_dim=64, numerics="fa2", **options):
    return kernel_config(
      q_len=1024, kv_len=1024, head_dim=head_dim, dtype=jnp.bfloat16, softmax_scale=0.1,
      causal=True, numerics=get_numerics(numerics), compensation=None, interpret=False,
      backend="mosaic_gpu", mgpu_options=MosaicGPUOptions(**options),
    )  # fmt: skip

  for d in (64, 128):
    cfg = config(d)
    (_, stages), (_, persistent) = bm.launch_plan(cfg, d, 1)
    assert bm.resolve_o_by_tma(cfg, d, stages, persistent), d
    assert not bm.resolve_o_by_tma(config(d, delta_in_dq=False), d, stages, persistent)
    assert not bm.resolve_o_by_tma(config(d, o_by_tma=False), d, stages, persistent)
  # the byte count: O's rows in each slot of each warpgroup, its itemsize each
  assert (
    bm._dq_bytes(64, 2, False, 64, 2, 2) - bm._dq_bytes(64, 2, False, 64, 2) == 2 * 2 * 64 * 64 * 2
  )
  # head_dim 128 persistent: Q, dO and rows of two items and the ring leave no room for O's
  cfg = config(128, delta_in_dq=True, persistent_bwd=True)
  (_, stages), (_, persistent) = bm.launch_plan(cfg, 128, 1)
  assert persistent and not bm.resolve_o_by_tma(cfg, 128, stages, persistent)
  with pytest.raises(
    ValueError,
    match=r"^MosaicGPUOptions\(o_by_tma=True\) at head_dim=128: [^\n]* KiB [^\n]*global memory there\)$",
  ):
    config(128, delta_in_dq=True, persistent_bwd=True, o_by_tma=True)


def test_delta_in_dq_is_on_by_default_for_a_gpu_where_timed_and_off_in_interpret_mode():
  """`MosaicGPUOptions.delta_in_dq=None` (the default) resolves on for a GPU's Mosaic GPU
  backward where it was timed faster (a padded head_dim up to 128, O in the input dtype:
  `backward_mgpu.DELTA_IN_DQ_MAX_HEAD_DIM`), off at 256, with fp32_out's float32 O and in
  interpret mode, where the tests run each way on purpose; True and False are kept."""
  from pallas_kernels.backward_mgpu import DELTA_IN_DQ_MAX_HEAD_DIM, resolve_delta_in_dq

  def config(numerics="fa2", interpret=False, **options):
    return kernel_config(
      q_len=200, kv_len=250, head_dim=64, dtype=jnp.bfloat16, softmax_scale=0.1, causal=True,
      numerics=get_numerics(numerics), compensation=None, interpret=interpret,
      backend="mosaic_gpu", mgpu_options=MosaicGPUOptions(**options),
    )  # fmt: skip

  assert DELTA_IN_DQ_MAX_HEAD_DIM == 128
  assert config().mgpu.delta_in_dq is None  # resolved where the backward runs
  for head_dim, want in ((32, True), (64, True), (128, True), (256, False)):
    assert resolve_delta_in_dq(config(), head_dim) is want, head_dim
  assert resolve_delta_in_dq(config("fp32_out"), 64) is False
  assert resolve_delta_in_dq(config(interpret=True), 64) is False
  for interpret in (False, True):
    for head_dim in (64, 256):
      for given in (True, False):
        cfg = config(interpret=interpret, delta_in_dq=given)
        assert resolve_delta_in_dq(cfg, head_dim) is given, (interpret, head_dim, given)


def test_mosaic_gpu_backward_lowers_with_the_dq_key_tile_of_128():
  """`KernelConfig.block_k_dq_mgpu=128`'s GPU path (S, dP and dQ += dS K over 128 keys a
  step) lowers for CUDA: two kernels, as with the default tile."""
  cfg, text = _lower_backward(64, fields=dict(block_k_dq_mgpu=128))
  assert cfg.block_k_dq_mgpu == 128
  _assert_two_backward_kernels(text)


def _assert_two_backward_kernels(text):
  """The lowered backward is two Mosaic GPU kernels (dK/dV, dQ), each with wgmma and TMA and
  its two compute warpgroups raised to 240 registers (setmaxnreg)."""
  kernels = text.split("stablehlo.custom_call @mosaic_gpu")[1:]
  assert len(kernels) == 2
  for kernel in kernels:
    assert "wgmma" in kernel and "cp.async.bulk.tensor" in kernel
    assert "setmaxnreg.inc.sync.aligned.u32 240;" in kernel


@pytest.mark.parametrize(
  "head_dim, block_k, stages, interpret, persistent",
  [
    (64, 64, 2, False, True),  # gpt2-small's attention: 81 KiB
    (128, 64, 3, False, True),  # 193 KiB
    (128, 128, 2, False, True),  # 226 KiB: at the limit
    (128, 128, 3, False, False),  # 290 KiB
    (256, 64, 1, False, False),  # 257 KiB
    (64, 64, 2, True, False),  # interpret mode
  ],
)
def test_the_forward_is_persistent_by_default_where_it_fits(
  head_dim, block_k, stages, interpret, persistent
):
  """`MosaicGPUOptions.persistent` None resolves on for a GPU wherever two Q tiles, O's own
  buffer and the key/value ring fit the 226 KiB (`smem_bytes`), off elsewhere and in
  interpret mode; a value set stays as set, True refused in one line where it does not fit."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions, resolve_persistent

  cfg = _cfg(  # the 64-key step (the wide step's slots: test_the_wide_step_is_on_by_default…)
    backend="mosaic_gpu",
    head_dim=head_dim,
    block_k=block_k,
    interpret=interpret,
    mgpu_options=MosaicGPUOptions(wide_step=False),
  )
  assert cfg.mgpu.persistent is None
  assert resolve_persistent(cfg, head_dim, stages, jnp.bfloat16).mgpu.persistent is persistent
  fits = persistent or interpret  # interpret mode: off, though it fits
  for chosen in (False, True):
    cfg = dataclasses.replace(cfg, mgpu=MosaicGPUOptions(persistent=chosen))
    if chosen and not fits:
      with pytest.raises(
        ValueError, match=rf"^MosaicGPUOptions\(persistent=True\) at head_dim={head_dim}, .* KiB"
      ):
        resolve_persistent(cfg, head_dim, stages, jnp.bfloat16)
    else:
      assert resolve_persistent(cfg, head_dim, stages, jnp.bfloat16).mgpu.persistent is chosen


@pytest.mark.parametrize(
  "head_dim, block_k, stages, numerics, options, interpret, on, refused",
  [
    (64, 64, 2, "fa2", {}, False, True, None),  # gpt2-small's attention
    (128, 64, 2, "fa2", {}, False, True, None),  # persistent too: 226 KiB
    (96, 64, 2, "fa2", {}, False, True, None),  # padded to 128
    # the 64-key step's persistent layout fits (194 KiB), the wide step's does not (290):
    # kept persistent; persistent=False: the wide step a CTA an item (226 KiB)
    (128, 64, 3, "fa2", {}, False, False, None),
    (128, 64, 3, "fa2", dict(persistent=False), False, True, None),
    (128, 64, 3, "fa2", dict(persistent=True), False, False, "persistent"),
    # fp32_out's float32 O: the same, 194 against 258 KiB, 226 a CTA an item
    (128, 64, 2, "fp32_out", {}, False, False, None),
    (128, 64, 2, "fp32_out", dict(persistent=False), False, True, None),
    (128, 64, 3, "fp32_out", dict(persistent=False), False, False, "wide_step"),  # 290 KiB
    (128, 64, 4, "fa2", {}, False, False, "wide_step"),  # 4 slots of 128 keys: 290 KiB
    (256, 64, 2, "fa2", {}, False, False, "wide_step"),  # the 64 × 128 scores' registers
    (128, 128, 2, "fa2", {}, False, False, "wide_step"),  # block_k 128: one tile a step already
    (64, 64, 2, "fa2", dict(overlap=True), False, False, "options"),  # one 64-key tile a step
    (64, 64, 2, "fa2", {}, True, False, None),  # interpret mode
  ],
)
def test_the_wide_step_is_on_by_default_where_it_runs(
  head_dim, block_k, stages, numerics, options, interpret, on, refused
):
  """`MosaicGPUOptions.wide_step` None (the default) resolves in `kernel_config` to on for a GPU
  wherever the wide step runs and does not turn the persistent forward off (1024 keys: each
  num_stages a full ring), off in interpret mode, beside overlap, where `wide_step_refusal`
  refuses it and where the 64-key step's persistent layout fits and the wide step's does not
  (then persistent=True is not refused for an option the caller did not set); wide_step=True
  is refused in one line where it cannot run, False stays off."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions, step_keys

  def config(**chosen):
    return _cfg(
      numerics=numerics,
      backend="mosaic_gpu",
      head_dim=head_dim,
      block_k=block_k,
      num_stages=stages,
      interpret=interpret,
      length=1024,
      mgpu_options=MosaicGPUOptions(**options, **chosen),
    )

  assert MosaicGPUOptions().wide_step is None
  cfg = config()
  assert cfg.mgpu.wide_step is on and step_keys(cfg) == block_k * (2 if on else 1)
  assert config(wide_step=False).mgpu.wide_step is False
  match = {
    "wide_step": r"^MosaicGPUOptions\(wide_step=True\) (with|runs)",
    "persistent": r"^MosaicGPUOptions\(persistent=True\) at .* and wide_step \(128 keys a slot\)",
    "options": r"^MosaicGPUOptions\(overlap=True\) runs one 64-key tile a step",
  }
  if refused is None:
    assert config(wide_step=True).mgpu.wide_step is True
  else:
    with pytest.raises(ValueError, match=match[refused]):
      config(wide_step=True)


@pytest.mark.parametrize(
  "block_k, stages, wide_step",
  [(64, 2, True), (128, 2, False), (64, 4, False)],
  ids=["wide_step-2-slots", "block_k128-2-slots", "block_k64-4-slots"],
)
def test_persistent_forward_at_the_shared_memory_limit_lowers(block_k, stages, wide_step):
  """The persistent forward's layouts that `smem_bytes` puts at `SMEM_BYTES` exactly (head_dim
  128: two Q tiles' 64 KiB, O's 32, the ring's 128, m's and log l's 1 each: 226 KiB) pass Mosaic GPU's own check of
  the kernel's shared memory against Hopper's 227 KiB (lowering for CUDA runs it): each buffer
  counted in whole KiB as Mosaic GPU aligns it, the barriers after them, and no reduction
  scratch (`REDUCTION_SCRATCH_BYTES`; its default 2 KiB would put these at 228.1 KiB)."""
  from pallas_kernels import forward_mgpu as fm

  keys = block_k * (2 if wide_step else 1)
  assert fm.smem_bytes(128, keys, stages, jnp.bfloat16, persistent=True) == fm.SMEM_BYTES
  options = fm.MosaicGPUOptions(pingpong=True, wide_step=wide_step, persistent=True)
  cfg = _cfg(
    backend="mosaic_gpu", causal=False, block_k=block_k, num_stages=stages, mgpu_options=options
  )
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(128))
  assert "wgmma" in text and "cp.async.bulk.tensor" in text


@pytest.mark.parametrize(
  "head_dim, causal, wide_step, unit_alpha",
  [(64, True, True, False), (128, False, True, True), (128, True, False, True)],
  ids=["d64-causal-wide_step", "d128-full-wide_step+unit_alpha", "d128-causal-unit_alpha"],
)
def test_mosaic_gpu_forward_lowers_with_wide_step_and_unit_alpha(
  head_dim, causal, wide_step, unit_alpha
):
  """`MosaicGPUOptions.wide_step` (a 64 × 128 QKᵀ wgmma a step, the softmax and P̄V per
  64-key half: its values, tests/test_mosaic_gpu.py) and `unit_alpha` (α·acc in a branch a
  warp skips where its rows all kept their max: an `inline_mgpu` block with `vote.sync.all`
  that interpret mode does not run; its values only the GPU checks) lower for CUDA; ptxas
  compiles both for sm_90a (experiment 20, 2026-12-07: a branch around the accumulator's
  FMULs after `VOTE.ALL`)."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  options = MosaicGPUOptions(pingpong=True, wide_step=wide_step, unit_alpha=unit_alpha)
  cfg = _cfg(
    backend="mosaic_gpu", head_dim=head_dim, causal=causal, block_k=64, mgpu_options=options
  )
  text = _lower_for_cuda(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], *_qkv(head_dim))
  assert "wgmma" in text and "cp.async.bulk.tensor" in text
  assert ("vote.sync" in text) == unit_alpha
