"""backend="auto" (the default): the Mosaic GPU kernels on a Hopper GPU wherever `supported`
says they run the call, the Triton kernels elsewhere; one mechanism
(`pallas_kernels.attention.choose_backend`), visible through `resolved_backend`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.forward_mgpu as fm
from pallas_kernels import backward_mgpu
from jax_flashstable import flash_attention, resolved_backend
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.lab.shapes import Shape, make_inputs
from pallas_kernels.attention import choose_backend, kernel_config
from pallas_kernels.policy import Compensation, get_numerics


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="on a CPU auto is Triton")
def test_auto_is_the_triton_kernels_on_cpu_bit_for_bit():
  """The default on a CPU is Triton in interpret mode: outputs, statistics and gradients are
  the explicit Triton call's bits (so the CPU golden hashes cannot move)."""
  shape = Shape(1, 70, 90, 4, 2, 64, causal=True)
  q, k, v, do = make_inputs(shape, jnp.bfloat16, 7)
  assert resolved_backend(q, k, v, causal=True) == ("triton", "triton")
  assert resolved_backend(q, k, v, backend="mosaic_gpu", interpret=True) == (
    "mosaic_gpu",
    "mosaic_gpu",
  )

  def run(**kw):
    f = lambda q, k, v: flash_attention(
      q, k, v, causal=True, stabilize=True, return_stats=True, **kw
    )
    (out, stats), vjp = jax.vjp(f, q, k, v)
    return (out, *stats) + vjp((do, jax.tree.map(jnp.zeros_like, stats)))

  for a, b in zip(run(), run(backend="triton")):
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_resolved_backend_takes_flash_attentions_arguments_and_defaults():
  """resolved_backend binds its arguments with flash_attention's signature (its one set of
  defaults): an unknown argument is a TypeError naming it, a bad value flash_attention's own
  ValueError."""
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 2, 2, 64), jnp.bfloat16, 0)
  with pytest.raises(TypeError, match="block_size"):
    resolved_backend(q, k, v, block_size=64)
  with pytest.raises(ValueError, match="beta=1.0"):
    resolved_backend(q, k, v, stabilize=True, beta=1.0)
  with pytest.raises(ValueError, match="beta=1.0"):
    flash_attention(q, k, v, stabilize=True, beta=1.0)
  spec = jax.ShapeDtypeStruct(q.shape, q.dtype)
  assert resolved_backend(spec, spec, spec) == resolved_backend(q, k, v, backend="auto")


BASE = dict(
  q_len=300,
  kv_len=300,
  head_dim=128,
  dtype=jnp.bfloat16,
  softmax_scale=0.1,
  causal=False,
  numerics=get_numerics("fa2"),
  compensation=Compensation(),
  interpret=False,
)


@pytest.fixture
def hopper(monkeypatch):
  """Pretend the default device is a Hopper GPU with a CUDA runtime that compiles causal masks."""
  monkeypatch.setattr(fm, "on_hopper", lambda: True)
  monkeypatch.setattr(fm, "causal_miscompiled", lambda: None)
  return monkeypatch


def test_auto_takes_the_mosaic_gpu_kernels_on_hopper_where_supported(hopper, monkeypatch):
  cfg = kernel_config(**BASE)
  assert (cfg.backend, cfg.backend_bwd) == ("mosaic_gpu", "mosaic_gpu")
  short = kernel_config(**dict(BASE, q_len=20, kv_len=20))
  assert short.backend == "mosaic_gpu" and short.blocks.block_k == 64  # not shrunk below 64
  assert kernel_config(**dict(BASE, q_len=20, kv_len=20), backend="triton").blocks.block_k == 32
  for numerics in ("fa2", "fp32_out"):
    for dtype in (jnp.bfloat16, jnp.float16):
      for head_dim in (64, 96, 128):
        cfg = kernel_config(
          **dict(BASE, numerics=get_numerics(numerics), dtype=dtype, head_dim=head_dim, causal=True)
        )
        assert cfg.backend == "mosaic_gpu", (numerics, dtype, head_dim)
  # head_dim 17–256: the Mosaic GPU forward and backward (above a padded 128: one tile in
  # flight in each kernel with grouped heads, and the Triton backward for centred keys)
  wide = [kernel_config(**dict(BASE, head_dim=d, group=2)) for d in (20, 192)]
  assert [(c.backend, c.backend_bwd, c.stages_bwd_mgpu) for c in wide] == [
    ("mosaic_gpu", "mosaic_gpu", (2, 2)),
    ("mosaic_gpu", "mosaic_gpu", (1, 1)),  # group 2 at 256: dK/dV's float32 partials
  ]
  # head_dim 96 pads to 128 and takes 128's row (`STAGES_BY_HEAD_DIM`, none measured now: a
  # row set here) or `STAGES`
  assert kernel_config(**dict(BASE, head_dim=96)).stages_bwd_mgpu == backward_mgpu.STAGES
  monkeypatch.setattr(backward_mgpu, "STAGES_BY_HEAD_DIM", {128: (3, 2)})
  assert kernel_config(**dict(BASE, head_dim=96)).stages_bwd_mgpu == (3, 2)
  centred = get_numerics("fa2").with_options(center_keys=True)
  wide = kernel_config(**dict(BASE, head_dim=192, numerics=centred))
  assert (wide.backend, wide.backend_bwd) == ("mosaic_gpu", "triton")
  q, k, v, _ = make_inputs(Shape(1, 64, 64, 2, 2, 64), jnp.bfloat16, 0)
  assert resolved_backend(q, k, v, interpret=False).forward == "mosaic_gpu"
  assert resolved_backend(q, k, v, interpret=True).forward == "triton"  # interpret: Triton


@pytest.mark.parametrize(
  "change",
  [
    dict(numerics=get_numerics("paper")),
    dict(numerics=get_numerics("stochastic")),
    dict(numerics=get_numerics("fa2").with_options(delta_float32=True)),
    dict(dtype=jnp.float32),
    dict(return_stats=True),
    dict(block_k=32),
    dict(block_k=256),
    dict(block_k=128, num_stages=4),  # more shared memory than Hopper has
    dict(head_dim=256, block_k=128),  # registers
    dict(head_dim=16),
    dict(interpret=True),
  ],
  ids=[
    "paper",
    "stochastic",
    "delta_float32",
    "float32",
    "return_stats",
    "block_k32",
    "block_k256",
    "smem",
    "d256-block_k128",
    "d16",
    "interpret",
  ],
)
def test_auto_falls_back_to_triton_where_mosaic_gpu_refuses(hopper, change):
  """Every refusal of `supported` is a fallback for auto, and an error for explicit
  backend="mosaic_gpu" (except interpret mode, which the Mosaic GPU kernels also run in)."""
  kw = dict(BASE, **change)
  assert kernel_config(**kw).backend == "triton"
  if not kw["interpret"]:
    with pytest.raises(ValueError, match="backend='mosaic_gpu' does not support"):
      kernel_config(**kw, backend="mosaic_gpu")


def test_auto_falls_back_for_causal_on_a_miscompiling_cuda(hopper):
  hopper.setattr(fm, "causal_miscompiled", lambda: 12080)
  assert kernel_config(**dict(BASE, causal=True)).backend == "triton"
  assert kernel_config(**BASE).backend == "mosaic_gpu"


def test_auto_off_hopper_is_triton(monkeypatch):
  monkeypatch.setattr(fm, "on_hopper", lambda: False)
  assert kernel_config(**BASE).backend == "triton"
  assert choose_backend("auto", numerics="fa2") == "triton"
  assert choose_backend("mosaic_gpu", numerics="paper") == "mosaic_gpu"  # explicit: as asked


def test_attention_config_default_is_auto_and_explicit_choices_parse():
  assert AttentionConfig().backend == "auto" and AttentionConfig.parse("fa2").backend == "auto"
  triton = AttentionConfig.parse("fa2+comp+triton")
  assert triton.backend == "triton" and triton.name == "fa2+comp+triton"
  assert AttentionConfig.parse(triton.name) == triton
  assert AttentionConfig.parse("paper").flash_kwargs()["backend"] == "auto"  # paper: Triton
  with pytest.raises(ValueError, match="backend='mosaic_gpu' does not support numerics='paper'"):
    AttentionConfig.parse("paper+mgpu")
  with pytest.raises(ValueError, match="'auto', 'triton', 'mosaic_gpu'"):
    flash_attention(*make_inputs(Shape(1, 8, 8, 1, 1, 16), jnp.bfloat16)[:3], backend="cuda")
  assert dataclasses.replace(AttentionConfig(), backend="mosaic_gpu").name == "fa2+mgpu"
