"""The bench's tables and plots."""

from __future__ import annotations

import math


def format_bench(rows):
  lines = [
    "| shape | implementation | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | vs cuDNN fwd / fwd+bwd | max err vs fp32 |",
    "|---|---|---:|---:|---:|---:|---|---:|",
  ]
  for r in rows:
    if "skipped" in r:
      lines.append(f"| {r['shape']} | {r['impl']} | skipped: {r['skipped'][:80]} | | | | | |")
    elif not r["ok"]:
      lines.append(f"| {r['shape']} | {r['impl']} | failed check | | | | | {r['max_err']:.2e} |")
    else:
      ratio = f"{r['fwd_vs_cudnn']:.2f} / {r['fwdbwd_vs_cudnn']:.2f}" if "fwd_vs_cudnn" in r else ""
      impl = r["impl"] + (f" ({r['kernels']})" if "kernels" in r else "")
      lines.append(
        f"| {r['shape']} | {impl} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.3g} | "
        f"{r['fwdbwd_ms']:.3f} | {r['fwdbwd_tflops']:.3g} | {ratio} | {r['max_err']:.1e} |"
      )
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
      ax.bar(
        [i + j * width for i in range(len(shapes))],
        [vals.get(s, 0.0) for s in shapes],
        width,
        label=impl,
      )
    ax.set(ylabel="TFLOP/s", title=title)
  axes[1].set_xticks(
    [i + 0.4 - width / 2 for i in range(len(shapes))], shapes, rotation=30, ha="right", fontsize=7
  )
  axes[0].legend(fontsize=7, ncol=3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def format_step_table(rows):
  out = [
    "| attention | model | devices | batch × seq | step ms | tokens/s | MFU | all-gathers |",
    "|---|---|---:|---|---:|---:|---:|---:|",
  ]
  for r in rows:
    mfu = "n/a" if math.isnan(r["mfu"]) else f"{100 * r['mfu']:.1f}%"
    out.append(
      f"| {r['attention']} | {r['model']} | {r['devices']} | {r['batch']}×{r['seq_len']} | "
      f"{r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {r['all_gathers']} |"
    )
  return "\n".join(out)
