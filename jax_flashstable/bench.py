"""Kernel timing: FLOP counts (FlashAttention convention) and a side-by-side speed table."""
from __future__ import annotations

import math
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_flashstable.attention import flash_attention


def attention_flops(batch, q_len, kv_len, num_heads, head_dim, causal, backward=False):
  """4·B·H·Lq·Lk·D for the forward (two matmuls); causal counts half; backward is 2.5× the
  forward, so forward+backward is 3.5× (FlashAttention-2's convention)."""
  f = 4.0 * batch * num_heads * q_len * kv_len * head_dim * (0.5 if causal else 1.0)
  return f * 3.5 if backward else f


def median_seconds(run, warmup=3, reps=20, calls=1):
  """Median wall time of one call, from `reps` timings of run() (which must wait for the device)
  after `warmup` calls; with calls > 1 each timing is run(calls) — that many calls dispatched
  back to back with one wait (`waiting`) — divided by calls."""
  go = run if calls == 1 else (lambda: run(calls))
  for _ in range(warmup):
    go()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    go()
    times.append((time.perf_counter() - t) / calls)
  return statistics.median(times)


def calls_per_timing(run, target_s=0.05, most=10):
  """How many back-to-back calls make one timing of ~target_s (1 to `most`): at ~1–5 ms per
  call the host's dispatch and synchronisation (0.2–0.4 ms per waited call at the headline
  shape on the H200, 2026-11-30: wall time against Nsight Compute's kernel time) would
  otherwise count as kernel time."""
  return max(1, min(most, int(target_s / median_seconds(run, warmup=1, reps=3))))


def seconds_per_call(run, warmup=3, reps=20):
  """`median_seconds` of run (a `waiting` callable) in batches of `calls_per_timing` calls."""
  return median_seconds(run, warmup, reps, calls_per_timing(run))


def paired_overhead(run_a, run_b, pairs=20, inner=10):
  """Median over `pairs` interleaved pairs of time(b)/time(a) − 1 (which of a and b runs first
  alternates from pair to pair, so drifts in clock or temperature cancel). Each time is one
  `run(inner)`: `inner` calls dispatched back to back with one wait at the end, so the host's
  dispatch and synchronisation (0.2–0.4 ms per waited call, see `calls_per_timing`) overlap
  the kernels instead of adding to a ~1 ms kernel's time."""
  ratios = []
  for i in range(pairs):
    t = {}
    for which, run in ((("a", run_a), ("b", run_b)) if i % 2 == 0 else (("b", run_b), ("a", run_a))):
      t0 = time.perf_counter()
      run(inner)
      t[which] = time.perf_counter() - t0
    ratios.append(t["b"] / t["a"])
  return statistics.median(ratios) - 1.0


# Implementations a bench row can name: "flash:<layout>" with an optional "+stabilize" (our
# Triton forward) or "flash-mgpu:<layout>[+stabilize]" (our Mosaic GPU forward, Hopper), each
# with an optional "@<block_k>" (e.g. flash-mgpu:fa2+stabilize@128; default 64),
# "cudnn" / "xla" (jax.nn.dot_product_attention), "pallas-mgpu" (JAX's own Mosaic GPU
# attention), "torch-<backend>" (torch SDPA, GPU only).
TORCH_BACKENDS = ("flash", "cudnn", "efficient", "math")
IMPL_FORMS = ("flash:<layout>[+stabilize][@block_k] (layouts: fa2, paper, fp32_out, stochastic)",
              "flash-mgpu:<layout>[+stabilize][@block_k] (layouts: fa2, fp32_out)", "cudnn",
              "xla", "pallas-mgpu") + tuple(f"torch-{b}" for b in TORCH_BACKENDS)
FLASH_PREFIXES = {"flash:": "triton", "flash-mgpu:": "mosaic_gpu"}


def _flash_spec(name: str) -> dict:
  """"flash:<layout>[+stabilize][@block_k]" (or flash-mgpu:…; "@block_k" may also come before
  "+stabilize") → flash_attention keyword arguments (a fixed rng_key for the stochastic layout).
  block_k must be a positive integer without leading zeros; flash_attention checks it further.
  Raises ValueError for any other name."""
  from pallas_kernels.policy import MOSAIC_GPU_NUMERICS, NUMERICS, check_tile
  tile = r"@(?P<bk{}>[1-9][0-9]*)"
  m = re.fullmatch(r"(?P<prefix>flash:|flash-mgpu:)(?P<layout>\w+)(?:(?P<stab>\+stabilize)(?:"
                   + tile.format(1) + ")?|" + tile.format(2) + r"(?P<stab2>\+stabilize)?)?", name)
  layouts = MOSAIC_GPU_NUMERICS if m and m["prefix"] == "flash-mgpu:" else NUMERICS
  if m is None or m["layout"] not in layouts:
    raise ValueError(f"unknown implementation {name!r}: expected flash:<layout>[+stabilize][@block_k] "
                     "or flash-mgpu:<layout>[+stabilize][@block_k]")
  layout, block_k = m["layout"], m["bk1"] or m["bk2"]
  kw = dict(numerics=layout, stabilize=bool(m["stab"] or m["stab2"]),
            backend=FLASH_PREFIXES[m["prefix"]])
  if block_k is not None:
    kw["block_k"] = int(block_k)
    try:
      check_tile("block_k", kw["block_k"])
    except ValueError as e:
      raise ValueError(f"implementation {name!r}: {e}") from None
  if layout == "stochastic":
    kw["rng_key"] = jax.random.key(0)
  return kw


def impl_error(name: str) -> str | None:
  """Why `bench` does not know the implementation name (None when it does; it may still be
  unavailable on this machine)."""
  if name.startswith(tuple(FLASH_PREFIXES)):
    try:
      _flash_spec(name)
    except ValueError as e:
      return str(e)
    return None
  return None if name in IMPL_FORMS[2:] else f"unknown implementation {name!r}"


def known_impl(name: str) -> bool:
  """Whether `bench` knows the implementation name (it may still be unavailable here)."""
  return impl_error(name) is None


def _jax_runs(name, shape, q, k, v, do):
  """(fwd, fwd+bwd) callables that wait for the device (`waiting`), and the output."""
  if name.startswith(tuple(FLASH_PREFIXES)):
    kw = dict(causal=shape.causal, **_flash_spec(name))
    f = lambda q, k, v: flash_attention(q, k, v, **kw)
  elif name in ("cudnn", "xla"):
    f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=shape.causal,
                                                      implementation=name)
  elif name == "pallas-mgpu":
    f, prepare = _mosaic_gpu_attention(shape)
    q, k, v, do = prepare(q, k, v, do)
  else:
    raise ValueError(f"unknown implementation {name!r}")
  fwd = jax.jit(f)
  def fwd_bwd(q, k, v, do):
    out, vjp = jax.vjp(f, q, k, v)
    return vjp(do.astype(out.dtype))          # fp32_out returns float32

  fb = jax.jit(fwd_bwd)
  out = fwd(q, k, v)
  return waiting(fwd, q, k, v), waiting(fb, q, k, v, do), np.asarray(out, np.float32)


def waiting(f, *args):
  """run(calls=1): `calls` calls of f(*args) dispatched back to back, then a wait for the last
  (the device runs them in order); the form `median_seconds` and `paired_overhead` time."""
  def run(calls=1):
    for _ in range(calls):
      out = f(*args)
    return jax.block_until_ready(out)
  return run


def _mosaic_gpu_attention(shape):
  """JAX's own Pallas Mosaic GPU attention for Hopper (`jax.experimental.pallas.ops.gpu.
  attention_mgpu`: wgmma, TMA, warp-specialised; forward and backward; head_dim a multiple of
  64): what Mosaic GPU reaches on this GPU, for issue 7. In jax 0.11.2 its forward's shared-memory
  buffers are float16 whatever the input dtype, so it runs on float16 inputs (same bytes and
  tensor-core rate as bfloat16), and it applies no softmax scale, so the query is scaled first.
  Returns (f, prepare): prepare converts the inputs once, outside the timed function."""
  if jax.default_backend() != "gpu":
    raise RuntimeError("Mosaic GPU needs a CUDA GPU (Hopper)")
  from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu
  cfg = mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=shape.causal,
                          block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
  scale = shape.head_dim ** -0.5
  prepare = lambda q, k, v, do: ((q.astype(jnp.float32) * scale).astype(jnp.float16),
                                 *(x.astype(jnp.float16) for x in (k, v, do)))
  return (lambda q, k, v: mgpu.attention(q, k, v, cfg)), prepare


def _torch_runs(name, shape, q, k, v, do):
  """The same for torch SDPA restricted to one backend ([b, s, h, d] in, bhsd inside)."""
  import torch
  from torch.nn.attention import SDPBackend, sdpa_kernel
  backend = dict(zip(TORCH_BACKENDS, (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                     SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)))[name[len("torch-"):]]
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  conv = lambda x: torch.tensor(np.asarray(x, np.float32)).to(torch.bfloat16).to(dev).transpose(1, 2).contiguous()
  tq, tk, tv, tdo = (conv(x) for x in (q, k, v, do))
  tq.requires_grad_(), tk.requires_grad_(), tv.requires_grad_()
  gqa = shape.num_heads != shape.num_kv_heads
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

  sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=shape.causal,
                                                                   enable_gqa=gqa)

  def fwd(calls=1):                     # `waiting`'s form: calls back to back, one wait
    with sdpa_kernel([backend]), torch.no_grad():
      for _ in range(calls):
        out = sdpa()
    sync()
    return out

  def fb(calls=1):
    with sdpa_kernel([backend]):
      for _ in range(calls):
        torch.autograd.grad(sdpa(), (tq, tk, tv), tdo)
    sync()

  return fwd, fb, fwd().transpose(1, 2).float().cpu().numpy()


def _reference_slice(shape, q, k, v):
  """FP32 reference output for batch 0 and the query heads of the first key/value head (cheap
  at any length): the check each implementation passes before it is timed."""
  from jax_flashstable.attention import reference_attention
  g = shape.num_heads // shape.num_kv_heads
  ref = reference_attention(q[:1, :, :g], k[:1, :, :1], v[:1, :, :1], causal=shape.causal,
                            dtype=jnp.float32)
  return np.asarray(ref, np.float32), g


def bench(shapes, impls, *, dtype=jnp.bfloat16, warmup=3, reps=20, seed=0, log=print):
  """Forward and forward+backward time and TFLOP/s of every implementation on every shape.

  Every implementation is first checked against an FP32 reference on a slice of the inputs
  (`max_err` ≤ 2⁻⁵ for bf16 inputs of unit variance, else the row says `ok: False` and is not
  timed). TFLOP/s follow FlashAttention's convention (`attention_flops`). Implementations a
  device lacks (cuDNN off GPU, torch not importable) become rows with a `skipped` reason.
  Returns a list of dict rows.
  """
  from jax_flashstable.accuracy import make_inputs
  rows = []
  for shape in shapes:
    q, k, v, do = make_inputs(shape, dtype, seed)
    ref, g = _reference_slice(shape, q, k, v)
    flops = attention_flops(shape.batch, shape.q_len, shape.kv_len, shape.num_heads,
                            shape.head_dim, shape.causal)
    for name in impls:
      row = dict(impl=name, shape=shape.name, batch=shape.batch, seq_len=shape.q_len,
                 num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                 head_dim=shape.head_dim, causal=shape.causal)
      try:
        make = _torch_runs if name.startswith("torch-") else _jax_runs
        fwd, fb, out = make(name, shape, q, k, v, do)
        err = float(np.max(np.abs(out[:1, :, :g] - ref)))
        row.update(max_err=err, ok=bool(np.isfinite(err) and err <= 2 ** -5))
        if row["ok"]:
          t_f, t_fb = seconds_per_call(fwd, warmup, reps), seconds_per_call(fb, warmup, reps)
          row.update(fwd_ms=1e3 * t_f, fwdbwd_ms=1e3 * t_fb, fwd_tflops=flops / t_f / 1e12,
                     fwdbwd_tflops=3.5 * flops / t_fb / 1e12)
      except Exception as e:                    # not available here (or failed): say why, go on
        why = (str(e).splitlines() or ["(no message)"])[0][:200]      # e.g. a bare assert
        row = dict(row, skipped=f"{type(e).__name__}: {why}")
        rows.append(row)
        log(f"{shape.name:>32} {name:>26}: skipped ({row['skipped']})")
        continue
      rows.append(row)
      log(f"{shape.name:>32} {name:>26}: " + (f"fwd {row['fwd_tflops']:.3g}, fwd+bwd "
          f"{row['fwdbwd_tflops']:.3g} TFLOP/s, max err {err:.1e}" if row["ok"] else f"FAILED check, max err {err:.2e}"))
  _add_ratios(rows)
  return rows


def _add_ratios(rows, base="cudnn"):
  """fwd/fwd+bwd TFLOP/s as a fraction of `base` on the same shape, where both were timed."""
  by_shape = {r["shape"]: r for r in rows if r["impl"] == base and "fwd_tflops" in r}
  for r in rows:
    b = by_shape.get(r["shape"])
    if b is not None and "fwd_tflops" in r:
      r[f"fwd_vs_{base}"] = r["fwd_tflops"] / b["fwd_tflops"]
      r[f"fwdbwd_vs_{base}"] = r["fwdbwd_tflops"] / b["fwdbwd_tflops"]


def overhead_impl(layout: str) -> str:
  """The implementation name of an --overhead-layouts entry: "<layout>" is flash:<layout>,
  "mgpu:<layout>" the Mosaic GPU forward flash-mgpu:<layout> (either with "@block_k")."""
  return f"flash-{layout}" if layout.startswith("mgpu:") else f"flash:{layout}"


def _paired(shape, impl_a, impl_b, dtype, pairs, seed):
  """`paired_overhead` of impl_b against impl_a on identical inputs, forward and
  forward+backward, after one warm-up call of each."""
  from jax_flashstable.accuracy import make_inputs
  q, k, v, do = make_inputs(shape, dtype, seed)
  a, b = _jax_runs(impl_a, shape, q, k, v, do), _jax_runs(impl_b, shape, q, k, v, do)
  for run in a[:2] + b[:2]:
    median_seconds(run, warmup=3, reps=1)
  return paired_overhead(a[0], b[0], pairs), paired_overhead(a[1], b[1], pairs)


def compensation_overhead(shape, layout="fa2", *, dtype=jnp.bfloat16, pairs=20, seed=0):
  """Relative cost of `stabilize=True` in forward and forward+backward: `paired_overhead` of
  flash:<layout> against flash:<layout>+stabilize on one shape (`overhead_impl`)."""
  impl = overhead_impl(layout)
  fwd, fwdbwd = _paired(shape, impl, f"{impl}+stabilize", dtype, pairs, seed)
  return dict(shape=shape.name, layout=layout, pairs=pairs, fwd_overhead=fwd,
              fwdbwd_overhead=fwdbwd)


def paired_speed_ratio(shape, impl, reference="cudnn", *, dtype=jnp.bfloat16, pairs=20, seed=0):
  """Speed of `impl` as a fraction of `reference` (1.2: 1.2× as fast), forward and
  forward+backward, each the median over `pairs` interleaved pairs (`paired_overhead`), so
  that both run under the same clocks and load: the ratio of one run, not of two medians
  taken at different moments (on 2026-11-29 cuDNN's forward varied 401–509 TFLOP/s between
  runs). Raises ValueError for an unknown name."""
  for name in (impl, reference):
    if (why := impl_error(name)) is not None:
      raise ValueError(why)
  fwd, fwdbwd = _paired(shape, impl, reference, dtype, pairs, seed)   # time(ref)/time(impl) − 1
  return dict(shape=shape.name, impl=impl, reference=reference, pairs=pairs,
              fwd_ratio=1.0 + fwd, fwdbwd_ratio=1.0 + fwdbwd)


def default_shapes(gpu: bool):
  """The sweep `flashstable bench` runs: on a GPU lengths 1k–16k at 16k tokens per batch,
  head_dim 64 and 128, causal and not, plus one GQA shape (16 query heads on 4 key/value heads);
  on CPU (interpret mode) two small shapes."""
  from jax_flashstable.accuracy import Shape
  if not gpu:
    return [Shape(1, 128, 128, 2, 2, 64, False), Shape(1, 128, 128, 4, 2, 64, True)]
  shapes = [Shape(16384 // n, n, n, 16, 16, d, c) for n in (1024, 4096, 16384) for d in (64, 128)
            for c in (False, True)]
  return shapes + [Shape(4, 4096, 4096, 16, 4, 128, True)]


def default_impls(gpu: bool, layouts=("fa2",)):
  impls = [f"flash:{l}{s}" for l in layouts for s in ("", "+stabilize")] + ["xla"]
  if gpu:
    impls += ["cudnn", "torch-flash", "torch-cudnn"]
  return impls


def format_bench(rows):
  lines = ["| shape | implementation | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | vs cuDNN fwd / fwd+bwd | max err vs fp32 |",
           "|---|---|---:|---:|---:|---:|---|---:|"]
  for r in rows:
    if "skipped" in r:
      lines.append(f"| {r['shape']} | {r['impl']} | skipped: {r['skipped'][:80]} | | | | | |")
    elif not r["ok"]:
      lines.append(f"| {r['shape']} | {r['impl']} | failed check | | | | | {r['max_err']:.2e} |")
    else:
      ratio = (f"{r['fwd_vs_cudnn']:.2f} / {r['fwdbwd_vs_cudnn']:.2f}" if "fwd_vs_cudnn" in r else "")
      lines.append(f"| {r['shape']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.3g} | "
                   f"{r['fwdbwd_ms']:.3f} | {r['fwdbwd_tflops']:.3g} | {ratio} | {r['max_err']:.1e} |")
  return "\n".join(lines)


def plot_bench(rows, path):
  """Grouped bars of fwd and fwd+bwd TFLOP/s per shape and implementation (PNG)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  timed = [r for r in rows if "fwd_tflops" in r]
  shapes = list(dict.fromkeys(r["shape"] for r in timed))
  impls = list(dict.fromkeys(r["impl"] for r in timed))
  fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(shapes)), 7), sharex=True)
  width = 0.8 / max(1, len(impls))
  for ax, key, title in zip(axes, ("fwd_tflops", "fwdbwd_tflops"), ("forward", "forward+backward")):
    for j, impl in enumerate(impls):
      vals = {r["shape"]: r[key] for r in timed if r["impl"] == impl}
      ax.bar([i + j * width for i in range(len(shapes))], [vals.get(s, 0.0) for s in shapes],
             width, label=impl)
    ax.set(ylabel="TFLOP/s", title=title)
  axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes, rotation=30,
                     ha="right", fontsize=7)
  axes[0].legend(fontsize=7, ncol=3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def golden_hashes(layouts=("fa2", "paper", "fp32_out", "stochastic"), block_q=64, block_k=64,
                  head_dims=(64, 128)):
  """SHA-256 (first 16 hex digits) of the bits of out, lse, dQ, dK and dV of every layout ×
  stabilize × head_dim on fixed inputs (seed 0, batch 1, length 200, 2 heads, causal; every
  odd key a copy of the even one before it, so rows have tied maxima and the compensation
  acts) with the given tiles: tuning (warps, stages, loop structure) must leave them unchanged.
  Keys: "<layout>[+stabilize]" for head_dim 64, with "@d<head_dim>" appended for the others."""
  import hashlib

  from jax_flashstable.accuracy import Shape, make_inputs
  out = {}
  for head_dim in head_dims:
    q, k, v, do = make_inputs(Shape(1, 200, 200, 2, 2, head_dim, True), jnp.bfloat16, 0)
    k = k.at[:, 1::2].set(k[:, 0::2])
    for layout in layouts:
      for stab in (False, True):
        name = f"flash:{layout}{'+stabilize' if stab else ''}"
        kw = dict(causal=True, block_q=block_q, block_k=block_k, **_flash_spec(name))
        _, stats = flash_attention(q, k, v, return_stats=True, **kw)
        o, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, **kw), q, k, v)
        grads = vjp(do.astype(o.dtype))
        h = hashlib.sha256()
        for x in (o, stats.lse, *grads):
          h.update(np.asarray(x).tobytes())
        out[name.removeprefix("flash:") + ("" if head_dim == 64 else f"@d{head_dim}")] = h.hexdigest()[:16]
  return out


def gpt2_step_table(model="gpt2-small", attentions=("flash", "flash-stable", "cudnn"),
                    batch_size=16, seq_len=None, steps=10, warmup=3, mesh=None):
  """Training-step time, tokens/s and MFU of GPT-2 per attention choice, in one process.

  `batch_size` is the global batch; with a `mesh` (`parallel.data_mesh`) it is split over the
  mesh's devices (`train.make_steps`). MFU = (6·N + 12·n_layer·n_head·head_dim·T)·tokens/s /
  (devices · peak) (`train.peak_flops`; 989 TFLOP/s on H100/H200; NaN on other devices). Each
  row also counts the all-gathers and all-reduces in the compiled step's HLO.
  """
  from jax_flashstable.data import Dataset
  from jax_flashstable.gpt2 import count_params, flops_per_token
  from jax_flashstable.parallel import collective_counts, replicate, shard_batch
  from jax_flashstable.train import TrainConfig, init_state, make_steps, peak_flops
  devices = 1 if mesh is None else mesh.size
  place = (lambda a: a[None]) if mesh is None else (lambda a: shard_batch(mesh, a[None], 1))
  rows = []
  for attention in attentions:
    cfg = TrainConfig(model=model, attention=attention, batch_size=batch_size, seq_len=seq_len,
                      steps=warmup + steps, progress=False)
    mcfg = cfg.model_config()
    t = cfg.seq_len or mcfg.block_size
    data = Dataset(None, mcfg.vocab_size)
    _, graphdef, params, tx, opt_state = init_state(cfg)
    n = count_params(params)
    state, key = (params, opt_state), jax.random.key(0)       # key: numerics="stochastic"
    if mesh is not None:
      state = replicate(mesh, state)
    batches = [data.batch("train", 0, step, batch_size, t) for step in range(warmup + steps)]
    train_step, _ = make_steps(graphdef, tx, mesh)
    x0, y0 = (place(a) for a in batches[0])
    compiled = train_step.lower(state, x0, y0, key).compile()
    collectives = collective_counts(compiled.as_text())
    times = []
    for step, (x, y) in enumerate(batches):
      x, y = place(x), place(y)
      t0 = time.perf_counter()
      state, m = compiled(state, x, y, jax.random.fold_in(key, step))
      loss = float(m["loss"])
      if step >= warmup:
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    tok_s = batch_size * t / dt
    rows.append(dict(attention=attention, model=model, batch=batch_size, seq_len=t, n_params=n,
                     devices=devices, step_ms=1e3 * dt, tokens_per_s=tok_s, last_loss=loss,
                     **collectives,
                     mfu=flops_per_token(mcfg, n, t) * tok_s / (devices * (peak_flops() or float("nan")))))
  return rows


def format_step_table(rows):
  out = ["| attention | model | devices | batch × seq | step ms | tokens/s | MFU | all-gathers |",
         "|---|---|---:|---|---:|---:|---:|---:|"]
  for r in rows:
    mfu = "n/a" if math.isnan(r["mfu"]) else f"{100 * r['mfu']:.1f}%"
    out.append(f"| {r['attention']} | {r['model']} | {r['devices']} | {r['batch']}×{r['seq_len']} | "
               f"{r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {r['all_gathers']} |")
  return "\n".join(out)
