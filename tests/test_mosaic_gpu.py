"""backend="mosaic_gpu" (the Hopper forward, `pallas_kernels.forward_mgpu`), run on CPU in
Pallas' GPU interpret mode (which simulates its warpgroups, TMA copies and barriers): against
FP64, against the Triton forward it must match, and its refusals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.forward_mgpu as fm
from jax_flashstable import flash_attention, reference_attention
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.lab.accuracy import TENSORS, bf16_ulp, compare_to_golden, ulp_at_scale
from jax_flashstable.lab.shapes import Shape, make_inputs


@pytest.mark.parametrize("shape,dtype,numerics", [
    (Shape(1, 150, 150, 4, 2, 64, causal=True), jnp.bfloat16, "fa2"),
    (Shape(1, 100, 130, 2, 2, 128), jnp.float16, "fa2"),
    (Shape(1, 100, 100, 2, 1, 128, causal=True), jnp.bfloat16, "fp32_out"),
], ids=["bf16-causal-gqa", "f16-d128", "fp32_out-causal-d128"])
@pytest.mark.parametrize("stabilize", [False, True], ids=["plain", "stable"])
def test_mosaic_gpu_against_fp64(shape, dtype, numerics, stabilize):
  _skip_if_causal_refused(shape.causal)
  c = compare_to_golden(shape, dtype, seed=1, stabilize=stabilize, numerics=numerics,
                        backend="mosaic_gpu")
  assert all(c.flash[t].finite for t in TENSORS)
  assert all(c.passes().values()), {t: (c.flash[t], c.standard[t]) for t in TENSORS}


def _skip_if_causal_refused(causal):
  """On a GPU with CUDA 12.8.0–12.9.0 the kernel refuses causal masks (`check_device`)."""
  if causal and jax.default_backend() == "gpu" and (version := fm.causal_miscompiled()):
    pytest.skip(f"causal refused on CUDA runtime {version}")


def _tied(shape, dtype, seed):
  """Inputs on a coarse grid, so that many rows have tied maxima within a key tile."""
  q, k, v, do = make_inputs(shape, dtype, seed)
  return (jnp.round(q * 2) / 2).astype(dtype), (jnp.round(k * 2) / 2).astype(dtype), v, do


@pytest.mark.parametrize("shape,dtype,numerics,extra", [
    (Shape(2, 130, 333, 2, 2, 64), jnp.bfloat16, "fa2", {}),             # partial key tile
    (Shape(1, 256, 200, 4, 1, 128, causal=True), jnp.bfloat16, "fa2", {}),  # MQA, q_len > kv_len
    (Shape(1, 100, 300, 4, 2, 64, causal=True), jnp.float16, "fa2", dict(num_stages=3)),
    (Shape(1, 90, 90, 2, 2, 96), jnp.bfloat16, "fp32_out", {}),          # head_dim padded to 128
    (Shape(1, 40, 20, 2, 2, 64), jnp.bfloat16, "fa2", dict(num_stages=4)),  # q, kv < 64; stages > tiles
    (Shape(1, 200, 390, 2, 1, 64, causal=True), jnp.bfloat16, "fa2", dict(block_k=128, num_stages=1)),
], ids=["partial-tile", "mqa-causal-d128", "f16-causal-3stages", "fp32_out-d96", "short",
        "block_k128-1stage"])
@pytest.mark.parametrize("stabilize", [False, True], ids=["plain", "stable"])
def test_mosaic_gpu_matches_triton_forward(shape, dtype, numerics, extra, stabilize):
  """The Triton kernel's rounding points, with float32 differences (exp2; on the GPU also
  fused_pv): the outputs agree to one ulp of the output dtype in interpret mode (the float32
  summation order of a row sum may differ by an FMA; two on the GPU, whose Mosaic exp/log are
  approximations), and so do the gradients (to one
  bf16 ulp at their scale), which the Triton backward computes from each forward's out and
  lse. num_stages changes nothing but speed."""
  _skip_if_causal_refused(shape.causal)
  q, k, v, do = _tied(shape, dtype, 3)
  turns = fm.MosaicGPUOptions(pingpong=True)                  # eager calls: the GPU's schedule
  kw = dict(causal=shape.causal, stabilize=stabilize, numerics=numerics,
            block_k=extra.get("block_k"))
  ulps = 1 if jax.default_backend() == "cpu" else 2

  def run(backend, **more):
    out, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, backend=backend, **kw, **more),
                       q, k, v)
    return (out,) + vjp(do.astype(out.dtype))
  mgpu, triton = run("mosaic_gpu", num_stages=extra.get("num_stages"), mgpu_options=turns), run("triton")
  assert mgpu[0].dtype == triton[0].dtype and mgpu[0].shape == triton[0].shape
  for name, a, b in zip(TENSORS, mgpu, triton):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), name
    ulp = bf16_ulp(b) if dtype == jnp.bfloat16 else np.spacing(np.abs(b).astype(np.float16)).astype(np.float64)
    if name != "out":         # an ulp of O moves delta, so every gradient element: one ulp
      ulp = ulp_at_scale(b)   # at the tensor's scale (the bound the FP64 tests use per ulp)
    assert np.all(np.abs(a - b) <= ulps * ulp + 1e-12), (name, np.abs(a - b).max())
  if stabilize:               # the compensation fired: it changes the output on tied rows
    plain = flash_attention(q, k, v, backend="mosaic_gpu", causal=shape.causal, numerics=numerics)
    assert not np.array_equal(np.asarray(plain), np.asarray(mgpu[0]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(numerics="paper"), "numerics='paper'"),
    (dict(return_stats=True), "return_stats"),
    (dict(block_k=32), "block_k=32"),
    (dict(block_k=256), "block_k=256"),
    (dict(num_stages=0), "num_stages=0"),
    (dict(num_stages=2.5), "num_stages=2.5"),
    (dict(block_k=128, num_stages=4), r"block_k=128 with num_stages=4 at head_dim=128: \d+\.\d KiB"),
    (dict(backend="cuda"), "backend='cuda'"),
])
def test_mosaic_gpu_refusals_name_the_value(kwargs, match):
  q, k, v, _ = make_inputs(Shape(1, 256, 256, 1, 1, 128), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match=match):
    flash_attention(q, k, v, **{"backend": "mosaic_gpu", **kwargs})


def test_mosaic_gpu_refuses_small_head_dim_and_float32():
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 1, 1, 16), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match="head_dim=16 after padding"):
    flash_attention(q, k, v, backend="mosaic_gpu")
  q, k, v, _ = make_inputs(Shape(1, 256, 256, 1, 1, 192), jnp.bfloat16, 0)
  with pytest.raises(ValueError, match=r"block_k=128 at head_dim=256 \(registers"):
    flash_attention(q, k, v, backend="mosaic_gpu", block_k=128)
  with pytest.raises(ValueError, match=r"fp32_out.*|KiB of shared memory"):
    flash_attention(q, k, v, backend="mosaic_gpu", numerics="fp32_out")
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


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mosaic_gpu_without_pingpong_is_the_same_function(causal):
  """The ping-pong schedule orders the warpgroups, not the arithmetic: without it the output
  is bit-identical (interpret mode; on the GPU too, as the same instructions run)."""
  _skip_if_causal_refused(causal)
  q, k, v, _ = _tied(Shape(1, 200, 260, 2, 1, 64, causal=causal), jnp.bfloat16, 5)
  run = lambda turns: np.asarray(flash_attention(
      q, k, v, causal=causal, stabilize=True, backend="mosaic_gpu",
      mgpu_options=fm.MosaicGPUOptions(pingpong=turns)))
  assert np.array_equal(run(False), run(True))


def test_mosaic_gpu_jitted_forward_backward_matches_eager():
  """A jitted forward+backward (what `flashstable bench` and training run) finishes and equals
  the eager one; block_k and num_stages may be NumPy integers."""
  q, k, v, do = make_inputs(Shape(1, 128, 128, 2, 2, 64), jnp.bfloat16, 6)
  f = lambda q, k, v: flash_attention(q, k, v, backend="mosaic_gpu", block_k=np.int32(64),
                                      num_stages=np.int64(2))

  def fwd_bwd(q, k, v, do):
    out, vjp = jax.vjp(f, q, k, v)
    return (out,) + vjp(do)
  for a, b in zip(jax.jit(fwd_bwd)(q, k, v, do), fwd_bwd(q, k, v, do)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
