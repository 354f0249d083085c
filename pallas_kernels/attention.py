"""The differentiable flash-attention op: each backend's limits (`supported`), the launch
heuristics (`kernel_config`), padding and the custom_vjp wiring.

Everything a kernel decides for itself lives here or beside the kernel, not in the public layer
(`jax_flashstable.attention.api`): tile defaults (`policy.BlockSizes`), Triton warps and
stages, the Mosaic GPU forward's key tile and speed options (`forward_mgpu.MosaicGPUOptions`),
head_dim padding.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import backward_mgpu, forward_mgpu
from pallas_kernels.backward import flash_backward
from pallas_kernels.backward_mgpu import flash_backward_mgpu
from pallas_kernels.forward import flash_forward
from pallas_kernels.forward_mgpu import MosaicGPUOptions, flash_forward_mgpu
from pallas_kernels.policy import (
  BACKENDS,
  TIE_METHODS,
  BlockSizes,
  Compensation,
  Numerics,
  next_power_of_2,
  pad_axis,
)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Everything static about one call (hashable: it is a jit/custom_vjp static argument)."""

  softmax_scale: float
  causal: bool
  q_len: int  # unpadded lengths; the kernels mask beyond them
  kv_len: int
  blocks: BlockSizes
  numerics: Numerics
  compensation: Compensation | None
  interpret: bool
  return_stats: bool = False
  num_warps: int | None = None  # forward kernel
  num_stages: int | None = None  # Triton pipeline stages; mosaic_gpu: K/V tiles in flight
  num_warps_bwd: int | None = None  # the two backward kernels
  num_stages_bwd: int | None = None  # the Triton backward's pipeline stages
  # the Mosaic GPU backward's tiles in flight, (dK/dV's, dQ's), never lowered to fit (more than
  # shared memory holds: ValueError), only clamped to the tiles a sequence has; `kernel_config`
  # sets `backward_mgpu.default_stages` (for dQ's key tile of 64); None: the backward's
  # `default_stages` for its dQ key tile
  stages_bwd_mgpu: tuple[int, int] | None = None
  # the Mosaic GPU backward dQ kernel's key tile (64 or 128); None: `backward_mgpu.DQ_BLOCK_K`.
  # Set on a `kernel_config` config, set `stages_bwd_mgpu=None` too (or counts that fit: its
  # filled-in stages were sized for the tile of 64)
  block_k_dq_mgpu: int | None = None
  backend: str = "triton"  # forward kernel: "triton" or "mosaic_gpu" (Hopper);
  # never "auto" here (`choose_backend` resolved it)
  mgpu: MosaicGPUOptions = MosaicGPUOptions()  # the Mosaic GPU forward's speed options
  backend_bwd: str = "triton"  # backward kernels: "triton" or "mosaic_gpu"
  # The compensation's tie rule (speed only, the same decisions): "top2", from the row's two
  # largest scores in one reduction (`pallas_kernels.top2`), or "count", the max then a count
  # of the scores within tol of it (a second reduction); both forwards.
  tie_method: str = "top2"

  def __post_init__(self):
    if self.tie_method not in TIE_METHODS:
      raise ValueError(f"tie_method={self.tie_method!r} is not one of {TIE_METHODS}")

  def compiler_params(self, backward=False):
    from jax.experimental.pallas import triton as plgpu

    if backward:
      return plgpu.CompilerParams(num_warps=self.num_warps_bwd, num_stages=self.num_stages_bwd)
    return plgpu.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def supported(
  backend: str,
  *,
  numerics,
  block_k=None,
  head_dim=None,
  dtype=None,
  return_stats=False,
  num_stages=None,
  delta_float32=False,
  center_keys=False,
  sum_rounded_p=False,
  backward=False,
  group=None,
) -> str | None:
  """Why `backend` cannot run a call with these settings, or None when it can (or when the
  arguments left None could still make it). The one statement of each backend's limits:
  `AttentionConfig` asks it with what a config knows, `kernel_config` with the whole call.

  numerics: a layout name or `Numerics`; head_dim: after padding to a power of two ≥ 16.
  The Triton kernels run every layout and option, and so does "auto", which falls back to
  them (`choose_backend`); the Mosaic GPU forward's limits are `forward_mgpu.supported`.
  backward=True asks about the backward kernels instead (num_stages: the backward's; group:
  num_heads // num_kv_heads): the Mosaic GPU backward's limits are `backward_mgpu.supported`;
  it runs after the Mosaic GPU forward where it supports the call, the Triton backward
  elsewhere (`kernel_config`).
  """
  name = numerics.name if isinstance(numerics, Numerics) else numerics
  if backend in ("triton", "auto"):  # auto falls back to Triton (`choose_backend`)
    return None
  if backend == "mosaic_gpu" and backward:
    return backward_mgpu.supported(
      numerics=name,
      head_dim=head_dim,
      dtype=dtype,
      num_stages=num_stages,
      group=group,
      center_keys=center_keys,
      sum_rounded_p=sum_rounded_p,
    )
  if backend == "mosaic_gpu":
    return forward_mgpu.supported(
      numerics=name,
      block_k=block_k,
      head_dim=head_dim,
      dtype=dtype,
      return_stats=return_stats,
      num_stages=num_stages,
      delta_float32=delta_float32,
      sum_rounded_p=sum_rounded_p,
    )
  return f"backend={backend!r} (one of {', '.join(BACKENDS)})"


def choose_backend(
  backend: str,
  *,
  numerics,
  block_k=None,
  head_dim=None,
  dtype=None,
  return_stats=False,
  num_stages=None,
  delta_float32=False,
  center_keys=False,
  sum_rounded_p=False,
  causal=False,
  interpret=False,
) -> str:
  """The forward kernel a call gets: `backend` itself unless it is "auto"; for "auto" the
  Mosaic GPU forward when all of these hold, else the Triton one:
  - not interpret mode (on a CPU, auto is Triton in interpret mode: the CPU's numerics and
    golden hashes are the Triton kernels');
  - the default device is a Hopper GPU (compute capability 9.0: wgmma, TMA);
  - `supported("mosaic_gpu", ...)` is None for these settings (layout, dtype, head_dim,
    block_k, stages, statistics, options);
  - causal=False, or a CUDA runtime whose ptxas compiles the causal mask
    (`forward_mgpu.causal_miscompiled`).
  Same arguments as `supported` (block_k: the tile `kernel_config` gives the Mosaic GPU
  forward), plus causal and interpret. Both choices have the same rounding points
  (`pallas_kernels.policy`); float32 intermediates may differ by ulps (`forward_mgpu`).
  """
  if backend != "auto":
    return backend
  if interpret or not forward_mgpu.on_hopper():
    return "triton"
  if (
    supported(
      "mosaic_gpu",
      numerics=numerics,
      block_k=block_k,
      head_dim=head_dim,
      dtype=dtype,
      return_stats=return_stats,
      num_stages=num_stages,
      delta_float32=delta_float32,
      center_keys=center_keys,
      sum_rounded_p=sum_rounded_p,
    )
    is not None
  ):
    return "triton"
  if causal and forward_mgpu.causal_miscompiled() is not None:
    return "triton"
  return "mosaic_gpu"


def kernel_config(
  *,
  q_len,
  kv_len,
  head_dim,
  dtype,
  softmax_scale,
  causal,
  numerics: Numerics,
  compensation,
  block_q=None,
  block_k=None,
  interpret,
  return_stats=False,
  num_warps=None,
  num_stages=None,
  backend="auto",
  mgpu_options: MosaicGPUOptions | None = None,
  group=1,
) -> KernelConfig:
  """The `KernelConfig` of one call, with every launch heuristic applied:

  - tiles: `BlockSizes.default` (the numerics' tiles; the paper layout's backward uses the
    forward tiles), shrunk to the padded sequence; the Mosaic GPU forward keeps a key tile of
    64 or more (shrinking a tile past the sequence changes nothing, and it needs 64 or 128);
  - Triton forward: 4 warps (8 when head_dim > 64) and 2 stages; backward kernels: 4 warps and
    2 stages (4 warps were faster than 8 in the H200 tile sweep, `experiments/03_tile_sweep.py`;
    figures: docs/studies/speed.md);
  - Mosaic GPU forward: 2 key/value tiles in flight, `MosaicGPUOptions()` (its scale_in_exp2
    resolved by `forward_mgpu.resolve_scale_in_exp2`: on where it changes no value);
  - backend="auto" resolved by `choose_backend` (`KernelConfig.backend` is the kernel that runs);
  - the backward (`KernelConfig.backend_bwd`): the Mosaic GPU one after the Mosaic GPU forward
    where `supported(..., backward=True)` allows (group = num_heads // num_kv_heads), else the
    Triton one; 2 tiles in flight (the Mosaic GPU one: `backward_mgpu.default_stages`, per
    kernel: (2, 1) at head_dim 256, else (2, 2); fewer where shared memory
    is short, as with grouped heads).
  Raises ValueError for num_warps other than None or 1, 2, 4, 8, 16, num_stages other than None
  or 1–8, when `supported` says the backend cannot run the call (the forward; a
  backward it cannot run falls back to Triton), for scale_in_exp2=True where
  `forward_mgpu.scale_in_exp2_refusal` refuses the scale, for wide_step=True where
  `forward_mgpu.wide_step_refusal` refuses it, or for persistent=True or
  persistent_bwd=True where the Mosaic GPU forward's or backward's persistent layout does not
  fit (`forward_mgpu.resolve_persistent`, `backward_mgpu.launch_plan`) or o_by_tma=True where
  O's rows do not (`backward_mgpu.resolve_o_by_tma`); TypeError for mgpu_options that are not a
  `MosaicGPUOptions` (used where the Mosaic GPU forward runs, unused by the Triton kernels).
  """
  if mgpu_options is not None and not isinstance(mgpu_options, MosaicGPUOptions):
    raise TypeError(f"mgpu_options must be a MosaicGPUOptions or None, got {mgpu_options!r}")
  for name, value, allowed in (
    ("num_warps", num_warps, (1, 2, 4, 8, 16)),  # Triton's: a power of two
    ("num_stages", num_stages, tuple(range(1, 9))),
  ):
    # an int (NumPy's too) in the list: not a bool, not 4.0 (Triton takes the value as given)
    if value is not None and (
      isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value not in allowed
    ):
      raise ValueError(f"{name} must be None or one of {allowed}, got {name}={value!r}")
  blocks = BlockSizes.default(head_dim, block_q, block_k).for_numerics(numerics)
  fitted = blocks.fit(q_len, kv_len)
  # the Mosaic GPU forward keeps a key tile of 64 or more (the same numerics: padding adds no
  # score and no tie)
  fitted_mgpu = dataclasses.replace(fitted, block_k=max(fitted.block_k, min(blocks.block_k, 64)))
  padded_head_dim = max(16, next_power_of_2(head_dim))
  stages = num_stages if num_stages is not None else 2
  backend = choose_backend(
    backend,
    numerics=numerics,
    block_k=fitted_mgpu.block_k,
    head_dim=padded_head_dim,
    dtype=dtype,
    return_stats=return_stats,
    num_stages=stages,
    delta_float32=numerics.delta_float32,
    center_keys=numerics.center_keys,
    sum_rounded_p=numerics.sum_rounded_p,
    causal=causal,
    interpret=interpret,
  )
  if backend == "mosaic_gpu":
    fitted = fitted_mgpu
  why = supported(
    backend,
    numerics=numerics,
    block_k=fitted.block_k,
    head_dim=padded_head_dim,
    dtype=dtype,
    return_stats=return_stats,
    num_stages=stages,
    delta_float32=numerics.delta_float32,
    center_keys=numerics.center_keys,
    sum_rounded_p=numerics.sum_rounded_p,
  )
  if why is not None:
    given = (
      f" (query.shape[3] = {head_dim})" if padded_head_dim != head_dim and "head_dim" in why else ""
    )
    raise ValueError(f"backend={backend!r} does not support {why}{given}")
  options = mgpu_options if mgpu_options is not None else MosaicGPUOptions()
  if backend == "mosaic_gpu":  # its None resolved: on where exact (a power-of-two scale)
    options = forward_mgpu.resolve_scale_in_exp2(options, softmax_scale, compensation)
    options = forward_mgpu.resolve_wide_step(  # None: on for a GPU wherever it runs
      options,
      numerics=numerics.name,
      block_k=fitted.block_k,
      head_dim=padded_head_dim,
      dtype=dtype,
      stages=stages,
      kv_len=kv_len,
      out_dtype=numerics.output_dtype(dtype),
      interpret=interpret,
    )
  backend_bwd, stages_mgpu_bwd = "triton", None
  stages_mgpu = backward_mgpu.default_stages(
    padded_head_dim, group, numerics.center_keys, persistent=bool(options.persistent_bwd)
  )
  if (
    backend == "mosaic_gpu"
    and supported(
      "mosaic_gpu",
      backward=True,
      numerics=numerics,
      head_dim=padded_head_dim,
      dtype=dtype,
      num_stages=stages_mgpu,
      group=group,
      center_keys=numerics.center_keys,
      sum_rounded_p=numerics.sum_rounded_p,
    )
    is None
  ):
    backend_bwd, stages_mgpu_bwd = "mosaic_gpu", stages_mgpu
  cfg = KernelConfig(
    softmax_scale=softmax_scale,
    causal=bool(causal),
    q_len=q_len,
    kv_len=kv_len,
    blocks=fitted,
    numerics=numerics,
    compensation=compensation,
    interpret=bool(interpret),
    return_stats=bool(return_stats),
    num_warps=num_warps if num_warps is not None else (4 if head_dim <= 64 else 8),
    num_stages=stages,
    num_warps_bwd=4,
    num_stages_bwd=2,
    stages_bwd_mgpu=stages_mgpu_bwd,
    backend=backend,
    mgpu=options,
    backend_bwd=backend_bwd,
  )
  # persistent=True or persistent_bwd=True where they do not fit: refused before any kernel runs
  if backend == "mosaic_gpu" and options.persistent:
    stages_fwd = forward_mgpu.key_tiles(cfg)[1]
    out_dtype = numerics.output_dtype(dtype)
    forward_mgpu.resolve_persistent(cfg, padded_head_dim, stages_fwd, out_dtype)
  if backend_bwd == "mosaic_gpu" and (options.persistent_bwd or options.o_by_tma):
    (_, stages_dq), (_, persistent_dq) = backward_mgpu.launch_plan(cfg, padded_head_dim, group)
    backward_mgpu.resolve_o_by_tma(cfg, padded_head_dim, stages_dq, persistent_dq)
  return cfg


@jax.custom_jvp
def _first_order_only(inputs):
  """The identity on the kernels' inputs, whose derivative is refused in one line: the custom
  vjp's forward and backward are differentiated only by a second derivative (a grad of a
  grad, `jax.hessian`, a jvp of a grad), which the kernels do not have; without it that fails
  inside Pallas' batching or linearisation rules, naming no call."""
  return inputs


@_first_order_only.defjvp
def _first_order_only_jvp(primals, tangents):
  raise NotImplementedError(
    "flash_attention has first derivatives only: its backward is a Pallas kernel under "
    "jax.custom_vjp, with no derivative of its own (jax.hessian, a grad of a grad and a jvp of "
    "a grad are not supported)"
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, seeds, cfg):
  return _flash_fwd(q, k, v, seeds, cfg)[0]


def _flash_fwd(q, k, v, seeds, cfg):
  q, k, v = _first_order_only((q, k, v))  # differentiated only under a second derivative
  if cfg.backend == "mosaic_gpu":
    forward_mgpu.check_device(cfg)
    out, m, log_l, stats, o32 = flash_forward_mgpu(q, k, v, cfg)
  else:
    out, m, log_l, stats, o32 = flash_forward(q, k, v, cfg, seeds)
  stats = (m + log_l, m) + stats if cfg.return_stats else ()  # lse, row_max, max_p, tied
  # delta's O: the output as returned, or the float32 O (delta_float32)
  return (out, stats), (q, k, v, seeds, out if o32 is None else o32, m, log_l)


def _flash_bwd(cfg, res, cotangents):
  q, k, v, seeds, out, m, log_l = res
  d_out, d_stats = cotangents
  q, k, v, out, m, log_l, d_out = _first_order_only((q, k, v, out, m, log_l, d_out))
  # ∂lse/∂S = P, so an lse cotangent enters dS = P∘(dP − delta) as delta − d_lse. The other
  # statistics (row_max, max_p, tied_tiles) are not differentiated: their cotangents are dropped.
  d_lse = d_stats[0] if d_stats else None
  d_seeds = np.zeros(seeds.shape, jax.dtypes.float0)
  backward = flash_backward_mgpu if cfg.backend_bwd == "mosaic_gpu" else flash_backward
  return backward(q, k, v, out, m, log_l, d_out, cfg, d_lse) + (d_seeds,)


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
  q = pad_axis(pad_axis(query, 1, q_len_p), 3, d_p)
  k = pad_axis(pad_axis(key, 1, kv_len_p), 3, d_p)
  v = pad_axis(pad_axis(value, 1, kv_len_p), 3, d_p)
  if seeds is None:
    seeds = jnp.zeros((2,), jnp.uint32)
  out, stats = _flash(q, k, v, seeds, cfg)
  return out[:, :q_len, :, :head_dim], tuple(s[:, :, :q_len] for s in stats)
