"""Issue 18: is the PyTorch twin's paper layout, compiled as its training compiles it
(torch.compile with `gpt_twin.setup_precision(compiled=True)`, on the GPU), still JAX's paper
layout bit for bit? Eager on the CPU the two agree on 100% of the bits of O, dQ, dK and dV
(tests/test_torch_twin.py::test_attention_matches_jax_layouts). A compiler may drop a
rounding spelled as a convert pair x.to(bf16).float(): Inductor's fused kernels unless
`emulate_precision_casts` is set, and torch 2.11's joint-graph pass `pointless_convert`
whatever that setting (the GPU image's torch; 2.13 keeps them), so since 2026-12-05 the twin
rounds on the bits (`common.round_bf16`). This runs the twin's `attend` eager and compiled (a
fresh static graph per input), each with both of the twin's GEMMs (torch's bf16 GEMM, what
CUDA training takes, and float32 GEMMs of the bf16 operands, CPU training's), compiled under a
pass that drops convert pairs (`common.drop_convert_pairs`, torch 2.11's rewrite on any
version), and the control: the same with the roundings spelled as convert pairs (the check
must be able to fail), and JAX's `attend` with the
twin's JAX spec, at the training's shape and tiles (anchor-b128: seq 1024, 6 heads, head_dim 64,
tiles 512, causal) on inputs with many tied scores (entries on a grid of 1/8, keys in equal
pairs: the compensation fires), and on the mechanism's common-keys input
(tests/test_mechanism.py: dQ's channel 0 is 0 in FP64; its error is the bias term). Prints,
per attention and mode, the share of equal bits against JAX and dQ's error on the common-keys
input. It compiles the attention alone: training compiles the whole step, whose fusions
across the attention's edges this does not see.

    PYTHONPATH=. python3 experiments/15_twin_paper_bits.py [--kinds paper,paper+comp] [--seq 1024]

On a CPU, 2026-12-04 (torch 2.13, `--seq 128 --tiles 64`, ~2 min):
experiments/results/cpu-2026-12-04-twin-paper-bits/; 2026-12-05 with torch 2.11 (the GPU
image's; FLASHSTABLE_TORCH_PYTHON names its interpreter): cpu-2026-12-05-twin-torch211/. On
the GPU the twin's interpreter is this one (the image has torch beside JAX).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_mechanism import common_keys, tied_keys  # noqa: E402

from jax_flashstable.attention.config import AttentionConfig  # noqa: E402
from jax_flashstable.attention.flax_adapter import attend  # noqa: E402
from jax_flashstable.experiment import twin  # noqa: E402
from pallas_kernels.policy import check_tile  # noqa: E402

# the torch side: argv = folder, torch_crosscheck, kinds (JSON), tiles; in.npz holds CASE/q, k, v,
# d (bf16 bits, [b, s, h, d]) and CASE/causal; out.npz gets "CASE/KIND/MODE/i" (out, dQ, dK, dV),
# MODE "HOW/MATMUL" (HOW: eager, compiled, compiled-dropping, compiled-pairs; the last two only at
# the GEMM training takes on this device)
TORCH_SIDE = """
import contextlib, json, sys
import numpy as np, torch
import torch._inductor.config as inductor_config
sys.path.insert(0, sys.argv[2])
import gpt_twin as T
import common, paper_fa2
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
T.setup_precision(device, compiled=True)  # as `gpt_twin train` on CUDA (emulate_precision_casts)
training = T.resolve_matmul("auto", device)  # the GEMM `gpt_twin train` takes here
d = np.load(sys.argv[1] + "/in.npz")
to = lambda a: torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16).to(device)
tiles, result = int(sys.argv[4]), {}
modes = [(h, m) for m in T.MATMULS for h in ("eager", "compiled")]
modes += [("compiled-dropping", training), ("compiled-pairs", training)]
for case in sorted({n.split("/")[0] for n in d.files}):
  causal = bool(d[case + "/causal"])
  for kind in json.loads(sys.argv[3]):
    choice = T.AttentionChoice(kind, tiles, tiles)
    for how, matmul in modes:
      f = lambda q, k, v: T.attend(q, k, v, choice, causal=causal, matmul=matmul)
      if how != "eager":  # a fresh static graph per input and kind, as training's one shape
        torch._dynamo.reset()
        f = torch.compile(f, dynamic=False)
      x = [to(d[f"{case}/{n}"]).requires_grad_() for n in "qkv"]
      # compiled-dropping: under a pass that drops convert pairs, as torch 2.11's
      # pointless_convert; compiled-pairs (the control): the same, the paper layout's roundings
      # spelled as convert pairs (x.to(bf16).float(), as before 2026-12-05)
      pairs = how == "compiled-pairs"
      spelling = paper_fa2.convert_pair_spelling() if pairs else contextlib.nullcontext()
      drop = common.drop_convert_pairs if how in ("compiled-dropping", "compiled-pairs") else None
      with spelling, inductor_config.patch(joint_custom_post_pass=drop):
        out = f(*x)
        out.backward(to(d[case + "/d"]))
      for i, t in enumerate((out, *(a.grad for a in x))):
        result[f"{case}/{kind}/{how}/{matmul}/{i}"] = t.detach().cpu().view(torch.int16).numpy()
np.savez(sys.argv[1] + "/out.npz", **result)
print(json.dumps(dict(torch=torch.__version__, device=str(device), training=training,
                      modes=[f"{h}/{m}" for h, m in modes])))
"""


def bits(x):
  return np.asarray(x).view(np.uint16)


def torch_bits(cases, kinds, tiles, env=None):
  """({case: {kind: {mode: [O, dQ, dK, dV] bits}}}, info) of the twin's `attend`, run in the
  twin's interpreter (`env`: added to its environment, e.g. TORCHINDUCTOR_COMPILE_THREADS);
  cases {name: ((q, k, v, dO), causal)}. A mode is "HOW/MATMUL": eager or compiled (as
  training compiles) with each of the twin's GEMMs (`gpt_twin.MATMULS`: "bf16", torch's bf16
  GEMM, CUDA training's; "emulated", float32 GEMMs of the bf16 operands, CPU training's), and
  at the GEMM training takes on that device "compiled-dropping" (compiled under
  `common.drop_convert_pairs`, which drops float convert pairs as torch 2.11's
  `pointless_convert` does, on any torch version) and the control "compiled-pairs" (the same,
  with the paper layout's roundings spelled as convert pairs, as the twin had them before
  2026-12-05: it must lose bits). info: the torch version, device, "training" (that GEMM) and
  "modes". ValueError with the torch side's last line when it fails."""
  with tempfile.TemporaryDirectory() as tmp:
    arrays = {}
    for case, ((q, k, v, do), causal) in cases.items():
      arrays.update({f"{case}/{n}": bits(x) for n, x in zip("qkvd", (q, k, v, do))})
      arrays[f"{case}/causal"] = causal
    np.savez(f"{tmp}/in.npz", **arrays)
    command = [twin.default_torch_python(), "-c", TORCH_SIDE, tmp, str(ROOT / "torch_crosscheck")]
    proc = subprocess.run(
      [*command, json.dumps(kinds), str(tiles)],
      capture_output=True,
      text=True,
      env={**os.environ, **(env or {})},
    )
    if proc.returncode:  # the torch side's last line (its error)
      raise ValueError((proc.stderr.strip().splitlines() or ["?"])[-1])
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    t = np.load(f"{tmp}/out.npz")
    got = {
      case: {
        kind: {
          m: [t[f"{case}/{kind}/{m}/{i}"].view(np.uint16) for i in range(4)] for m in info["modes"]
        }
        for kind in kinds
      }
      for case in cases
    }
  return got, info


def jax_bits(case, kind, tiles):
  """[O, dQ, dK, dV] bits of JAX's `attend` with the twin attention's JAX spec on case
  ((q, k, v, dO), causal)."""
  (q, k, v, do), causal = case
  cfg = AttentionConfig.parse(twin.twin_jax_spec(kind, tiles))
  out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, cfg, causal=causal), q, k, v)
  return [bits(x) for x in (out, *vjp(do))]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--kinds", default="paper,paper+comp", help="twin attentions, comma-separated")
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--heads", type=int, default=6)
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--tiles", type=int, default=512, help="block_q = block_k of both sides")
  a = ap.parse_args(argv)
  kinds = a.kinds.split(",")
  for kind in kinds:
    if kind not in twin.EXACT:
      sys.exit(
        f"15_twin_paper_bits: --kinds: {kind!r} is not a twin attention with JAX's numerics "
        f"({', '.join(twin.EXACT)})"
      )
  for name in ("seq", "heads", "head_dim"):
    if getattr(a, name) < 1:
      sys.exit(f"15_twin_paper_bits: --{name.replace('_', '-')} {getattr(a, name)} (at least 1)")
  try:
    check_tile("--tiles", a.tiles)
    twin.check_torch_python(twin.default_torch_python())
  except ValueError as e:
    sys.exit(f"15_twin_paper_bits: {e}")
  cases = {"tied": tied_keys((1, a.seq, a.heads, a.head_dim)), "common_keys": common_keys()}
  try:
    got, versions = torch_bits(cases, kinds, a.tiles)
  except ValueError as e:
    sys.exit(f"15_twin_paper_bits: {e}")
  print(
    f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, torch {versions['torch']} on "
    f"{versions['device']}; tied: 1 × {a.seq} × {a.heads} × {a.head_dim}, tiles {a.tiles}"
  )
  print(
    f"\nmode: eager or compiled (as training compiles) / the GEMMs (bf16: torch's bf16 GEMM; "
    f"emulated: float32 GEMMs of the bf16 operands); training on {versions['device']}: "
    f"compiled/{versions['training']}; compiled-dropping: compiled under a pass that drops "
    "convert pairs (as torch 2.11's pointless_convert); compiled-pairs: the control, the "
    "same with the roundings spelled as convert pairs\n"
  )
  print(
    "| input | twin attention | mode | same bits as JAX: O / dQ / dK / dV | dQ channel 0, max (FP64: 0) |"
  )
  print("|---|---|---|---|---:|")
  shares = {}  # (case, kind, mode) → [share of equal bits] of O, dQ, dK, dV
  for case in cases:
    for kind in kinds:
      ref = jax_bits(cases[case], kind, a.tiles)
      for mode, row in {"JAX": ref, **got[case][kind]}.items():
        shares[case, kind, mode] = [np.mean(g == r) for g, r in zip(row, ref)]
        same = " / ".join(f"{x:.4f}" for x in shares[case, kind, mode])
        dq0 = np.abs(row[1].view(jnp.bfloat16).astype(np.float64)[..., 0]).max()
        dq0 = f"{dq0:.3g}" if case == "common_keys" else "–"
        print(f"| {case} | {kind} | {mode} | {same} | {dq0} |")
  print("\n" + verdict(shares, versions["training"]))


def verdict(shares, training, slack=1e-3) -> str:
  """One line, "verdict: …": whether compiling keeps the twin's bits at the GEMM its training
  takes — compiled/TRAINING within `slack` of eager/TRAINING's share of JAX's bits in every
  tensor of every input and attention — and so whether the twin trains compiled or with
  `--compile off` (experiments/h200_twin.sh, TORCH_ARGS=check, reads it). A check whose
  control (compiled-pairs/TRAINING) kept the bits too cannot tell: compiled, as every twin run
  before the check. shares: {(input, attention, mode): [share of O, dQ, dK, dV]}."""

  def below_eager(how):  # tensors where mode how/TRAINING falls below eager's share
    return [
      f"{case} {kind} {name}"
      for (case, kind, mode), row in shares.items()
      if mode == f"{how}/{training}"
      for name, x, e in zip(("O", "dQ", "dK", "dV"), row, shares[case, kind, f"eager/{training}"])
      if x < e - slack
    ]

  if not below_eager("compiled-pairs"):
    return "verdict: the control kept eager's bits too, the check cannot tell: compiled"
  if lost := below_eager("compiled"):
    return f"verdict: compiled/{training} loses bits eager keeps ({', '.join(lost)}): --compile off"
  return f"verdict: compiled/{training} keeps eager's bits everywhere (within {slack:g}): compiled"


if __name__ == "__main__":
  main()
