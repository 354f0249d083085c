"""`flashstable bench` end to end: check every name first, time every shape (partial results
kept as they come), then the compensation overheads and paired speed ratios on the first shape
(or, with targets, the issue's targets on every shape: `bench.targets`), the golden hashes, and
the JSON, table and plot."""

from __future__ import annotations

import importlib.util
import json
import os

import jax

from jax_flashstable.bench.kernels import (
  bench,
  compensation_overhead,
  default_impls,
  default_shapes,
  golden_hashes,
  paired_speed_ratio,
)
from jax_flashstable.bench.report import format_bench, plot_bench
from jax_flashstable.bench.runners import NAME_FORMS, attention_config, name_error
from jax_flashstable.lab.shapes import Shape
from jax_flashstable.results import write_results


def check(names, paired, paired_reference, overhead, names_option="--attention") -> None:
  """Raises ValueError, in one line naming the option, the offending name and why, with the
  valid forms, before anything is timed."""
  for what, items in (
    (names_option, names),
    ("--paired", paired),
    ("--paired-reference", [paired_reference]),
  ):
    if bad := [n for n in items if name_error(n)]:
      raise ValueError(
        f"{what} {bad[0]!r}: {name_error(bad[0]).split(': ', 1)[-1]}. Use {'; '.join(NAME_FORMS)}"
      )
  for spec in overhead:
    config = None if name_error(spec) else attention_config(spec)
    if config is None or config.implementation != "flash" or config.stabilize:
      raise ValueError(
        f"--overhead {spec!r}: needs an attention spec of our flash kernels without the "
        f"compensation (e.g. fa2, paper, fa2+mgpu:block_k=128); its +comp twin is timed "
        f"against it"
      )


def needs_gpu(name: str) -> bool:
  """Whether the bench's `name` runs only on a CUDA GPU: JAX's Mosaic GPU attention and cuDNN
  (`jax.nn.dot_product_attention`'s, also centred: cudnn+center)."""
  if name == "pallas-mgpu":
    return True
  config = None if name_error(name) else attention_config(name)
  return config is not None and config.implementation == "cudnn"


def _cannot_run(name: str, gpu: bool) -> str | None:
  """Why the bench's `name` cannot run in this process (one line), or None: a GPU-only name
  off a GPU (`needs_gpu`), torch SDPA (torch-*) where torch cannot be imported."""
  if not gpu and needs_gpu(name):
    return _off_gpu("--attention", name, "fa2 or xla")
  if name.startswith("torch-") and importlib.util.find_spec("torch") is None:
    return (
      f"--attention {name!r} runs torch SDPA: torch cannot be imported in this Python (the GPU "
      "image has it)"
    )
  return None


def _off_gpu(option: str, name: str, instead: str) -> str:
  return (
    f"{option} {name!r} needs a CUDA GPU; the default backend is {jax.default_backend()!r} "
    f"(e.g. {option} {instead})"
  )


def run(
  out,
  *,
  shapes=None,
  names=None,
  warmup=3,
  reps=20,
  pairs=20,
  overhead=("fa2",),
  paired=(),
  paired_reference="cudnn",
  hashes=True,
  meta=None,
  log=print,
  targets=None,
  step=None,
) -> int:
  """Runs the bench into `out` (bench.json, bench.md, bench.png); returns the exit status: 1
  when one of our kernels failed its check against the FP32 reference, else 0.

  targets: an attention spec with the compensation (e.g. "fa2+comp") to judge against the
  issue's targets (`bench.targets`): the shapes default to the headline pair on a GPU
  (`targets.HEADLINE`), the first default shape on a CPU; the timed names to it, the rival
  ("pallas-mgpu") and `paired_reference`; the overheads and ratios are measured per shape
  there (the generic --overhead/--paired measurements are then skipped), with the training
  step (`step`: `targets.StepSetting`); a "targets" table closes bench.md (until then the
  measurements so far are in targets_partial.json)."""
  gpu = jax.default_backend() == "gpu"
  named = bool(names)  # the user's own list (the defaults hold names a CPU skips)
  if targets is not None:
    from jax_flashstable.bench import targets as target_lib

    check([targets], [], paired_reference, [], names_option="--targets")
    target_lib.check(targets)
    names = list(names) if names else [targets, "pallas-mgpu", paired_reference]
    shapes = list(shapes or (target_lib.HEADLINE if gpu else default_shapes(gpu)[:1]))
    overhead, paired = (), ()
  names = list(names) if names else default_impls(gpu)
  check(names, list(paired), paired_reference, list(overhead) if pairs else [])
  if named and all(_cannot_run(n, gpu) for n in names):  # every row would be skipped, late
    raise ValueError(_cannot_run(names[0], gpu))
  judged = targets is not None or (paired and pairs)  # against the paired reference
  if not gpu and judged and needs_gpu(paired_reference):
    raise ValueError(_off_gpu("--paired-reference", paired_reference, "xla"))
  if paired and not pairs:
    raise ValueError(f"--paired {','.join(paired)!r} needs --overhead-pairs ≥ 1 (its pairs)")
  given, shapes = bool(shapes), list(shapes) if shapes else default_shapes(gpu)
  meta = dict(meta or {})
  rows = []
  os.makedirs(out, exist_ok=True)
  partial = os.path.join(out, "bench_partial.json")
  for shape in shapes:  # partial results survive a time limit
    rows += bench([shape], names, warmup=warmup, reps=reps, log=log)
    with open(partial, "w") as f:
      json.dump(rows, f)
  # the pairs' shape: the first given one, or the headline shape on a GPU
  head = shapes[0] if given or not gpu else Shape(4, 4096, 4096, 16, 16, 128, False)
  if pairs:
    meta["compensation_overhead"] = [
      _safe(
        lambda: compensation_overhead(head, spec, pairs=pairs),
        dict(attention=spec, shape=head.name),
      )
      for spec in overhead
    ]
    if paired:
      meta["paired_ratios"] = [
        _safe(
          lambda: paired_speed_ratio(head, name, paired_reference, pairs=pairs),
          dict(impl=name, reference=paired_reference, shape=head.name),
        )
        for name in paired
      ]
  table = format_bench(rows)
  if targets is not None:
    partial_targets = os.path.join(out, "targets_partial.json")

    def save(results):
      with open(partial_targets, "w") as f:
        json.dump(results, f)

    results = target_lib.measure(
      shapes, targets, paired_reference, pairs=max(pairs, 1), step=step, log=log, save=save
    )
    if os.path.exists(partial_targets):
      os.remove(partial_targets)
    meta["targets"] = dict(results, rows=target_lib.target_rows(results))
    table += "\n\n" + target_lib.format_targets(meta["targets"]["rows"], results)
  meta["golden_hashes"] = golden_hashes() if hashes else None
  write_results(out, "bench", rows, table, meta)
  pair_measured = any(
    "error" not in o for o in meta.get("compensation_overhead", []) + meta.get("paired_ratios", [])
  )
  if all("skipped" in r for r in rows) and targets is None and not pair_measured:
    os.remove(partial)
    if os.path.exists(png := os.path.join(out, "bench.png")):
      os.remove(png)  # an earlier run's, beside this table
    raise ValueError(
      f"nothing was measured: every implementation was skipped on this device (first: "
      f"{rows[0]['impl']}: {rows[0]['skipped'][:120]}); the table is in {out}/bench.md"
    )
  plot_bench(rows, os.path.join(out, "bench.png"))
  os.remove(partial)
  for o in meta.get("compensation_overhead", []):
    where = f"{o['attention']}, {o['shape']}"
    log(
      f"compensation overhead [{where}]: failed ({o['error']})"
      if "error" in o
      else f"compensation overhead [{where}, median of {o['pairs']} interleaved pairs]: "
      f"fwd {100 * o['fwd_overhead']:+.1f}%, fwd+bwd {100 * o['fwdbwd_overhead']:+.1f}%"
    )
  for o in meta.get("paired_ratios", []):
    where = f"{o['impl']} vs {o['reference']}, {o['shape']}"
    log(
      f"paired speed ratio [{where}]: failed ({o['error']})"
      if "error" in o
      else f"paired speed ratio [{where}, median of {o['pairs']} interleaved pairs]: "
      f"fwd {o['fwd_ratio']:.2f}×, fwd+bwd {o['fwdbwd_ratio']:.2f}×"
    )
  log(f"plot: {out}/bench.png")
  ours = lambda name: (c := attention_config(name)) is not None and c.implementation == "flash"
  ours_failed = [r for r in rows if ours(r["impl"]) and not r.get("ok", False)]
  return 1 if ours_failed or not all(r.get("ok", True) for r in rows) else 0


def _safe(measure, where: dict) -> dict:
  """A pair measurement, or its failure in one line: the table is written either way."""
  try:
    return measure()
  except Exception as e:  # the table still gets written; say why
    return dict(where, error=f"{type(e).__name__}: {e}"[:300])
