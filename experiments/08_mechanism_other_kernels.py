"""The bias mechanism's two inputs (tests/test_mechanism.py) through the implementations that are
not ours, with and without `+center`: dQ, dK, dV and O against FP64, beside naive attention in the
inputs' dtype (the suite's rule). On a GPU this includes cuDNN (`jax.nn.dot_product_attention`),
whose backward takes delta from the rounded O (head_dim 16 only: cuDNN needs a multiple of 8).
Then PyTorch's SDPA backends through the training twin's attention (`torch_crosscheck/gpt_twin.py`:
sdpa-*, sdpa-*+center; flash and math on a CPU, efficient and cudnn on CUDA too), run in the
twin's interpreter (`experiment.twin.default_torch_python`: $FLASHSTABLE_TORCH_PYTHON,
.torchvenv, or this one, as on the GPU image), with the cuDNN versions of both frameworks in
the heading; without torch, the JAX rows only.

    PYTHONPATH=. python3 experiments/08_mechanism_other_kernels.py
"""

from jax_flashstable.xla_cpu import plain_dots

plain_dots()  # `compare`'s CPU references in plain float32 dots, before JAX starts

import json  # noqa: E402
import pathlib
import subprocess
import sys
import tempfile

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_mechanism import common_keys, nine  # noqa: E402

from jax_flashstable.attention.config import AttentionConfig  # noqa: E402
from jax_flashstable.attention.flax_adapter import attend  # noqa: E402
from jax_flashstable.experiment.twin import check_torch_python, default_torch_python  # noqa: E402
from jax_flashstable.lab.accuracy import compare  # noqa: E402

GPU = jax.default_backend() == "gpu"
SPECS = ["xla", "xla+center", "fa2", "fa2+center"]
if GPU:
  SPECS = ["cudnn", "cudnn+center"] + SPECS

# the torch side: every sdpa-* twin attention on the inputs of in.npz (bf16 bits, [b, s, h, d]);
# out.npz gets "KIND/i" (out, dQ, dK, dV bits) or "KIND/error"; prints versions as JSON
TORCH_SIDE = """
import json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
import gpt_twin as T
d = np.load(sys.argv[1] + "/in.npz")
device = "cuda" if torch.cuda.is_available() else "cpu"
to = lambda a: torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16).to(device)
result = {}
for kind in (a for a in T.ATTENTIONS if a.startswith("sdpa-")):
  if device == "cpu" and kind in T.CUDA_ONLY:
    continue
  x = [to(d[n]).requires_grad_() for n in "qkv"]
  try:
    out = T.attend(*x, T.AttentionChoice(kind), causal=bool(d["causal"]))
    out.backward(to(d["d"]))
  except RuntimeError as e:  # no kernel for this shape or device
    result[kind + "/error"] = np.asarray((str(e).splitlines() or [type(e).__name__])[0][:80])
    continue
  for i, t in enumerate((out, *(a.grad for a in x))):
    result[f"{kind}/{i}"] = t.detach().cpu().view(torch.int16).numpy()
np.savez(sys.argv[1] + "/out.npz", **result)
print(json.dumps(dict(torch=torch.__version__, cudnn=torch.backends.cudnn.version())))
"""


def torch_runs(q, k, v, do, causal):
  """({kind: (out, (dQ, dK, dV)) or an error line}, versions) of the twin's SDPA attentions,
  or ({}, None) when the twin's interpreter has no torch."""
  try:
    check_torch_python(default_torch_python())
  except ValueError as e:  # no torch there: the JAX rows only, and why
    print(f"no torch rows: {e}", file=sys.stderr)
    return {}, None
  bits = lambda a: np.asarray(a).view(np.uint16)
  with tempfile.TemporaryDirectory() as tmp:
    np.savez(f"{tmp}/in.npz", q=bits(q), k=bits(k), v=bits(v), d=bits(do), causal=causal)
    proc = subprocess.run(
      [default_torch_python(), "-c", TORCH_SIDE, tmp, str(ROOT / "torch_crosscheck")],
      capture_output=True,
      text=True,
    )
    if proc.returncode:
      raise RuntimeError(
        (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
      )
    t = np.load(f"{tmp}/out.npz")
    dtype = np.asarray(q).dtype
    runs = {}
    for name in t.files:
      kind, item = name.split("/")
      if item == "error":
        runs[kind] = str(t[name])
      elif item == "0":
        got = [t[f"{kind}/{i}"].view(dtype) for i in range(4)]
        runs[kind] = (got[0], tuple(got[1:]))
  return runs, json.loads(proc.stdout.strip().splitlines()[-1])


def jax_cudnn_version():
  """The cuDNN version JAX's CUDA plugin loaded (None without one): a private JAX module, the
  one its cuDNN attention checks versions with."""
  try:
    from jax._src.lib import cuda_versions

    return cuda_versions.cudnn_get_version() if GPU and cuda_versions else None
  except (ImportError, AttributeError, RuntimeError):
    return None


def main():
  jax_cudnn = jax_cudnn_version()
  lines, head = [], f"# {jax.devices()[0].device_kind}, jax {jax.__version__} (cuDNN {jax_cudnn})"
  for case in (common_keys, nine):
    (q, k, v, do), causal = case()
    runs = {}
    for spec in SPECS if case is common_keys else [s for s in SPECS if "cudnn" not in s]:
      cfg = AttentionConfig.parse(spec)
      out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, cfg, causal=causal), q, k, v)
      runs[spec] = (out, vjp(do))
    torch_side, versions = torch_runs(q, k, v, do, causal)
    runs.update({f"torch {kind}": r for kind, r in torch_side.items()})
    if versions and case is common_keys:
      head += f", torch {versions['torch']} (cuDNN {versions['cudnn']})"
    for name, result in runs.items():
      if isinstance(result, str):  # an SDPA backend without a kernel for this shape
        lines.append(f"| {case.__name__} | {name} | – | {result} | | |")
        continue
      c = compare(q, k, v, do, causal=causal, result=result)
      ok = c.passes()
      for t in c.flash:
        err, naive = c.flash[t].max, c.standard[t].max
        lines.append(f"| {case.__name__} | {name} | {t} | {err:.3g} | {naive:.3g} | {ok[t]} |")
  print(head)
  print("| input | attention | tensor | max error | naive max error | within the rule |")
  print("|---|---|---|---:|---:|---|")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
