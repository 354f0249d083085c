"""The paper layout in PyTorch: Qiu & Yao's (arXiv 2510.04212, Alg. 1, §3) pure-PyTorch
blockwise FlashAttention-2 whose O, m and l live in BF16 buffers, written in this repo from the
paper's description, with the rounding points of BF16 autocast spelled out as explicit casts so
that it has the same rounding points on CPU and GPU (and, with float32 GEMMs, `mm`, the same
bits up to float32 summation order). Query tiles outer, key tiles inner (forward); key tiles
outer, query tiles inner (backward).

The forward keeps the row max m (bf16 values) and log l (float32, natural log of the bf16 l),
as JAX's paper layout does (`pallas_kernels/forward.py`). The backward forms P in one of two
ways, the two of JAX's `Numerics.probs`:
  single_lse=False  P = exp((S − m) − log l), 0 in place of S − m where S == m: JAX "paper"
                    (its default since 2026-12-01)
  single_lse=True   P = exp(S − lse), lse = log l + m rounded once to float32: the paper's own
                    kernel (what this file computed before 2026-12-01, the same bits) and JAX
                    "paper+lse"

Runs in its own environment (torch only, no JAX); talks to JAX through dump files:
  python torch_crosscheck/paper_fa2.py OUT.npz --len 256 --heads 2 --head-dim 64 \\
      --block-q 64 --block-k 64 --causal --stabilize [--single-lse] [--device cuda] \\
      [--matmul bf16]
then, in the JAX environment:  flashstable crosscheck OUT.npz --numerics paper
(the dump's attrs say which backward made it; crosscheck runs the JAX backward that matches:
paper, or paper+lse with --single-lse)
"""

from __future__ import annotations

import contextlib
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import (  # noqa: E402
  BF,
  NAMES,
  make_inputs,
  round_bf16,
  shape_parser,
  to_bf16,
  write_dump,
)


rb = round_bf16  # round to bf16 and compute on in float32 (what autocast's bf16 buffers do)


@contextlib.contextmanager
def convert_pair_spelling():
  """Within it, this file's roundings (`rb`, `to_bf16`) are spelled as they were before
  2026-12-05: convert pairs, x.to(bf16).float() and x.to(bf16), which torch 2.11's joint-graph
  pass `pointless_convert` drops under torch.compile (`common.drop_convert_pairs` does the same
  on any torch). The control of the checks that the bit rounding survives such a compiler
  (experiments/15_twin_paper_bits.py, tests/test_torch_twin.py); not for training."""
  global rb, to_bf16
  kept = rb, to_bf16
  rb, to_bf16 = (lambda x: x.to(torch.bfloat16).float()), (lambda x: x.to(torch.bfloat16))
  try:
    yield
  finally:
    rb, to_bf16 = kept


MATMULS = ("bf16", "emulated")  # `mm`'s modes


def mm(a, b, matmul="emulated"):
  """The product of bf16-valued a and b with float32 accumulation, as float32; every caller
  rounds it to bf16 at once, as a bf16 dot with a float32 accumulator does. "emulated": a
  float32 matmul (the products of bf16 values are exact in float32; on CUDA without TF32, a
  non-tensor-core GEMM); "bf16": torch's bf16 GEMM (float32 accumulation, its result rounded
  once to bf16; tensor cores on CUDA): the same rounding points, another summation order."""
  if matmul == "bf16":
    return (a.to(BF) @ b.to(BF)).float()
  if matmul != "emulated":
    raise ValueError(f"matmul={matmul!r} is not one of {MATMULS}")
  return a.float() @ b.float()


def scores(qi, kj, scale, causal, rows, j, matmul="emulated", masked=-torch.finfo(BF).max):
  """S = bf16(bf16(Q_i K_jᵀ)·scale) of query tile qi [..., bq, D] (its rows' positions `rows`)
  and the key tile kj [..., bk, D] that starts at key j, as float32; causally masked entries
  `masked`: −BF16_MAX as the paper's forward masks them, −inf in the backward (P = 0 there)."""
  s = rb(rb(mm(qi, kj.transpose(-1, -2), matmul)) * scale)
  if causal:
    cols = torch.arange(j, j + kj.shape[-2], device=qi.device)
    s = s.masked_fill(cols[None, :] > rows[:, None], masked)
  return s


def tied(s, tile_max, tol):
  """The compensation's rule per row of a score tile s [..., bq, bk] (Qiu & Yao 2025, Alg. 1):
  more than one score ≥ bf16(tile max − tol), masked entries (−BF16_MAX) counted, as the paper's
  kernel counts them (JAX: `policy.tie_count`, paper). bool [..., bq]."""
  return (s >= rb(tile_max - tol)[..., None]).sum(-1) > 1


def tied_tiles(q, k, scale, causal, bq, bk, tol, matmul="emulated"):
  """Per row, the number of key tiles on which the compensation's rule fires (`tied`), every
  tile visited as `forward` visits them (a fully masked one is tied at −BF16_MAX): JAX's
  `AttentionStats.tied_tiles` of the paper layout with the compensation on. q [B,H,Lq,D],
  k [B,H,Lk,D] bf16 → float32 [B,H,Lq]."""
  count = torch.zeros(q.shape[:3], device=q.device)
  for i in range(0, q.shape[2], bq):
    qi = q[:, :, i : i + bq]
    rows = torch.arange(i, i + qi.shape[2], device=q.device)
    for j in range(0, k.shape[2], bk):
      s = scores(qi, k[:, :, j : j + bk], scale, causal, rows, j, matmul)
      count[:, :, i : i + bq] += tied(s, s.amax(-1), tol)
  return count


def forward(q, k, v, scale, causal, bq, bk, stabilize, beta, tol, matmul="emulated"):
  """q [B,H,Lq,D], k/v [B,H,Lk,D] bf16 → (O bf16, m, log l), m and log l float32 [B,H,Lq]: the
  row max (bf16 values) and the natural log of the bf16 row sum, kept apart for `backward`
  (the paper's lse is log l + m, `lse`). Every key tile is visited, fully masked ones too (the
  paper's kernel does: the compensation sees such a tile as tied at −BF16_MAX and shifts its
  max to 0, as JAX's paper layout). `matmul`: one of MATMULS (`mm`)."""
  B, H, Lq, D = q.shape
  Lk = k.shape[2]
  out = torch.empty(B, H, Lq, D, dtype=BF, device=q.device)
  m_out = torch.empty(B, H, Lq, dtype=torch.float32, device=q.device)
  log_l = torch.empty(B, H, Lq, dtype=torch.float32, device=q.device)
  for i in range(0, Lq, bq):
    qi = q[:, :, i : i + bq]
    rows = torch.arange(i, i + qi.shape[2], device=q.device)
    m = torch.full(qi.shape[:3], -float("inf"), device=q.device)  # bf16 values, float32 storage
    l = torch.zeros(qi.shape[:3], device=q.device)
    o = torch.zeros(qi.shape, device=q.device)
    for j in range(0, Lk, bk):
      kj, vj = k[:, :, j : j + bk], v[:, :, j : j + bk]
      s = scores(qi, kj, scale, causal, rows, j, matmul)
      mt = s.amax(-1)  # tile max (bf16 value)
      if stabilize:
        shifted = torch.where(mt > 0, rb(beta * mt), torch.where(mt < 0, torch.zeros_like(mt), mt))
        mt = torch.where(tied(s, mt, tol), shifted, mt)
      m_new = torch.maximum(mt, m)
      p = torch.exp(rb(s - m_new[..., None]))  # P̄, float32
      rs = p.sum(-1).clamp_min(1e-10)
      pv = rb(mm(to_bf16(p), vj, matmul))  # bf16(P̄V)
      alpha = torch.exp(rb(m - m_new))
      l = rb(alpha * l + rs)
      o = rb(rb(o * alpha[..., None]) + pv)
      m = m_new
    out[:, :, i : i + bq] = to_bf16(o / l[..., None])
    m_out[:, :, i : i + bq] = m
    log_l[:, :, i : i + bq] = torch.log(l)
  return out, m_out, log_l


def lse(m, log_l):
  """The paper's lse = log(l) + m, rounded once to float32 (a statistic of the m/log l
  backward; the single_lse backward's operand)."""
  return log_l + m


def probs(s, m, log_l, single_lse=False):
  """P in float32 from the scores s [..., bq, bk] and the rows' m, log l [..., bq], as JAX's
  `Numerics.probs`: exp((s − m) − log l) with s − m written as 0 where s == m, or
  (single_lse, the paper's kernel) exp(s − lse). Masked scores (−inf) give 0."""
  m, log_l = m[..., None], log_l[..., None]
  if single_lse:
    return torch.exp(s - lse(m, log_l))
  return torch.exp(torch.where(s == m, torch.zeros_like(s), s - m) - log_l)


def backward(
  q, k, v, out, m, log_l, d_out, scale, causal, bq, bk, single_lse=False, matmul="emulated"
):
  """→ (dQ, dK, dV) bf16, accumulated tile by tile in bf16 buffers. P from `forward`'s m and
  log l (`probs`): kept apart (default; JAX "paper") or through one float32 lse (single_lse:
  the paper's own kernel; JAX "paper+lse"). Causal: a (query tile, key tile) pair with every
  key after every query is skipped, as JAX's backward skips it (`pallas_kernels/backward.py`):
  its P is 0, so it would add exact zeros to dQ, dK and dV. `matmul`: one of MATMULS (`mm`)."""
  Lq, Lk = q.shape[2], k.shape[2]
  delta = rb(d_out.float() * out.float()).sum(-1)  # fp32 sum of bf16(dO∘O)
  dq = torch.zeros(q.shape, device=q.device)
  dk = torch.zeros(k.shape, device=q.device)
  dv = torch.zeros(v.shape, device=q.device)
  for j in range(0, Lk, bk):
    kj, vj = k[:, :, j : j + bk], v[:, :, j : j + bk]
    for i in range(0, Lq, bq):
      if causal and j > i + bq - 1:  # every key of tile j after every query of tile i
        continue
      qi, doi = q[:, :, i : i + bq], d_out[:, :, i : i + bq]
      rows = torch.arange(i, i + qi.shape[2], device=q.device)
      s = scores(qi, kj, scale, causal, rows, j, matmul, masked=-float("inf"))
      p = probs(s, m[:, :, i : i + bq], log_l[:, :, i : i + bq], single_lse)
      dv[:, :, j : j + bk] = rb(
        dv[:, :, j : j + bk] + rb(mm(to_bf16(p).transpose(-1, -2), doi, matmul))
      )
      dp = rb(mm(doi, vj.transpose(-1, -2), matmul))
      ds = (p * scale) * (dp - delta[:, :, i : i + bq, None])
      dq[:, :, i : i + bq] = rb(dq[:, :, i : i + bq] + rb(mm(to_bf16(ds), kj, matmul)))
      dk[:, :, j : j + bk] = rb(
        dk[:, :, j : j + bk] + rb(mm(to_bf16(ds).transpose(-1, -2), qi, matmul))
      )
  return dq.to(BF), dk.to(BF), dv.to(BF)


def main(argv=None):
  ap = shape_parser(__doc__.splitlines()[0])
  ap.add_argument("--block-q", type=int, default=64)
  ap.add_argument("--block-k", type=int, default=64)
  ap.add_argument("--stabilize", action="store_true")
  ap.add_argument("--beta", type=float, default=2.0)
  ap.add_argument("--tie-tolerance", type=float, default=1e-3)
  ap.add_argument(
    "--matmul",
    choices=MATMULS,
    default="emulated",
    help="float32 GEMMs of the bf16 operands (emulated, default) or torch's bf16 GEMM",
  )
  ap.add_argument(
    "--single-lse",
    action="store_true",
    help="the paper's own backward, P = exp(S − lse) (default: m and log l apart, JAX's paper)",
  )
  a = ap.parse_args(argv)
  q, k, v, do = make_inputs(a)
  scale = a.head_dim**-0.5
  out, m, log_l = forward(
    q,
    k,
    v,
    scale,
    a.causal,
    a.block_q,
    a.block_k,
    a.stabilize,
    a.beta,
    a.tie_tolerance,
    a.matmul,
  )
  dq, dk, dv = backward(
    q, k, v, out, m, log_l, do, scale, a.causal, a.block_q, a.block_k, a.single_lse, a.matmul
  )
  write_dump(
    a.out,
    dict(zip(NAMES, (q, k, v, do, out, dq, dk, dv))),
    lse(m, log_l),
    producer=f"torch {torch.__version__} paper_fa2 ({a.device})",
    causal=a.causal,
    softmax_scale=scale,
    stabilize=a.stabilize,
    single_lse=a.single_lse,
    beta=a.beta,
    tie_tolerance=a.tie_tolerance,
    block_q=a.block_q,
    block_k=a.block_k,
    matmul=a.matmul,
  )


if __name__ == "__main__":
  main()
