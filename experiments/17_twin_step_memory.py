"""The twin's step memory with its loss chunked (`gpt_twin.lm_head_loss`) and as autograd
spelled it before 2026-12-05 (the whole batch's float32 logits): the anchor's model (6 layers ×
6 heads × 384, context 1024, vocab 50,304, no bias) with the paper layout at tiles 512, one
step (loss and backward) compiled as the twin compiles it, or eager. Each (batch, spelling) in
a process of its own; the peak of a second step: on CUDA torch's max_memory_allocated, on the
CPU the peak resident memory (VmHWM, reset by /proc/self/clear_refs before the step; run with
MALLOC_MMAP_THRESHOLD_=65536 so that freed tensors leave it). The chunks are an eighth of the
batch's tokens, as LOSS_CHUNK's at batch 128. Issue 18: every paper twin at anchor-b128 ran out
of an H100's 80 GB in the loss's backward (2026-12-05).

    MALLOC_MMAP_THRESHOLD_=65536 .torchvenv/bin/python experiments/17_twin_step_memory.py \\
      [--batches 2,4] [--compile on|off] [--device cpu|cuda]      # CPU: ~10 min at 2,4

Prints one line per run and the slope per sequence of each spelling.
"""

import argparse
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPELLINGS = ("plain", "chunked")


def one(batch, spelling, compile, device):
  """One step's peak in GiB (see the module docstring), and the loss."""
  sys.path.insert(0, str(ROOT / "torch_crosscheck"))
  import gpt_twin as T
  import torch

  torch.manual_seed(0)
  cfg = T.ModelConfig(6, 6, 384, 1024, 50304, False)
  model = T.GPT(cfg, T.AttentionChoice("paper", block_q=512, block_k=512), seed=0).to(device)
  g = torch.Generator().manual_seed(0)
  x, y = (torch.randint(0, 50304, (batch, 1024), generator=g).to(device) for _ in range(2))

  def plain(x, y):
    logits = model(x)
    return (torch.logsumexp(logits, -1) - logits.gather(-1, y[..., None]).squeeze(-1)).mean()

  def chunked(x, y):
    return T.loss_fn(model, x, y, chunk=batch * 1024 // 8)

  step = plain if spelling == "plain" else chunked
  step = torch.compile(step) if compile == "on" else step
  step(x, y).backward()  # the first step compiles
  for p in model.parameters():
    p.grad = None
  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  else:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  loss = step(x, y)
  loss.backward()
  if device == "cuda":
    peak = torch.cuda.max_memory_allocated()
  else:
    with open("/proc/self/status") as f:
      peak = int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024
  return peak / 2**30, loss.item()


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batches", default="2,4")
  ap.add_argument("--compile", default="on", choices=("on", "off"))
  ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
  ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # BATCH SPELLING: a child process
  args = ap.parse_args()
  if args.one:
    peak, loss = one(int(args.one[0]), args.one[1], args.compile, args.device)
    print(f"{peak:.3f} {loss:.6f}")
    return
  batches = [int(b) for b in args.batches.split(",")]
  found = {}
  for spelling in SPELLINGS:
    for b in batches:
      cmd = [sys.executable, __file__, "--one", str(b), spelling]
      cmd += ["--compile", args.compile, "--device", args.device]
      out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
      if out.returncode:
        sys.exit(f"batch {b} {spelling}: exit status {out.returncode}\n{out.stderr[-2000:]}")
      peak, loss = map(float, out.stdout.split()[-2:])
      found[spelling, b] = peak
      print(f"batch {b}, {spelling}, compile {args.compile}: peak {peak:.2f} GiB, loss {loss:.4f}")
  if len(batches) > 1:
    lo, hi = min(batches), max(batches)
    for spelling in SPELLINGS:
      slope = (found[spelling, hi] - found[spelling, lo]) / (hi - lo)
      print(f"{spelling}: {slope:.3f} GiB a sequence")


if __name__ == "__main__":
  main()
