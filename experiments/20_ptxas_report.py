"""Issue 19, on a CPU: ptxas's report (registers, spill bytes, C75xx warnings) for each Mosaic GPU
kernel, compiled for sm_90a (H100/H200) by Mosaic GPU's own compiler with no GPU, and with
nvdisasm (setup's) the SASS's spill instructions (STL/LDL) per kernel and per loop over tiles.

How: each kernel is lowered for CUDA on the CPU (as `tests/test_lowering.py` does), which leaves
its serialised Mosaic GPU module in `jax.experimental.mosaic.gpu.core.KNOWN_KERNELS`; the module
goes through `MosaicGpuCompile` of the jax-cuda13 PJRT plugin, the GPU's own pipeline (NVVM →
LLVM NVPTX → PTX → the first `ptxas` on PATH, `-arch=sm_90a -v --warn-on-spills`, printed with
MOSAIC_GPU_DUMP_PTXAS=1). The only thing that pipeline asks the CUDA driver is the current
device's compute capability, so a stub `libcuda.so.1` (C source below, built once with cc into
.venv-ptxas/) answers 9.0 and loads modules as no-ops. On 2026-12-05 (CUDA 13.0.88's ptxas, this
project's CPU) it reproduced the H200's report of the same day byte for byte in its numbers
(`experiments/results/h200-2026-12-05b-b128/ptxas.txt`: the causal dK/dV kernel at head_dim 128,
stages (3, 2), 60 bytes spill stores, 108 loads, 40 bytes stack, six C7519 warnings). Another
ptxas version can report otherwise (CUDA 13.5's: 60/100 there); the device's is the judge.

    bash scripts/setup.sh ptxas   # .venv-ptxas: jax 0.11.2 + the CUDA 13 plugin (~1 GB)
    PYTHONPATH=. .venv-ptxas/bin/python experiments/20_ptxas_report.py [--causal] \
      [--shape B,N,H,HK,D] [--out DIR] [--nvdisasm PATH|''] [fwd:VARIANT | bwd:DKV,DQ[,OPT=0|1] ...]

fwd:VARIANT is `11_mgpu_forward_ab.py`'s (bk, st, comp, MosaicGPUOptions fields; "fwd:" alone is
the default forward, with the compensation as there: comp=0 for plain fa2; jax=1 JAX's own
attention_mgpu), bwd:... is `18_mgpu_backward_stages_ab.py`'s ("bwd:" alone: the default
stages; the backward takes the fa2 numerics without the compensation, as there). Default:
`fwd: bwd:`. DIR (default /tmp/ptxas-report) keeps each kernel's PTX and ptxas output.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUB = ROOT / ".venv-ptxas" / "stub-libcuda" / "libcuda.so.1"
STUB_SOURCE = r"""
/* A CUDA driver stub for experiments/20_ptxas_report.py: MosaicGpuCompile asks only for the
   current device's compute capability (attributes 75, 76), here 9.0 → sm_90a. */
typedef int CUresult;
static char handle[64];
CUresult cuInit(unsigned f) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int o) { *d = 0; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = handle; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  *v = attr == 75 ? 9 : 0; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "stub libcuda"; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = "STUB_LIBCUDA"; return 0; }
CUresult cuModuleLoadData(void **m, const void *image) { *m = handle; return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { *f = handle; return 0; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { return 0; }
CUresult cuModuleUnload(void *m) { return 0; }
"""


def experiment(name):
  spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def parse_variants(specs, options_cls):
  """[(spec, kind, parsed)] from "fwd:..." / "bwd:..." (ValueError naming a bad one)."""
  forward, backward = experiment("11_mgpu_forward_ab"), experiment("18_mgpu_backward_stages_ab")
  out = []
  for spec in specs:
    kind, colon, rest = spec.partition(":")
    if not colon or kind not in ("fwd", "bwd"):
      raise ValueError(f"variant {spec!r} is not fwd:VARIANT or bwd:DKV,DQ")
    if kind == "fwd":
      out.append((spec, kind, forward.parse_variant(rest, options_cls)))
    else:
      out.append((spec, kind, backward.parse_stages(rest) if rest else (None, {})))
  return out


def checked(shape, variants) -> str | None:
  """Why a variant cannot be compiled at the shape (None when all can): the kernels run the
  padded shape the API would hand them, so its length must be a multiple of 128 and head_dim
  32, 64, 128 or 256 here; each variant as `forward_mgpu.supported` / `backward_mgpu.supported`."""
  import jax.numpy as jnp

  from pallas_kernels import backward_mgpu, forward_mgpu

  if shape.q_len % 128 or shape.kv_len % 128 or shape.head_dim not in forward_mgpu.HEAD_DIMS:
    return (
      f"--shape: length {shape.q_len} and head_dim {shape.head_dim}: the kernels take padded "
      "arrays (length a multiple of 128, head_dim 32, 64, 128 or 256)"
    )
  group = shape.num_heads // shape.num_kv_heads
  split_fields = experiment("18_mgpu_backward_stages_ab").split_fields  # bk_dq of a bwd variant
  for spec, kind, v in variants:
    if kind == "fwd":
      why = forward_mgpu.supported(
        numerics="fa2",
        block_k=v["block_k"],
        head_dim=shape.head_dim,
        dtype=jnp.bfloat16,
        num_stages=v["num_stages"],
      )
    else:
      _, fields = split_fields(v[1])
      why = backward_mgpu.supported(
        numerics="fa2",
        head_dim=shape.head_dim,
        dtype=jnp.bfloat16,
        num_stages=v[0] if v[0] is not None else 1,
        group=group,
        block_k_dq=fields.get("block_k_dq_mgpu"),
      )
    if why:
      return f"variant {spec!r}: {why}"
  return None


def stub_driver():
  """Loads the stub libcuda.so.1 (built on first use) before the plugin opens one by soname."""
  if not STUB.exists():
    STUB.parent.mkdir(parents=True, exist_ok=True)
    src = STUB.with_suffix(".c")
    src.write_text(STUB_SOURCE)
    cmd = ["cc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(STUB), str(src)]
    subprocess.run(cmd, check=True)
  ctypes.CDLL(str(STUB), mode=ctypes.RTLD_GLOBAL)


class CapturedFds:
  """Fds 1 and 2 (where the compiler's C++ side prints) into a file while open."""

  def __enter__(self):
    sys.stdout.flush()
    sys.stderr.flush()
    self.file = tempfile.TemporaryFile()
    self.saved = [os.dup(1), os.dup(2)]
    for fd in (1, 2):
      os.dup2(self.file.fileno(), fd)
    return self

  def __exit__(self, *exc):
    for fd, saved in zip((1, 2), self.saved):
      os.dup2(saved, fd)
      os.close(saved)
    self.file.seek(0)
    self.text = self.file.read().decode(errors="replace")
    self.file.close()


def opcode(line):
  """A SASS line's opcode without modifiers or predicate ("@!P1 FMNMX.NAN R1, ..." → FMNMX), or
  None for a line that is no instruction."""
  m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
  return m.group(1) if m and ";" in line else None


def sass_loops(nvdisasm, cubin):
  """(the kernel's opcodes, [the opcodes of each innermost loop with a wgmma (HGMMA)], the
  NANOSLEEPs before the last EXIT) of a cubin, the first two as Counters: the loops are the
  kernel's loops over tiles, one per mask variant, not the barriers' wait loops; a loop is
  the span from a label to a branch back to it (nvdisasm -c: "BRA `(.L_x_7)", ".L_x_7:")
  before the last EXIT (after it ptxas puts the barriers' retries, which branch back into the
  loops). A NANOSLEEP before that EXIT is a barrier wait whose retry ptxas put inline (a
  sleep after the first failed try): the Mosaic GPU forward of one item a CTA with its Q
  loaded by the producer had 15, about 10% slower on an H100 (2026-12-06); 0–1 is the
  usual form."""
  sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True)
  lines = sass.stdout.splitlines()
  labels = {
    m.group(1): i for i, t in enumerate(lines) if (m := re.match(r"(\.L_x_\d+):", t.strip()))
  }
  spans = []  # (label's line, branch's line) of each loop with a wgmma
  end = max((i for i, t in enumerate(lines) if re.search(r"\sEXIT ;", t)), default=len(lines))
  for i, line in enumerate(lines[:end]):
    to = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", line)
    if to and labels.get(to.group(1), i) < i:
      if any("HGMMA" in t for t in lines[labels[to.group(1)] : i]):
        spans.append((labels[to.group(1)], i))
  inner = [
    (a, b) for a, b in spans if not any(a <= c < d <= b and (c, d) != (a, b) for c, d in spans)
  ]
  ops = lambda part: collections.Counter(filter(None, map(opcode, part)))  # noqa: E731
  inline_sleeps = ops(lines[:end])["NANOSLEEP"]
  return ops(lines), [ops(lines[a : b + 1]) for a, b in inner], inline_sleeps


SHOWN = ("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "MUFU", "F2FP", "SHFL", "HGMMA")


def describe(ops):
  """One line: the instruction count, the float ops of `SHOWN`, spills (STL/LDL)."""
  shown = ", ".join(f"{ops[k]} {k}" for k in (*SHOWN, "STL", "LDL") if ops[k])
  return f"{sum(ops.values())} instructions ({shown})"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("variants", nargs="*", default=["fwd:", "bwd:"])
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--shape", default="1,1024,2,2,128", help="batch,len,heads,kv_heads,head_dim")
  ap.add_argument("--out", default="/tmp/ptxas-report", help="each kernel's PTX and report")
  wheel = next(
    pathlib.Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm"), None
  )
  ap.add_argument(
    "--nvdisasm",
    default=str(wheel) if wheel else None,
    help="nvdisasm, to count SASS spill instructions ('' for none; default: setup's, if any)",
  )
  a = ap.parse_args(argv)
  name = "20_ptxas_report"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  try:
    import jax_plugins.xla_cuda13 as plugin
  except ImportError:
    sys.exit(f"{name}: needs the CUDA 13 plugin: bash scripts/setup.sh ptxas, then .venv-ptxas")
  import jax
  import jax.numpy as jnp
  from jax.experimental.mosaic.gpu import core

  from jax_flashstable.bench import runners
  from jax_flashstable.lab.shapes import Shape
  from pallas_kernels.attention import kernel_config
  from pallas_kernels import backward_mgpu
  from pallas_kernels.backward_mgpu import flash_backward_mgpu
  from pallas_kernels.forward_mgpu import MosaicGPUOptions, flash_forward_mgpu
  from pallas_kernels.policy import Compensation, get_numerics

  try:
    s = Shape.parse(a.shape, causal=a.causal)
    variants = parse_variants(a.variants, MosaicGPUOptions)
  except ValueError as e:
    sys.exit(f"{name}: {e}")
  if a.nvdisasm and not os.access(a.nvdisasm, os.X_OK):
    sys.exit(f"{name}: --nvdisasm {a.nvdisasm!r} is not an executable")
  for tool, why in (("ptxas", "Mosaic GPU runs the first on PATH"), ("cc", "builds the stub")):
    if not shutil.which(tool):
      sys.exit(f"{name}: no {tool} on PATH ({why}; a CUDA toolkit's ptxas, a C compiler)")
  why = checked(s, variants)
  if why:
    sys.exit(f"{name}: {why}")
  stub_driver()
  lib = ctypes.CDLL(plugin._get_library_path())
  compile_module, unload = lib.MosaicGpuCompile, lib.MosaicGpuUnload
  compile_module.argtypes, compile_module.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p
  unload.argtypes, unload.restype = [ctypes.c_void_p], None
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)

  b, n, h, hk, d = s.batch, s.q_len, s.num_heads, s.num_kv_heads, s.head_dim
  q = jnp.zeros((b, n, h, d), jnp.bfloat16)
  kv = jnp.zeros((b, n, hk, d), jnp.bfloat16)
  rows = jnp.zeros((b, h, n), jnp.float32)

  def config(compensation=None, block_k=None, num_stages=None, mgpu_options=None):
    return kernel_config(
      q_len=n,
      kv_len=n,
      head_dim=d,
      dtype=jnp.bfloat16,
      softmax_scale=d**-0.5,
      causal=a.causal,
      numerics=get_numerics("fa2"),
      compensation=compensation,
      block_k=block_k,
      num_stages=num_stages,
      interpret=False,
      backend="mosaic_gpu",
      mgpu_options=mgpu_options,
      group=h // hk,
    )

  def lowered(f, *xs):
    core.KNOWN_KERNELS.clear()
    jax.jit(f).trace(*xs).lower(lowering_platforms=("cuda",))
    return list(core.KNOWN_KERNELS.values())  # trace order

  os.environ["MOSAIC_GPU_DUMP_PTX"] = os.environ["MOSAIC_GPU_DUMP_PTXAS"] = "1"
  print(f"# shape {(b, n, h, hk, d)}, causal={a.causal}, jax {jax.__version__}, sm_90a")
  backward_ab = experiment("18_mgpu_backward_stages_ab")  # its variants' KernelConfig fields
  for spec, kind, v in variants:
    if kind == "fwd" and v["jax"]:  # JAX's attention_mgpu, on its inputs (float16)
      f = runners.mosaic_gpu_attention_unchecked(s, v["block_k"], v["num_stages"])
      half = [x.astype(jnp.float16) for x in (q, kv, kv)]
      kernels = [("JAX's forward", m) for m in lowered(f, *half)]
    elif kind == "fwd":
      cfg = config(
        compensation=Compensation() if v["stabilize"] else None,
        block_k=v["block_k"],
        num_stages=v["num_stages"],
        mgpu_options=MosaicGPUOptions(**v["options"]),
      )
      kernels = [
        ("forward", m)
        for m in lowered(lambda q, k, v: flash_forward_mgpu(q, k, v, cfg)[:3], q, kv, kv)
      ]
    else:
      stages, options = v
      options, fields = backward_ab.split_fields(options)
      cfg = config(mgpu_options=MosaicGPUOptions(**options))
      cfg = dataclasses.replace(cfg, **fields)
      if stages is not None:
        cfg = dataclasses.replace(cfg, stages_bwd_mgpu=stages)
      mods = lowered(lambda q, k, v: flash_backward_mgpu(q, k, v, q, rows, rows, q, cfg), q, kv, kv)
      # trace order: dK/dV before dQ, but dQ first with delta_in_dq (dK/dV reads its rows)
      in_dq = backward_mgpu.resolve_delta_in_dq(cfg, d)
      kernels = list(zip(("dQ", "dK/dV") if in_dq else ("dK/dV", "dQ"), mods))
    for kernel, module in kernels:
      tag = re.sub(r"\W+", "_", f"{spec}_{kernel}").strip("_")
      with CapturedFds() as cap:
        handle = compile_module(module, len(module))
      if handle:
        unload(handle)
      lines = cap.text.splitlines()
      first = next((i for i, t in enumerate(lines) if t.startswith("ptxas")), len(lines))
      (out / f"{tag}.ptx").write_text("\n".join(lines[:first]) + "\n")
      (out / f"{tag}.ptxas.txt").write_text("\n".join(lines[first:]) + "\n")
      report = "\n".join(lines[first:])
      regs = re.search(r"Used \d+ registers", report)
      stack = re.search(r"\d+ bytes stack frame", report)
      spill = re.search(r"\d+ bytes spill stores, \d+ bytes spill loads", report)
      warns = sorted(set(re.findall(r"C75\d\d", report)))
      facts = [x.group(0) for x in (regs, stack, spill) if x] or ["no ptxas report"]
      print(
        f"{spec} {kernel}: {'compiled' if handle else 'FAILED'}; {', '.join(facts)}; "
        f"warnings {warns or 'none'}"
      )
      if not handle:
        print("  " + "\n  ".join(lines[first:][-5:]))
      elif a.nvdisasm:
        cubin = out / f"{tag}.cubin"
        ptx = str(out / f"{tag}.ptx")
        subprocess.run(
          ["ptxas", "-arch=sm_90a", ptx, "-o", str(cubin)], check=True, capture_output=True
        )
        kernel_ops, loops, sleeps = sass_loops(a.nvdisasm, cubin)
        print(
          f"  SASS: {kernel_ops['STL']} STL, {kernel_ops['LDL']} LDL in all, {sleeps} inline "
          "barrier-wait sleeps; loops over tiles:"
        )
        for ops in loops:
          print(f"    {describe(ops)}")


if __name__ == "__main__":
  main()
