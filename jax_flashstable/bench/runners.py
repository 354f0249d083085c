"""What the bench can time, by name: any attention spec of `AttentionConfig`'s grammar (our
kernels in every layout and backend, "xla" and "cudnn" through `jax.nn.dot_product_attention`,
the materialized references), and outside it "pallas-mgpu" (JAX's own Mosaic GPU attention)
and "torch-<backend>" (torch SDPA restricted to one backend, GPU only).

`runs(name, shape, q, k, v, do)` gives (forward, forward+backward, output): the two callables
take `calls` and wait once (`timing.waiting`).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention.config import PRESETS, AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.bench.timing import waiting

TORCH_BACKENDS = ("flash", "cudnn", "efficient", "math")
EXTERNAL = ("pallas-mgpu",) + tuple(f"torch-{b}" for b in TORCH_BACKENDS)
NAME_FORMS = (
  f"an attention spec (PRESET[+MODIFIER...][:FIELD=VALUE,...], presets: "
  f"{', '.join(PRESETS)}; e.g. fa2+comp+mgpu:block_k=128)",
) + EXTERNAL


def attention_config(name: str) -> AttentionConfig | None:
  """The AttentionConfig a bench name stands for (None for an external implementation).
  Raises ValueError naming the name when it is neither."""
  if name in EXTERNAL:
    return None
  try:
    return AttentionConfig.parse(name)
  except ValueError as e:
    raise ValueError(f"unknown implementation {name!r}: {e}") from None


def name_error(name: str) -> str | None:
  """Why the bench does not know `name` (None when it does; it may still be unavailable on
  this machine, e.g. cudnn off a GPU)."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", FutureWarning)
      attention_config(name)
  except ValueError as e:
    return str(e)
  return None


def kernels(name, shape, q, k, v) -> str | None:
  """ "forward/backward" kernels ("triton", "mosaic_gpu") that our attention `name` runs on this
  problem here (backend="auto" resolved: `resolved_backend`); None for the others."""
  config = attention_config(name)
  if config is None or config.implementation != "flash":
    return None
  from jax_flashstable.attention.api import resolved_backend

  key = jax.random.key(0) if config.numerics == "stochastic" else None
  return "/".join(
    resolved_backend(q, k, v, causal=shape.causal, rng_key=key, **config.flash_kwargs())
  )


def runs(name, shape, q, k, v, do):
  """(fwd, fwd+bwd, out as float32 NumPy) for one implementation on one problem."""
  if name.startswith("torch-"):
    return _torch_runs(name, shape, q, k, v, do)
  if name == "pallas-mgpu":
    f, prepare = _mosaic_gpu_attention(shape)
    q, k, v, do = prepare(q, k, v, do)
  else:
    config = attention_config(name)
    key = jax.random.key(0) if config.numerics == "stochastic" else None  # a fixed stream
    f = lambda q, k, v: attend(q, k, v, config, causal=shape.causal, rng_key=key)
  fwd = jax.jit(f)

  def fwd_bwd(q, k, v, do):
    out, vjp = jax.vjp(f, q, k, v)
    return vjp(do.astype(out.dtype))  # fp32_out returns float32

  fb = jax.jit(fwd_bwd)
  out = fwd(q, k, v)
  return waiting(fwd, q, k, v), waiting(fb, q, k, v, do), np.asarray(out, np.float32)


def _mosaic_gpu_attention(shape, block_kv=128, stages=2):
  """JAX's own Pallas Mosaic GPU attention for Hopper (`jax.experimental.pallas.ops.gpu.
  attention_mgpu`: wgmma, TMA, warp-specialised; forward and backward; head_dim a multiple of
  64): what Mosaic GPU reaches on this GPU. In jax 0.11.2 its forward's shared-memory buffers
  are float16 whatever the input dtype, so it runs on float16 inputs (same bytes and
  tensor-core rate as bfloat16), and it applies no softmax scale, so the query is scaled first.
  block_kv, stages: its forward's key tile (64 or 128) and key tiles in flight (the bench's:
  128 and 2; experiments/11_mgpu_forward_ab.py's `jax=1` variants set them).
  Returns (f, prepare): prepare converts the inputs once, outside the timed function."""
  if jax.default_backend() != "gpu":
    raise RuntimeError("Mosaic GPU needs a CUDA GPU (Hopper)")
  scale = shape.head_dim**-0.5
  prepare = lambda q, k, v, do: (
    (q.astype(jnp.float32) * scale).astype(jnp.float16),
    *(x.astype(jnp.float16) for x in (k, v, do)),
  )
  return mosaic_gpu_attention_unchecked(shape, block_kv, stages), prepare


def mosaic_gpu_attention_unchecked(shape, block_kv=128, stages=2):
  """`_mosaic_gpu_attention`'s function (float16 inputs, the query scaled), without the check
  for a GPU: to lower it for CUDA on a CPU (experiments/20_ptxas_report.py)."""
  from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu

  cfg = mgpu.TuningConfig(
    block_q=64,
    block_kv=block_kv,
    max_concurrent_steps=stages,
    causal=shape.causal,
    block_q_dkv=64,
    block_kv_dkv=64,
    block_q_dq=64,
    block_kv_dq=64,
  )
  return lambda q, k, v: mgpu.attention(q, k, v, cfg)


def _torch_runs(name, shape, q, k, v, do):
  """The same for torch SDPA restricted to one backend ([b, s, h, d] in, bhsd inside)."""
  import torch
  from torch.nn.attention import SDPBackend, sdpa_kernel

  backend = dict(
    zip(
      TORCH_BACKENDS,
      (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
      ),
    )
  )[name[len("torch-") :]]
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  conv = lambda x: (
    torch.tensor(np.asarray(x, np.float32)).to(torch.bfloat16).to(dev).transpose(1, 2).contiguous()
  )
  tq, tk, tv, tdo = (conv(x) for x in (q, k, v, do))
  tq.requires_grad_(), tk.requires_grad_(), tv.requires_grad_()
  gqa = shape.num_heads != shape.num_kv_heads
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

  sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(
    tq, tk, tv, is_causal=shape.causal, enable_gqa=gqa
  )

  def fwd(calls=1):  # `waiting`'s form: calls back to back, one wait
    with sdpa_kernel([backend]), torch.no_grad():
      for _ in range(calls):
        out = sdpa()
    sync()
    return out

  def fb(calls=1):
    with sdpa_kernel([backend]):
      for _ in range(calls):
        torch.autograd.grad(sdpa(), (tq, tk, tv), tdo)
    sync()

  return fwd, fb, fwd().transpose(1, 2).float().cpu().numpy()
