"""GPT-2 in nnx: names, shapes, parameter count, initialisation, per-layer attention."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.models.gpt2 import GPT, GPTConfig, count_params


def test_gpt2_small_parameter_count_and_names():
  model = nnx.eval_shape(lambda: GPT(GPTConfig.preset("gpt2-small"), rngs=nnx.Rngs(0)))
  n = count_params(model)
  # nanoGPT's GPT-2 small with vocab 50304: 124,475,904 parameters (tied wte)
  assert n == 124_475_904
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  names = {".".join(map(str, path)) for path, _ in flat}
  for name in [
    "wte.embedding",
    "wpe.embedding",
    "h.0.ln_1.scale",
    "h.0.attn.c_attn.kernel",
    "h.0.attn.c_proj.kernel",
    "h.11.mlp.c_fc.kernel",
    "h.11.mlp.c_proj.bias",
    "ln_f.scale",
  ]:
    assert name in names, name
  shapes = {".".join(map(str, p)): v.shape for p, v in flat}
  assert shapes["h.0.attn.c_attn.kernel"] == (768, 2304) and shapes["wpe.embedding"] == (1024, 768)


def test_forward_shapes_init_and_per_layer_attention():
  cfg = GPTConfig.preset(
    "tiny", n_layer=3, attention_overrides=((1, AttentionConfig.parse("reference-fp32")),)
  )
  model = GPT(cfg, rngs=nnx.Rngs(0))
  assert [b.attn.attention.implementation for b in model.h] == ["flash", "reference", "flash"]
  logits = model(jnp.zeros((2, 20), jnp.int32))
  assert logits.shape == (2, 20, 50304) and logits.dtype == jnp.float32
  std = float(np.std(np.asarray(model.h[0].mlp.c_fc.kernel[...])))
  proj = float(np.std(np.asarray(model.h[0].mlp.c_proj.kernel[...])))
  assert abs(std - 0.02) < 0.002 and abs(proj - 0.02 / np.sqrt(6)) < 0.001
  assert model.h[0].attn.c_attn.bias is None  # tiny has bias=False


def test_causality_of_the_model():
  """Changing a later token must not change earlier logits (the mask reaches the kernel)."""
  model = GPT(GPTConfig.preset("tiny"), rngs=nnx.Rngs(1))
  a = jnp.arange(30, dtype=jnp.int32)[None] * 7
  b = a.at[0, 20].set(5)
  la, lb = model(a), model(b)
  np.testing.assert_array_equal(np.asarray(la[:, :20]), np.asarray(lb[:, :20]))
  assert not np.array_equal(np.asarray(la[:, 20:]), np.asarray(lb[:, 20:]))


def test_bad_model_configs():
  with pytest.raises(ValueError, match="'gpt5'"):
    GPTConfig.preset("gpt5")
  with pytest.raises(ValueError, match="n_heads"):
    GPTConfig.preset("tiny", n_heads=3)
  with pytest.raises(ValueError, match="n_head=3"):
    GPTConfig.preset("tiny", n_head=3)
  with pytest.raises(ValueError, match="layer 5"):
    GPTConfig.preset("tiny", attention_overrides=((5, AttentionConfig()),))
  model = GPT(GPTConfig.preset("tiny"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="block_size=128"):
    model(jnp.zeros((1, 129), jnp.int32))
