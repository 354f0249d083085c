"""Which tiles and Triton launch parameters make the fa2 kernels fastest on this GPU? (issue 7)

Question: forward TFLOP/s over (block_q, block_k, num_warps, num_stages), and forward+backward
TFLOP/s over the backward tiles (block_q_bwd, block_k_bwd) and warps, at one shape (default:
batch 4, length 4096, 16 heads, head_dim 128, bf16, non-causal, compensation off).
Every configuration's output is checked against the default's before it is timed.
Command (H200): python3 experiments/03_tile_sweep.py --out runs/tiles
CPU smoke: python experiments/03_tile_sweep.py --seq-len 128 --batch 1 --heads 2 --head-dim 64 --reps 1 --quick
Expected runtime: ~2 min on one H200.
"""

import argparse
import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.lab.shapes import Shape, make_inputs
from jax_flashstable.bench import attention_flops, seconds_per_call, waiting
from jax_flashstable.results import run_meta, write_results
from pallas_kernels.attention import KernelConfig, flash_attention_padded
from pallas_kernels.policy import BlockSizes, get_numerics


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="runs/tiles")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq-len", type=int, default=4096)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--quick", action="store_true", help="two configurations per sweep")
  a = ap.parse_args()
  shape = Shape(a.batch, a.seq_len, a.seq_len, a.heads, a.heads, a.head_dim, a.causal)
  q, k, v, do = make_inputs(shape, jnp.bfloat16, 0)
  flops = attention_flops(a.batch, a.seq_len, a.seq_len, a.heads, a.head_dim, a.causal)
  base = BlockSizes.default(a.head_dim)
  interpret = jax.default_backend() != "gpu"

  def config(blocks, warps, stages, warps_bwd=4):
    return KernelConfig(
      softmax_scale=a.head_dim**-0.5,
      causal=a.causal,
      q_len=a.seq_len,
      kv_len=a.seq_len,
      blocks=blocks.fit(a.seq_len, a.seq_len),
      numerics=get_numerics("fa2"),
      compensation=None,
      interpret=interpret,
      num_warps=warps,
      num_stages=stages,
      num_warps_bwd=warps_bwd,
      num_stages_bwd=2,
    )

  ref = np.asarray(flash_attention_padded(q, k, v, config(base, 8, 2))[0], np.float32)
  fwd_grid = list(
    itertools.product([(64, 64), (128, 64), (128, 128), (64, 128), (256, 64)], (4, 8), (2, 3, 4))
  )
  bwd_grid = list(
    itertools.product([(32, 64), (64, 64), (64, 128), (128, 64), (128, 128), (32, 128)], (4, 8))
  )
  if a.quick:
    fwd_grid, bwd_grid = fwd_grid[:2], bwd_grid[:2]
  rows = []
  for (bq, bk), warps, stages in fwd_grid:
    cfg = config(dataclasses.replace(base, block_q=bq, block_k=bk, sub=bk), warps, stages)
    f = jax.jit(lambda q, k, v, cfg=cfg: flash_attention_padded(q, k, v, cfg)[0])
    try:
      err = float(np.max(np.abs(np.asarray(f(q, k, v), np.float32) - ref)))
      t = seconds_per_call(waiting(f, q, k, v), 2, a.reps)
    except Exception as e:  # e.g. out of shared memory for this tile
      rows.append(
        dict(
          sweep="fwd",
          block_q=bq,
          block_k=bk,
          warps=warps,
          stages=stages,
          error=str(e).splitlines()[0][:160],
        )
      )
      continue
    rows.append(
      dict(
        sweep="fwd",
        block_q=bq,
        block_k=bk,
        warps=warps,
        stages=stages,
        ms=1e3 * t,
        tflops=flops / t / 1e12,
        max_diff_vs_default=err,
      )
    )
    print(rows[-1], flush=True)
  for (bqb, bkb), warps in bwd_grid:
    cfg = config(
      dataclasses.replace(base, block_q_bwd=bqb, block_k_bwd=bkb),
      8 if a.head_dim > 64 else 4,
      2,
      warps,
    )
    fb = jax.jit(
      lambda q, k, v, do, cfg=cfg: jax.vjp(
        lambda q, k, v: flash_attention_padded(q, k, v, cfg)[0], q, k, v
      )[1](do)
    )
    try:
      t = seconds_per_call(waiting(fb, q, k, v, do), 2, a.reps)
    except Exception as e:
      rows.append(
        dict(
          sweep="fwd+bwd",
          block_q_bwd=bqb,
          block_k_bwd=bkb,
          warps=warps,
          error=str(e).splitlines()[0][:160],
        )
      )
      continue
    rows.append(
      dict(
        sweep="fwd+bwd",
        block_q_bwd=bqb,
        block_k_bwd=bkb,
        warps=warps,
        ms=1e3 * t,
        tflops=3.5 * flops / t / 1e12,
      )
    )
    print(rows[-1], flush=True)
  best = {
    s: max(
      (r for r in rows if r["sweep"] == s and "tflops" in r),
      key=lambda r: r["tflops"],
      default=None,
    )
    for s in ("fwd", "fwd+bwd")
  }
  table = "\n".join(
    ["| sweep | config | ms | TFLOP/s |", "|---|---|---:|---:|"]
    + [
      f"| {r['sweep']} | "
      + ", ".join(
        f"{k}={v}"
        for k, v in r.items()
        if k not in ("sweep", "ms", "tflops", "max_diff_vs_default", "error")
      )
      + (
        f" | {r['ms']:.3f} | {r['tflops']:.3g} |"
        if "tflops" in r
        else f" | error | {r['error'][:60]} |"
      )
      for r in rows
    ]
  )
  write_results(a.out, "tiles", rows, table, run_meta(shape=shape.name, best=best))


if __name__ == "__main__":
  main()
