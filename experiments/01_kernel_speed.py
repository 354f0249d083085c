"""How fast are the flash kernels next to cuDNN and XLA? (issue 2's side-by-side table)

Question: forward and forward+backward TFLOP/s at batch 4, length 4096, 16 heads, head_dim
128, bf16, causal and not, with and without the compensation, against
`jax.nn.dot_product_attention(implementation="cudnn")` and "xla".
Command (H200): python3 experiments/01_kernel_speed.py --out runs/speed
CPU: python experiments/01_kernel_speed.py --seq-len 256 --batch 1 --heads 2 --reps 2
Expected runtime: ~2 min on one H200 (compiles included).
"""
import argparse

import jax

from jax_flashstable.results import run_meta, write_results
from jax_flashstable.bench import format_table, speed_table


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="runs/speed")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq-len", type=int, default=4096)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--reps", type=int, default=20)
  a = ap.parse_args()
  rows = speed_table(a.batch, a.seq_len, a.heads, a.head_dim, reps=a.reps)
  meta = run_meta(batch=a.batch, seq_len=a.seq_len, heads=a.heads, head_dim=a.head_dim,
                  dtype="bfloat16")
  write_results(a.out, "speed", rows, format_table(rows), meta)


if __name__ == "__main__":
  main()
