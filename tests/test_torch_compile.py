"""The PyTorch twin compiled as its training compiles it (issue 18): torch.compile keeps the
paper layout's rounding points. A file of its own (one torch process, ~45 s with a cold
Inductor cache on this project's CPU, one compile thread: a pool of compile workers beside the
suite's two made it ~100 s slower), so that the suite's workers share the time with
test_torch_twin.py's; the check itself is experiments/15_twin_paper_bits.py's."""

import importlib.util
import pathlib

import numpy as np
from test_mechanism import tied_keys
from test_torch_twin import pytestmark  # noqa: F401  (skipped without the torch environment)

PATH = pathlib.Path(__file__).parents[1] / "experiments" / "15_twin_paper_bits.py"
_spec = importlib.util.spec_from_file_location("twin_paper_bits", PATH)
paper_bits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_bits)


def test_compiled_twin_attention_keeps_the_paper_layouts_rounding_points():
  """Training compiles the twin's step (torch.compile). A compiler may drop a rounding spelled
  as a convert pair x.to(bf16).float() — torch 2.11, the GPU image's, does so whatever
  `emulate_precision_casts` says — so the twin rounds on the bits (`common.round_bf16`). The
  paper layout eager and compiled, with either of the twin's GEMMs (torch's bf16 GEMM, CUDA
  training's; float32 GEMMs of the bf16 operands, CPU training's), and compiled under a pass
  that drops convert pairs (`common.drop_convert_pairs`, torch 2.11's rewrite on this
  torch) gives JAX's bits (O, dQ, dK, dV: 100%); the control, the same pass with the roundings
  spelled as convert pairs (the twin before 2026-12-05), does not. One tile (1 × 16 × 1 × 16,
  causal) keeps the compiles short; experiments/15_twin_paper_bits.py runs the same at 1 × 128
  × 6 × 64 with tiles 64 (the control: 31–39% of the bits on this input, 2026-12-05) and, on
  the GPU, at the training's shape."""
  case = tied_keys((1, 16, 1, 16))
  got, info = paper_bits.torch_bits(
    {"tied": case}, ["paper"], 16, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"}
  )
  got = got["tied"]["paper"]
  want = paper_bits.jax_bits(case, "paper", 16)
  exact = [m for m in info["modes"] if not m.startswith("compiled-pairs/")]
  assert sorted(exact) == sorted(
    [f"{h}/{g}" for h in ("eager", "compiled") for g in ("bf16", "emulated")]
    + [f"compiled-dropping/{info['training']}"]
  )
  for mode in exact:
    for name, g, w in zip(("out", "dq", "dk", "dv"), got[mode], want):
      np.testing.assert_array_equal(g, w, err_msg=f"{mode} {name}")
  control = got[f"compiled-pairs/{info['training']}"]
  assert min(np.mean(g == w) for g, w in zip(control, want)) < 0.9


def test_the_verdict_sends_the_twin_eager_when_compiling_loses_bits():
  """experiments/h200_twin.sh (TORCH_ARGS=check) trains the paper twins with --compile off when
  the verdict says so: compiled at the training's GEMM below eager's share of JAX's bits (not
  JAX's own, 1) by more than 0.001 in any tensor of any input and attention; the other GEMM
  does not count, and a control that kept the bits makes the check unable to tell."""
  keeps = {
    ("tied", "paper", "eager/bf16"): [1.0, 0.95, 1.0, 1.0],
    ("tied", "paper", "compiled/bf16"): [1.0, 0.9495, 1.0, 1.0],
    ("tied", "paper", "eager/emulated"): [1.0, 1.0, 1.0, 1.0],
    ("tied", "paper", "compiled/emulated"): [0.5, 0.5, 0.5, 0.5],
    ("tied", "paper", "compiled-pairs/bf16"): [0.4, 0.4, 0.4, 0.4],
    ("common_keys", "paper+comp", "eager/bf16"): [1.0, 1.0, 1.0, 1.0],
    ("common_keys", "paper+comp", "compiled/bf16"): [1.0, 1.0, 1.0, 1.0],
    ("common_keys", "paper+comp", "compiled-pairs/bf16"): [1.0, 0.2, 0.3, 1.0],
  }
  line = paper_bits.verdict(keeps, "bf16")
  assert line.startswith("verdict: compiled/bf16 keeps") and line.endswith(": compiled"), line
  loses = dict(keeps)
  loses["common_keys", "paper+comp", "compiled/bf16"] = [1.0, 1.0, 0.998, 1.0]
  line = paper_bits.verdict(loses, "bf16")
  assert line.endswith(": --compile off") and "common_keys paper+comp dK" in line, line
  assert "tied" not in line, line
  blind = {k: v for k, v in loses.items() if "compiled-pairs" not in k[2]}
  blind["tied", "paper", "compiled-pairs/bf16"] = [1.0, 0.95, 1.0, 1.0]
  blind["common_keys", "paper+comp", "compiled-pairs/bf16"] = [1.0, 1.0, 1.0, 1.0]
  assert paper_bits.verdict(blind, "bf16").endswith("cannot tell: compiled")
  emulated = keeps | {("tied", "paper", "compiled-pairs/emulated"): [0.4, 0.4, 0.4, 0.4]}
  assert paper_bits.verdict(emulated, "emulated").endswith(
    "(tied paper O, tied paper dQ, tied paper dK, tied paper dV): --compile off"
  )
