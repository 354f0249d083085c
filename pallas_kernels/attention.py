"""The differentiable flash-attention op: padding, configuration and the custom_vjp wiring."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.backward import flash_backward
from pallas_kernels.forward import flash_forward
from pallas_kernels.forward_mgpu import flash_forward_mgpu
from pallas_kernels.policy import BlockSizes, Compensation, Numerics, next_power_of_2


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Everything static about one call (hashable: it is a jit/custom_vjp static argument)."""
  softmax_scale: float
  causal: bool
  q_len: int          # unpadded lengths; the kernels mask beyond them
  kv_len: int
  blocks: BlockSizes
  numerics: Numerics
  compensation: Compensation | None
  interpret: bool
  return_stats: bool = False
  num_warps: int | None = None        # forward kernel
  num_stages: int | None = None      # Triton pipeline stages; mosaic_gpu: K/V tiles in flight
  num_warps_bwd: int | None = None    # the two backward kernels
  num_stages_bwd: int | None = None
  backend: str = "triton"             # forward kernel: "triton" or "mosaic_gpu" (Hopper)

  def compiler_params(self, backward=False):
    from jax.experimental.pallas import triton as plgpu
    if backward:
      return plgpu.CompilerParams(num_warps=self.num_warps_bwd, num_stages=self.num_stages_bwd)
    return plgpu.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def _pad_axis(x, axis, size):
  pad = size - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, seeds, cfg):
  return _flash_fwd(q, k, v, seeds, cfg)[0]


def _flash_fwd(q, k, v, seeds, cfg):
  if cfg.backend == "mosaic_gpu":
    out, lse, stats = flash_forward_mgpu(q, k, v, cfg)
  else:
    out, lse, stats = flash_forward(q, k, v, cfg, seeds)
  stats = (lse,) + stats if cfg.return_stats else ()
  return (out, stats), (q, k, v, seeds, out, lse)


def _flash_bwd(cfg, res, cotangents):
  q, k, v, seeds, out, lse = res
  d_out, d_stats = cotangents
  # ∂lse/∂S = P, so an lse cotangent enters dS = P∘(dP − delta) as delta − d_lse. The other
  # statistics (row_max, max_p, tied_tiles) are not differentiated: their cotangents are dropped.
  d_lse = d_stats[0] if d_stats else None
  d_seeds = np.zeros(seeds.shape, jax.dtypes.float0)
  return flash_backward(q, k, v, out, lse, d_out, cfg, d_lse) + (d_seeds,)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention_padded(query, key, value, cfg: KernelConfig, seeds=None):
  """Pads to the tiles (sequence) and to a power of two ≥ 16 (head_dim), runs, slices back.

  Padding happens outside the custom_vjp, so its gradient (a slice) is JAX's own. Triton in
  jax 0.11.2 does not mask partial blocks: with padding the GPU never reads or writes past an
  array. Zero-padded head_dim columns add nothing to QKᵀ and produce zero output columns.
  Returns (out [batch, q_len, heads, head_dim], () or (lse, row_max, max_p, tied_tiles), each
  [batch, heads, q_len] float32).
  """
  b = cfg.blocks
  q_len, kv_len, head_dim = query.shape[1], key.shape[1], query.shape[3]
  mq, mk = max(b.block_q, b.block_q_bwd), max(b.block_k, b.block_k_bwd)
  q_len_p, kv_len_p = -(-q_len // mq) * mq, -(-kv_len // mk) * mk
  d_p = max(16, next_power_of_2(head_dim))
  q = _pad_axis(_pad_axis(query, 1, q_len_p), 3, d_p)
  k = _pad_axis(_pad_axis(key, 1, kv_len_p), 3, d_p)
  v = _pad_axis(_pad_axis(value, 1, kv_len_p), 3, d_p)
  if seeds is None:
    seeds = jnp.zeros((2,), jnp.uint32)
  out, stats = _flash(q, k, v, seeds, cfg)
  return out[:, :q_len, :, :head_dim], tuple(s[:, :, :q_len] for s in stats)
