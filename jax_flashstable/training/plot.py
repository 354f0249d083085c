"""`flashstable plot RUN_DIR`: loss, gradient norm and the diagnostics of one training run."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np

from jax_flashstable.training.train import read_diagnostics, read_metrics

PANELS = (
  ("sn_q_full", "spectral norm of W_Q (whole)", None),
  ("tie_rate", "rows with tied tile maxima", "mean"),
  ("max_logit", "max attention logit", "max"),
  ("delta_err", "delta(bf16) − delta(fp32), mean", "mean"),
  ("dq_err", "dQ error / rms exact dQ, max", "max"),
  ("dq_common", "dQ error along keys' mean, max", "max"),
)


def plot_run(run_dir) -> pathlib.Path:
  """Writes RUN_DIR/diagnostics.png; returns its path. Raises FileNotFoundError without metrics."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  run = pathlib.Path(run_dir)
  rows = read_metrics(run)
  if not rows:
    raise FileNotFoundError(f"no metrics.jsonl in {run}")
  diags = read_diagnostics(run)
  panels = [p for p in PANELS if diags and all(p[0] in d for d in diags)]  # older runs: fewer
  n = 2 + len(panels)
  fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6))
  steps = [r["step"] for r in rows]
  axes[0].plot(steps, [r["loss"] for r in rows], lw=0.8)
  axes[0].set(title="loss", xlabel="step")
  axes[1].plot(steps, [r["grad_norm"] for r in rows], lw=0.8)
  axes[1].set(title="global grad norm", xlabel="step", yscale="log")
  if panels:
    ds = [d["step"] for d in diags]
    for ax, (key, title, reduce) in zip(axes[2:], panels):
      values = np.asarray([d[key] for d in diags], np.float64)  # [steps, L] or [steps, L, H]
      if reduce is not None:  # over heads, NaN ones left out; a row of NaN heads stays NaN
        with warnings.catch_warnings():  # (a gap in its curve), which NumPy warns of
          warnings.filterwarnings("ignore", "Mean of empty slice|All-NaN slice", RuntimeWarning)
          values = getattr(np, "nan" + reduce)(values, axis=-1)
      for layer in range(values.shape[1]):
        ax.plot(ds, values[:, layer], marker=".", lw=1, label=f"layer {layer}")
      ax.set(title=title, xlabel="step")
    axes[2].legend(fontsize=7)
  fig.tight_layout()
  path = run / "diagnostics.png"
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
