"""Dump format, the crosscheck report, and the PyTorch paper layout against ours (CPU)."""

import os
import pathlib
import subprocess

import ml_dtypes
import numpy as np
import pytest

from jax_flashstable.lab.crosscheck import compare_tensors, crosscheck, ulp_difference
from jax_flashstable.lab.dumpfile import load_dump, save_dump

ROOT = pathlib.Path(__file__).resolve().parents[1]
TORCH_PYTHON = os.environ.get(
  "FLASHSTABLE_TORCH_PYTHON", str(ROOT / ".torchvenv" / "bin" / "python")
)


def test_dump_round_trip_keeps_bits_and_axis_orders(tmp_path):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 5, 4)).astype(ml_dtypes.bfloat16)  # [b, h, s, d]
  lse = rng.standard_normal((2, 3, 5)).astype(np.float32)
  save_dump(tmp_path / "d.npz", dict(query=x, lse=lse), layout="bhsd", attrs=dict(causal=True))
  t, attrs = load_dump(tmp_path / "d.npz", layout="bshd")
  assert attrs == dict(causal=True) and t["query"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(t["query"].view(np.uint16), np.swapaxes(x, 1, 2).view(np.uint16))
  t2, _ = load_dump(tmp_path / "d.npz", layout="bhsd", as_bits=True)
  np.testing.assert_array_equal(t2["query"], x.view(np.uint16))
  np.testing.assert_array_equal(t2["lse"], lse)
  (tmp_path / "bad.npz").write_bytes(b"PK")
  with pytest.raises(Exception):
    load_dump(tmp_path / "bad.npz")


def test_a_bad_dump_is_refused_in_one_line_before_any_computation(tmp_path):
  """Every kind of fault in a dump — its file, its __meta__, its tensors, its attrs, a compared
  tensor that is not what our kernels return — is a one-line ValueError/TypeError naming the
  file and the offending tensor or attr, from `dump_call`, before anything is computed (the
  CLI prints it: test_cli). Built from a good dump of a real call."""
  import json

  import jax
  import jax.numpy as jnp

  from jax_flashstable import flash_attention
  from jax_flashstable.lab.crosscheck import dump_call
  from jax_flashstable.lab.dumpfile import FORMAT

  x = jax.random.normal(jax.random.key(0), (1, 32, 2, 16), jnp.bfloat16)
  out, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v), x, x, x)
  dq, dk, dv = vjp(x)
  good = dict(query=x, key=x, value=x, d_out=x, out=out, d_query=dq, d_key=dk, d_value=dv)
  good = {n: np.asarray(a) for n, a in good.items()}
  save_dump(tmp_path / "good.npz", good)
  assert crosscheck(tmp_path / "good.npz")["out"]["pct_bit_identical"] == 100.0

  def bad(name, tensors=good, **kw):
    save_dump(tmp_path / name, tensors, **kw)
    return tmp_path / name

  meta = lambda **m: np.asarray(json.dumps(dict(format=FORMAT, layout="bshd", **m)))
  np.savez(
    tmp_path / "lying.npz",
    __meta__=meta(tensors={"query": dict(dtype="bfloat16", shape=[1])}, attrs={}),
    query=np.zeros(3, np.float32),
  )
  (tmp_path / "text.npz").write_text("not a dump")
  cases = [
    (tmp_path / "text.npz", ValueError, r"text.npz is not a readable dump \(not an .npz"),
    (tmp_path / "lying.npz", ValueError, r"tensor 'query' is stored as float32\[3\], __meta__"),
    (
      bad("noq.npz", {n: a for n, a in good.items() if n != "query"}),
      ValueError,
      "no tensor 'query'",
    ),
    (bad("nothing.npz", dict(query=x, key=x, value=x)), ValueError, "nothing to compare"),
    (
      bad("nodo.npz", {n: a for n, a in good.items() if n != "d_out"}),
      ValueError,
      "'d_query' without 'd_out'",
    ),
    (bad("causal.npz", attrs=dict(causal="no")), TypeError, "attrs causal='no' is not a bool"),
    (bad("bq.npz", attrs=dict(block_q=17)), ValueError, "block_q=17"),
    (
      bad("scale.npz", attrs=dict(softmax_scale="abc")),
      (TypeError, ValueError),
      "softmax_scale='abc'",
    ),
    (bad("rank.npz", {n: a[0] for n, a in good.items()}), ValueError, r"query.shape=\(32, 2, 16\)"),
    (
      bad("short.npz", dict(good, out=good["out"][:, :16])),
      ValueError,
      r"out is bfloat16\[1, 16, 2, 16\], ours would be bfloat16\[1, 32, 2, 16\]",
    ),
    (
      bad("f32.npz", dict(good, d_key=good["d_key"].astype(np.float32))),
      ValueError,
      r"d_key is float32",
    ),
    (bad("do.npz", dict(good, d_out=good["d_out"][:, :8])), ValueError, "d_out has shape"),
  ]
  for path, exc, match in cases:
    with pytest.raises(exc, match=match) as e:
      dump_call(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value), (path, e.value)
  with pytest.raises(ValueError, match=r"layout='xyz' is not one of"):
    np.savez(
      tmp_path / "lay.npz",
      __meta__=np.asarray(json.dumps(dict(format=FORMAT, layout="xyz", tensors={}))),
    )
    load_dump(tmp_path / "lay.npz")


def test_report_on_known_differences():
  rng = np.random.default_rng(1)
  theirs = np.abs(rng.standard_normal(1000)).astype(ml_dtypes.bfloat16) + ml_dtypes.bfloat16(0.5)
  bits = theirs.view(np.uint16).copy()
  bits[:100] += 1  # +1 ulp on 10% (positive values: larger)
  bits[100:120] -= 3  # −3 ulp on 2%
  ours = bits.view(ml_dtypes.bfloat16)
  r = compare_tensors(ours, theirs)
  assert r["pct_bit_identical"] == pytest.approx(88.0)
  assert r["ulp_histogram"]["1"] == 100 and r["ulp_histogram"]["3"] == 20
  assert list(np.unique(ulp_difference(ours, theirs))) == [-3, 0, 1]
  d = ours.astype(np.float64) - theirs.astype(np.float64)
  assert r["signed_mean_error"] == pytest.approx(d.mean()) and r["max_abs_error"] == pytest.approx(
    np.abs(d).max()
  )
  neg = -theirs  # ulp order across the sign
  assert compare_tensors(neg, neg)["pct_bit_identical"] == 100.0


def _torch_ok():
  if not pathlib.Path(TORCH_PYTHON).exists():
    return False
  return subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


needs_torch = pytest.mark.skipif(
  not _torch_ok(),
  reason=f"no PyTorch environment at {TORCH_PYTHON} (.ci/run makes "
  "one with Python 3.11 and the local torch 2.13.0 CPU wheel; or set FLASHSTABLE_TORCH_PYTHON)",
)


@needs_torch
@pytest.mark.parametrize("backward", [[], ["--single-lse"]], ids=["m-log-l", "single-lse"])
@pytest.mark.parametrize(
  "extra",
  [["--causal", "--stabilize"], ["--block-q", "32", "--block-k", "128"]],
  ids=["causal-stable-64x64", "full-32x128"],
)
def test_paper_layout_matches_pytorch_paper_kernel(tmp_path, extra, backward):
  """The PyTorch port of the paper's kernel against our paper layout, each backward against
  its own: the port's default (P from m and log l apart) against "paper", its --single-lse
  (the paper's own kernel, P = exp(S − lse)) against "paper+lse" — crosscheck takes the
  backward from the dump's attrs. Measured 2026-12-01 (CPU, length 200, 2 heads, head_dim 64),
  the same for both backwards: out 100% / 99.996% bit-identical, dQ 99.977% / 99.906%, dK
  99.922% / 99.895%, dV 100% (causal-stable-64x64 / full-32x128); every gradient ≥ 99.949%
  within one ulp. (At these logits the two backwards give the same bits; the large-logit dumps
  of `test_crosscheck_compares_the_dumps_backward` tell them apart.)"""
  dump = tmp_path / "torch.npz"
  script = str(ROOT / "torch_crosscheck" / "paper_fa2.py")
  shape = ["--len", "200", "--heads", "2", "--head-dim", "64"]
  cmd = [TORCH_PYTHON, script, str(dump), *shape, *extra, *backward]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert load_dump(dump)[1]["single_lse"] is bool(backward)
  report = crosscheck(dump, numerics="paper")
  assert report["out"]["pct_bit_identical"] >= 99.9, report["out"]
  for g in ("d_query", "d_key", "d_value"):
    assert report[g]["pct_bit_identical"] >= 99.5, (g, report[g])
    assert report[g]["pct_within_1ulp"] >= 99.8, (g, report[g])


LARGE_LOGIT_DUMPS = """
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import paper_fa2
from common import BF, NAMES, write_dump
x = torch.full((1, 1, 4, 64), 704.0, dtype=BF)
do = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, 4, 64))).to(BF)
settings = (64**-0.5, False, 16, 16)
out, m, log_l = paper_fa2.forward(x, x, x, *settings, False, 2.0, 1e-3)
for single_lse in (False, True):
  grads = paper_fa2.backward(x, x, x, out, m, log_l, do, *settings, single_lse=single_lse)
  write_dump(f"{sys.argv[2]}/{single_lse}.npz", dict(zip(NAMES, (x, x, x, do, out, *grads))),
             paper_fa2.lse(m, log_l), causal=False, softmax_scale=settings[0], stabilize=False,
             single_lse=single_lse, block_q=16, block_k=16)
"""


@needs_torch
def test_crosscheck_compares_the_dumps_backward(tmp_path):
  """bf16 q = k = v = 704 (4 positions, head_dim 64), where lse = m + log 4 rounds to m + 1.5
  and the single-lse P is exp(−1.5) instead of ¼ (tests/test_mechanism.py): the port's dumps of
  both backwards are each 100% bit-identical to ours with the backward their attrs name, and
  0% in every gradient with the other one (dV 10.7% apart); out is the same forward."""
  proc = subprocess.run(
    [TORCH_PYTHON, "-c", LARGE_LOGIT_DUMPS, str(ROOT / "torch_crosscheck"), str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  for single_lse in (False, True):
    dump = tmp_path / f"{single_lse}.npz"
    like = crosscheck(dump, numerics="paper")
    unlike = crosscheck(dump, numerics="paper", single_lse=not single_lse)
    assert like == crosscheck(dump, numerics="paper", single_lse=single_lse)
    for name in ("out", "d_query", "d_key", "d_value"):
      assert like[name]["pct_bit_identical"] == 100.0, (single_lse, name, like[name])
    assert unlike["out"]["pct_bit_identical"] == 100.0
    for name in ("d_query", "d_key", "d_value"):
      assert unlike[name]["pct_bit_identical"] == 0.0, (single_lse, name, unlike[name])


@needs_torch
def test_fa2_agrees_with_torch_sdpa_backends(tmp_path):
  """torch SDPA (math and, on CPU, its flash kernel) against our fa2 layout: both round O once
  from fp32, so most outputs agree to the bit; a wrong axis order or scale would give ~0%."""
  cmd = [
    TORCH_PYTHON,
    str(ROOT / "torch_crosscheck" / "sdpa_dump.py"),
    str(tmp_path),
    "--len",
    "200",
    "--heads",
    "2",
    "--head-dim",
    "64",
    "--causal",
    "--backends",
    "math,flash",
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for backend in ("math", "flash"):
    report = crosscheck(tmp_path / f"sdpa_{backend}.npz", numerics="fa2")
    assert report["out"]["pct_bit_identical"] >= 50.0, (backend, report["out"])
    for name in ("out", "d_query", "d_key", "d_value"):
      assert report[name]["pct_within_1ulp"] >= 80.0, (backend, name, report[name])
      assert report[name]["max_abs_error"] < 0.05, (backend, name, report[name])
