"""`flashstable compare`: the same model, seed and data order trained with BF16 flash attention
without and with the compensation, and with an FP32 reference attention; a markdown report and
one PNG of the curves."""
from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib

import jax

from jax_flashstable.train import NonFiniteError, TrainConfig, read_metrics, train_and_evaluate

CONFIGS = (("flash (bf16)", "flash"), ("flash + compensation (bf16)", "flash-stable"),
           ("reference attention (fp32)", "reference-fp32"))


def run_compare(base: TrainConfig, out_dir="runs/compare", configs=CONFIGS) -> dict:
  """Trains each (label, attention) of `configs` from `base`; writes report.md, curves.png,
  summary.json under `out_dir`; returns the summary."""
  out = pathlib.Path(out_dir)
  results = {}
  for label, attention in configs:
    run_dir = out / attention
    cfg = dataclasses.replace(base, attention=attention, out_dir=str(run_dir))
    try:
      summary = train_and_evaluate(cfg)
      error = None
    except NonFiniteError as e:
      summary, error = {}, str(e)
    rows = read_metrics(run_dir)
    results[label] = dict(attention=attention, summary=summary, error=error, rows=rows)
  _plot(results, out / "curves.png")
  report = _report(base, results)
  (out / "report.md").write_text(report)
  (out / "summary.json").write_text(json.dumps(
      {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in results.items()}, indent=1))
  return results


def _plot(results, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for label, r in results.items():
    steps = [x["step"] for x in r["rows"]]
    loss = [x["loss"] for x in r["rows"]]
    raw, = axes[0].plot(steps, loss, lw=0.5, alpha=0.3)
    axes[0].plot(steps, _trailing_mean(loss, 10), label=label, lw=1.5, color=raw.get_color())
    val = [(x["step"], x["val_loss"]) for x in r["rows"] if "val_loss" in x]
    if val:
      axes[0].plot(*zip(*val), "o", ms=4, color=raw.get_color())
    axes[1].plot(steps, [x["grad_norm"] for x in r["rows"]], label=label, lw=1)
  axes[0].set(xlabel="step", ylabel="loss, nats (line: 10-step mean; dots: validation)", title="loss")
  axes[1].set(xlabel="step", ylabel="global grad norm", yscale="log", title="gradient norm")
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _trailing_mean(xs, window):
  return [sum(xs[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def _report(base, results):
  dev = jax.devices()[0]
  lines = [f"# flashstable compare — {datetime.date.today()}",
           "",
           f"Device: {getattr(dev, 'device_kind', dev.platform)} ({jax.default_backend()}), jax {jax.__version__}. "
           f"Model `{base.model}`{' ' + str(dict(base.model_overrides)) if base.model_overrides else ''}, "
           f"{base.steps} steps, batch {base.batch_size}×{base.grad_accum}, seq_len "
           f"{base.seq_len or base.model_config().block_size}, peak lr {base.lr}, "
           f"weight decay {base.weight_decay}, "
           f"warmup {base.warmup_steps}, seed {base.seed}, data {base.data or 'embedded sample'}.",
           "",
           "| attention | final train loss | final val loss | max grad norm | exploding / non-finite step |",
           "|---|---:|---:|---:|---|"]
  for label, r in results.items():
    rows, s = r["rows"], r["summary"]
    last = rows[-1] if rows else {}
    val = next((x["val_loss"] for x in reversed(rows) if "val_loss" in x), float("nan"))
    gmax = max((x["grad_norm"] for x in rows), default=float("nan"))
    event = r["error"] or (f"step {s['explosion_step']}" if s.get("explosion_step") else "none")
    lines.append(f"| {label} | {last.get('loss', float('nan')):.4f} | {val:.4f} | {gmax:.3f} | {event} |")
  lines += ["", "Explosion: a non-finite loss, or after warmup a 10-step mean loss above 2× its "
            "running minimum.",
            "", "![curves](curves.png)", ""]
  return "\n".join(lines)
