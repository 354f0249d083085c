"""attention_fn in flax.nnx and flax.linen: wiring, options reaching the kernel, clear errors."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

import jax_flashstable.attention.api as attention_module
from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.attention.flax_adapter import attend, attention_fn, make_attention_fn


@pytest.fixture
def recorder(monkeypatch):
  calls = []
  real = attention_module.flash_attention

  def record(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(attention_module, "flash_attention", record)
  return calls


CFG = AttentionConfig("flash", stabilize=True, beta=3.0, tie_tolerance=0.01, block_q=32, block_k=16)
# Flax's own attention and XLA's run float32 dots at JAX's default matmul precision, TF32 on a
# GPU (1.5e-3 off the kernels' float32 here, H100, 2026-12-07); the kernels' dots are float32
# (`Precision.HIGHEST`), so the comparisons run XLA's at that precision too
FLOAT32_DOTS = jax.default_matmul_precision("highest")


def test_nnx_multihead_attention(recorder):
  x = jax.random.normal(jax.random.key(0), (2, 40, 48), jnp.float32)
  kw = dict(num_heads=3, in_features=48, decode=False, rngs=nnx.Rngs(0))
  ours = nnx.MultiHeadAttention(**kw, attention_fn=make_attention_fn(CFG))
  theirs = nnx.MultiHeadAttention(**kw)
  nnx.update(theirs, nnx.state(ours))
  with FLOAT32_DOTS:
    y = ours(x, is_causal=True)
    want = theirs(x, mask=nnx.make_causal_mask(jnp.ones((2, 40))))
  np.testing.assert_allclose(np.asarray(y), np.asarray(want), atol=2e-5)
  (call,) = recorder
  assert call == dict(
    causal=True,
    softmax_scale=pytest.approx(16**-0.5),
    stabilize=True,
    beta=3.0,
    tie_tolerance=0.01,
    numerics="fa2",
    block_q=32,
    block_k=16,
    rng_key=None,
    backend="auto",
    delta_float32=False,
    center_keys=False,
    single_lse=False,
    sum_rounded_p=False,
    guard_shift=False,
    max_shift=None,
    shift_above=0.0,
    mgpu_options=None,
  )


def test_linen_multihead_attention_with_partial_causal(recorder):
  x = jax.random.normal(jax.random.key(1), (2, 24, 32), jnp.float32)
  ours = linen.MultiHeadDotProductAttention(
    num_heads=2, attention_fn=make_attention_fn(CFG, causal=True)
  )
  params = ours.init(jax.random.key(2), x)
  mask = linen.make_causal_mask(jnp.ones((2, 24)))
  with FLOAT32_DOTS:
    y = ours.apply(params, x)
    want = linen.MultiHeadDotProductAttention(num_heads=2).apply(params, x, mask=mask)
  np.testing.assert_allclose(np.asarray(y), np.asarray(want), atol=2e-5)
  assert recorder[-1]["causal"] is True and recorder[-1]["block_k"] == 16


def test_unsupported_options_raise():
  fn = make_attention_fn("fa2")
  q = jnp.zeros((1, 8, 2, 16))
  with pytest.raises(NotImplementedError, match="mask"):
    fn(q, q, q, mask=jnp.ones((1, 1, 8, 8), bool))
  with pytest.raises(NotImplementedError, match="dropout_rate=0.1"):
    fn(q, q, q, dropout_rate=0.1, deterministic=False)
  with pytest.raises(NotImplementedError, match="bias"):
    fn(q, q, q, bias=jnp.zeros((1, 2, 8, 8)))
  assert fn(q, q, q, dropout_rate=0.1, deterministic=True).shape == q.shape
  # causal and is_causal are bools, not truthy values; every implementation checks the scale
  for bad in ("no", 1, None):
    with pytest.raises(TypeError, match=f"^causal must be a bool, got causal={bad!r}$"):
      make_attention_fn("fa2", causal=bad)
    with pytest.raises(TypeError, match=f"^is_causal must be a bool, got is_causal={bad!r}$"):
      fn(q, q, q, is_causal=bad)
  for spec in ("xla", "reference-fp32", "fa2"):
    config = AttentionConfig.parse(spec)
    with pytest.raises(TypeError, match="^causal must be a bool, got causal='no'$"):
      attend(q, q, q, config, causal="no")
    for scale, message in (
      (-1.0, "finite and > 0"),
      (0.0, "finite and > 0"),
      (1e39, "a normal float32"),
    ):
      with pytest.raises(ValueError, match=f"softmax_scale must be {message}"):
        attend(q, q, q, config, causal=False, softmax_scale=scale)
    with pytest.raises(TypeError, match="softmax_scale"):
      attend(q, q, q, config, causal=False, softmax_scale="0.25")


@pytest.mark.parametrize("impl", ["fa2", "reference-fp32", "reference-bf16", "xla"])
def test_every_implementation_agrees_with_fp64(impl):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((1, 33, 4, 32)), jnp.bfloat16) for _ in range(3))
  k, v = k[:, :, :2], v[:, :, :2]  # GQA
  out = attend(q, k, v, AttentionConfig.parse(impl), causal=True)
  gold = attention_module.reference_attention(q, k, v, causal=True, dtype=jnp.float64)
  assert out.dtype == jnp.bfloat16
  assert np.abs(np.asarray(out, np.float64) - gold).max() < 2e-2


@pytest.mark.parametrize("spec", ["reference-fp32", "reference-bf16"])
def test_reference_backward_recomputes_the_scores_same_values_less_memory(spec):
  """The materialized reference's backward recomputes its scores and probabilities
  (jax.checkpoint): jitted gradients of a stack of four layers bit for bit those of the
  program that keeps them, and the compiled program holds less, since each layer's scores no
  longer live until its backward (the anchor-b128 FP32 reference ran out of an H200's memory)."""
  from jax_flashstable.attention import flax_adapter

  cfg = AttentionConfig.parse(spec)
  rng = np.random.default_rng(1)
  q, k, v, d_out = (
    jnp.asarray(3 * rng.standard_normal((2, 256, 4, 32)), jnp.bfloat16) for _ in range(4)
  )
  dtype = jnp.dtype(cfg.reference_dtype)

  def grads(layer):
    def stack(q, k, v):
      for _ in range(4):
        q = layer(q, k, v, True, 0.17, dtype)
      return q

    step = jax.jit(lambda q, k, v: jax.vjp(stack, q, k, v)[1](d_out))
    return step(q, k, v), step.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

  (got, temp), (want, temp_kept) = (
    grads(flax_adapter._reference),
    grads(flax_adapter._reference_kept),
  )
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
  # kept, every layer's probabilities live until its backward; recomputed, about one layer's
  # at a time (plus the recomputation's own buffers: one layer alone saves nothing, −0.26 MB on
  # the CPU): at least three layers' [2, 4, 256, 256] less over four, in bytes of the
  # reference's dtype (measured: CPU 11.8 MB less of 22.6 and 21.5, an H100's XLA 11.4 of
  # 53.1 and 4.1 of 45.7, most of its temp its own workspace, 2026-12-07)
  probs_bytes = 2 * 4 * 256 * 256 * dtype.itemsize
  assert temp_kept - temp >= 3 * probs_bytes, (temp, temp_kept)
  out = attend(q, k, v, cfg, causal=True, softmax_scale=0.17)  # what the model calls
  kept = flax_adapter._reference_kept(q, k, v, True, 0.17, dtype)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(kept, np.float32))


def test_attention_config_parsing_and_errors():
  assert AttentionConfig.parse("fa2+comp") == AttentionConfig("flash", stabilize=True)
  assert AttentionConfig.parse("fa2+comp:block_k=32,beta=2.5") == AttentionConfig(
    "flash", stabilize=True, block_k=32, beta=2.5
  )
  assert AttentionConfig.parse("fa2:stabilize=true").name == "fa2+comp"
  with pytest.raises(ValueError, match="'nope'"):
    AttentionConfig.parse("nope")
  with pytest.raises(ValueError, match="'colour=red'"):
    AttentionConfig.parse("fa2:colour=red")
  with pytest.raises(ValueError, match=r"'\+x'"):
    AttentionConfig.parse("fa2+x")
  with pytest.raises(ValueError, match="implementation='sdpa'"):
    AttentionConfig("sdpa")
  with pytest.raises(ValueError, match="stabilize=True needs"):
    AttentionConfig("xla", stabilize=True)
  with pytest.raises(ValueError, match="stabilize=True needs"):
    AttentionConfig.parse("xla+comp")
  with pytest.raises(ValueError, match="delta_float32=True needs"):
    AttentionConfig.parse("cudnn+delta32")
  assert AttentionConfig.parse("cudnn+center") == AttentionConfig("cudnn", center_keys=True)
  with pytest.raises(ValueError, match="block_k=24"):
    AttentionConfig(block_k=24)
  assert AttentionConfig.parse("fa2+comp+mgpu") == AttentionConfig(
    "flash", stabilize=True, backend="mosaic_gpu"
  )
  with pytest.raises(ValueError, match="backend='cuda'"):
    AttentionConfig(backend="cuda")
  with pytest.raises(ValueError, match="backend='mosaic_gpu' needs implementation='flash'"):
    AttentionConfig("cudnn", backend="mosaic_gpu")
  with pytest.raises(ValueError, match="numerics='paper'"):
    AttentionConfig(numerics="paper", backend="mosaic_gpu")
  with pytest.raises(ValueError, match="block_k=32"):
    AttentionConfig(block_k=32, backend="mosaic_gpu")
  with pytest.raises(ValueError, match="delta_float32"):
    AttentionConfig.parse("fa2+mgpu+delta32")


def test_mosaic_gpu_options_in_a_spec_reach_the_kernel_call(recorder):
  """The Mosaic GPU kernels' speed options are FIELDs of a spec, gathered into
  `AttentionConfig.mgpu_options` (so the training step and the bench time one against the
  defaults): they reach `flash_attention` as one `MosaicGPUOptions`, the defaults are None
  (one name for one config), and a value no kernel reads is refused in one line."""
  from pallas_kernels.forward_mgpu import MosaicGPUOptions

  config = AttentionConfig.parse("fa2+comp:items_early=true,persistent=false")
  assert config.mgpu_options == MosaicGPUOptions(items_early=True, persistent=False)
  assert config.name == "fa2+comp:persistent=false,items_early=true"
  assert AttentionConfig(mgpu_options=MosaicGPUOptions()).mgpu_options is None
  assert AttentionConfig.parse("fa2:items_early=false,o_by_tma=none").name == "fa2"
  q = jax.random.normal(jax.random.key(0), (1, 24, 2, 16), jnp.float32)
  attend(q, q, q, config, causal=True)
  (call,) = recorder
  assert call["mgpu_options"] == config.mgpu_options and call["stabilize"] is True
  for spec, why in (
    ("fa2+triton:items_early=true", "items_early=True: Mosaic GPU options, unused with backend='t"),
    ("paper:items_early=true", "unused with backend='auto', which runs Triton for numerics='pa"),
    ("fa2:block_k=32,persistent=false", "persistent=False: .* Triton for block_k=32"),
    ("cudnn:items_early=true", "items_early=True needs implementation='flash', got 'cudnn'"),
    ("fa2:items_early=maybe", "items_early='maybe' is not a valid bool"),
    ("fa2:persistent=2", r"persistent='2' is not a valid bool \| None"),
    ("fa2:items_early=true,items_early=false", "both set items_early"),
    ("fa2:overlap=true,wide_step=true", "wide_step must be False \\(in 'fa2:overlap"),
    ("fa2:mgpu_options=x", "or of MosaicGPUOptions"),
  ):
    with pytest.raises(ValueError, match=why):
      AttentionConfig.parse(spec)
  with pytest.raises(TypeError, match="mgpu_options must be a MosaicGPUOptions or None"):
    AttentionConfig(mgpu_options={"items_early": True})


@pytest.mark.parametrize(
  "old,new",
  [
    ("flash", "fa2"),
    ("flash-stable", "fa2+comp"),
    ("fp32-reference", "reference-fp32"),
    (
      "flash:numerics=paper,block_q=512,block_k=512,stabilize=true",
      "paper+comp:block_q=512,block_k=512",
    ),
    ("flash:paper+stabilize@128", "paper+comp:block_k=128"),
    ("flash-mgpu:fa2+stabilize@128", "fa2+comp+mgpu:block_k=128"),
    ("flash-mgpu:fa2@128+stabilize", "fa2+comp+mgpu:block_k=128"),
    ("mgpu:fp32_out@64", "fp32_out+mgpu:block_k=64"),
  ],
)
def test_old_spellings_parse_with_a_warning_naming_the_new_one(old, new):
  with pytest.warns(FutureWarning, match=re.escape(repr(new))):
    config = AttentionConfig.parse(old)
  assert config.name == new and AttentionConfig.parse(new) == config


@pytest.mark.parametrize(
  "spec",
  [
    "fa2",
    "paper+comp",
    "fa2+comp+mgpu:block_k=128",
    "xla",
    "cudnn",
    "reference-bf16",
    "cudnn+center",
    "reference-fp32+center",
    "stochastic+comp",
    "fa2+comp+delta32+center",
    "fa2+comp+lse",
    "paper+lse:block_q=512,block_k=512",
    "paper:tie_tolerance=0.01,block_q=512,block_k=512",
    "fa2+comp:items_early=true",
    "fa2+comp+mgpu:block_k=128,wide_step=false,delta_in_dq=true",
  ],
)
def test_every_config_has_one_name_that_parses_back(spec):
  config = AttentionConfig.parse(spec)
  assert config.name == spec and AttentionConfig.parse(config.name) == config


def test_spec_lists_split_at_specs_not_fields():
  from jax_flashstable.attention.config import split_specs

  assert split_specs("fa2:block_q=64,block_k=64,xla,paper+comp") == [
    "fa2:block_q=64,block_k=64",
    "xla",
    "paper+comp",
  ]
  for text, why in (
    ("", "empty"),
    ("fa2,,xla", "an empty item"),
    ("fa2,", "an empty item"),
    ("fa2:block_k=32,xla,fa2:block_k=32", "'fa2:block_k=32' given twice"),  # the same work
  ):
    with pytest.raises(ValueError, match=rf"^--attention '{text}': {why}$"):
      split_specs(text)
  assert split_specs("fa2:block_k=32,fa2:block_k=64") == ["fa2:block_k=32", "fa2:block_k=64"]


def test_a_spec_sets_each_field_once():
  """A field set twice in one spec (two values, two modifiers, a modifier and a FIELD=VALUE,
  a modifier repeated) is refused, naming both: nothing is silently overridden."""
  for spec, message in (
    ("fa2:block_k=64,block_k=32", "block_k=64 and block_k=32 both set block_k"),
    ("fa2+mgpu+triton", r"\+mgpu and \+triton both set backend"),
    ("fa2+comp:stabilize=False", r"\+comp and stabilize=False both set stabilize"),
    ("fa2+comp+comp", r"modifier '\+comp' twice"),
  ):
    with pytest.raises(ValueError, match=message):
      AttentionConfig.parse(spec)
  assert AttentionConfig.parse("fa2+comp+mgpu:block_k=128").block_k == 128


def test_top_level_export_is_the_adapter():
  import jax_flashstable
  from jax_flashstable import make_attention_fn as exported
  from jax_flashstable.attention import flax_adapter

  assert exported is flax_adapter.make_attention_fn
  assert "make_attention_fn" in jax_flashstable.__all__
  assert "make_attention_fn" in dir(jax_flashstable)
  fn = exported("xla", causal=True)
  q = jax.random.normal(jax.random.key(0), (1, 8, 2, 16), jnp.float32)
  want = jax.nn.dot_product_attention(q, q, q, is_causal=True)
  np.testing.assert_allclose(np.asarray(fn(q, q, q)), np.asarray(want), rtol=1e-6)


def test_nnx_decode_cache_is_named_as_unsupported():
  """nnx.MultiHeadAttention(decode=True) passes the mask of its KV cache although the user gave
  none: the error names decoding and says what to use instead."""
  mha = nnx.MultiHeadAttention(
    num_heads=2,
    in_features=16,
    decode=True,
    rngs=nnx.Rngs(0),
    attention_fn=make_attention_fn("fa2"),
  )
  mha.init_cache((1, 8, 16))
  with pytest.raises(
    NotImplementedError,
    match=r"autoregressive decoding with a KV cache: it got "
    r"a mask of one query over 8 cached keys.*decode=False and is_causal=True.*"
    r"jax.nn.dot_product_attention",
  ):
    mha(jnp.ones((1, 1, 16)))
  q = jnp.zeros((1, 8, 2, 16))
  with pytest.raises(NotImplementedError, match=r"no mask \(got mask.shape=\(1, 1, 8, 8\)\)"):
    make_attention_fn("fa2")(q, q, q, mask=jnp.ones((1, 1, 8, 8), bool))


NNX_JIT_STEP = """
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax_flashstable import AttentionConfig, GPT, GPTConfig
from jax_flashstable.models.gpt2 import loss_fn
traces = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: traces.append(name) if name.endswith("jaxpr_trace_duration") else None)
cfg = GPTConfig.preset("tiny", block_size=16, n_layer=1, attention=AttentionConfig.parse("fa2"))
model = GPT(cfg, rngs=nnx.Rngs(0))
opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

@nnx.jit
def step(model, opt, x):
  loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, x[:, :-1], x[:, 1:]))(model)
  opt.update(model, grads)
  return loss

x = jnp.arange(34, dtype=jnp.int32).reshape(2, 17)
print([float(step(model, opt, x)) > 0 and len(traces) for _ in range(3)])   # traces so far
"""


def test_nnx_jit_step_compiles_once():
  """A user's nnx.jit training step over GPT with our attention traces once in three calls. It
  traced twice when Pallas's interpret mode imported, inside the first trace, a module that
  adds a JAX config option to the tracing context (`flax_adapter._register_interpret_config`).
  A fresh interpreter, so that nothing imported by other tests hides it."""
  import os
  import pathlib
  import subprocess
  import sys

  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parents[1]))
  out = subprocess.run(
    [sys.executable, "-c", NNX_JIT_STEP], env=env, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  first, second, third = json.loads(out.stdout.strip().splitlines()[-1])
  assert first > 0 and second == first and third == first  # no trace after the first call


@pytest.mark.parametrize(
  "spec,why",
  [
    ("paper:numerics=fa2", r"the preset sets numerics"),
    ("reference-bf16:reference_dtype=float32", r"the preset sets reference_dtype"),
    ("fa2:implementation=xla", r"the preset sets implementation"),
    ("fa2:", r"ends in ':' with no FIELD=VALUE"),
    ("fa2:block_q=64_0", r"block_q='64_0' is not a valid int"),
  ],
)
def test_a_spec_cannot_overwrite_its_preset(spec, why):
  """The preset's name sets implementation, numerics and reference_dtype: a FIELD=VALUE of one
  of them would make 'paper:numerics=fa2' fa2 under paper's name (older spellings, which set
  numerics that way, still parse: above). An empty field list and ints with underscores are
  refused too; a reference_dtype outside implementation='reference' is refused by the
  dataclass."""
  with pytest.raises(ValueError, match=why):
    AttentionConfig.parse(spec)
  with pytest.raises(ValueError, match=r"reference_dtype='bfloat16' needs implementation"):
    AttentionConfig(reference_dtype="bfloat16")


def test_attend_takes_a_spec_and_checks_inputs_for_every_implementation():
  """`attend` takes a spec string as `make_attention_fn` does (the same values as its
  AttentionConfig), and every implementation, the XLA one included, refuses inputs the kernels
  refuse in one line naming them (`checks.check_inputs`) instead of an AttributeError or
  JAX's own message from inside."""
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 8, 2, 16)), jnp.float32)
  for spec in ("fa2", "xla"):
    by_spec = attend(q, q, q, spec, causal=True)
    by_config = attend(q, q, q, AttentionConfig.parse(spec), causal=True)
    assert np.array_equal(np.asarray(by_spec), np.asarray(by_config))
  bad = [
    ((q.tolist(), q, q), TypeError, r"^query must be an array .* got a list"),
    ((q[0], q[0], q[0]), ValueError, r"^query must have rank 4 .* got query.shape=\(8, 2, 16\)$"),
    ((q, q.astype(jnp.bfloat16), q), TypeError, r"^query, key and value must share one dtype"),
    ((q, q[:, :, :1], q), ValueError, r"^key and value shapes differ"),
    ((q[..., :1, :], q, q), ValueError, r"^num_heads=1 is not a multiple of num_kv_heads=2$"),
  ]
  for spec in ("fa2", "xla", "reference-fp32"):
    for args, error, message in bad:
      with pytest.raises(error, match=message):
        attend(*args, spec, causal=False)
  with pytest.raises(ValueError, match="attention spec"):
    attend(q, q, q, 42, causal=False)
  # attention_fn (Flax's signature) refuses a non-array by the same rule, before reading a shape
  with pytest.raises(TypeError, match=r"^query must be an array .* got a list"):
    attention_fn(q.tolist(), q, q, config="fa2")
  with pytest.raises(TypeError, match=r"^value must be an array .* got a float"):
    attention_fn(q, q, 1.0, config="fa2")
  # cuDNN off a GPU: named, not JAX's "cuDNN is not detected" from inside its first call
  if jax.default_backend() != "gpu":
    for spec in ("cudnn", "cudnn+center"):
      with pytest.raises(
        ValueError, match=rf"^attention '{re.escape(spec)}' needs a GPU \(cuDNN\)"
      ):
        attend(q, q, q, spec, causal=True)
  # head_dim above the kernels' 256: refused for flash and the references, XLA's runs it
  wide = jnp.asarray(rng.standard_normal((1, 8, 2, 300)), jnp.float32)
  for spec in ("fa2", "reference-fp32"):
    with pytest.raises(ValueError, match=r"^head_dim=300 is not supported \(at most 256\)$"):
      attend(wide, wide, wide, spec, causal=True)
  with FLOAT32_DOTS:  # "xla" follows JAX's default precision (TF32 on a GPU: 9.7e-4 off here)
    out = np.asarray(attend(wide, wide, wide, "xla", causal=True), np.float64)
  x = np.asarray(wide, np.float64)[0].transpose(1, 0, 2)  # [heads, len, d]
  s = x @ x.transpose(0, 2, 1) / np.sqrt(300.0) + np.triu(np.full((8, 8), -np.inf), 1)
  p = np.exp(s - s.max(-1, keepdims=True))
  gold = ((p / p.sum(-1, keepdims=True)) @ x).transpose(1, 0, 2)[None]
  assert np.abs(out - gold).max() < 1e-4


def test_the_readmes_flax_example_runs_bf16_attention(monkeypatch):
  """The README's nnx example, run as written: the flash kernel receives bfloat16
  query/key/value (the numerics the library shows) and the output is [2, 128, 768] bfloat16
  and finite."""
  import pathlib

  readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
  example = next(b for b in blocks if "nnx.MultiHeadAttention" in b)
  dtypes = []
  real = attention_module.flash_attention

  def record(query, key, value, *args, **kwargs):
    dtypes.append((query.dtype, key.dtype, value.dtype))
    return real(query, key, value, *args, **kwargs)

  monkeypatch.setattr(attention_module, "flash_attention", record)
  scope = {}
  exec(compile(example, "README.md", "exec"), scope)
  y = scope["y"]
  assert dtypes == [(jnp.dtype(jnp.bfloat16),) * 3]
  assert y.shape == (2, 128, 768) and y.dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(y)))
