"""Issue 19's speed targets ("Speed": the fast kernels by default, a Mosaic GPU backward, a
cheaper compensation), measured in one run and judged in one table (`flashstable bench
--targets`; docs/bench.md, docs/studies/speed.md):

  forward ≥ 0.95× cuDNN, forward+backward ≥ 0.80× cuDNN       (paired ratios, each shape)
  both ahead of JAX's own Mosaic GPU attention ("pallas-mgpu")  (paired ratios to it, > 1)
  compensation overhead ≤ 3% forward, ≤ 1% forward+backward     (paired, each shape)
  gpt2-small training step at least as fast as with cuDNN       (`step_table`: the median of
                                                                 interleaved rounds' ratios)

Our attention is a spec (default "fa2+comp": the default kernels, backend="auto", with the
compensation); every ratio is the median of interleaved pairs (`timing.paired_overhead`), so
both sides run under the same clocks. On a GPU the shapes are the headline b4 × 4096 × 16 ×
d128 bf16, non-causal and causal; on a CPU everything runs at toy size (interpret mode, XLA as
the reference), which tests the machinery, not the speed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.bench.step_table import paired_step_ratio
from jax_flashstable.lab.shapes import Shape, make_inputs

HEADLINE = (Shape(4, 4096, 4096, 16, 16, 128, False), Shape(4, 4096, 4096, 16, 16, 128, True))
THRESHOLDS = dict(fwd_ratio=0.95, fwdbwd_ratio=0.80, fwd_overhead=0.03, fwdbwd_overhead=0.01)


@dataclasses.dataclass(frozen=True)
class StepSetting:
  """The training-step comparison: model preset, global batch, sequence (None: the model's),
  timed steps after warm-up."""

  model: str = "gpt2-small"
  batch_size: int = 16
  seq_len: int | None = None
  steps: int = 30  # interleaved rounds (`step_table.gpt2_step_table`)
  warmup: int = 3

  @classmethod
  def default(cls, gpu: bool) -> "StepSetting":
    return cls() if gpu else cls(model="tiny", batch_size=2, seq_len=64, steps=2, warmup=1)


def check(attention: str) -> str:
  """The spec of `attention` without the compensation; raises ValueError (one line) unless
  `attention` is our flash attention with the compensation."""
  config = AttentionConfig.parse(attention)
  if config.implementation != "flash" or not config.stabilize:
    raise ValueError(
      f"--targets needs our attention with the compensation (e.g. fa2+comp), got {attention!r}"
    )
  return dataclasses.replace(config, stabilize=False).name


def measure(
  shapes,
  attention="fa2+comp",
  reference="cudnn",
  rival="pallas-mgpu",
  *,
  pairs=20,
  step: StepSetting | None = None,
  log=print,
  save=None,
) -> dict:
  """Every measurement the targets need, per shape from one set of compiled functions: ours
  (`attention`), the same without the compensation, the reference and the rival, each warmed
  up, then paired against ours (`timing.paired_overhead`). A part that fails is recorded with
  its error (the rival has no causal backward in jax 0.11.2; cuDNN needs a GPU) and the others
  still run. Returns a dict for `target_rows` and the bench's JSON; save(dict so far) is called
  after each shape (partial results survive a time limit)."""
  from jax_flashstable.bench.runners import kernels
  from jax_flashstable.bench.step_table import gpt2_step_table

  plain = check(attention)
  out = dict(
    attention=attention,
    plain=plain,
    reference=reference,
    rival=rival,
    pairs=pairs,
    device=jax.devices()[0].device_kind,
    shapes=[],
  )
  for shape in shapes:
    q, k, v, do = make_inputs(shape, jnp.bfloat16, 0)
    entry = dict(shape=shape.name, kernels=kernels(attention, shape, q, k, v))
    timed = {
      name: _warmed(name, shape, q, k, v, do) for name in (attention, plain, reference, rival)
    }
    ours = timed[attention]
    # time(other) / time(ours): ours as a fraction of the reference's and the rival's speed
    for key, other in (("ours", reference), ("rival", rival)):
      entry[key] = {
        f"{part}_ratio": _pair(ours, timed[other], part, pairs, speed=True)
        for part in ("fwd", "fwdbwd")
      }
    # time(ours) / time(ours without the compensation) − 1
    entry["overhead"] = {
      f"{part}_overhead": _pair(timed[plain], ours, part, pairs) for part in ("fwd", "fwdbwd")
    }
    for key in ("ours", "rival", "overhead"):
      log(
        f"targets [{shape.name}] {key}: "
        + ", ".join(
          f"{k} {v:.3f}" if isinstance(v, float) else f"{k} failed ({v['error']})"
          for k, v in entry[key].items()
        )
      )
    out["shapes"].append(entry)
    if save is not None:
      save(out)
  step = step or StepSetting.default(jax.default_backend() == "gpu")
  out["step"] = dict(dataclasses.asdict(step))
  try:
    out["step"]["rows"] = gpt2_step_table(
      step.model, (attention, reference), step.batch_size, step.seq_len, step.steps, step.warmup
    )
  except Exception as e:  # the table is written either way; say why
    out["step"]["error"] = _error(e)
  return out


def _error(e: Exception) -> str:
  return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]


def _warmed(name, shape, q, k, v, do) -> dict:
  """{"fwd": run, "fwdbwd": run} of one implementation (`runners.runs`), each compiled and
  called once, or the part's error."""
  from jax_flashstable.bench.runners import runs
  from jax_flashstable.bench.timing import median_seconds

  try:
    fwd, fwdbwd, _ = runs(name, shape, q, k, v, do)
  except Exception as e:  # not available here: both parts fail
    return dict(fwd=dict(error=_error(e)), fwdbwd=dict(error=_error(e)))
  parts = {}
  for part, run in (("fwd", fwd), ("fwdbwd", fwdbwd)):
    try:
      median_seconds(run, warmup=2, reps=1)
      parts[part] = run
    except Exception as e:  # e.g. a backward it does not have
      parts[part] = dict(error=_error(e))
  return parts


def _pair(a: dict, b: dict, part: str, pairs: int, speed=False):
  """time(b)/time(a) − 1 for one part, the median of `pairs` interleaved pairs; with speed,
  time(b)/time(a): a's speed as a fraction of b's. The error of a side that failed instead."""
  from jax_flashstable.bench.timing import paired_overhead

  for side in (a[part], b[part]):
    if isinstance(side, dict):
      return side
  try:
    return float(paired_overhead(a[part], b[part], pairs) + (1.0 if speed else 0.0))
  except Exception as e:
    return dict(error=_error(e))


def target_rows(results: dict) -> list[dict]:
  """One row per target and shape: target, shape, measured (text), met (True, False, or None
  when it could not be measured)."""
  ref, rival, rows = results["reference"], results["rival"], []

  def add(target, shape, measured, met):
    rows.append(dict(target=target, shape=shape, measured=measured, met=met))

  for e in results["shapes"]:
    for part, what in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
      t, key = THRESHOLDS[f"{part}_ratio"], f"{part}_ratio"
      for target, r, met in (
        (f"{what} ≥ {t:.2f}× {ref}", e["ours"][key], lambda x: x >= t),
        (f"{what} ahead of {rival}", e["rival"][key], lambda x: x > 1.0),
      ):
        if isinstance(r, dict):
          add(target, e["shape"], f"failed: {r['error'][:80]}", None)
        else:
          add(target, e["shape"], f"{r:.3f}×", bool(met(r)))
    for part, what in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
      t, r = THRESHOLDS[f"{part}_overhead"], e["overhead"][f"{part}_overhead"]
      target = f"compensation overhead, {what} ≤ {100 * t:.0f}%"
      if isinstance(r, dict):
        add(target, e["shape"], f"failed: {r['error'][:80]}", None)
      else:
        add(target, e["shape"], f"{100 * r:+.1f}%", bool(r <= t))
  step = results.get("step", {})
  target = f"{step.get('model', '?')} training step ≤ {ref}'s"
  by = {r["attention"]: r for r in step.get("rows", [])}
  if results["attention"] in by and ref in by:
    ours, theirs = by[results["attention"]], by[ref]
    ratio = paired_step_ratio(ours, theirs)
    add(
      target,
      f"batch {step['batch_size']}",
      f"{ours['step_ms']:.1f} ms against {theirs['step_ms']:.1f} ms; {ratio:.3f}× its time "
      f"(median of {len(ours['step_ms_rounds'])} interleaved rounds)",
      bool(ratio <= 1.0),
    )
  else:
    add(
      target,
      f"batch {step.get('batch_size', '?')}",
      f"failed: {step.get('error', 'not run')[:80]}",
      None,
    )
  return rows


def format_targets(rows: list[dict], results: dict) -> str:
  head = (
    f"Targets: ours = {results['attention']}, reference = {results['reference']}, "
    f"rival = {results['rival']}; ratios and overheads: medians of {results['pairs']} "
    "interleaved pairs"
  )
  kernels = ", ".join(f"{e['shape']}: {e['kernels']}" for e in results["shapes"])
  if jax.default_backend() != "gpu":
    head += " (not a GPU: interpret mode at toy size, which tests the machinery, not the speed)"
  lines = [
    head,
    f"(device {results.get('device', '?')}; our kernels, forward/backward: {kernels})",
    "",
    "| target | shape | measured | met |",
    "|---|---|---|---|",
  ]
  verdict = {True: "met", False: "**not met**", None: "n/a"}
  for r in rows:
    lines.append(f"| {r['target']} | {r['shape']} | {r['measured']} | {verdict[r['met']]} |")
  return "\n".join(lines)
