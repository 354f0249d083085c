"""The numerics lab: the paper's bit example, the deviation benchmark (Golden et al. 2024) and
the bias benchmark (Qiu & Yao 2025), for every precision layout or any flash spec.

Shared by `flashstable deviation`, `flashstable bias`, `experiments/` and the tests.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_flashstable.attention.api import flash_attention, reference_attention, resolved_backend
from jax_flashstable.attention.flax_adapter import attend
from jax_flashstable.checks import random_seed
from jax_flashstable.lab.accuracy import bf16_ulp
from jax_flashstable.lab.shapes import Shape, make_inputs
from pallas_kernels.policy import get_numerics

LAYOUTS = ("fa2", "paper", "fp32_out", "stochastic")


def _layout_kwargs(layout, seed=0):
  return dict(numerics=layout, rng_key=jax.random.key(seed) if layout == "stochastic" else None)


# ---------------------------------------------------------------------------------------------
# The bit example (Qiu & Yao 2025, §3): two tied keys with P̄ = 1 and a third, small one.


def bit_example_inputs(with_small_term=True):
  """query/key/value [1, 1, 1, 16] / [1, n, 1, 16] (bf16, softmax_scale=1) whose P̄V tile sum
  is exactly −4.703990459442139 (ties alone: −4.703125, a bf16 midpoint).

  Scores: 0, 0 (tied, P̄ = exp(0) = 1) and −8 (bf16(exp(−8)) = 0.000335693359375);
  values −2.34375, −2.359375 and −2.578125: 1·V1 + 1·V2 + P̄3·V3 = −4.703125 − 0.000865459…
  """
  n = 3 if with_small_term else 2
  q = np.zeros((1, 1, 1, 16))
  q[..., 0] = 1.0
  k = np.zeros((1, n, 1, 16))
  v = np.zeros((1, n, 1, 16))
  v[0, :, 0, 0] = [-2.34375, -2.359375, -2.578125][:n]
  if with_small_term:
    k[0, 2, 0, 0] = -8.0
  return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


def bit_example(layouts=LAYOUTS):
  """The rounded P̄V sum each layout's kernel formed, read back as O·l with
  l = exp(lse − row_max) from the kernel's statistics: {layout: {"ties+small", "ties"}}."""
  out = {}
  for layout in layouts:
    row = {}
    for label, small in (("ties+small", True), ("ties", False)):
      q, k, v = bit_example_inputs(small)
      o, st = flash_attention(
        q, k, v, softmax_scale=1.0, return_stats=True, **_layout_kwargs(layout)
      )
      l = math.exp(float(st.lse[0, 0, 0]) - float(st.row_max[0, 0, 0]))
      row[label] = dict(out=float(o[0, 0, 0, 0]), pv_sum=float(o[0, 0, 0, 0]) * l, l=l)
    out[layout] = row
  return out


# ---------------------------------------------------------------------------------------------
# Deviation from the FP64 golden value (Golden et al. 2024, arXiv 2405.02803, §4).


def check_deviation(
  seq_lens, head_dims, dtypes, block_ks, batch=1, num_heads=2, causal=False, layout="fa2"
):
  """`flash_attention`'s checks of every call `deviation_benchmark` would make with these
  arguments, without computing any: its ValueError/TypeError, one line, led by the layout,
  dtype, head_dim, length and block_k of the call it refuses (the sweep's own words: a
  float16 the user never typed comes from the default dtypes)."""
  for dtype, d, n, bk in itertools.product(dtypes, head_dims, seq_lens, block_ks):
    spec = jax.ShapeDtypeStruct((batch, n, num_heads, d), jnp.dtype(dtype))
    try:
      resolved_backend(spec, spec, spec, causal=causal, block_k=bk, **_layout_kwargs(layout))
    except (ValueError, TypeError) as e:
      where = f"numerics={layout!r}, dtype={jnp.dtype(dtype)}, head_dim={d}, len={n}, block_k={bk}"
      raise type(e)(f"{where}: {e}") from None


def deviation_benchmark(
  seq_lens=(128, 256, 512),
  head_dims=(64,),
  dtypes=("bfloat16",),
  block_ks=(64,),
  batch=1,
  num_heads=2,
  causal=False,
  seed=0,
  layout="fa2",
):
  """max and mean |O − O_FP64| of flash and of standard attention (`reference_attention` in
  the same dtype), random normal inputs. Rows of dicts. Every combination is checked first
  (`check_deviation`)."""
  check_deviation(seq_lens, head_dims, dtypes, block_ks, batch, num_heads, causal, layout)
  rows = []
  for dtype in dtypes:
    for d in head_dims:
      for n in seq_lens:
        q, k, v, _ = make_inputs(Shape(batch, n, n, num_heads, num_heads, d, causal), dtype, seed)
        gold = reference_attention(q, k, v, causal=causal, dtype=jnp.float64)
        std = np.asarray(reference_attention(q, k, v, causal=causal, dtype=dtype), np.float64)
        for bk in block_ks:
          o = np.asarray(
            flash_attention(q, k, v, causal=causal, block_k=bk, **_layout_kwargs(layout)),
            np.float64,
          )
          e_f, e_s = np.abs(o - gold), np.abs(std - gold)
          rows.append(
            dict(
              dtype=str(dtype),
              head_dim=d,
              seq_len=n,
              block_k=bk,
              layout=layout,
              flash_max=float(e_f.max()),
              flash_mean=float(e_f.mean()),
              standard_max=float(e_s.max()),
              standard_mean=float(e_s.mean()),
              ratio_max=float(e_f.max() / max(e_s.max(), 1e-30)),
            )
          )
  return rows


def deviation_headline(rows):
  """{"layout, block_k N": geometric mean over its bf16 rows of flash / standard max deviation}."""
  out = {}
  for layout, bk in dict.fromkeys((x["layout"], x["block_k"]) for x in rows):
    r = [
      x["ratio_max"]
      for x in rows
      if x["dtype"] == "bfloat16" and x["layout"] == layout and x["block_k"] == bk
    ]
    if r:
      out[f"{layout}, block_k {bk}"] = float(np.exp(np.mean(np.log(r))))
  return out


# ---------------------------------------------------------------------------------------------
# Bias of tied maxima (Qiu & Yao 2025, §3-4).


def tied_rows(
  num_rows=512,
  kv_len=64,
  head_dim=16,
  tie_values=(-4.0, 0.0, 2.0, 5.0),
  n_ties=(2, 3, 4),
  gap=(6.0, 12.0),
  value_mean=-1.0,
  seed=0,
):
  """Rows with several exactly tied maxima (duplicated keys) and same-sign values.

  Row r: scores (softmax_scale=1) are t at `n` keys and t − δ (δ ∈ `gap`, multiples of 1/16)
  elsewhere, so P̄V is "two (or more) large, many small" terms of one sign,
  via q = [t, 1, 0…], tied keys [1, 0, …], others [1, −δ, …]; V ≈ value_mean·(1 ± 0.25),
  one sign. Returns bf16 query [1, num_rows, 1, d], key/value [num_rows, kv_len, 1, d] as a
  batch of single-query problems: query reshaped to [num_rows, 1, 1, d]. ValueError for a tie
  value beyond bfloat16's range (it would be inf, and the scores NaN).
  """
  big = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
  if bad := [x for x in tie_values if not abs(x) <= big]:
    raise ValueError(f"tie value {bad[0]!r} is beyond bfloat16's range (±{big:.4g})")
  rng = np.random.default_rng(seed)
  t = rng.choice(tie_values, num_rows)
  n = rng.choice(n_ties, num_rows)
  q = np.zeros((num_rows, 1, 1, head_dim))
  q[:, 0, 0, 0] = t
  q[:, 0, 0, 1] = 1.0
  k = np.zeros((num_rows, kv_len, 1, head_dim))
  k[..., 0] = 1.0
  k[:, :, 0, 1] = -np.round(rng.uniform(*gap, (num_rows, kv_len)) * 16) / 16
  for r in range(num_rows):
    k[r, rng.choice(kv_len, n[r], replace=False), 0, 1] = 0.0
  v = value_mean * (1.0 + 0.25 * rng.uniform(-1, 1, (num_rows, kv_len, 1, head_dim)))
  do = np.ones((num_rows, 1, 1, head_dim))
  return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do))


@dataclasses.dataclass(frozen=True)
class Bias:
  """Mean signed error with its standard error and z-score (mean / standard error)."""

  mean: float
  stderr: float
  z: float

  @classmethod
  def of(cls, err):
    err = np.asarray(err, np.float64).ravel()
    se = float(err.std(ddof=1) / math.sqrt(err.size)) if err.size > 1 else float("nan")
    m = float(err.mean())
    return cls(m, se, m / se if se > 0 else (0.0 if m == 0 else math.copysign(math.inf, m)))


# flash_attention's compensation on and off in every layout: the rows of `flashstable bias`
BIAS_ATTENTIONS = tuple(f"{layout}{comp}" for layout in LAYOUTS for comp in ("", "+comp"))


def bias_configs(attentions):
  """Specs (`AttentionConfig` grammar; a comma-separated string, a list, or configs) → configs
  for the bias benchmark. Raises ValueError naming a spec that is not one of our flash kernels
  (the benchmark reads their O), or that takes delta from the float32 O (`+delta32`: the
  benchmark forms delta as the layout does), or when none is given."""
  from jax_flashstable.attention.config import AttentionConfig, split_specs

  if isinstance(attentions, str):
    attentions = split_specs(attentions)
  configs = [AttentionConfig.parse(a) for a in attentions]
  for c in configs:
    if c.implementation != "flash":
      raise ValueError(f"attention {c.name!r} is not a flash layout (fa2, paper, ...)")
    if c.delta_float32:
      raise ValueError(
        f"attention {c.name!r}: +delta32 changes delta, which this benchmark forms from O as "
        "the layout does"
      )
  if not configs:
    raise ValueError("no attention given")
  return configs


def bias_benchmark(inputs=None, attentions=BIAS_ATTENTIONS, seed=0):
  """Signed error of O and of delta = rowsum(dO∘O) per attention (a flash spec of the
  `AttentionConfig` grammar, e.g. "paper+comp+guard:max_shift=6"), against FP64 and against
  the correctly rounded (bf16, nearest-even) FP64 output. Rows of dicts: attention (its
  name), layout, stabilize, and a `Bias` per comparison.

  Errors are in units of one bf16 ulp of the FP64 value, so rows of different scale add up.
  Raises ValueError as `bias_configs`, or for a seed that is not one in [0, 2**32)
  (`checks.random_seed`), before any kernel runs.
  """
  configs = bias_configs(attentions)
  seed = random_seed("seed", seed)  # jax.random.key's below (stochastic)
  q, k, v, do = inputs if inputs is not None else tied_rows(seed=seed)
  gold = reference_attention(q, k, v, softmax_scale=1.0, dtype=jnp.float64)
  cr = gold.astype(ml_dtypes.bfloat16).astype(np.float64)  # correctly rounded
  ulp = bf16_ulp(gold)
  do64 = np.asarray(do, np.float64)
  delta_gold, delta_cr = (do64 * gold).sum(-1), (do64 * cr).sum(-1)
  delta_ulp = bf16_ulp(delta_gold)
  rows = []
  for config in configs:  # the stochastic layout's rng_key: ignored by the others
    o = attend(q, k, v, config, causal=False, softmax_scale=1.0, rng_key=jax.random.key(seed))
    delta = np.asarray(get_numerics(config.numerics).delta(do, o), np.float64)  # as the backward
    o = np.asarray(o, np.float64)
    rows.append(
      dict(
        attention=config.name,
        layout=config.numerics,
        stabilize=config.stabilize,
        out_vs_fp64=dataclasses.asdict(Bias.of((o - gold) / ulp)),
        out_vs_rounded=dataclasses.asdict(Bias.of((o - cr) / ulp)),
        delta_vs_fp64=dataclasses.asdict(Bias.of((delta - delta_gold) / delta_ulp)),
        delta_vs_rounded=dataclasses.asdict(Bias.of((delta - delta_cr) / delta_ulp)),
      )
    )
  rows.append(
    dict(
      attention="correctly rounded FP64",
      layout="correctly rounded FP64",
      stabilize=None,
      out_vs_fp64=dataclasses.asdict(Bias.of((cr - gold) / ulp)),
      out_vs_rounded=dataclasses.asdict(Bias.of(np.zeros(1))),
      delta_vs_fp64=dataclasses.asdict(Bias.of((delta_cr - delta_gold) / delta_ulp)),
      delta_vs_rounded=dataclasses.asdict(Bias.of(np.zeros(1))),
    )
  )
  return rows


def _bias_label(row):
  """A row's attention (rows written before 2026-12-02 have layout and stabilize only)."""
  return row.get("attention") or f"{row['layout']}{'+comp' if row['stabilize'] else ''}"


def format_bias(rows):
  out = [
    "| attention | O − FP64 (ulp, z) | O − rounded FP64 (ulp, z) | delta − FP64 (ulp, z) | delta − rounded FP64 (ulp, z) |",
    "|---|---:|---:|---:|---:|",
  ]
  f = lambda b: f"{b['mean']:+.4f} (z={b['z']:+.1f})"
  for r in rows:
    out.append(
      f"| {_bias_label(r)} | {f(r['out_vs_fp64'])} | {f(r['out_vs_rounded'])} | "
      f"{f(r['delta_vs_fp64'])} | {f(r['delta_vs_rounded'])} |"
    )
  return "\n".join(out)


def format_deviation(rows):
  out = [
    "| layout | dtype | head_dim | seq_len | block_k | flash max | standard max | ratio | flash mean | standard mean |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    out.append(
      f"| {r['layout']} | {r['dtype']} | {r['head_dim']} | {r['seq_len']} | {r['block_k']} | "
      f"{r['flash_max']:.2e} | {r['standard_max']:.2e} | {r['ratio_max']:.2f} | "
      f"{r['flash_mean']:.2e} | {r['standard_mean']:.2e} |"
    )
  return "\n".join(out)


def plot_deviation(rows, path):
  """Max |O − O_FP64| against sequence length, one panel per (dtype, head_dim): standard
  attention and every (layout, block_k) of flash attention, log–log (PNG)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = list(dict.fromkeys((r["dtype"], r["head_dim"]) for r in rows))
  fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
  for ax, (dtype, d) in zip(axes[0], panels):
    rs = [r for r in rows if r["dtype"] == dtype and r["head_dim"] == d]
    std = {r["seq_len"]: r["standard_max"] for r in rs}
    ax.plot(sorted(std), [std[n] for n in sorted(std)], "k--o", ms=3, label="standard attention")
    for layout, bk in dict.fromkeys((r["layout"], r["block_k"]) for r in rs):
      pts = sorted(
        (r["seq_len"], r["flash_max"]) for r in rs if (r["layout"], r["block_k"]) == (layout, bk)
      )
      ax.plot(*zip(*pts), "-o", ms=3, label=f"flash {layout}, block_k {bk}")
    ax.set(xscale="log", yscale="log", xlabel="sequence length", title=f"{dtype}, head_dim {d}")
  axes[0][0].set_ylabel("max |O − O_FP64|")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot_bias(rows, path):
  """Mean signed error of O and delta (bf16 ulps, ± 2 standard errors) per layout × stabilize,
  against FP64 and against the correctly rounded FP64 value (PNG)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = (
    ("out_vs_fp64", "O − FP64"),
    ("out_vs_rounded", "O − rounded FP64"),
    ("delta_vs_fp64", "delta − FP64"),
  )
  labels = [_bias_label(r) for r in rows]
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.8), sharey=False)
  for ax, (key, title) in zip(axes, keys):
    have = [i for i, r in enumerate(rows) if r.get(key)]
    means = [rows[i][key]["mean"] for i in have]
    errs = [2 * rows[i][key]["stderr"] for i in have]
    ax.barh(
      [labels[i] for i in have],
      means,
      xerr=errs,
      color=["C3" if abs(rows[i][key]["z"]) > 4 else "C0" for i in have],
    )
    ax.axvline(0, color="k", lw=0.8)
    ax.set(title=title, xlabel="mean signed error (bf16 ulp); red: |z| > 4")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
