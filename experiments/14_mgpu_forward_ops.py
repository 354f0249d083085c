"""Issue 19, on a CPU: what one key tile of the Mosaic GPU forward costs a compute thread, op by
op, against JAX's own Mosaic GPU attention (`jax.experimental.pallas.ops.gpu.attention_mgpu`).
Both kernels are lowered for CUDA (no GPU needed: the Mosaic GPU module is taken before it is
serialised) and the body of the first loop that carries float32 pairs (the compute
warpgroup's loop over key tiles) is counted: float32 arithmetic per element (vector<2xf32> ops
count 2), max/min/ex2 (inline PTX), bf16x2 conversions, warp shuffles, and the loop's
barriers and wgmma waits. Counts of the lowered MLIR, before LLVM and ptxas: a guide to where
the elementwise work differs, not a timing (that is `11_mgpu_forward_ab.py`, on the GPU). An op
repeated on the same operands counts once (LLVM's CSE); ops inside a branch count as if it were
always taken.

    PYTHONPATH=. python3 experiments/14_mgpu_forward_ops.py [OPTION=1 ...]

OPTIONs (`MosaicGPUOptions` flags, e.g. opt_barrier=1) apply to our kernel (the 64-key step:
wide_step=0 unless wide_step=1 is given, so that a row is one key tile). Our kernel runs
the fa2 numerics with and without the compensation; JAX's takes float16 and a pre-scaled query.
"""

import collections
import re
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import core

from pallas_kernels.attention import kernel_config
from pallas_kernels.forward_mgpu import MosaicGPUOptions, flash_forward_mgpu
from pallas_kernels.policy import Compensation, get_numerics

_serde = core._run_serde_pass  # the Mosaic GPU module, as text, before it is serialised
MODULES = []
core._run_serde_pass = lambda module, *a, **k: (
  MODULES.append(str(module)) or _serde(module, *a, **k)
)


def lowered(f, *args):
  MODULES.clear()
  jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
  return MODULES[-1]


def loop_body(text):
  """The lines of the first scf.for carrying vector<2xf32> values (the softmax's loop)."""
  lines = text.split("\n")
  for i, line in enumerate(lines):
    if "scf.for" in line and "iter_args" in line and "vector<2xf32>" in line:
      indent = len(line) - len(line.lstrip())
      end = next(j for j in range(i + 1, len(lines)) if lines[j] == " " * indent + "}")
      return lines[i + 1 : end]
  raise ValueError("no loop over key tiles found")


ARITH = ("addf", "subf", "mulf", "cmpf", "select", "uitofp", "negf")


def count(body):
  """Ops by kind; an op repeated on the same operands (the same text after `=`: e.g. m·log₂e
  on each register of a broadcast row) counts once, as LLVM's CSE leaves it."""
  c, seen = collections.Counter(), set()
  for line in body:
    rhs = line.partition("=")[2].strip()
    if rhs and "inline_asm has_side_effects" not in rhs and "shfl" not in rhs:
      if rhs in seen:
        continue
      seen.add(rhs)
    asm = re.search(r'llvm.inline_asm[^"]*"\s*([a-z0-9_.:]+)', line)
    op = re.search(r"=\s*arith\.([a-z_]+)", line)
    if "nvvm.shfl.sync" in line:
      c["shfl"] += 1
    elif asm:
      name = asm.group(1)
      for key in ("max", "min", "ex2", "mbarrier", "wgmma.wait"):
        if name.startswith(key):
          c[key] += 1
          break
    elif op and op.group(1) in ARITH:
      c[op.group(1)] += 2 if "vector<2xf32>" in line.split(":")[-1] else 1
    elif op and op.group(1) == "truncf":
      c["cvt bf16x2"] += 1
  return c


def main(argv):
  options = {k: bool(int(v)) for k, v in (a.split("=") for a in argv)}
  q = jnp.zeros((1, 1024, 2, 128), jnp.bfloat16)
  from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu

  mgpu.cuda_versions = type("V", (), {"cuda_runtime_get_version": staticmethod(lambda: 13000)})
  rows = {}
  for block_k in (64, 128):
    for comp in (False, True):
      cfg = kernel_config(
        q_len=1024,
        kv_len=1024,
        head_dim=128,
        dtype=jnp.bfloat16,
        softmax_scale=128**-0.5,
        causal=False,
        numerics=get_numerics("fa2"),
        compensation=Compensation() if comp else None,
        interpret=False,
        backend="mosaic_gpu",
        block_k=block_k,
        mgpu_options=MosaicGPUOptions(pingpong=True, **{"wide_step": False, **options}),
      )
      text = lowered(lambda q, k, v, cfg=cfg: flash_forward_mgpu(q, k, v, cfg)[:3], q, q, q)
      rows[f"ours fa2{'+comp' if comp else ''}, block_k {block_k}"] = count(loop_body(text))
    tuning = mgpu.TuningConfig(block_q=64, block_kv=block_k, max_concurrent_steps=2, causal=False)
    qh = q.astype(jnp.float16)
    text = lowered(lambda q, k, v: mgpu._attention_forward(q, k, v, tuning), qh, qh, qh)
    rows[f"JAX attention_mgpu, block_kv {block_k}"] = count(loop_body(text))
  keys = ["ex2", "max", "min", *ARITH, "cvt bf16x2", "shfl", "mbarrier", "wgmma.wait"]
  print(
    f"b1 × 1024 × 2 × d128, non-causal; options {options or 'none'}; per compute thread, one key tile\n"
  )
  print("| kernel | " + " | ".join(keys) + " | elementwise + shfl |")
  print("|---|" + "---:|" * (len(keys) + 1))
  for name, c in rows.items():
    total = sum(c[k] for k in keys if k not in ("mbarrier", "wgmma.wait"))
    print(f"| {name} | " + " | ".join(str(c[k]) for k in keys) + f" | {total} |")


if __name__ == "__main__":
  main(sys.argv[1:])
