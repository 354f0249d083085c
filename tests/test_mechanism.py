"""The bias mechanism of Qiu & Yao 2025 (§4) on two small inputs, against FP64 (issue 16).

The exact dQ_i = scale·Σ_j dS_ij k_j does not depend on a component c that all keys share,
because each row of dS = P∘(dP − delta) sums to 0. An FA2 backward breaks that twice:
delta = rowsum(dO∘O) comes from the rounded O, and dS is rounded to the input dtype before
the dS·K product. The two inputs separate the pieces: in the fa2 layout one is fixed by
`delta_float32` only, the other by `center_keys` only, both options together fix both; in the
paper layout, whose O is built in bf16 buffers and whose dP is rounded too, only `center_keys`
fixes anything. The rule is the accuracy
rule of the suite: error ≤ 2·error(naive attention in bf16) + one bf16 ulp at the FP64 value's
scale + one float32 ulp at the scale of the terms it sums (`lab.accuracy`).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from jax_flashstable.lab.accuracy import compare

OPTIONS = {
  "fa2": {},
  "delta32": dict(delta_float32=True),
  "center": dict(center_keys=True),
  "both": dict(delta_float32=True, center_keys=True),
}


def nine():
  """q = k = v = [[1,2,3],[4,5,6],[7,8,9]] (bf16, one head), dO = 1 on the first two rows:
  row 0 of dQ is 4.78e-4 in every channel (FP64). Its error comes from delta."""
  x = jnp.asarray([[1, 2, 3], [4, 5, 6], [7, 8, 9]], jnp.bfloat16)[None, :, None, :]
  do = jnp.asarray([[1, 1, 1], [1, 1, 1], [0, 0, 0]], jnp.bfloat16)[None, :, None, :]
  return (x, x, x, do), False


def common_keys():
  """q = 1 in channel 0 and 0.1·N(0,1) elsewhere, keys at −480 in channel 0 (T = S = 2,
  H = 16, causal): dQ in channel 0 is 0 (FP64). Its error is (rowsum of the rounded dS)·c."""
  rng = np.random.default_rng(0)
  q, k = (0.1 * rng.standard_normal((1, 2, 16, 16)) for _ in range(2))
  q[..., 0], k[..., 0] = 1.0, -480.0
  v, do = (rng.standard_normal((1, 2, 16, 16)) for _ in range(2))
  return tuple(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v, do)), True


def tied_keys(shape=(1, 128, 2, 32)):
  """q, k, v on a grid of 1/8 with the keys in equal pairs (a tied row max is common, so the
  compensation fires), dO standard normal, all bf16 ([batch, seq, heads, head_dim]), causal:
  the twin's bit-for-bit input (tests/test_torch_twin.py, tests/test_torch_compile.py,
  experiments/15_twin_paper_bits.py)."""
  rng = np.random.default_rng(5)
  q, k, v = (np.round(rng.standard_normal(shape) * 8) / 8 for _ in range(3))
  k[:, 1::2] = k[:, 0::2]
  do = rng.standard_normal(shape)
  return tuple(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v, do)), True


# which options keep dQ within the rule on each input, per layout. In the paper layout the
# "float32 O" of delta_float32 is acc / l of bf16 buffers rounded every tile, and dP is rounded
# to bf16 too (`Numerics.dp`): the option fixes neither input; the keys' centring still takes
# the (rowsum dS)·c term away. Consistent with training at anchor-b128 (H200, 2026-12-02):
# paper + center stayed stable where paper exploded, paper + delta32 exploded
# (docs/studies/instability-anchor-b128.md).
EXPECTED = {
  ("fa2", "nine"): {"fa2": False, "delta32": True, "center": False, "both": True},
  ("fa2", "common_keys"): {"fa2": False, "delta32": False, "center": True, "both": True},
  ("paper", "nine"): {"fa2": False, "delta32": False, "center": False, "both": False},
  ("paper", "common_keys"): {"fa2": False, "delta32": False, "center": True, "both": True},
}


@pytest.mark.parametrize("numerics, case", EXPECTED)
def test_each_option_fixes_its_piece(numerics, case):
  inputs, causal = {"nine": nine, "common_keys": common_keys}[case]()
  got = {
    name: compare(*inputs, causal=causal, numerics=numerics, **kw) for name, kw in OPTIONS.items()
  }
  passes = {name: c.passes()["d_query"] for name, c in got.items()}
  assert passes == EXPECTED[numerics, case], {
    n: (c.flash["d_query"].max, c.standard["d_query"].max) for n, c in got.items()
  }
  for c in got.values():  # the options change the backward's dQ only
    assert c.flash["out"].max == got["fa2"].flash["out"].max
    assert c.passes()["out"] and c.passes()["d_value"]


def test_stochastic_rounding_of_o_reaches_dq_only_through_delta():
  """The stochastic layout (fa2 with O rounded to bf16 unbiasedly; at anchor-b128 it exploded
  at 3 of 3 seeds where fa2 stayed calm) on the common-keys input: its backward reads the
  rounded O only in delta, so with delta from the float32 O its dQ (and dK, dV) equals fa2 +
  delta32's bit for bit, whatever the rounding key, while O differs; without, its dQ fails the rule as
  fa2's does (the (rowsum dS)·c
  term, with O's rounding noise in delta), and centring the keys takes the term away for
  every rounding key (experiments/12_dq_error_along_the_common_key.py measures the term along c:
  rms 8.5e-3 fa2, 0.96–1.02e-2 stochastic, 8e-5 with the centring)."""
  import jax

  from jax_flashstable.lab.accuracy import flash_vjp

  (q, k, v, do), causal = common_keys()
  fa2_out, fa2_grads = flash_vjp(q, k, v, do, causal=causal, delta_float32=True)
  for seed in range(2):
    kw = dict(causal=causal, numerics="stochastic", rng_key=jax.random.key(seed))
    plain = compare(q, k, v, do, **kw)
    assert not plain.passes()["d_query"], plain.flash["d_query"].max
    assert compare(q, k, v, do, center_keys=True, **kw).passes()["d_query"]
    out, grads = flash_vjp(q, k, v, do, delta_float32=True, **kw)
    for got, want in zip(grads, fa2_grads):  # dQ, dK, dV: fa2 + delta32's, to the bit
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(out), np.asarray(fa2_out))  # O is rounded otherwise


def test_the_issue_numbers():
  """The values quoted in issue 16: dQ row 0 of the 3×3 input is [−6.4e-4, −8.0e-4, −9.6e-4]
  with fa2 against 4.78e-4 (FP64), the wrong sign; with delta from the float32 O it is
  [4.71e-4, 4.71e-4, 4.69e-4], a few bf16 ulps (1.9e-6) off."""
  import jax
  from jax_flashstable import flash_attention, reference_attention_vjp

  (q, k, v, do), _ = nine()
  gold = np.asarray(reference_attention_vjp(q, k, v, do, dtype=jnp.float64)[1][0])[0, 0, 0]
  assert gold == pytest.approx([4.7809e-4] * 3, rel=1e-4)
  dq = lambda **kw: np.asarray(
    jax.vjp(lambda q: flash_attention(q, k, v, **kw), q)[1](do)[0], np.float64
  )[0, 0, 0]
  assert dq() == pytest.approx([-6.37e-4, -7.97e-4, -9.57e-4], rel=2e-2)
  assert dq(delta_float32=True) == pytest.approx(gold, abs=5 * 2.0**-19)


@pytest.mark.parametrize("backend", ["triton", "mosaic_gpu"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("value", [704.0, 133120.0])
def test_large_logits_keep_the_backward_exact(value, head_dim, backend):
  """bf16 q = k = v = `value` (T = S = 4): every logit equal, P = 1/4 in every row. With
  lse = m + log l in float32, log 4 is rounded away at logits ~10^7 and 10^11 (dV was 11%
  off at 704, 4× at 133120); with m and log l kept apart dV is as exact as naive attention.
  In both backends, at head_dim 64 (softmax_scale 1/8, exact) and 128 (1/√128: S = QKᵀ·c
  rounds): the Mosaic GPU forward's P̄ was FlashAttention-2's FMA 2^(S·log₂e − m·log₂e), off 1
  at the max by ln 2·½ ulp(m·log₂e), and on an H100 dV came out 8% off at 704 and O NaN at
  133120 (2026-12-07; `policy.Numerics.exp_scores`)."""
  x = jnp.full((1, 4, 1, head_dim), value, jnp.bfloat16)
  do = jnp.asarray(np.random.default_rng(0).standard_normal((1, 4, 1, head_dim)), jnp.bfloat16)
  c = compare(x, x, x, do, causal=False, backend=backend)
  assert all(c.passes().values()), {t: (c.flash[t].max, c.standard[t].max) for t in c.flash}
  assert c.flash["d_value"].max <= c.standard["d_value"].max


@pytest.mark.parametrize("rsum", [False, True])
def test_single_lse_gives_the_production_kernels_p(rsum):
  """`single_lse=True` forms P = exp(S − lse) from one float32 lse, as FlashAttention-2/3 and
  cuDNN do. On bf16 q = k = v = 704 (T = S = 4, head_dim 64) every logit is
  S = 704²·64/8 = 3,964,928, exact in float32, and lse = fl32(S + log 4) = S + 1.5 (ulp 0.25):
  each P is exp(−1.5) = 0.2231 instead of 1/4, so dV_j = 0.2231·Σ_i dO_i, 10.7% low. The output
  is the forward's and stays exact. With `sum_rounded_p` (its own branch of `Numerics.probs`:
  r(P̄)·exp(m − lse)) the same, since every P̄ is 1."""
  import jax
  from jax_flashstable import flash_attention, reference_attention_vjp

  x = jnp.full((1, 4, 1, 64), 704.0, jnp.bfloat16)
  do = jnp.asarray(np.random.default_rng(0).standard_normal((1, 4, 1, 64)), jnp.bfloat16)
  s = np.float32(704.0 * 704.0 * 64 / 8)
  lse = s + np.float32(np.log(4.0))  # float32 sum
  assert lse - s == 1.5
  p = np.exp(np.float64(s) - np.float64(lse))
  want = p * np.asarray(do, np.float64).sum(axis=1)  # [1, 1, 64], every key row the same
  gold_out, (_, _, gold_dv) = reference_attention_vjp(x, x, x, do, dtype=jnp.float64)
  got = {}
  for single in (False, True):
    out, vjp = jax.vjp(lambda v: flash_attention(x, x, v, single_lse=single, sum_rounded_p=rsum), x)
    got[single] = np.asarray(vjp(do)[0], np.float64)
    np.testing.assert_allclose(np.asarray(out, np.float64), gold_out, rtol=2**-8)
  ulp = 2.0**-8 * np.abs(gold_dv).max()
  np.testing.assert_allclose(got[True], np.broadcast_to(want, got[True].shape), atol=ulp)
  assert np.abs(got[True] - gold_dv).max() > 0.1 * np.abs(gold_dv).max()  # 10.7% off
  np.testing.assert_allclose(got[False], gold_dv, atol=ulp)  # the default: exact to bf16


def test_float32_gradients_reach_float32_accuracy():
  """float32 q = k = v = [[1,2,3],[4,5,6],[7,8,9]], dO = 1 on the first two rows: dV within
  2·error(naive float32) + 1 float32 ulp of FP64 (it was 1.6e-6 against 3e-8: the max's P
  came out 1 + 2e-6 where the compiler fused S = QKᵀ·scale into S − m)."""
  x = jnp.asarray([[1, 2, 3], [4, 5, 6], [7, 8, 9]], jnp.float32)[None, :, None, :]
  do = jnp.asarray([[1, 1, 1], [1, 1, 1], [0, 0, 0]], jnp.float32)[None, :, None, :]
  c = compare(x, x, x, do, causal=False)
  assert c.ulp["d_value"] == 2.0**-23  # one float32 ulp in [1, 2)
  assert all(c.passes().values()), {t: (c.flash[t].max, c.standard[t].max) for t in c.flash}
  assert c.flash["d_value"].max <= 5e-8


CENTRED = ("xla", "reference-fp32", "cudnn")  # reference-bf16 takes reference-fp32's path


def grouped_keys(causal=True):
  """A causal input the two above lack: 4 query heads on 2 key/value heads, q_len 20 against
  kv_len 44 (top-left alignment), keys sharing 8 in every channel (bf16, head_dim 16)."""
  rng = np.random.default_rng(3)
  q, do = (rng.standard_normal((1, 20, 4, 16)) for _ in range(2))
  k, v = (rng.standard_normal((1, 44, 2, 16)) for _ in range(2))
  return tuple(jnp.asarray(a, jnp.bfloat16) for a in (q, k + 8.0, v, do)), causal


@pytest.mark.parametrize("spec", CENTRED)
def test_centred_keys_serve_every_implementation(spec):
  """`+center` on an implementation that is not ours is a backward option, as in our kernels:
  the output is the implementation's own, bit for bit (so a causal row never sees a later key:
  changing the last keys leaves the first rows' output alone), and the gradients are the
  implementation's at `centered_keys(k)`, bit for bit; on the inputs above every tensor stays
  within the rule against FP64. On the GPU this includes cuDNN, whose backward takes delta from
  the rounded O as ours does (its dQ on `common_keys`: 1.88 without the centring; the study's
  ninth session)."""
  import jax

  from jax_flashstable.attention.config import AttentionConfig
  from jax_flashstable.attention.flax_adapter import attend
  from pallas_kernels.policy import centered_keys

  if spec == "cudnn" and jax.default_backend() != "gpu":
    pytest.skip("cuDNN attention needs a GPU")
  plain, centred = AttentionConfig.parse(spec), AttentionConfig.parse(spec + "+center")
  f32 = lambda x: np.asarray(x, np.float32)
  for case in (common_keys, grouped_keys):  # (cuDNN needs head_dim a multiple of 8: not nine)
    (q, k, v, do), causal = case()
    run = lambda cfg: lambda q, k, v: attend(q, k, v, cfg, causal=causal)  # noqa: E731
    out, vjp = jax.vjp(run(centred), q, k, v)
    grads = vjp(do)
    np.testing.assert_array_equal(f32(out), f32(run(plain)(q, k, v)))
    want = jax.vjp(run(plain), q, centered_keys(k), v)[1](do)
    for got, x in zip(grads, want):
      np.testing.assert_array_equal(f32(got), f32(x))
    c = compare(q, k, v, do, causal=causal, result=(out, grads))
    assert all(c.passes().values()), {t: (c.flash[t].max, c.standard[t].max) for t in c.flash}
  (q, k, v, _), _ = grouped_keys()
  later = k.at[:, 30:].set(-k[:, 30:])  # the 20 query rows see keys 0–19 only
  np.testing.assert_array_equal(
    f32(run(centred)(q, later, v)[:, :20]), f32(run(centred)(q, k, v)[:, :20])
  )


def test_mosaic_gpu_exponent_takes_the_difference_first():
  """The Mosaic GPU forward's P̄ (`Numerics.exp_scores` with base2): 2^(fl(fl(S − m)·k)), k =
  fl(c·log₂e), bit for bit, not FlashAttention-2's 2^(fl(S·k) − fl(m·k)) (one FMA on the GPU),
  whose exponent at m ≈ 2.3·10⁷ carries the rounding of m·k (ulp 4) and, unless contracted
  (XLA's CPU contracts it too), of S·k: at S = m − 2 and m − 8 the forms differ, and at S = m
  the new one is exactly 1, which 2^(fma(S, k, −fl(m·k))) is not. On the CPU
  test_large_logits_keep_the_backward_exact passes either way: its m·k is exact there."""
  import jax

  from pallas_kernels.policy import LOG2E, get_numerics

  m = np.float32(23456788.0)  # not a power of two times anything simple: m·k rounds
  s = np.asarray([m, m - 2, m - 8, -np.inf], np.float32)
  for scale, rounded in ((1.0, False), (0.125, True)):
    k = np.float32(scale * LOG2E)
    got = np.asarray(
      jax.jit(
        lambda s, m: get_numerics("fa2").exp_scores(s, m, True, scale, rounded)  # noqa: B023
      )(s, jnp.full(s.shape, m)),
      np.float32,
    )
    exp2 = lambda x: np.asarray(jax.jit(jnp.exp2)(x.astype(np.float32)))  # noqa: E731 (XLA's)
    want = exp2((s - m) * k)  # float32 arithmetic, each step rounded
    np.testing.assert_array_equal(got, want)
    assert got[0] == 1.0 and got[3] == 0.0
    mk = np.float32(np.float64(m) * np.float64(k))  # fl(m·k)
    rounded_form = exp2((s * k).astype(np.float32) - mk)
    fma_form = exp2(np.float64(s) * np.float64(k) - np.float64(mk))  # S·k exact, one rounding
    assert rounded_form[1] != want[1] and fma_form[0] != 1.0, (rounded_form, fma_form, want)
