"""A PyTorch twin of the JAX GPT-2 training (`jax_flashstable/models/gpt2.py`, `training/train.py`): the same
model, precision split, optimizer, schedule and batches, so one run can be made in both
frameworks from the same initial weights and compared step by step.

Runs in the torch environment (torch + NumPy, no JAX):

  python torch_crosscheck/gpt_twin.py train --init INIT.npz --data DIR --attention paper+comp \\
      --steps 3000 --batch-size 128 --lr 3e-3 --seed 24 --out runs/torch/paper+comp/seed24

Every option defaults to the recipe `anchor-b128` of `jax_flashstable/experiment/instability.py` (GPT 6
layers × 6 heads × 384, no bias, context 1024, vocab 50304; batch 128, AdamW (0.9, 0.95), eps
1e-8, no weight decay, peak lr 3e-3 after 200 warmup steps, cosine to 1e-5 over 20,000 steps,
clipping 1.0, 3,000 steps, validation every 500 steps on 4 batches, diagnostics every 100
steps on 64 rows, stop 300 steps after an explosion); `--help` lists them.
The JAX run to compare with must use the same `--seed` (it fixes the data order; the
initialisation comes from INIT.npz) and the same recipe; `flashstable crosscheck-train`
(`jax_flashstable/experiment/twin.py`) runs both and compares them. Writes OUT/config.json,
OUT/metrics.jsonl (one row per step, the keys of `train.train_and_evaluate`: step, lr,
step_time_s, tokens_per_s, loss, grad_norm (before clipping), param_norm (after the update),
mfu on H100/H200, val_loss on evaluation steps), OUT/diagnostics.jsonl (`--diag-interval`),
OUT/summary.json, and with --save-final OUT/final_params.npz. A non-finite loss or gradient
ends the run as in JAX (the row is written first); the command then exits with status 3 and
summary.json says stopped="non-finite". `--stop-after-explosion N` ends the run N steps after
the explosion step of JAX's rule (`ExplosionMonitor`; summary.json: stopped="explosion").
Checkpoints (`--checkpoint-interval`, and when `--max-seconds` of wall time are spent): OUT/
checkpoint.pt holds the parameters, the optimizer's moments and count and the explosion rule's
state; the same command then resumes after its step, bit for bit the run it would have been
(the rows past it are dropped), and refuses in one line a checkpoint it cannot read or one of
a run with other trajectory fields (`RESUME_FREE` may differ; `read_checkpoint`). A run stopped by
--max-seconds writes no summary.json (it is not done) and exits 0; one that ends (finished,
stopped after an explosion, non-finite) removes its checkpoint.

Diagnostics (`diagnose`, for the instability experiment's runaway rule): a row every
--diag-interval steps with "step", "max_logit" [layer][head], "sn_q_full" [layer] and
"tie_rate" [layer][head] (the paper layout's, as JAX's; NaN for the other attentions), the
keys `instability.collect` reads. The diagnostics run the model eager whatever --compile says
(only the dQ of `dq_diagnostics` comes from the training's attention as it compiles it). The
max logit is taken over --diag-rows (sequence, position) rows of the step's batch drawn with
NumPy (seeded by seed and step), or over every position of its first sequence
(--diag-rows 0). JAX draws its 64 rows with jax.random, which NumPy cannot reproduce, so the
two sides read the same statistic (the max over 64 uniformly drawn rows) on different rows: a
max logit differs between them by the spread of that max over draws (tiny model, 16 rows, a
row every 10 steps: the largest over 100 steps 4.65 in JAX and 4.53 in the twin for
reference-fp32, 3.86 and 4.20 for the paper layout; given JAX's rows the twin's max logits
equal JAX's, tests/test_torch_twin.py). The runaway rule is unaffected in practice: it compares
a run with 10× the largest max logit of the reference runs of the same side (same sampling),
and a runaway moves the max logit by orders of magnitude (anchor-b128 in JAX: 10⁵–10⁶ in the
exploding paper runs, 10²–10³ in the compensated ones). Since the evening of 2026-12-04 the row
also has JAX's "dq_err", "dq_rank1" and "dq_common" [layer][head] (`dq_diagnostics`): each
layer's dQ, as the training's attention forms it (compiled when training compiles), against
FP32 attention's on --diag-rows rows of the first micro-batch's first DQ_SEQUENCES
sequences, each layer's dO from that micro-batch's mean loss, as JAX (and, training compiled,
"dq_err_eager": the attention eager) — the size of Qiu & Yao's bias term (§4) in the twin, to
set beside JAX's (layer 1 of JAX's paper 29 and 31 rerun on 2026-12-03 at steps 300, 600,
900: 0.036–0.081).

Initial parameters: the .npz layout (what the JAX side must write)
-------------------------------------------------------------------
One uncompressed or compressed NumPy .npz (`np.savez` / `np.savez_compressed`), one array per
parameter of the JAX model, nothing else; every array float32, C order, in the JAX orientation.
The key is the parameter's path in `nnx.state(model, nnx.Param)` joined with "." (list indices
in decimal), with the trailing ".embedding" of the two `nnx.Embed` tables dropped:

  key                         shape                      JAX path (nnx.state)
  wte                         [vocab_size, n_embd]       wte.embedding
  wpe                         [block_size, n_embd]       wpe.embedding
  h.{i}.ln_1.scale            [n_embd]                   (i = 0 … n_layer−1)
  h.{i}.ln_1.bias             [n_embd]                   only when bias=True
  h.{i}.attn.c_attn.kernel    [n_embd, 3·n_embd]         [in, out]; output columns q | k | v,
                                                         each head-major (head·head_dim + j)
  h.{i}.attn.c_attn.bias      [3·n_embd]                 only when bias=True
  h.{i}.attn.c_proj.kernel    [n_embd, n_embd]
  h.{i}.attn.c_proj.bias      [n_embd]                   only when bias=True
  h.{i}.ln_2.scale / .bias    [n_embd]                   bias only when bias=True
  h.{i}.mlp.c_fc.kernel       [n_embd, 4·n_embd]
  h.{i}.mlp.c_fc.bias         [4·n_embd]                 only when bias=True
  h.{i}.mlp.c_proj.kernel     [4·n_embd, n_embd]
  h.{i}.mlp.c_proj.bias       [n_embd]                   only when bias=True
  ln_f.scale / ln_f.bias      [n_embd]                   bias only when bias=True

(anchor: 6 layers, no bias: 2 + 6·6 + 1 = 39 arrays.) For example, from the JAX side:

  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  arrays = {".".join(map(str, path)).removesuffix(".embedding"): np.asarray(p[...], np.float32)
            for path, p in flat}
  np.savez(path, **arrays)

`load_npz` refuses a file with a missing or unexpected key, a wrong shape or a dtype other than
float32, naming them. `save_npz` writes the same layout (e.g. the twin's final parameters).

Precision split (as `gpt2.py`, i.e. BF16 autocast with float32 master weights)
-----------------------------------------------------------------------------
Parameters, LayerNorm, the residual stream, logits → loss and the optimizer in float32. Every
Linear is `nnx.Linear(dtype=bfloat16, param_dtype=float32)`: input and kernel rounded to bf16,
products accumulated in float32, the result rounded once to bf16, a bias added in bf16. The
logits are bf16(bf16(x) @ bf16(wte)ᵀ) cast to float32. The roundings are written out (as
`paper_fa2.py` does for autocast), not left to torch.autocast, so that they sit where XLA puts
them on every device, and on the bits (`common.round_bf16`, `to_bf16`), not as convert pairs
x.to(bf16).float(), which torch.compile may drop (torch 2.11, the GPU image's, drops them:
experiments/results/cpu-2026-12-05-twin-torch211). With `--matmul emulated` (the default on
CPU) a bf16 matmul is computed as a float32 matmul of the bf16-rounded operands (exact products, float32 sums), with
`--matmul bf16` (the default on CUDA) by torch's bf16 GEMM with float32 accumulation (cuBLAS,
reduced-precision reductions switched off): the same rounding points, another summation order.
The paper layout's GEMMs follow the same mode (`paper_fa2.mm`; runs whose config.json has
"attention_matmul", from the evening of 2026-12-04); before, they were float32 GEMMs on every
device (non-tensor-core on CUDA, no TF32).
Compilation (`--compile`, `resolve_compile`; config.json "compile"): on (the default on CUDA)
compiles the step, loss and backward, as one torch.compile graph per micro-batch shape;
attention compiles each layer's attention alone (`GPT.compile_attention`: nothing around it
fuses into it) and runs the rest eager; off (the default on CPU) is eager. Compiled, the
roundings on the bits stay whatever the compiler does to convert pairs (twin runs before
2026-12-05 spelled them as convert pairs: compiled with torch 2.11 they lost them).
LayerNorm is flax's: var = max(0, E[x²] − E[x]²), y = (x − mean)·(rsqrt(var + 1e−5)·scale)
+ bias. GELU is `jax.nn.gelu(approximate=False)` on bf16 as XLA compiles it (jax 0.11.2, CPU
HLO): forward bf16(bf16(0.5x) · bf16(erfc(−x · bf16(√½)))), the product −x·0.70703125 kept in
float32; backward JAX's autodiff chain with every bf16 op rounded (`_Gelu`; autograd through
the forward's casts would round elsewhere). Loss: logsumexp(logits) − logit[target], mean,
float32 (optax's formula), forward and backward LOSS_CHUNK tokens at a time (`lm_head_loss`:
at anchor-b128 the whole batch's float32 logits alone are 24.6 GiB).

Attention choices (`--attention`; layout [batch, seq, heads, head_dim], bf16 in and out)
-----------------------------------------------------------------------------------------
  paper, paper+comp   `paper_fa2.forward`/`backward` (Qiu & Yao, arXiv 2510.04212, Alg. 1,
                      §3: BF16 O, m, l buffers; the backward with its bf16 rounding points),
                      without / with the compensation; tiles --block-q × --block-k (default
                      512×512, the JAX experiment's at length 1024). The backward forms P
                      from the forward's m and log l kept apart, as JAX's paper layout does
                      since 2026-12-01 (`Numerics.probs`). JAX twin:
                      "paper[+comp]:block_q=T,block_k=T".
  paper+lse, paper+comp+lse
                      the same with the paper's own backward, P = exp(S − lse) from one
                      float32 lse = log l + m per row (the twin's paper and paper+comp until
                      2026-12-01). JAX twin: "paper[+comp]+lse:block_q=T,block_k=T"
                      (single_lse).
  reference-fp32      materialised softmax(QKᵀ·scale)V in float32 from the bf16 q, k, v,
                      output rounded to bf16 (JAX: "reference-fp32"). Its backward recomputes
                      the scores and probabilities (torch.utils.checkpoint, as JAX's
                      jax.checkpoint) instead of keeping them, the same values bit for bit
                      (`RECOMPUTE_REFERENCE`): kept, each layer's float32 P is [batch, heads,
                      seq, seq], 3 GiB at anchor-b128 (batch 128, 6 heads, 1024), and the eager
                      step there peaks at about 136 GiB, an H200's whole memory; recomputed at
                      about 116 GiB (measured on CPU at batch 2 and 4: 1,084 and 927 MiB a
                      sequence, 2026-12-01; torch.compile's step not measured).
  sdpa-flash, sdpa-efficient, sdpa-cudnn, sdpa-math
                      torch.nn.functional.scaled_dot_product_attention restricted to one
                      backend (no JAX twin bit for bit; "cudnn" is the nearest for sdpa-cudnn).
                      On CPU torch has only math and flash (its CPU flash kernel, not FA2);
                      efficient and cudnn need CUDA and are refused on CPU.
  sdpa-*+center       the same backend's output, its backward evaluated at the keys less
                      their mean (`centered_keys`, `_centred_sdpa`), as JAX's "+center" for an
                      implementation not its own (`flax_adapter._centred_backward`;
                      "cudnn+center" is the nearest for sdpa-cudnn+center): exact in exact
                      arithmetic, it drops the (rowsum dS)·c term a common key component c
                      leaves in dQ when rounding unbalances a row of dS (Qiu & Yao 2025, §4).

Optimizer: `OptaxAdamW` is optax.chain(clip_by_global_norm(c), adamw(schedule, b1, b2, eps,
weight_decay, mask=ndim ≥ 2)) in float32 as optax 0.2.8 writes it and XLA compiles it (its fma
contractions and rewrites, read from the CPU HLO): bit-identical to optax over 12 steps of random
gradients on the CPU it was written on, within one float32 ulp at each leaf's scale on another
(an AVX2 CPU, 2026-12-01: ≥ 84% of the entries identical; its code generation contracts
multiply-adds beyond the HLO's) (tests/test_torch_twin.py); torch.optim.AdamW is not. The schedule
(`learning_rate`) is `warmup_cosine_decay_schedule` at count = step − 1 (lr = 0 on step 1), as
the JAX loop; equal to optax's but where XLA's float32 cos is an ulp off.

Batches: `Dataset.batch` of the JAX package's data module, imported from its file
(`import_data_module`), so the (seed, step) → batch rule is the JAX side's own code. --data
must hold train.bin[.xz] / val.bin[.xz] (a folder of text files needs tiktoken, which the torch
environment lacks: pass the tokenized copy the JAX side made in its cache instead).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import pickle
import sys
import zipfile
import time

STARTED = time.perf_counter()  # --max-seconds counts from here, torch's import included
# CUDA's caching allocator with growable segments (read at torch's first CUDA allocation; a
# setting already made under either name is kept; torch ≥ 2.9 reads PYTORCH_ALLOC_CONF and
# warns on the old PYTORCH_CUDA_ALLOC_CONF): at anchor-b128 a twin's peak is 68.4 GiB of an
# H100's 79 GiB, and with fixed segments a paper twin's second step could not find 12.3 GiB in
# one piece while 9.4 GiB sat reserved and unused (2026-12-05, docs/studies/training-twin.md).
if not {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} & set(os.environ):
  os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import paper_fa2  # noqa: E402  (the paper layout's forward and backward, torch only)
from common import round_bf16, to_bf16  # noqa: E402  (bf16 rounding on the bits)

BF = torch.bfloat16
F32 = np.float32
LN_EPS = 1e-5
SQRT_HALF_BF16 = 0.70703125  # np.sqrt(0.5) rounded to bf16, as jax.nn.gelu builds it
NEG_TWO_OVER_SQRT_PI_BF16 = -1.125  # −2/√π rounded to bf16 (the erfc jvp on bf16)
SDPA_ATTENTIONS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
ATTENTIONS = (
  "paper",
  "paper+comp",
  "paper+lse",
  "paper+comp+lse",
  "reference-fp32",
  *SDPA_ATTENTIONS,
  *(f"{a}+center" for a in SDPA_ATTENTIONS),  # each backend with its backward at centred keys
)
# torch has these SDPA backends on CUDA only (with or without +center)
CUDA_ONLY = tuple(
  a for a in ATTENTIONS if a.removesuffix("+center") in ("sdpa-efficient", "sdpa-cudnn")
)
CPU_ATTENTIONS = tuple(a for a in ATTENTIONS if a not in CUDA_ONLY)
MATMULS = paper_fa2.MATMULS  # `bf16_matmul`, the paper layout's `paper_fa2.mm`


COMPILES = ("on", "off", "attention")  # --compile as resolved (`resolve_compile`)


def resolve_compile(compile: str, device: torch.device) -> str:
  """--compile as a run takes it, one of COMPILES: "auto" is "on" on CUDA, "off" elsewhere.
  on: the step (loss and its backward) under torch.compile; attention: only each layer's
  attention, as a graph of its own (`GPT.compile_attention`), the rest eager; off: eager."""
  if compile != "auto":
    return compile
  return "on" if device.type == "cuda" else "off"


def resolve_matmul(matmul: str, device: torch.device) -> str:
  """--matmul as a run takes it: "auto" is torch's bf16 GEMM on CUDA, float32 GEMMs elsewhere."""
  if matmul != "auto":
    return matmul
  return "bf16" if device.type == "cuda" else "emulated"


EXIT_NON_FINITE = 3
CHECKPOINT = "checkpoint.pt"
# TwinConfig fields a resumed run may change: where things are and how the run is reported or
# driven, not its numbers (`steps` too when decay_steps is fixed). init, data, device,
# compile and matmul are compared as what they resolve to (`_resolved`, with the paper
# layout's GEMMs).
RESUME_FREE = frozenset(
  (
    "init",
    "data",
    "device",
    "compile",
    "matmul",
    "out_dir",
    "save_final",
    "print_interval",
    "checkpoint_interval",
    "max_seconds",
  )
)
# The data module's file, newest location first (the JAX package is being reorganised).
DATA_MODULE_PATHS = ("jax_flashstable/training/data.py",)


# --- batches ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def import_data_module(root: str = str(ROOT)):
  """The JAX package's NumPy-only data module (`Dataset`, `Dataset.batch`), imported from its
  file: importing it as `jax_flashstable.data` would import the package, hence JAX. Tries
  `DATA_MODULE_PATHS` in order under `root`.

  Raises:
    ImportError: none of the files exists, or the module imports something the torch
      environment lacks (it must stay NumPy-only).
  """
  for rel in DATA_MODULE_PATHS:
    path = pathlib.Path(root) / rel
    if not path.is_file():
      continue
    spec = importlib.util.spec_from_file_location("flashstable_data", path)
    module = importlib.util.module_from_spec(spec)
    try:
      spec.loader.exec_module(module)
    except ImportError as e:
      raise ImportError(
        f"{path} imports {e.name!r}, which the torch environment lacks; the twin "
        "needs the data module to import with NumPy only"
      ) from e
    return module
  raise ImportError(f"no data module under {root}: tried {', '.join(DATA_MODULE_PATHS)}")


# --- model -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """`gpt2.GPTConfig`'s shape fields; defaults: the anchor ("gpt-6l")."""

  n_layer: int = 6
  n_head: int = 6
  n_embd: int = 384
  block_size: int = 1024
  vocab_size: int = 50304
  bias: bool = False

  def __post_init__(self):
    for f in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
      if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
        raise ValueError(f"{f} must be a positive int, got {f}={getattr(self, f)!r}")
    if self.n_embd % self.n_head:
      raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")


def check_tile(name, b):
  """ValueError unless `b` is a power of two ≥ 16 (`pallas_kernels.policy.check_tile`)."""
  if not isinstance(b, int) or isinstance(b, bool) or b < 16 or b & (b - 1):
    raise ValueError(f"{name} must be a power of two >= 16, got {name}={b!r}")


def fit_tile(block: int, length: int) -> int:
  """A tile shrunk to the power-of-two-rounded length, as `BlockSizes.fit` (same numerics)."""
  return min(block, max(16, 1 << max(0, length - 1).bit_length()))


@dataclasses.dataclass(frozen=True)
class AttentionChoice:
  """One of `ATTENTIONS`, with the paper layout's tiles and compensation settings."""

  kind: str = "paper"
  block_q: int = 512
  block_k: int = 512
  beta: float = 2.0
  tie_tolerance: float = 1e-3

  def __post_init__(self):
    if self.kind not in ATTENTIONS:
      raise ValueError(f"attention={self.kind!r} is not one of {', '.join(ATTENTIONS)}")
    check_tile("block_q", self.block_q)
    check_tile("block_k", self.block_k)
    if not (math.isfinite(self.beta) and self.beta > 1):
      raise ValueError(f"beta must be a finite number > 1, got beta={self.beta!r}")
    if not (math.isfinite(self.tie_tolerance) and self.tie_tolerance >= 0):
      raise ValueError(f"tie_tolerance must be >= 0, got tie_tolerance={self.tie_tolerance!r}")

  @property
  def paper(self) -> bool:
    return self.kind.startswith("paper")

  @property
  def center_keys(self) -> bool:
    """An SDPA backend whose backward runs at the keys less their mean (modifier +center)."""
    return self.kind.startswith("sdpa-") and self.kind.endswith("+center")

  @property
  def stabilize(self) -> bool:
    """The compensation (modifier +comp of JAX's grammar)."""
    return self.paper and "+comp" in self.kind

  @property
  def single_lse(self) -> bool:
    """The paper kernel's own backward, P = exp(S − lse) (modifier +lse: JAX's single_lse)."""
    return self.paper and self.kind.endswith("+lse")

  def jax_spec(self) -> str | None:
    """The `AttentionConfig.parse` spec of the JAX run with the same numerics (None: none), as
    `AttentionConfig.name` spells it (e.g. "paper+comp+lse:block_q=512,block_k=512"; the JAX
    side's `experiment.twin.twin_jax_spec` builds the config, a test keeps the two equal)."""
    if self.kind == "reference-fp32":
      return "reference-fp32"
    if not self.paper:
      return None
    head = "paper" + "+comp" * self.stabilize + "+lse" * self.single_lse
    fields = []
    if self.stabilize and self.beta != 2.0:
      fields.append(f"beta={self.beta!r}")
    if self.stabilize and self.tie_tolerance != 1e-3:
      fields.append(f"tie_tolerance={self.tie_tolerance!r}")
    fields += [f"block_q={self.block_q}", f"block_k={self.block_k}"]
    return f"{head}:{','.join(fields)}"


def check_attention_device(choice: AttentionChoice, device: torch.device):
  """ValueError for an SDPA backend torch does not have on `device` (efficient, cudnn: CUDA)."""
  if device.type != "cuda" and choice.kind not in CPU_ATTENTIONS:
    raise ValueError(
      f"attention={choice.kind!r} needs CUDA (torch's SDPA has only its math and "
      f"flash backends on {device.type}); on {device.type} choose one of "
      f"{', '.join(CPU_ATTENTIONS)}"
    )


class _PaperAttention(torch.autograd.Function):
  """`paper_fa2.forward` with `paper_fa2.backward` as its gradient: the paper layout's backward
  with its bf16 rounding points (as the JAX paper layout's custom_vjp), not autograd through
  the forward's loops; P from the forward's m and log l apart, or (single_lse) from one float32
  lse as the paper's kernel. Tensors [batch, heads, seq, head_dim] bf16."""

  @staticmethod
  def forward(ctx, query, key, value, tiling, compensation, single_lse, matmul):
    """tiling (softmax_scale, causal, block_q, block_k), compensation (stabilize, beta,
    tie_tolerance): `paper_fa2.forward`'s arguments; matmul: `paper_fa2.mm`'s."""
    out, m, log_l = paper_fa2.forward(query, key, value, *tiling, *compensation, matmul)
    ctx.save_for_backward(query, key, value, out, m, log_l)
    ctx.settings = (*tiling, single_lse, matmul)
    return out

  @staticmethod
  def backward(ctx, d_out):
    query, key, value, out, m, log_l = ctx.saved_tensors
    d_query, d_key, d_value = paper_fa2.backward(
      query, key, value, out, m, log_l, d_out.to(BF), *ctx.settings
    )
    return (d_query, d_key, d_value) + (None,) * 4


def centered_keys(key):
  """K − c, c the mean of the keys per (batch, head), computed in float32 and rounded to key's
  dtype; key [batch, heads, seq, head_dim]. `pallas_kernels.policy.centered_keys` in torch
  (the same bits: tests/test_torch_twin.py). For a backward only: c takes every key, later
  ones too."""
  wide = key.float()
  centred = wide - wide.mean(dim=2, keepdim=True)
  return to_bf16(centred) if key.dtype == BF else centred.to(key.dtype)


class _StraightThrough(torch.autograd.Function):
  """f(x) forward, the identity backward: the gradient with respect to f(x) passed to x."""

  @staticmethod
  def forward(ctx, x, f):
    return f(x)

  @staticmethod
  def backward(ctx, grad):
    return grad, None


def _centred_sdpa(query, key, value, softmax_scale, causal, choice):
  """SDPA restricted to `choice`'s backend whose output is the backend's own at (query, key,
  value), bit for bit, and whose backward is the same SDPA's at (query, `centered_keys(key)`,
  value), its dK passed to key as it is: JAX's `flax_adapter._centred_backward`. Written
  without a custom backward (out = plain + (centred − centred), the second term exactly 0 but
  for -0 outputs, which come back +0), so that torch.compile traces it whole. Tensors [batch,
  heads, seq, head_dim] in the inputs' dtype (bf16 in training)."""
  sdpa = functools.partial(
    torch.nn.functional.scaled_dot_product_attention, is_causal=causal, scale=softmax_scale
  )
  with backend_context(choice):
    with torch.no_grad():
      plain = sdpa(query, key, value)
    centred = sdpa(query, _StraightThrough.apply(key, centered_keys), value)
  return plain + (centred - centred.detach())


def _sdpa_backend(kind):
  from torch.nn.attention import SDPBackend

  return dict(
    flash=SDPBackend.FLASH_ATTENTION,
    efficient=SDPBackend.EFFICIENT_ATTENTION,
    cudnn=SDPBackend.CUDNN_ATTENTION,
    math=SDPBackend.MATH,
  )[kind.removeprefix("sdpa-").removesuffix("+center")]


def backend_context(choice: AttentionChoice):
  """`sdpa_kernel([backend])` for an sdpa-* choice (a no-op context otherwise)."""
  if not choice.kind.startswith("sdpa-"):
    return contextlib.nullcontext()
  from torch.nn.attention import sdpa_kernel

  return sdpa_kernel([_sdpa_backend(choice.kind)])


def attend(
  query,
  key,
  value,
  choice: AttentionChoice,
  *,
  causal=True,
  softmax_scale=None,
  matmul="emulated",
):
  """softmax(softmax_scale·QKᵀ)V by `choice.kind` (see the module docstring).

  Args:
    query, key, value: [batch, seq, heads, head_dim] bfloat16 (equal lengths for causal).
    causal: key j visible to query i iff j ≤ i.
    softmax_scale: defaults to 1/√head_dim (Python float, as the JAX side).
    matmul: the paper layout's GEMMs, one of MATMULS ("emulated": float32 GEMMs of the bf16
      operands; "bf16": torch's bf16 GEMM, float32 accumulation; `paper_fa2.mm`), as the
      model's Linear layers (`bf16_matmul`). The other choices ignore it.
  Returns:
    [batch, seq, heads, head_dim] bfloat16, differentiable in query, key and value.
  Raises:
    RuntimeError: from torch, for an SDPA backend that has no kernel for the device/shape.
  """
  if softmax_scale is None:
    softmax_scale = 1.0 / math.sqrt(query.shape[-1])
  q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # [b, h, s, d]
  kind = choice.kind
  if choice.paper:
    bq, bk = fit_tile(choice.block_q, q.shape[2]), fit_tile(choice.block_k, k.shape[2])
    out = _PaperAttention.apply(
      q,
      k,
      v,
      (softmax_scale, causal, bq, bk),
      (choice.stabilize, choice.beta, choice.tie_tolerance),
      choice.single_lse,
      matmul,
    )
  elif kind == "reference-fp32":
    if RECOMPUTE_REFERENCE and torch.is_grad_enabled():
      from torch.utils.checkpoint import checkpoint

      out = checkpoint(
        reference_attention,
        q,
        k,
        v,
        softmax_scale,
        causal,
        use_reentrant=False,
        preserve_rng_state=False,  # no random numbers in it
      )
    else:
      out = reference_attention(q, k, v, softmax_scale, causal)
  elif choice.center_keys:
    out = _centred_sdpa(q, k, v, softmax_scale, causal, choice)
  else:
    with backend_context(choice):
      out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=softmax_scale
      )
  return out.transpose(1, 2)


@functools.cache
def compiled_attend():
  """`attend` under torch.compile (static shapes): one compiled function, so one cache of
  graphs, for training's --compile attention (`GPT.compile_attention`) and the dQ diagnostics'
  `attention_dq(compiled=True)`."""
  return torch.compile(attend, dynamic=False)


# The reference's backward recomputes S and P from q, k, v (torch.utils.checkpoint) instead of
# keeping P (module docstring); False keeps them (the same gradients bit for bit, a test checks).
RECOMPUTE_REFERENCE = True


def reference_attention(q, k, v, softmax_scale, causal):
  """softmax(softmax_scale·QKᵀ)V materialised in float32, [b, h, s, d] bf16 in and out."""
  s = (q.float() @ k.float().transpose(-1, -2)) * softmax_scale  # [b, h, s, s] float32
  if causal:
    keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    s = s.masked_fill(~keep, -math.inf)
  return to_bf16(torch.softmax(s, dim=-1) @ v.float())


def bf16_matmul(x, w, mode="emulated", bias=None):
  """bf16(bf16(x) @ bf16(w)) with float32 accumulation, as XLA's bf16 dot, and with `bias` a
  bf16 add of bf16(bias) (nnx's Linear).

  x [..., n] (any float dtype), w [n, m] float32, bias [m] float32 or None → [..., m] bfloat16.
  mode "emulated": a float32 matmul of the rounded operands (their products are exact in
  float32); "bf16": torch's bf16 GEMM (float32 accumulation). The JAX backward's rounding
  points, written out (`_BF16Matmul`): dx = bf16(dy @ bf16(w)ᵀ), dw = bf16(bf16(x)ᵀ @ dy),
  dbias = bf16(Σ dy), in x's, w's and bias's dtypes.
  """
  return _BF16Matmul.apply(x, w, bias, mode)


class _BF16Matmul(torch.autograd.Function):
  """`bf16_matmul` with its backward written out, every rounding by `to_bf16` (autograd's own
  casts would make convert pairs, which torch.compile may drop: `common.round_bf16`)."""

  @staticmethod
  def forward(ctx, x, w, bias, mode):
    xb, wb = to_bf16(x), to_bf16(w)
    ctx.save_for_backward(xb, wb)
    ctx.mode, ctx.dtypes = mode, (x.dtype, w.dtype, None if bias is None else bias.dtype)
    y = to_bf16(paper_fa2.mm(xb, wb, mode))
    if bias is None:
      return y
    return to_bf16(y.float() + round_bf16(bias))  # a bf16 add, as torch's: a float32 sum, rounded

  @staticmethod
  def backward(ctx, dy):
    xb, wb = ctx.saved_tensors
    dy = to_bf16(dy)
    dx, dw = matmul_grads(dy, xb, wb, ctx.mode)
    rows = dy.reshape(-1, dy.shape[-1])
    db = None if ctx.dtypes[2] is None else to_bf16(rows.float().sum(0)).to(ctx.dtypes[2])
    return dx.to(ctx.dtypes[0]), dw.to(ctx.dtypes[1]), db, None


def matmul_grads(dy, xb, wb, mode):
  """The backward of y = bf16(xb @ wb) as JAX's bf16 dot's: dx = bf16(dy @ wbᵀ), dw =
  bf16(xbᵀ @ dy) summed over every leading axis, both bf16. dy, xb [..., m] / [..., n] bf16, wb
  [n, m] bf16 (`_BF16Matmul`, `lm_head_loss`)."""
  dx = to_bf16(paper_fa2.mm(dy, wb.t(), mode))
  dw = to_bf16(paper_fa2.mm(xb.reshape(-1, xb.shape[-1]).t(), dy.reshape(-1, dy.shape[-1]), mode))
  return dx, dw


class Linear(nn.Module):
  """`nnx.Linear(dtype=bfloat16, param_dtype=float32)`: kernel [in, out] (JAX orientation)."""

  def __init__(self, n_in, n_out, bias, std, generator, matmul):
    super().__init__()
    self.kernel = nn.Parameter(torch.empty(n_in, n_out).normal_(0.0, std, generator=generator))
    self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
    self.matmul = matmul

  def forward(self, x):  # → bf16
    return bf16_matmul(x, self.kernel, self.matmul, self.bias)


class LayerNorm(nn.Module):
  """flax `nnx.LayerNorm(epsilon=1e-5, dtype=float32)` with its fast variance, in float32."""

  def __init__(self, n, bias):
    super().__init__()
    self.scale = nn.Parameter(torch.ones(n))
    self.bias = nn.Parameter(torch.zeros(n)) if bias else None

  def forward(self, x):  # x float32
    mean = x.mean(-1, keepdim=True)
    mean2 = (x * x).mean(-1, keepdim=True)
    var = torch.clamp_min(mean2 - mean * mean, 0.0)
    y = (x - mean) * (torch.rsqrt(var + LN_EPS) * self.scale)
    return y + self.bias if self.bias is not None else y


class _Gelu(torch.autograd.Function):
  """`jax.nn.gelu(h, approximate=False)` on bf16 h, 0.5·h·erfc(−h·bf16(√½)), with the rounding
  points XLA gives its forward and its autodiff backward (jax 0.11.2 CPU, read from the
  compiled HLO and checked bit for bit against JAX, `gelu`). Tensors bf16."""

  @staticmethod
  def forward(ctx, h):
    x = h.float()
    e = to_bf16(torch.erfc(-x * SQRT_HALF_BF16))  # the argument stays float32
    ctx.save_for_backward(h, e)
    return to_bf16(round_bf16(0.5 * x) * e.float())

  @staticmethod
  def backward(ctx, d_out):
    h, e = ctx.saved_tensors
    x, g = h.float(), d_out.float()
    # JAX's jvp of erfc, d/da erfc(a) = −2/√π·exp(−a²), in bf16 ops: every product rounded,
    # −2/√π rounded to bf16 (−1.125), a = bf16(−h·bf16(√½)).
    rb = round_bf16
    d_e = rb(rb(0.5 * x) * g)
    a = rb(-x * SQRT_HALF_BF16)
    d_a = rb(rb(d_e * NEG_TWO_OVER_SQRT_PI_BF16) * rb(torch.exp(-rb(a * a))))
    from_e = -rb(d_a * SQRT_HALF_BF16)
    from_h = rb(rb(g * e.float()) * 0.5)
    return to_bf16(from_e + from_h)


def gelu(h):
  """`jax.nn.gelu(h, approximate=False)` for bf16 h → bf16, with XLA's rounding points:
  forward bf16(bf16(0.5h) · bf16(erfc(−h·bf16(√½)))), the product −h·0.70703125 kept in
  float32; backward the bf16 chain of JAX's autodiff (`_Gelu.backward`). Against jax 0.11.2 (CPU):
  forward equal for every bf16 h with |h| < 20 except denormal results (XLA flushes them to
  zero), backward equal for 200,000 random (h, dO) pairs."""
  return _Gelu.apply(h)


class CausalSelfAttention(nn.Module):
  def __init__(self, cfg: ModelConfig, attention: AttentionChoice, generator, matmul):
    super().__init__()
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    self.c_attn = Linear(cfg.n_embd, 3 * cfg.n_embd, cfg.bias, 0.02, generator, matmul)
    self.c_proj = Linear(cfg.n_embd, cfg.n_embd, cfg.bias, proj_std, generator, matmul)
    self.n_head = cfg.n_head
    self.attention, self.matmul = attention, matmul
    self.attend = attend  # `GPT.compile_attention` replaces it

  def forward(self, x, record=None):  # x [b, t, c] float32
    b, t, c = x.shape
    q, k, v = self.c_attn(x).split(c, dim=-1)  # 3 × [b, t, c] bf16
    q, k, v = (y.reshape(b, t, self.n_head, c // self.n_head) for y in (q, k, v))
    y = self.attend(q, k, v, self.attention, causal=True, matmul=self.matmul)  # [b, t, h, d] bf16
    if record is not None:  # diagnostics: the attention's inputs and output
      record.append((q, k, v, y))
    return self.c_proj(y.reshape(b, t, c))


class MLP(nn.Module):
  def __init__(self, cfg: ModelConfig, generator, matmul):
    super().__init__()
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    self.c_fc = Linear(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, 0.02, generator, matmul)
    self.c_proj = Linear(4 * cfg.n_embd, cfg.n_embd, cfg.bias, proj_std, generator, matmul)

  def forward(self, x):
    return self.c_proj(gelu(self.c_fc(x)))


class Block(nn.Module):
  def __init__(self, cfg: ModelConfig, attention, generator, matmul):
    super().__init__()
    self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias)
    self.attn = CausalSelfAttention(cfg, attention, generator, matmul)
    self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias)
    self.mlp = MLP(cfg, generator, matmul)

  def forward(self, x, record=None):  # float32 residual stream
    x = x + self.attn(self.ln_1(x), record)
    return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
  """`gpt2.GPT` in PyTorch; parameter names = the .npz keys (module docstring).

  The initialisation (GPT-2's: normal(0, 0.02), residual projections 0.02/√(2·n_layer), zero
  biases, unit LayerNorm scales; torch generator `seed`) only matters when no .npz is loaded.
  """

  def __init__(
    self,
    cfg: ModelConfig,
    attention: AttentionChoice = AttentionChoice(),
    *,
    matmul="emulated",
    seed=0,
  ):
    super().__init__()
    if matmul not in MATMULS:
      raise ValueError(f"matmul={matmul!r} is not one of {MATMULS}")
    g = torch.Generator().manual_seed(seed)
    self.config, self.attention, self.matmul = cfg, attention, matmul
    self.wte = nn.Parameter(torch.empty(cfg.vocab_size, cfg.n_embd).normal_(0.0, 0.02, generator=g))
    self.wpe = nn.Parameter(torch.empty(cfg.block_size, cfg.n_embd).normal_(0.0, 0.02, generator=g))
    self.h = nn.ModuleList(Block(cfg, attention, g, matmul) for _ in range(cfg.n_layer))
    self.ln_f = LayerNorm(cfg.n_embd, cfg.bias)

  def forward(self, tokens, record=None):
    """tokens [batch, t] integer (t ≤ block_size) → logits [batch, t, vocab_size] float32.
    `record`: a list to which each layer appends its attention's (query, key, value, output),
    [batch, t, heads, head_dim] bf16 (diagnostics).

    Raises:
      ValueError: t > block_size.
    """
    x = self.ln_f(self.hidden(tokens, record))
    return bf16_matmul(x, self.wte.t(), self.matmul).float()  # tied output embedding

  def compile_attention(self):
    """Each layer's attention (`attend`) under torch.compile (static shapes), a graph of its own
    that the same layer's neighbours cannot fuse into, as `attention_dq(compiled=True)`
    compiles it; the rest of the model stays as it is (--compile attention: eager)."""
    for block in self.h:
      block.attn.attend = compiled_attend()

  def hidden(self, tokens, record=None):
    """The residual stream after the last block, [batch, t, n_embd] float32 (`forward`
    without the final LayerNorm and the logits)."""
    t = tokens.shape[1]
    if t > self.config.block_size:
      raise ValueError(f"sequence length {t} exceeds block_size={self.config.block_size}")
    x = self.wte[tokens] + self.wpe[:t][None]
    for block in self.h:
      x = block(x, record)
    return x


# tokens per chunk of `lm_head_loss`: a chunk's float32 logits are 1.6 GB at vocab 50304, and
# the loss's backward, where every activation is still held, keeps a few such temporaries at
# once (16,384 until 2026-12-05; halved hoping two twins would fit an H200, but the step's peak
# stayed at 68.4–68.5 GiB on the H200 the same day: the peak is not the loss's temporaries)
LOSS_CHUNK = 8192


def loss_fn(model: GPT, tokens, targets, record=None, count=None, chunk=LOSS_CHUNK):
  """Mean next-token cross-entropy in float32 (nats): optax's logsumexp − target logit of
  `GPT.forward`'s logits, computed `chunk` tokens at a time (`lm_head_loss`). `record`: as
  `GPT.forward`'s. count: the denominator instead of the number of tokens (the sum over these
  tokens / count; each token's gradient 1/count, as the mean's over count)."""
  x = model.ln_f(model.hidden(tokens, record))
  return lm_head_loss(x, model.wte.t(), targets, count, model.matmul, chunk)


def lm_head_loss(x, w, targets, count=None, matmul="emulated", chunk=LOSS_CHUNK):
  """The cross-entropy of the logits bf16(bf16(x) @ bf16(w)) taken as float32 (`bf16_matmul`'s,
  as `GPT.forward`'s): per token logsumexp(logits) − logits[target], their mean (or their sum /
  count), with autograd's backward of that spelling — dlogits = g/N · exp(logits − lse), the
  target's − g/N added, rounded to bf16, then `bf16_matmul`'s dx and dw — but `chunk` tokens at a
  time: the float32 logits and their gradient of the whole batch never exist (at anchor-b128,
  128 × 1024 × 50304 float32 logits are 24.6 GiB, and autograd held them and their gradient
  at once: the twin's paper runs ran out of an H100's 80 GB, 2026-12-05). Eager, the backward
  computes each chunk's logits again from the saved bf16 x and w (one more GEMM of the head);
  compiled, AOTAutograd's CSE merges that with the forward's and keeps each chunk's bf16 logits
  instead (the same peak: each is freed as its gradient is made). What stays is the bf16
  gradient of the whole batch's logits (12.3 GiB at anchor-b128; with matmul="emulated" its
  float32 copy too, for the float32 GEMMs). The chunk count fixes the token count in a
  compiled graph: each batch shape compiles once (the twin has one).

  x [..., n] float32 (the final LayerNorm's output), w [n, vocab] float32, targets [...] int64
  (x's leading shape) → a float32 scalar (nats). The same values, bit for bit, as the
  unchunked spelling where each chunk's GEMM sums as the whole batch's does (tests).
  """
  return _ChunkedCrossEntropy.apply(x, w, targets, count, matmul, chunk)


class _ChunkedCrossEntropy(torch.autograd.Function):
  """`lm_head_loss`; every rounding by `to_bf16`, as `_BF16Matmul`."""

  @staticmethod
  def logits(xb, wb, matmul, rows):
    return to_bf16(paper_fa2.mm(xb[rows], wb, matmul)).float()

  @staticmethod
  def forward(ctx, x, w, targets, count, matmul, chunk):
    xb, wb, t = to_bf16(x.reshape(-1, x.shape[-1])), to_bf16(w), targets.reshape(-1)
    lse, label = [], []
    for r in range(0, len(t), chunk):
      logits = _ChunkedCrossEntropy.logits(xb, wb, matmul, slice(r, r + chunk))
      lse.append(torch.logsumexp(logits, dim=-1))
      label.append(logits.gather(-1, t[r : r + chunk, None]).squeeze(-1))
    lse = torch.cat(lse)
    ctx.save_for_backward(xb, wb, t, lse)
    ctx.count, ctx.matmul, ctx.chunk = count, matmul, chunk
    ctx.x_shape, ctx.dtypes = x.shape, (x.dtype, w.dtype)
    per_token = (lse - torch.cat(label)).reshape(targets.shape)
    return per_token.mean() if count is None else per_token.sum() / count

  @staticmethod
  def backward(ctx, g):
    xb, wb, t, lse = ctx.saved_tensors
    d_token = g / (len(t) if ctx.count is None else ctx.count)  # the mean's (the division's)
    dy = []
    for r in range(0, len(t), ctx.chunk):
      rows = slice(r, r + ctx.chunk)
      logits = _ChunkedCrossEntropy.logits(xb, wb, ctx.matmul, rows)
      d = d_token * torch.exp(logits - lse[rows, None])  # logsumexp's backward
      d = d.scatter_add(-1, t[rows, None], (-d_token).expand(len(logits), 1))  # − the target's
      dy.append(to_bf16(d))  # the .float()'s backward
    dy = torch.cat(dy)  # (eager: the chunks' list goes before the GEMMs)
    dx, dw = matmul_grads(dy, xb, wb, ctx.matmul)
    return dx.to(ctx.dtypes[0]).reshape(ctx.x_shape), dw.to(ctx.dtypes[1]), None, None, None, None


def jax_order(names):
  """`names` in JAX's pytree leaf order for the nnx state (paths sorted, list indices as ints):
  the order of optax's sums over leaves (global norms)."""
  return sorted(
    names, key=lambda n: tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in n.split("."))
  )


def count_params(model) -> int:
  return sum(p.numel() for p in model.parameters())


def flops_per_token(cfg: ModelConfig, n_params, seq_len) -> float:
  """6·N + 12·n_layer·n_head·head_dim·T (PaLM appendix B; `gpt2.flops_per_token`)."""
  return 6.0 * n_params + 12.0 * cfg.n_layer * cfg.n_embd * seq_len


# --- diagnostics -----------------------------------------------------------------------------


DQ_SEQUENCES = 8  # `diagnostics.DQ_SEQUENCES`: the batch's first sequences, where dQ is sampled


def diagnostic_rows(seed: int, step: int, batch: int, seq_len: int, n_rows: int, stream=2):
  """The (sequence, position) rows a diagnostics call reads, as two int64 arrays [R].

  n_rows > 0: n_rows pairs drawn uniformly from `batch` sequences by NumPy's generator seeded
  with (seed, step, stream) — the distribution of `diagnostics.diagnose`'s 64 rows in JAX
  (stream 2: the max logits' rows over the step's batch; 3: dQ's over its first DQ_SEQUENCES),
  not its draws (those come from jax.random, which NumPy cannot reproduce). n_rows = 0: every
  position of the first sequence (R = seq_len).
  """
  if n_rows == 0:
    return np.zeros(seq_len, np.int64), np.arange(seq_len, dtype=np.int64)
  rng = np.random.default_rng([seed, step, stream])
  return rng.integers(0, batch, n_rows), rng.integers(0, seq_len, n_rows)


DIAG_CHUNK = 16  # sequences per forward of the tie rate in `diagnose`


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # eager in every --compile mode
def diagnose(model: "GPT", tokens, rows) -> dict:
  """The twin's diagnostics row (without step), as `diagnostics.diagnose` names them:

    max_logit [layer][head]   the largest scaled score q·k/√head_dim over the `rows`
                              (`diagnostic_rows`) and their visible keys (causal), in float32
                              from the bf16 query and key of the model's own forward — as
                              JAX's `_attention_rows`
    sn_q_full [layer]         σ_max of the layer's whole W_Q ([n_embd, n_embd] float32), exact
                              (float64 singular values; JAX: power iteration, one step a call)
    tie_rate [layer][head]    the paper layout: the share of the batch's rows (every sequence
                              and position) with at least one key tile on which the
                              compensation's tie rule fires (`paper_fa2.tied_tiles` on the
                              layer's query and key, its tiles and tie_tolerance, whether the
                              compensation is on or not), as JAX reads it from its kernel's
                              `tied_tiles`; NaN for the other attentions (JAX: NaN for the
                              reference and cuDNN; its fa2's rate has no SDPA counterpart)

  (and the dQ error's fields: `dq_diagnostics`, which the training adds to the row).

  tokens: the step's batch [batch, t] int64 on the model's device; only the sequences that
  `rows` name are run (no logits), the whole batch for the paper layout's tie rate; DIAG_CHUNK
  sequences at a time (the paper's eager forward's float32 score tiles at anchor-b128: 0.8 GiB
  each for 128 sequences). Runs the model eager whatever --compile says. Changes nothing in the
  model (no_grad, no state).
  """
  b_idx, t_idx = (np.asarray(r) for r in rows)
  seqs, where = np.unique(b_idx, return_inverse=True)
  n_layer, n_head, n_embd = model.config.n_layer, model.config.n_head, model.config.n_embd
  scale = 1.0 / math.sqrt(n_embd // n_head)
  choice = model.attention
  # the sequences run: the whole batch for the tie rate's rows (paper), else the rows' own;
  # DIAG_CHUNK at a time, each layer's query and key kept for the rows' sequences
  run = np.arange(len(tokens)) if choice.paper else seqs
  tied = torch.zeros(n_layer, n_head, device=tokens.device)
  kept = [[] for _ in range(n_layer)]
  for c in range(0, len(run), DIAG_CHUNK):
    chunk, part = [], run[c : c + DIAG_CHUNK]
    model.hidden(tokens[torch.from_numpy(part).to(tokens.device)], chunk)
    mine = torch.from_numpy(np.flatnonzero(np.isin(part, seqs))).to(tokens.device)
    for layer, (query, key, *_) in enumerate(chunk):
      kept[layer].append((query[mine], key[mine]))
      if choice.paper:
        q, k = (x.transpose(1, 2) for x in (query, key))  # [b, h, t, d]
        bq, bk = fit_tile(choice.block_q, q.shape[2]), fit_tile(choice.block_k, k.shape[2])
        n = paper_fa2.tied_tiles(q, k, scale, True, bq, bk, choice.tie_tolerance, model.matmul)
        tied[layer] += (n > 0).float().sum(dim=(0, 2))
  record = [tuple(torch.cat(x) for x in zip(*pairs)) for pairs in kept]  # in the order of seqs
  nan = [[math.nan] * n_head] * n_layer
  tie_rate = (tied / (tokens.shape[0] * tokens.shape[1])).tolist() if choice.paper else nan
  max_logit = []
  for query, key, *_ in record:  # [s, t, h, d] bf16
    best = torch.full((n_head,), -math.inf, device=query.device)
    for j in range(len(seqs)):
      pos = torch.from_numpy(t_idx[where == j]).to(query.device)  # this sequence's rows
      q, k = query[j, pos].float(), key[j].float()  # [r, h, d], [t, h, d]
      s = torch.einsum("rhd,khd->hrk", q, k) * scale  # [h, r, t] float32
      hidden = torch.arange(k.shape[0], device=q.device)[None, None, :] > pos[None, :, None]
      best = torch.maximum(best, s.masked_fill(hidden, -math.inf).amax(dim=(1, 2)))
    max_logit.append(best.tolist())
  sn_q = [
    torch.linalg.svdvals(blk.attn.c_attn.kernel[:, :n_embd].detach().double().cpu())[0].item()
    for blk in model.h
  ]
  return dict(max_logit=max_logit, sn_q_full=sn_q, tie_rate=tie_rate)


def attention_dq(choice: AttentionChoice, matmul="emulated", compiled=False):
  """f(query, key, value, d_out) → dQ of `attend` (its own backward, as training runs it),
  tensors [batch, seq, heads, head_dim] bf16, causal; compiled: `compiled_attend` (the graphs
  of --compile attention's training, at their shapes) with `emulate_precision_casts`
  (`setup_precision`), as the training step compiles it — if no graph of the same shapes and
  choice was compiled before in the process without it: dynamo reuses compiled code whatever
  that setting (training sets it first, for the whole process). The dQ `dq_diagnostics`
  measures (JAX: `diagnostics.dq_rows`' vjp of `attend`)."""
  forward = functools.partial(
    compiled_attend() if compiled else attend, choice=choice, causal=True, matmul=matmul
  )
  casts = contextlib.nullcontext
  if compiled:
    import torch._inductor.config as inductor_config

    casts = functools.partial(inductor_config.patch, emulate_precision_casts=True)

  def dq(query, key, value, d_out):
    with torch.enable_grad(), casts():
      query = query.detach().requires_grad_()
      forward(query, key.detach(), value.detach()).backward(d_out)
    return query.grad

  return dq


def dq_diagnostics(model: "GPT", tokens, targets, rows, batch, dq_of, eager_of=None) -> dict:
  """dQ's error in every layer, as `diagnostics.diagnose` (Qiu & Yao 2025, §4):

    dq_err [layer][head]      rms of dQ − exact dQ over the rows, relative to the exact dQ's
                              rms row norm (`dq_error`)
    dq_rank1 [layer][head]    the share of that error's squared norm along its leading
                              direction in head_dim space (the bias mechanism's is near 1)
    dq_common [layer][head]   the error's rms part along each row's keys' mean, less its part
                              along the exact dQ, relative as dq_err (`dq_error_along`)
    dq_err_eager [layer][head]
                              with eager_of: dq_err of eager_of's dQ (the twin's own field: the
                              attention eager beside dq_of compiled, on the training's states)

  tokens, targets: [n, t] int64 on the model's device, the step's first n sequences (n ≤
  DQ_SEQUENCES); rows: (sequence < n, position) int64 arrays [R] (`diagnostic_rows`, stream
  3; --diag-rows 0, every position of sequence 0, which JAX refuses, holds float64 tensors
  [seq, seq, heads, head_dim] here: 3 GiB each at anchor-b128); batch: the micro-batch's
  sequences, the loss's count (`loss_fn`'s), so that each token's gradient, and so each
  layer's dO, is the micro-batch's mean loss's bit for bit, as JAX takes it; dq_of:
  `attention_dq`, dQ from (q, k, v, dO); eager_of: the same, eager (or None). The model's
  forward and backward run eager (`torch.compiler.set_stance("force_eager")`: also under
  --compile attention); its gradients touch no parameter's .grad.
  """
  record = []
  with torch.enable_grad(), torch.compiler.set_stance("force_eager"):
    loss = loss_fn(model, tokens, targets, record, count=batch * tokens.shape[1])
    d_outs = torch.autograd.grad(loss, [y for *_, y in record])  # each layer's dO, bf16
  scale = 1.0 / math.sqrt(record[0][0].shape[-1])
  b, t = (torch.from_numpy(np.asarray(r)).to(tokens.device) for r in rows)
  out = {"dq_err": [], "dq_rank1": [], "dq_common": []} | ({"dq_err_eager": []} if eager_of else {})
  for (q, k, v, _), d_o in zip(record, d_outs):
    q, k, v = (x.detach() for x in (q, k, v))
    formed = dq_of(q, k, v, d_o)[b, t].double()
    exact = exact_dq_rows(q, k, v, d_o, (b, t), scale)
    err, rank1 = dq_error(formed, exact)
    out["dq_err"].append(err.tolist())
    out["dq_rank1"].append(rank1.tolist())
    out["dq_common"].append(dq_error_along(formed, exact, row_key_mean(k, (b, t))).tolist())
    if eager_of:
      out["dq_err_eager"].append(dq_error(eager_of(q, k, v, d_o)[b, t].double(), exact)[0].tolist())
  return out


def exact_dq_rows(q, k, v, d_out, rows, softmax_scale):
  """FP32 attention's dQ of sampled rows, here in float64: P from the exact scores, dP = dO·Vᵀ,
  delta = rowsum(dO∘O) from the exact O, dQ = scale·Σ_j dS_j (k_j − Σ_j P_j k_j) with dS =
  P∘(dP − delta) (Σ_j dS_j = 0, so the same as Σ_j dS_j k_j without the cancellation of a large
  common key component) — `diagnostics.dq_rows`' exact dQ. q, k, v, d_out [batch, seq, heads,
  head_dim] (any float dtype), causal; rows: (batch index, position) int64 tensors [R].
  Returns float64 [R, heads, head_dim]."""
  b, t = rows
  qr, do_r = q[b, t].double(), d_out[b, t].double()  # [R, h, d]
  kr, vr = k[b].double(), v[b].double()  # [R, T, h, d]
  s = torch.einsum("rhd,rkhd->rhk", qr, kr) * softmax_scale
  hidden = torch.arange(k.shape[1], device=q.device)[None, None, :] > t[:, None, None]
  p = torch.softmax(s.masked_fill(hidden, -math.inf), dim=-1)
  o = torch.einsum("rhk,rkhd->rhd", p, vr)
  dp = torch.einsum("rhd,rkhd->rhk", do_r, vr)
  ds = p * (dp - (do_r * o).sum(-1, keepdim=True))
  k_mean = torch.einsum("rhk,rkhd->rhd", p, kr)
  return softmax_scale * torch.einsum("rhk,rkhd->rhd", ds, kr - k_mean[:, None])


def rms_row_norm(x):
  """The root mean square over rows of x [R, heads, head_dim]'s row norms, per head [h]: the
  exact dQ's size, which `dq_error` and `dq_error_along` divide by (`diagnostics.rms_row_norm`)."""
  return x.pow(2).sum(-1).mean(0).sqrt()


def dq_error(formed, exact):
  """`diagnostics.dq_error`: per head, from dQ rows [R, heads, head_dim], (the error's rms row
  norm relative to the exact dQ's, the share of its squared norm along its leading direction);
  NaN where a head's exact dQ or error is 0, and the share NaN where the error is not finite."""
  err = (formed - exact).transpose(0, 1)  # [h, R, d]
  size = rms_row_norm(exact)  # [h]
  energy = err.pow(2).sum((1, 2))
  finite = torch.isfinite(err).flatten(1).all(1)
  top = torch.linalg.svdvals(torch.where(finite[:, None, None], err, 0.0).cpu())[:, 0] ** 2
  rms = (energy / err.shape[1]).sqrt()
  nan = torch.full_like(size, math.nan)
  share = torch.where(finite & (energy > 0), top.to(energy.device) / energy, nan)
  return torch.where(size > 0, rms / size, nan), share


def row_key_mean(k, rows):
  """`diagnostics.row_key_mean`: for each sampled causal row (b, t), the mean of keys 0..t of
  sequence b, float64 [R, heads, head_dim]; k [batch, seq, heads, head_dim]."""
  b, t = rows
  return k.double().cumsum(1)[b, t] / (t.double() + 1.0)[:, None, None]


def dq_error_along(formed, exact, direction):
  """`diagnostics.dq_error_along`: per head, the rms over rows of the error's component along
  each row's direction less its part along the row's exact dQ, relative to the exact dQ's rms
  row norm; a row whose direction is within 1e-4 of its exact dQ's contributes 0, a row whose
  error is not finite makes the head's value inf, NaN where a head's exact dQ is 0."""

  def norm(x):
    return x.pow(2).sum(-1, keepdim=True).sqrt()

  def unit(x):
    n = norm(x)
    return torch.where(n > 0, x / torch.where(n > 0, n, 1.0), 0.0)

  e = unit(exact)
  across = direction - (direction * e).sum(-1, keepdim=True) * e
  across = across - (across * e).sum(-1, keepdim=True) * e
  u = torch.where(norm(across) > 1e-4 * norm(direction), unit(across), 0.0)
  err = formed - exact
  along = (err * u).sum(-1)
  along = torch.where(torch.isfinite(err).all(-1), along, math.inf)  # [R, h]
  size = rms_row_norm(exact)
  rms = along.pow(2).mean(0).sqrt()
  return torch.where(size > 0, rms / size, math.nan)


class ExplosionMonitor:
  """`train.ExplosionMonitor`, the same rule: fed (step, loss) in order, `step` is the first
  step whose loss is non-finite or, after warmup, whose trailing mean over `window` steps
  exceeds `factor` × the running minimum of that mean."""

  def __init__(self, warmup_steps, factor=2.0, window=10):
    self.warmup_steps, self.factor, self.window = warmup_steps, factor, window
    self.running, self.recent, self.step = math.inf, [], None

  def update(self, step, loss):
    """Returns the explosion step once one has been seen (None before)."""
    if self.step is not None:
      return self.step
    if not math.isfinite(loss):
      self.step = step
      return step
    self.recent = (self.recent + [loss])[-self.window :]
    smooth = sum(self.recent) / len(self.recent)
    if step > self.warmup_steps and smooth > self.factor * self.running:
      self.step = step
    elif len(self.recent) == self.window:
      self.running = min(self.running, smooth)
    return self.step


# --- parameters in .npz ----------------------------------------------------------------------


def save_npz(model: GPT, path):
  """Writes the parameters in the .npz layout of the module docstring (float32, JAX order)."""
  np.savez(path, **{n: p.detach().float().cpu().numpy() for n, p in model.named_parameters()})


def load_npz(model: GPT, path):
  """Copies the parameters of a .npz in the layout of the module docstring into `model`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a missing or unexpected key, a shape that differs from the model's or a dtype
      other than float32 (the message names them).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"initial parameters not found: {path}")
  params = dict(model.named_parameters())
  try:
    with np.load(path) as f:  # allow_pickle off: an .npz of arrays, nothing else
      arrays = {k: f[k] for k in f.files}
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(
      f"initial parameters {path}: not an .npz of arrays ({type(e).__name__})"
    ) from None
  problems = [f"missing {k}" for k in params if k not in arrays]
  problems += [f"unexpected {k}" for k in arrays if k not in params]
  for k, a in arrays.items():
    if k in params and tuple(a.shape) != tuple(params[k].shape):
      problems.append(f"{k} has shape {list(a.shape)}, the model {list(params[k].shape)}")
    elif k in params and a.dtype != np.float32:
      problems.append(f"{k} has dtype {a.dtype}, not float32")
  if problems:
    more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
    raise ValueError(f"{path} does not fit the model: {'; '.join(problems[:8])}{more}")
  with torch.no_grad():
    for k, p in params.items():
      p.copy_(torch.from_numpy(arrays[k]))


# --- optimizer -------------------------------------------------------------------------------


def _f32(x) -> float:
  """The float32 nearest to `x`, as a Python float (exactly representable)."""
  return float(F32(x))


def _fma_scalar(a, b, c) -> float:
  """float32 fma(a, b, c) (one rounding) of float32 values, through float64, as a Python float.
  Exact: a·b has ≤ 48 significant bits; the float64 sum rounds only when the float32 result
  is inexact anyway (double rounding happens with probability ~2⁻²⁹)."""
  return _f32(float(np.float64(a) * np.float64(b) + np.float64(c)))


def _cos32(x) -> float:
  """cos of a float32 argument, correctly rounded to float32 (XLA's differs in ~1% of
  arguments by one ulp; NumPy's float32 cos in ~17%)."""
  return _f32(math.cos(x))


def learning_rate(count, *, lr, min_lr, warmup_steps, decay_steps, jitted=True) -> float:
  """optax.warmup_cosine_decay_schedule(init_value=0, peak_value=lr, warmup_steps,
  decay_steps, end_value=min_lr) at integer `count`, in float32 (optax 0.2.8), as XLA
  computes it (a float32 value as a Python float).

  jitted=True: as compiled inside the jitted update, where XLA (CPU, read from its HLO) turns a
  division by a constant into a product with its reciprocal and folds constants — c·(π·(1/T))
  for π·c/T, (1 + cos)·(0.5·(1 − α)) for (1 − α)·0.5·(1 + cos), c·(1/W) for c/W — and
  contracts a·b + c into one fma. jitted=False: as the eager call that
  writes metrics.jsonl's `lr` (every op rounded on its own). Against JAX 0.11.2 on CPU over
  the anchor's 25,000 counts: equal except where XLA's float32 cos is off by an ulp (0.4% of
  counts, ≤ 2.7e-7 relative). `decay_steps` must already be > warmup_steps (the JAX config
  passes max(decay_steps or steps, warmup_steps + 1)).
  """
  f = _f32
  alpha = 0.0 if lr == 0.0 else min_lr / lr
  if count < warmup_steps:  # linear_schedule(0 → lr)
    c = f(min(max(count, 0), warmup_steps))
    if jitted:
      frac = _fma_scalar(-c, f(f(1.0) / f(warmup_steps)), 1.0)
      return _fma_scalar(frac, f(0.0 - lr), f(lr))
    frac = f(1.0 - f(c / f(warmup_steps)))
    return f(f(f(0.0 - lr) * frac) + f(lr))
  length = decay_steps - warmup_steps  # cosine_decay_schedule(lr, …, α)
  c = f(min(count - warmup_steps, length))
  if jitted:
    cos = _cos32(f(c * f(f(math.pi) * f(1.0 / f(length)))))
    return f(_fma_scalar(f(cos + 1.0), f(0.5 * f(1 - alpha)), f(alpha)) * f(lr))
  cosine = f(0.5 * f(1.0 + _cos32(f(f(f(math.pi) * c) / f(length)))))
  return f(f(f(f(1 - alpha) * cosine) + f(alpha)) * f(lr))


def _fma(a, b, c):
  """float32 fma(a, b, c) elementwise, one rounding, exact through float64 (`_fma_scalar`);
  a, b: float32 tensors or float32 values as Python floats; c a float32 tensor."""
  d = lambda x: x.double() if torch.is_tensor(x) else x
  return (d(a) * d(b) + c.double()).float()


class OptaxAdamW:
  """optax.chain(clip_by_global_norm(grad_clip), adamw(schedule, b1, b2, eps, weight_decay,
  mask=ndim ≥ 2)) in float32 as optax 0.2.8 writes it and XLA compiles it (jax 0.11.2, CPU,
  read from the HLO of `train.make_steps`' update and checked against optax bit for bit):

    g_norm = √(Σ_leaves Σ g²)                  (leaves in JAX's order; the logged grad_norm)
    g ← g                  if g_norm < grad_clip, else (g / g_norm) · grad_clip   (no +1e-6)
    mu ← fma(1 − b1, g, b1·mu);   nu ← fma(b2, nu, (1 − b2)·g²)       (XLA contracts into fma)
    count ← count + 1;   bcᵢ = 1 − bᵢ^count      (float32 pow, correctly rounded like XLA's)
    u = mu / ((√(nu / bc2) + eps) · bc1)          (XLA's form of (mu/bc1) / (√(nu/bc2) + eps))
    u ← fma(p, weight_decay, u) on ≥2-D parameters (skipped when weight_decay = 0, as optax)
    p ← fma(−lr(count − 1), u, p)                                     (`learning_rate`)

  torch.optim.AdamW is another algorithm at this precision (eps added to √v̂ after a different
  bias correction, decoupled decay p·(1 − lr·wd), its own lr count), hence this class; each
  line above is a separate eager op (foreach kernels), the fmas exact through float64.
  What can still differ from JAX: the order of XLA's sums in the norms (one ulp of g_norm
  changes the clipped g), its cos (`learning_rate`), and on GPU whichever contractions XLA's
  GPU backend makes there (these are the CPU's; not checked on a GPU).
  """

  def __init__(
    self,
    named_params,
    *,
    lr,
    min_lr,
    warmup_steps,
    decay_steps,
    beta1,
    beta2,
    eps,
    weight_decay,
    grad_clip,
  ):
    names = jax_order([n for n, _ in named_params])
    by_name = dict(named_params)
    self.names = names
    self.params = [by_name[n] for n in names]
    self.decay = [p.ndim >= 2 for p in self.params]
    self.mu = [torch.zeros_like(p) for p in self.params]
    self.nu = [torch.zeros_like(p) for p in self.params]
    self.count = 0
    self.schedule = functools.partial(
      learning_rate, lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, decay_steps=decay_steps
    )
    self.b1, self.b2, self.eps, self.wd, self.clip = beta1, beta2, eps, weight_decay, grad_clip

  @staticmethod
  def global_norm(tensors):
    """√(Σ_leaves Σ x²) in float32, summed leaf by leaf in order (optax.tree.norm)."""
    total = None
    for s in (torch.sum(x * x) for x in tensors):
      total = s if total is None else total + s
    return torch.sqrt(total)

  @torch.no_grad()
  def step(self, grads):
    """Applies one update from `grads` (float32, in `self.names` order; overwritten); returns
    the global norm of `grads` before clipping (a 0-d tensor on the parameters' device)."""
    f = _f32
    g_norm = self.global_norm(grads)
    keep = g_norm < self.clip  # optax: select(trigger, g, g/n·c)
    torch._foreach_div_(grads, torch.where(keep, torch.ones_like(g_norm), g_norm))
    torch._foreach_mul_(
      grads, torch.where(keep, torch.ones_like(g_norm), torch.full_like(g_norm, self.clip))
    )
    self.count += 1
    bc1 = f(1.0 - f(float(np.float64(f(self.b1)) ** self.count)))
    bc2 = f(1.0 - f(float(np.float64(f(self.b2)) ** self.count)))
    neg_lr = -self.schedule(self.count - 1)
    for i, (p, g) in enumerate(zip(self.params, grads)):
      self.mu[i] = _fma(f(1 - self.b1), g, self.mu[i] * self.b1)
      self.nu[i] = _fma(f(self.b2), self.nu[i], (g * g) * (1 - self.b2))
      u = self.mu[i] / (((self.nu[i] / bc2).sqrt_() + self.eps) * bc1)
      if self.wd != 0.0 and self.decay[i]:
        u = _fma(p, f(self.wd), u)
      p.copy_(_fma(neg_lr, u, p))
    return g_norm

  # Python-float multipliers are rounded to the tensors' float32 by torch, as JAX rounds its
  # weakly typed constants (1 − 0.9 → float32(0.1)).


# --- training --------------------------------------------------------------------------------


class NonFiniteError(RuntimeError):
  """A step produced a non-finite loss or gradient (as `train.NonFiniteError`)."""


@dataclasses.dataclass(frozen=True)
class TwinConfig:
  """The twin's run: `train.TrainConfig`'s fields that decide the trajectory (same names and
  meaning), the model shape, the attention and the torch-side settings. Defaults: anchor-b128."""

  init: str = ""  # the .npz of initial parameters (required)
  data: str | None = None  # data folder; None = the JAX package's embedded sample
  attention: str = "paper"
  block_q: int = 512
  block_k: int = 512
  beta: float = 2.0
  tie_tolerance: float = 1e-3
  n_layer: int = 6
  n_head: int = 6
  n_embd: int = 384
  block_size: int = 1024
  vocab_size: int = 50304
  bias: bool = False
  steps: int = 3000
  batch_size: int = 128
  grad_accum: int = 1
  seq_len: int | None = None  # default: block_size
  lr: float = 3e-3
  min_lr: float = 1e-5
  warmup_steps: int = 200
  decay_steps: int | None = 20000  # None: steps
  weight_decay: float = 0.0
  beta1: float = 0.9
  beta2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0
  seed: int = 0  # data order (the JAX run's seed)
  eval_interval: int = 500
  eval_batches: int = 4
  diag_interval: int = 100  # steps between diagnostics rows (0: off), `diagnose`
  diag_rows: int = 64  # rows per diagnostics call (0: the first sequence's all)
  stop_after_explosion: int = 300  # stop this many steps after an explosion (-1: never)
  checkpoint_interval: int = 250  # steps between checkpoints (0: none but the time stop's)
  max_seconds: float = 0.0  # stop with a checkpoint this long after the start (0: never)
  out_dir: str = "runs/torch_twin"
  device: str = "auto"  # auto: cuda if available, else cpu
  compile: str = "auto"  # auto: on for CUDA, off on CPU
  matmul: str = "auto"  # auto: bf16 on CUDA, emulated on CPU
  deterministic: bool = False  # torch.use_deterministic_algorithms (CUDA: slower)
  save_final: bool = False  # OUT/final_params.npz after the last step
  print_interval: int = 100  # progress line every N steps (0: none)
  threads: int = 0  # torch CPU threads (0: torch's default)

  def model_config(self) -> ModelConfig:
    return ModelConfig(
      self.n_layer, self.n_head, self.n_embd, self.block_size, self.vocab_size, self.bias
    )

  def attention_choice(self) -> AttentionChoice:
    return AttentionChoice(
      self.attention, self.block_q, self.block_k, self.beta, self.tie_tolerance
    )

  def decay_length(self) -> int:
    return max(self.decay_steps or self.steps, self.warmup_steps + 1)  # as TrainConfig

  def torch_device(self) -> torch.device:
    if self.device == "auto":
      return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(self.device)

  def validate(self):
    """ValueError naming the first bad field (before any expensive work)."""
    self.model_config()
    self.attention_choice()
    positive = ("steps", "batch_size", "grad_accum", "eval_batches")
    for f in positive:
      if getattr(self, f) < 1:
        raise ValueError(f"{f} must be >= 1, got {f}={getattr(self, f)}")
    for f in (
      "warmup_steps",
      "eval_interval",
      "print_interval",
      "threads",
      "diag_interval",
      "diag_rows",
      "checkpoint_interval",
    ):
      if getattr(self, f) < 0:
        raise ValueError(f"{f} must be >= 0, got {f}={getattr(self, f)}")
    if self.stop_after_explosion < -1:
      raise ValueError(
        f"stop_after_explosion must be >= -1, got stop_after_explosion={self.stop_after_explosion}"
      )
    seq = self.seq_len or self.block_size
    if not 1 <= seq <= self.block_size:
      raise ValueError(f"seq_len={self.seq_len} must be in [1, block_size={self.block_size}]")
    if self.decay_steps is not None and self.decay_steps < 1:
      raise ValueError(f"decay_steps must be >= 1, got decay_steps={self.decay_steps}")
    if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
      raise ValueError(  # as TrainConfig: `schedule_steps` would lengthen it unsaid
        f"decay_steps={self.decay_steps} must be more than warmup_steps={self.warmup_steps}: "
        "the cosine's length counts the warmup"
      )
    for f in ("lr", "min_lr", "weight_decay", "eps"):
      v = getattr(self, f)
      if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{f} must be a finite number >= 0, got {f}={v!r}")
    for f in ("beta1", "beta2"):
      if not 0 <= getattr(self, f) < 1:
        raise ValueError(f"{f} must be in [0, 1), got {f}={getattr(self, f)!r}")
    if not (math.isfinite(self.max_seconds) and self.max_seconds >= 0):
      raise ValueError(
        f"max_seconds must be a finite number >= 0, got max_seconds={self.max_seconds!r}"
      )
    if not (math.isfinite(self.grad_clip) and self.grad_clip > 0):
      raise ValueError(f"grad_clip must be a finite number > 0, got grad_clip={self.grad_clip!r}")
    if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
      raise ValueError(f"device={self.device!r} must be auto, cpu or cuda[:N]")
    device = self.torch_device()
    if device.type == "cuda" and not torch.cuda.is_available():
      raise ValueError(f"device={self.device!r}, but torch {torch.__version__} sees no CUDA device")
    check_attention_device(self.attention_choice(), device)
    for f, allowed in (("compile", ("auto",) + COMPILES), ("matmul", ("auto",) + MATMULS)):
      if getattr(self, f) not in allowed:
        raise ValueError(f"{f}={getattr(self, f)!r} is not one of {', '.join(allowed)}")
    if not self.init:
      raise ValueError("init is required: the .npz of initial parameters")
    if pathlib.Path(self.init).is_dir():
      raise ValueError(f"init={self.init!r} is a folder, not an .npz")
    if not pathlib.Path(self.init).is_file():
      raise ValueError(f"init={self.init!r}: no such file")
    if self.data is not None and not pathlib.Path(self.data).is_dir():
      raise ValueError(f"data={self.data!r}: no such folder")


def train_batches(data, cfg: TwinConfig, step: int, seq_len: int):
  """The (x, y) int32 [batch_size, seq_len] micro-batches of optimizer step `step` (1-based):
  `Dataset.batch("train", seed, step·grad_accum + j, …)` for j < grad_accum, as JAX."""
  return [
    data.batch("train", cfg.seed, step * cfg.grad_accum + j, cfg.batch_size, seq_len)
    for j in range(cfg.grad_accum)
  ]


def eval_batches(data, cfg: TwinConfig, seq_len: int):
  """The validation batches: `Dataset.batch("val", 1234, i, …)` for i < eval_batches, as JAX."""
  return [data.batch("val", 1234, i, cfg.batch_size, seq_len) for i in range(cfg.eval_batches)]


def setup_precision(device: torch.device, compiled: bool, deterministic=False):
  """float32 matmuls in full float32 (no TF32, as JAX's HIGHEST), bf16 GEMMs without
  reduced-precision reductions, and, when compiling, `emulate_precision_casts` (a fused kernel
  keeps the rounding of torch's own bf16 ops; the twin's explicit roundings are on the bits,
  `common.round_bf16`, which no compiler setting touches)."""
  torch.set_float32_matmul_precision("highest")
  if device.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
  if compiled:
    import torch._inductor.config as inductor_config  # (2.5 s to import: only here)

    inductor_config.emulate_precision_casts = True
  if deterministic:
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def _device_name(device):
  if device.type == "cuda":
    return torch.cuda.get_device_name(device)
  import platform

  return platform.processor() or platform.machine() or "cpu"


def _sha256(path):
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _monitor_state(monitor: ExplosionMonitor) -> dict:
  return dict(running=monitor.running, recent=list(monitor.recent), step=monitor.step)


def save_checkpoint(out: pathlib.Path, step, cfg: TwinConfig, resolved: dict, opt, monitor):
  """OUT/checkpoint.pt after `step`: the parameters and moments (JAX's order), the optimizer's
  count, the explosion rule's state, and what a resumption must match (the config, and what
  init, data, device, compile and matmul resolve to: `_resolved`). Written whole, then renamed
  over the old one (a kill while writing leaves the old checkpoint); OUT/checkpoint.json
  then names its step for the JAX side (`experiment.twin`), which reads no torch files."""
  cpu = lambda ts: [t.detach().to("cpu", copy=True) for t in ts]  # noqa: E731
  state = dict(
    step=step,
    config=dataclasses.asdict(cfg),
    resolved=resolved,
    names=list(opt.names),
    params=cpu(opt.params),
    mu=cpu(opt.mu),
    nu=cpu(opt.nu),
    count=opt.count,
    monitor=_monitor_state(monitor),
  )
  tmp = out / (CHECKPOINT + ".tmp")
  torch.save(state, tmp)
  tmp.replace(out / CHECKPOINT)
  _write_atomic(out / "checkpoint.json", json.dumps(dict(step=step)) + "\n")


def remove_checkpoint(out: pathlib.Path):
  """The run is over (finished, exploded and stopped, or non-finite): nothing to resume."""
  for name in (CHECKPOINT, CHECKPOINT + ".tmp", "checkpoint.json"):
    (out / name).unlink(missing_ok=True)


def _write_atomic(path: pathlib.Path, text: str):
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(path)


def read_checkpoint(out: pathlib.Path, cfg: TwinConfig, resolved: dict) -> dict | None:
  """OUT/checkpoint.pt, checked against this run before any model is built (None: no
  checkpoint); `restore` then loads it. Raises ValueError, naming the file, for a checkpoint
  that cannot be read, one of a run with another trajectory field (`RESUME_FREE` aside) or
  another resolved init, data, device, compile, matmul or paper-layout GEMM (`_resolved`), and
  one not before
  `steps` (nothing left to run)."""
  path = out / CHECKPOINT
  if not path.exists():
    return None
  try:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    old, done = ck["config"], ck["resolved"]
    step, names = int(ck["step"]), ck["names"]
    params, mu, nu, count, m = (ck[k] for k in ("params", "mu", "nu", "count", "monitor"))
    running, recent, exploded = m["running"], list(m["recent"]), m["step"]
  except Exception as e:  # a cut or foreign file, a folder: one line, not a traceback
    first = (str(e).splitlines() or [""])[0]
    why = (
      "not a file torch.save wrote"  # torch's own message suggests weights_only=False
      if isinstance(e, pickle.UnpicklingError)
      else type(e).__name__ + (f": {first[:120]}" if first else "")
    )
    raise ValueError(
      f"{path} cannot be read as a twin checkpoint ({why}); remove it to start again"
    ) from None
  new = dataclasses.asdict(cfg)
  free = set(RESUME_FREE)
  if old.get("decay_steps") is not None and new["decay_steps"] is not None:
    free.add("steps")  # a longer or shorter run of the same schedule
  if isinstance(done.get("compile"), bool):  # a checkpoint from before --compile attention
    done = dict(done, compile="on" if done["compile"] else "off")
  for key, was, now in (
    *((k, old.get(k), v) for k, v in new.items() if k not in free),
    *((f"{k} (resolved)", done.get(k), v) for k, v in resolved.items()),
  ):
    if was != now:
      raise ValueError(
        f"{path} is of a run with {key}={was!r}, not {now!r}: resume with its settings, "
        "or remove it to start again"
      )
  if step >= cfg.steps:
    raise ValueError(
      f"{path} is at step {step}, not before steps={cfg.steps}: nothing to resume "
      "(give more steps, or remove it to start again)"
    )
  return dict(
    path=path,
    step=step,
    names=names,
    params=params,
    mu=mu,
    nu=nu,
    count=count,
    monitor=(running, recent, exploded),
  )


def restore(ck: dict, opt, monitor) -> int:
  """Loads a `read_checkpoint` result into `opt` (its parameters are the model's) and
  `monitor`; returns its step. ValueError if it holds other parameters than the model's."""
  if ck["names"] != list(opt.names):
    raise ValueError(f"{ck['path']} holds other parameters than this model's")
  with torch.no_grad():
    for p, saved in zip(opt.params, ck["params"]):
      p.copy_(saved)
  device = opt.params[0].device
  opt.mu = [t.to(device) for t in ck["mu"]]
  opt.nu = [t.to(device) for t in ck["nu"]]
  opt.count = ck["count"]
  monitor.running, monitor.recent, monitor.step = ck["monitor"]
  return ck["step"]


def _keep_rows(path: pathlib.Path, last_step: int) -> list[dict]:
  """Rewrites a JSON-lines log with its rows up to `last_step` (a resumed run's own; a last
  line cut by a killed process is dropped, as JAX's reader does) and returns them. ValueError
  naming the file for a line that does not parse before its last."""
  lines = path.read_text().splitlines() if path.exists() else []
  rows = []
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if i < len(lines) - 1:
        raise ValueError(f"{path}: line {i + 1} is not JSON; remove the run to start again")
  kept = [r for r in rows if r["step"] <= last_step]
  _write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
  return kept


# config.json's "rounding": bf16 roundings on the bits (`common.round_bf16`); runs before
# 2026-12-05 lack the field: convert pairs, which torch 2.11 drops when it compiles
ROUNDING = "bits"


def _resolved(device, compile, matmul, choice, data_folder, init_sha256) -> dict:
  """What a resumed run must match beside its trajectory fields: the initial parameters by
  content, the data folder as found, and the device, compilation and matmul as resolved, and
  for the paper layout its GEMMs (`attention_matmul`; None for the other attentions: a paper
  checkpoint from before its GEMMs followed --matmul lacks the field and is refused), and the
  rounding (`ROUNDING`: a checkpoint of the convert-pair code lacks it and is refused)."""
  return dict(
    init=init_sha256,
    data=str(data_folder),
    device=device.type,
    compile=compile,
    matmul=matmul,
    attention_matmul=matmul if choice.paper else None,
    rounding=ROUNDING,
  )


def train(cfg: TwinConfig, started: float | None = None) -> dict:
  """Trains as `train.train_and_evaluate` does, logging to cfg.out_dir; returns the summary
  (the last row, n_params, stopped: None, "explosion" or "time", explosion_step). Resumes
  from OUT/checkpoint.pt when there is one (`read_checkpoint`, `restore`); checkpoints every
  checkpoint_interval steps and when max_seconds (counted from the call, setup and
  compilation included, as JAX; `started`: a perf_counter time to count from instead, as
  `main` gives the module's import) are spent, then stops with stopped="time".

  Per step s = 1 … steps: batches `Dataset.batch("train", seed, s·grad_accum + j, batch_size,
  seq_len)` for j < grad_accum; loss and gradients averaged over them; the update; a row with
  lr = schedule(s − 1). Validation (eval_interval, and at the last step): the mean loss of
  `Dataset.batch("val", 1234, i, …)` for i < eval_batches, as JAX. Every diag_interval steps
  (after the update, on the step's first micro-batch, as JAX) a row of `diagnose` in
  OUT/diagnostics.jsonl. stop_after_explosion ≥ 0: the run ends that many steps after the
  explosion step of `ExplosionMonitor` (as JAX).

  Raises:
    ValueError: a bad field (`TwinConfig.validate`), a data folder without data, or an .npz
      that does not fit the model.
    NonFiniteError: a non-finite loss or gradient (after writing that step's row).
  """
  t_start = time.perf_counter() if started is None else started
  cfg.validate()
  device = cfg.torch_device()
  matmul = resolve_matmul(cfg.matmul, device)
  mode = resolve_compile(cfg.compile, device)
  setup_precision(device, mode != "off", cfg.deterministic)
  if cfg.threads:
    torch.set_num_threads(cfg.threads)
  mcfg, choice = cfg.model_config(), cfg.attention_choice()
  seq_len = cfg.seq_len or mcfg.block_size
  try:
    data = import_data_module().Dataset(cfg.data, mcfg.vocab_size)
  except FileNotFoundError as e:  # no such folder, or nothing to read in it: bad input
    raise ValueError(f"data={cfg.data!r}: {e}") from None
  out = pathlib.Path(cfg.out_dir)
  init_sha256 = _sha256(cfg.init)
  resolved = _resolved(device, mode, matmul, choice, data.folder, init_sha256)
  checkpoint = read_checkpoint(out, cfg, resolved)  # refused before the model is built
  model = GPT(mcfg, choice, matmul=matmul)
  load_npz(model, cfg.init)
  model.to(device)
  n_params = count_params(model)
  opt = OptaxAdamW(
    list(model.named_parameters()),
    lr=cfg.lr,
    min_lr=cfg.min_lr,
    warmup_steps=cfg.warmup_steps,
    decay_steps=cfg.decay_length(),
    beta1=cfg.beta1,
    beta2=cfg.beta2,
    eps=cfg.eps,
    weight_decay=cfg.weight_decay,
    grad_clip=cfg.grad_clip,
  )
  out.mkdir(parents=True, exist_ok=True)
  monitor = ExplosionMonitor(cfg.warmup_steps)
  start = restore(checkpoint, opt, monitor) if checkpoint else 0
  for stale in ("summary.json", "final_params.npz"):  # of an earlier run: this one is not done
    (out / stale).unlink(missing_ok=True)
  if start:
    print(f"resuming from {out / CHECKPOINT} after step {start}", flush=True)
  with open(out / "config.json", "w") as f:
    json.dump(
      dict(
        train=dataclasses.asdict(cfg),
        n_params=n_params,
        data=str(data.folder),
        backend=f"torch-{device.type}",
        device=_device_name(device),
        device_count=1,
        framework=f"torch {torch.__version__}",
        matmul=matmul,
        attention_matmul=resolved["attention_matmul"],  # the paper layout's GEMMs
        rounding=ROUNDING,  # how bf16 roundings are made (absent: convert pairs, before 2026-12-05)
        compile=mode,
        jax_attention=choice.jax_spec(),
        init_sha256=init_sha256,
      ),
      f,
      indent=1,
      default=str,
    )

  def loss_of(x, y):
    return loss_fn(model, x, y)

  if mode == "attention":
    model.compile_attention()
  compiled = torch.compile(loss_of) if mode == "on" else loss_of
  dq_of = attention_dq(choice, matmul, compiled=mode != "off")  # diagnostics: dQ as training's
  eager_of = attention_dq(choice, matmul) if mode != "off" else None  # and eager, beside it

  def to_device(a):
    return torch.from_numpy(np.asarray(a, np.int64)).to(device, non_blocking=True)

  def evaluate():
    with torch.no_grad(), backend_context(choice):
      losses = [
        compiled(to_device(x), to_device(y)).item() for x, y in eval_batches(data, cfg, seq_len)
      ]
    return float(np.mean(losses))

  tokens_per_step = cfg.batch_size * cfg.grad_accum * seq_len
  flops_step = flops_per_token(mcfg, n_params, seq_len) * tokens_per_step
  peak = (
    989e12
    if device.type == "cuda" and any(s in _device_name(device) for s in ("H100", "H200"))
    else None
  )  # as train.peak_flops
  params = opt.params
  summary, stopped = {}, None
  diag_path = out / "diagnostics.jsonl"
  if not cfg.diag_interval:
    diag_path.unlink(missing_ok=True)  # no stale rows of an older run
  elif start:
    _keep_rows(diag_path, start)
  else:
    diag_path.write_text("")
  if start:
    rows = _keep_rows(out / "metrics.jsonl", start)
    if not rows or rows[-1]["step"] != start:
      raise ValueError(
        f"{out / 'metrics.jsonl'} holds rows to step {rows[-1]['step'] if rows else 0}, its "
        f"checkpoint is at {start}; remove the run to start again"
      )
    summary = rows[-1]
  with open(out / "metrics.jsonl", "a" if start else "w") as log:
    for step in range(start + 1, cfg.steps + 1):
      xy = train_batches(data, cfg, step, seq_len)
      t0 = time.perf_counter()
      for p in params:
        p.grad = None
      loss = None
      with backend_context(choice):
        for x, y in xy:
          micro = compiled(to_device(x), to_device(y))
          micro.backward()
          loss = micro.detach() if loss is None else loss + micro.detach()
      grads = [p.grad for p in params]
      if cfg.grad_accum > 1:  # JAX: Σ then / grad_accum
        loss = loss / cfg.grad_accum
        grads = torch._foreach_div(grads, float(cfg.grad_accum))
      grad_norm = opt.step(grads)
      param_norm = opt.global_norm(params)
      m = dict(loss=loss.item(), grad_norm=grad_norm.item(), param_norm=param_norm.item())
      dt = time.perf_counter() - t0
      row = dict(
        step=step,
        lr=opt.schedule(step - 1, jitted=False),
        step_time_s=dt,
        tokens_per_s=tokens_per_step / dt,
        **m,
      )
      if peak:
        row["mfu"] = flops_step / dt / peak
      finite = math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
      if finite and (step == cfg.steps or (cfg.eval_interval and step % cfg.eval_interval == 0)):
        row["val_loss"] = evaluate()
      log.write(json.dumps(row) + "\n")
      log.flush()
      if finite and cfg.diag_interval and step % cfg.diag_interval == 0:
        t_diag = time.perf_counter()
        x0, y0 = xy[0]  # the first micro-batch
        rows = diagnostic_rows(cfg.seed, step, x0.shape[0], x0.shape[1], cfg.diag_rows)
        with backend_context(choice):
          drow = dict(step=step, **diagnose(model, to_device(x0), rows))
          failed = None
          if dq_of is not None:
            n = min(len(x0), DQ_SEQUENCES)
            dq_at = diagnostic_rows(cfg.seed, step, n, x0.shape[1], cfg.diag_rows, stream=3)
            dq = (to_device(x0[:n]), to_device(y0[:n]), dq_at, x0.shape[0], dq_of, eager_of)
            try:
              drow |= dq_diagnostics(model, *dq)
            except Exception as e:  # a compile, memory: the run goes on without them
              failed = f"{type(e).__name__}: " + " ".join(str(e).split())[:300]
        if failed:
          print(
            f"dQ diagnostics failed at step {step} ({failed}); the run goes on without them",
            file=sys.stderr,
            flush=True,
          )
          dq_of = None
        drow["diag_time_s"] = time.perf_counter() - t_diag
        with open(diag_path, "a") as f:
          f.write(json.dumps(drow) + "\n")
      if cfg.print_interval and (step % cfg.print_interval == 0 or step in (1, cfg.steps)):
        print(
          f"step {step}: loss {m['loss']:.4f}, grad_norm {m['grad_norm']:.3f}, "
          f"{row['tokens_per_s']:.0f} tokens/s ({1 / dt:.2f} steps/s)"
          + (
            f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
            if device.type == "cuda"
            else ""
          ),
          flush=True,
        )
      if not finite:
        remove_checkpoint(out)  # the run is over
        raise NonFiniteError(
          f"non-finite loss or gradient at step {step} (loss={m['loss']}, "
          f"grad_norm={m['grad_norm']}) in {out}"
        )
      summary = row
      exploded = monitor.update(step, m["loss"])
      if exploded is not None and 0 <= cfg.stop_after_explosion <= step - exploded:
        stopped = "explosion"
        break
      out_of_time = cfg.max_seconds and time.perf_counter() - t_start > cfg.max_seconds
      if step < cfg.steps and (
        out_of_time or (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0)
      ):
        save_checkpoint(out, step, cfg, resolved, opt, monitor)
        if out_of_time:
          stopped = "time"
          break
  if stopped != "time":  # done: nothing to resume
    remove_checkpoint(out)
    if cfg.save_final:
      save_npz(model, out / "final_params.npz")
  return dict(summary, n_params=n_params, stopped=stopped, explosion_step=monitor.step)


# --- command line ----------------------------------------------------------------------------


def _bool(text):
  if text.lower() in ("true", "1", "yes"):
    return True
  if text.lower() in ("false", "0", "no"):
    return False
  raise argparse.ArgumentTypeError(f"{text!r} is not a bool (true/false)")


class _Parser(argparse.ArgumentParser):
  """argparse with its errors in one line (no usage block first), as the repo's other
  command lines; its subcommands' parsers are of this class too."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
  ap = _Parser(
    prog="gpt_twin.py", description=" ".join(__doc__.split("\n\n")[0].split())
  )  # the docstring's first paragraph
  sub = ap.add_subparsers(dest="command", required=True)
  tr = sub.add_parser(
    "train",
    help="train the twin; defaults: the anchor-b128 recipe",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  d = TwinConfig()
  types = {
    "int": int,
    "float": float,
    "str": str,
    "bool": _bool,
    "str | None": lambda s: None if s.lower() == "none" else s,
  }
  helps = dict(
    init="the .npz of initial parameters (layout: this file's docstring)",
    data="data folder with train.bin[.xz]/val.bin[.xz]; none: the JAX package's embedded sample",
    attention=f"one of {', '.join(ATTENTIONS)}",
    out_dir="output folder",
    seed="data order: the JAX run's seed",
    seq_len="default: block_size",
    decay_steps="cosine length incl. warmup (0 or none: steps)",
    device="auto, cpu or cuda[:N]",
    compile="auto (on for CUDA), on (the step), off, attention (each layer's attention alone)",
    matmul="auto (bf16 on CUDA, emulated on CPU), bf16, emulated",
    threads="torch CPU threads (0: torch's default; 1 is fastest for tiny models on a small CPU)",
  )
  for f in dataclasses.fields(TwinConfig):
    flag = "--out" if f.name == "out_dir" else "--" + f.name.replace("_", "-")
    kw = dict(dest=f.name, default=getattr(d, f.name), help=helps.get(f.name))
    if f.name == "init":
      kw.update(required=True, default=None)
    if f.name in ("seq_len", "decay_steps"):
      kw["type"] = lambda s: None if s.lower() in ("none", "0") else int(s)
    else:
      kw["type"] = types[str(f.type)]
    if kw["type"] is _bool:
      kw.update(metavar="{true,false}", nargs="?", const=True)  # --save-final = true
    tr.add_argument(flag, **kw)
  return ap


def main(argv=None):
  ap = build_parser()
  a = ap.parse_args(argv)
  fields = {f.name for f in dataclasses.fields(TwinConfig)}
  cfg = TwinConfig(**{k: v for k, v in vars(a).items() if k in fields})
  try:
    cfg.validate()
  except ValueError as e:
    ap.error(str(e))
  out = pathlib.Path(cfg.out_dir)
  try:
    summary = train(cfg, started=STARTED)
  except NonFiniteError as e:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(dict(stopped="non-finite", error=str(e))))
    print(e, file=sys.stderr)
    return EXIT_NON_FINITE
  except ValueError as e:  # e.g. an .npz that does not fit
    print(f"gpt_twin.py: error: {e}", file=sys.stderr)
    return 2
  if summary.get("stopped") == "time":  # not done: no summary.json, the checkpoint resumes it
    print(
      f"stopped by --max-seconds after step {summary.get('step')}; the same command resumes "
      f"from {out / CHECKPOINT}"
    )
    return 0
  (out / "summary.json").write_text(json.dumps(summary, default=str))
  print(
    f"done: {summary.get('step')} steps, final loss {summary.get('loss')}"
    f"{', stopped after the explosion' if summary.get('stopped') else ''}; {out}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
