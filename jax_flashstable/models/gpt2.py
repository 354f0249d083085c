"""GPT-2 in flax.nnx, nanoGPT's architecture, with the attention chosen per layer.

Token + learned position embeddings, pre-LayerNorm blocks (causal self-attention, GELU MLP
4×), final LayerNorm, output projection tied to `wte`. Initialisation as nanoGPT / GPT-2:
normal(0, 0.02) weights, zero biases, and the residual projections (`c_proj`) at
0.02/√(2·n_layer) (GPT-2 paper §2.3). Parameter names follow GPT-2's checkpoint
(`wte`, `wpe`, `h.N.ln_1`, `h.N.attn.c_attn`, `h.N.attn.c_proj`, `h.N.ln_2`, `h.N.mlp.c_fc`,
`h.N.mlp.c_proj`, `ln_f`), so tensors map across frameworks by name; our Linear kernels are
[in, out] like GPT-2's Conv1D weights (PyTorch nn.Linear stores [out, in]).

Precision follows PyTorch BF16 autocast (the paper's setting): parameters float32, matmuls in
bfloat16 (`compute_dtype`), LayerNorm, the residual stream and the loss in float32.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.checks import integer


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  block_size: int = 1024  # context length
  vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64 (nanoGPT)
  bias: bool = True
  compute_dtype: str = "bfloat16"  # matmul dtype; "float32" for a full-precision model
  attention: AttentionConfig = AttentionConfig()
  # (layer index, config) pairs that replace `attention` in those layers (0-based)
  attention_overrides: tuple[tuple[int, AttentionConfig], ...] = ()

  def __post_init__(self):
    """Raises ValueError naming the field for a size < 1, an unknown compute_dtype, n_embd not
    a multiple of n_head, or an attention override of a layer the model does not have."""
    for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
      object.__setattr__(self, name, integer(name, getattr(self, name), 1))
    if self.compute_dtype not in ("bfloat16", "float16", "float32"):
      raise ValueError(
        f"compute_dtype={self.compute_dtype!r} must be 'bfloat16', 'float16' or 'float32'"
      )
    if self.n_embd % self.n_head:
      raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")
    for i, _ in self.attention_overrides:
      if not 0 <= i < self.n_layer:
        raise ValueError(f"attention override for layer {i}, but n_layer={self.n_layer}")

  def attention_for(self, layer: int) -> AttentionConfig:
    return dict(self.attention_overrides).get(layer, self.attention)

  @property
  def head_dim(self):
    return self.n_embd // self.n_head

  @classmethod
  def preset(cls, name: str, **overrides) -> "GPTConfig":
    """A named size ("gpt2-small", "tiny", …) with any field overridden."""
    if name not in MODEL_PRESETS:
      raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(MODEL_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(cls)}
    bad = set(overrides) - fields
    if bad:
      raise ValueError(f"unknown GPTConfig field(s) {sorted(bad)}")
    return dataclasses.replace(MODEL_PRESETS[name], **overrides)


MODEL_PRESETS = {
  "gpt2-small": GPTConfig(),
  # the instability anchor of issue 6 (6 layers, 6 heads, width 384, no bias, context 1024)
  "gpt-6l": GPTConfig(n_layer=6, n_head=6, n_embd=384, bias=False),
  # trains on a 2-core CPU
  "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128, bias=False),
}


def _linear(cfg, n_in, n_out, std, rngs):
  return nnx.Linear(
    n_in,
    n_out,
    use_bias=cfg.bias,
    dtype=jnp.dtype(cfg.compute_dtype),
    param_dtype=jnp.float32,
    kernel_init=nnx.initializers.normal(std),
    rngs=rngs,
  )


def _layer_norm(cfg, rngs):
  return nnx.LayerNorm(
    cfg.n_embd,
    epsilon=1e-5,
    use_bias=cfg.bias,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    rngs=rngs,
  )


class CausalSelfAttention(nnx.Module):
  """Multi-head causal self-attention whose softmax(QKᵀ)V runs through `AttentionConfig`."""

  def __init__(self, cfg: GPTConfig, attention: AttentionConfig, *, rngs: nnx.Rngs):
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    self.c_attn = _linear(cfg, cfg.n_embd, 3 * cfg.n_embd, 0.02, rngs)
    self.c_proj = _linear(cfg, cfg.n_embd, cfg.n_embd, proj_std, rngs)
    self.n_head = cfg.n_head
    self.attention = attention

  def __call__(self, x, probe=None, rng_key=None):
    """`probe` (diagnostics only): None, or (zeros [b, t, h, d] float32 added to the attention
    output so that its gradient is dO, a list that receives (q, k, v, O)). `rng_key`: for
    numerics="stochastic"."""
    b, t, c = x.shape
    q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)  # 3 × [b, t, c]
    q, k, v = (y.reshape(b, t, self.n_head, c // self.n_head) for y in (q, k, v))
    y = attend(q, k, v, self.attention, causal=True, rng_key=rng_key)  # [b, t, h, d]
    if probe is not None:
      zero, record = probe
      record.append((q, k, v, y))
      y = (y.astype(jnp.float32) + zero).astype(y.dtype)  # exact: adds 0
    return self.c_proj(y.reshape(b, t, c))


class MLP(nnx.Module):
  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    self.c_fc = _linear(cfg, cfg.n_embd, 4 * cfg.n_embd, 0.02, rngs)
    self.c_proj = _linear(cfg, 4 * cfg.n_embd, cfg.n_embd, 0.02 / math.sqrt(2 * cfg.n_layer), rngs)

  def __call__(self, x):
    return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=False))


class Block(nnx.Module):
  def __init__(self, cfg: GPTConfig, layer: int, *, rngs: nnx.Rngs):
    self.ln_1 = _layer_norm(cfg, rngs)
    self.attn = CausalSelfAttention(cfg, cfg.attention_for(layer), rngs=rngs)
    self.ln_2 = _layer_norm(cfg, rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, probe=None, rng_key=None):  # x: [b, t, c] float32
    x = x + self.attn(self.ln_1(x), probe, rng_key)
    return x + self.mlp(self.ln_2(x))


class GPT(nnx.Module):
  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(0.02)
    self.config = cfg
    self.wte = nnx.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=init, rngs=rngs)
    self.wpe = nnx.Embed(cfg.block_size, cfg.n_embd, embedding_init=init, rngs=rngs)
    self.h = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layer)])
    self.ln_f = _layer_norm(cfg, rngs)

  def __call__(self, tokens, probes=None, rng_key=None):
    """tokens [batch, t] int32 (t ≤ block_size) → logits [batch, t, vocab_size] float32.

    `probes`: diagnostics only, one (zeros, list) per layer (see `CausalSelfAttention`).
    `rng_key`: needed when a layer uses numerics="stochastic"; layer i gets fold_in(key, i).

    Raises:
      ValueError: t > block_size, or a stochastic layer and no rng_key.
    """
    t = tokens.shape[1]
    if t > self.config.block_size:
      raise ValueError(f"sequence length {t} exceeds block_size={self.config.block_size}")
    x = self.wte(tokens) + self.wpe(jnp.arange(t))[None]
    for i, block in enumerate(self.h):
      key = None if rng_key is None else jax.random.fold_in(rng_key, i)
      x = block(x, None if probes is None else probes[i], key)
    x = self.ln_f(x)
    dt = jnp.dtype(self.config.compute_dtype)
    logits = x.astype(dt) @ self.wte.embedding[...].astype(dt).T  # tied output embedding
    return logits.astype(jnp.float32)


def loss_fn(model: GPT, tokens, targets, probes=None, rng_key=None):
  """Mean next-token cross-entropy in float32 (nats); `probes`, `rng_key`: see `GPT.__call__`."""
  logits = model(tokens, probes, rng_key)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def count_params(model_or_state) -> int:
  state = (
    nnx.state(model_or_state, nnx.Param)
    if isinstance(model_or_state, nnx.Module)
    else model_or_state
  )
  return sum(x.size for x in jax.tree.leaves(state))


def flops_per_token(cfg: GPTConfig, n_params: int, seq_len: int) -> float:
  """6·N + 12·n_layer·n_head·head_dim·T training FLOPs per token (PaLM appendix B)."""
  return 6.0 * n_params + 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
