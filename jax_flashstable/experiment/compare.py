"""`flashstable compare`, the main job: attentions trained from the same weights on the same
batches (`instability.run_matrix`: resumable, a finished run is kept), with a report that says
what the run shows and what it does not, and one PNG.

Two settings (`SETTINGS`), picked by the default device:
- GPU: the key pair of the instability study (Qiu & Yao 2025, §4) at its decisive recipe,
  `anchor-b128`: the paper's BF16 layout without and with the compensation, one seed (702 s
  on one H200, 2026-12-04), its runaways judged against the FP32 reference measured at that
  recipe. Pass the study's corpus with `--data` (the embedded sample is 616k tokens, under 5 of
  the recipe's 3,000 steps' worth).
- CPU: fa2, fa2 + compensation and FP32 reference attention on the tiny model (163–195 s on
  2 cores, 2026-12-04): a model this size trained this briefly does not explode; the report
  gives the noise band that the final losses must be read against.
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
import statistics

import jax

from jax_flashstable.attention.config import AttentionConfig
from jax_flashstable.experiment import instability
from jax_flashstable.training.train import DQErrorWarning, EarlyWarning, TrainConfig, read_metrics

# the CPU setting: 3 runs of 250 steps of the tiny model (its time: README, first lines)
CPU_DEFAULTS = dict(
  model="tiny",
  steps=250,
  batch_size=4,
  lr=3e-3,
  min_lr=3e-4,
  warmup_steps=25,
  eval_interval=50,
  eval_batches=4,
  checkpoint_interval=50,
  diag_interval=25,
  diag_rows=16,
)
SETTINGS = {
  "gpu": dict(
    recipe=dict(instability.RECIPES["anchor-b128"]),
    seed=25,
    variants=("paper", "paper+comp"),
    # layer 1's largest max logit of the FP32 reference at this recipe (`reference-fp32` 21,
    # H200, 2026-12-03; experiments/results/h200-2026-12-03d-b128): the runaway's basis here,
    # where the setting runs no reference of its own
    reference_max_logit=46.529408,
  ),
  "cpu": dict(recipe=CPU_DEFAULTS, seed=0, variants=("fa2", "fa2+comp", "reference-fp32")),
}
NOISE_STEPS = 50  # the final loss is the mean of the last NOISE_STEPS steps, ± their std


def setting(gpu: bool | None = None) -> dict:
  """The compare setting of this machine (or of `gpu`)."""
  return SETTINGS["gpu" if (jax.default_backend() == "gpu" if gpu is None else gpu) else "cpu"]


def reference_max_logit(setting: dict, base: TrainConfig) -> float | None:
  """The setting's measured reference max logit (the runaway's basis) when `base` trains its
  recipe (every `instability.RECIPE_FIELDS` field and `diag_rows` as the setting has them) on
  a corpus given (`data`: it was measured on the study's, not on the embedded sample), else
  None: a reference measured at one recipe says nothing of another."""
  recipe = TrainConfig(**setting["recipe"])
  fields = (*instability.RECIPE_FIELDS, "diag_rows")
  if not base.data or any(getattr(base, k) != getattr(recipe, k) for k in fields):
    return None
  return setting.get("reference_max_logit")


def run_compare(
  base: TrainConfig,
  out_dir="runs/compare",
  variants=("fa2", "fa2+comp", "reference-fp32"),
  seed=0,
  log=print,
  command: str | None = None,
  reference_max_logit: float | None = None,
) -> list[dict]:
  """Trains each variant from `base` with `seed` (runs already finished under out_dir are kept,
  an interrupted one resumes from its last checkpoint); writes report.md (headed by `command`,
  the command line that ran it, when given, and the date), curves.png and summary.json under
  out_dir; returns the report rows (`instability.collect`: a run's `runaway_step` from a
  reference-fp32 run among the variants and `reference_max_logit`, a reference's largest
  layer-1 max logit measured elsewhere; with neither, runaways are not judged)."""
  out = pathlib.Path(out_dir)
  rows = instability.run_matrix(
    base,
    list(variants),
    [seed],
    out,
    log=log,
    reference_max_logit=reference_max_logit,
    out_option="--out-dir",
  )
  rows = [
    dict(r, **noise_band(out / r["variant"] / f"seed{seed}"))
    for r in rows
    if r["variant"] in variants and r["seed"] == seed
  ]
  plot(out, rows)
  text = report(base, rows, command, trained_on(out, rows), ran_deterministic(out, rows))
  (out / "report.md").write_text(text)
  (out / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
  return rows


def noise_band(run_dir, steps=NOISE_STEPS) -> dict:
  """Mean and standard deviation of the training loss over a run's last `steps` steps: the
  batch-to-batch noise a final loss is to be read against."""
  losses = [r["loss"] for r in read_metrics(run_dir)][-steps:]
  finite = [x for x in losses if math.isfinite(x)]
  return dict(
    last_mean=statistics.fmean(finite) if finite else math.nan,
    last_std=statistics.stdev(finite) if len(finite) > 1 else math.nan,
    last_steps=len(losses),
  )


def runaway_basis(rows) -> tuple[float | None, str]:
  """The runaway threshold the rows were judged by (their `runaway_threshold`, from
  `instability.collect`: 10× the largest max logit of a reference-fp32 run among them and of
  the setting's measured one) and what sets it, in words; (None, why) when there is none."""
  threshold = rows[0].get("runaway_threshold") if rows else None
  if threshold is None:
    silent = [r for r in rows if instability.is_reference(r["variant"])]
    if silent:  # reference runs here, none with a finite max logit
      runs = ", ".join(f"{r['variant']} (seed {r['seed']}, {r['steps']} steps)" for r in silent)
      return None, (
        f"no finite max logit in the reference run{'s' if len(silent) > 1 else ''} here, "
        f"{runs}: no diagnostics logged (a run logs them every --diag-interval steps) or none "
        "finite; and no reference is measured at this recipe"
      )
    return None, (
      "no reference-fp32 run with diagnostics among these runs, and no reference measured at "
      "this recipe (the GPU setting's applies at its own recipe, with --data)"
    )
  own = threshold == instability.runaway_threshold(rows)  # a reference run among the rows
  source = "its run here" if own else "measured at this recipe by the study's reference-fp32 run"
  return threshold, (
    f"{instability.RUNAWAY_FACTOR:g}× the FP32 reference's "
    f"{threshold / instability.RUNAWAY_FACTOR:.1f}, {source}"
  )


def findings(rows, on_cpu=False, deterministic=False) -> list[str]:
  """What the runs show and do not show, in plain sentences (`on_cpu`: trained on a CPU;
  `deterministic`: every run with XLA's deterministic GPU ops, `ran_deterministic`). A
  run that did not explode but whose `runaway_step` is set held the loss, not the logits: it
  is said so, not counted as stable; with no runaway threshold a run that did not explode is
  not called calm."""
  out = []
  threshold, basis = runaway_basis(rows)
  exploded = [r for r in rows if r["explosion_step"] is not None]
  ran_away = [r for r in rows if r["explosion_step"] is None and r.get("runaway_step")]
  calm = [r for r in rows if r["explosion_step"] is None and not r.get("runaway_step")]
  for r in exploded:
    out.append(
      f"**{r['variant']} exploded at step {r['explosion_step']:,}** (loss {r['min_loss']:.2f} "
      f"→ {r['final_loss']:.2f}; layer-1 max logit {instability.magnitude(r['max_logit'])}, σ(W_Q) "
      f"{instability.cell(r['max_sigma_wq'], '.0f')})."
    )
  for r in ran_away:
    out.append(
      f"**{r['variant']} did not explode by step {r['steps']:,}, but its layer 1 ran away**: "
      f"its max logit passed {instability.magnitude(threshold)} ({basis}) at step {r['runaway_step']:,} and "
      f"reached {instability.magnitude(r['max_logit'])} (σ(W_Q) {instability.cell(r['max_sigma_wq'], '.0f')}): it held the loss, "
      "not the logits."
    )
  if exploded and calm and threshold is not None:
    out.append(
      f"{', '.join(r['variant'] for r in calm)} stayed calm to step "
      f"{max(r['steps'] for r in calm):,} on the same weights and batches: one seed shows "
      "the failure and its fix; how often it happens takes many seeds "
      "(`flashstable experiment instability`, docs/studies)."
    )
  elif exploded and calm:
    out.append(
      f"{', '.join(r['variant'] for r in calm)} did not explode by step "
      f"{max(r['steps'] for r in calm):,} on the same weights and batches; whether its logits "
      "ran away is not judged here."
    )
  if rows and threshold is None:
    out.append(f"Runaways are not judged here: {basis}.")
  if not exploded and not ran_away:
    spread = max(r["last_mean"] for r in rows) - min(r["last_mean"] for r in rows)
    noise = max(r["last_std"] for r in rows)
    verdict = (
      "smaller than" if spread < noise else "comparable to" if spread < 3 * noise else "larger than"
    )
    out.append(
      f"No run exploded, and none was expected at this size and length. The final losses "
      f"(mean of the last {rows[0]['last_steps']} steps) differ by {spread:.3f} nats, "
      f"{verdict} the batch-to-batch noise (std up to {noise:.3f}): this run shows that "
      "the pipeline trains with every attention, not a difference between them. The "
      "explosion and the compensation's effect need the GPU setting (`flashstable "
      "compare --data DIR` on a GPU, with the study's corpus) or the study's recipes."
    )
    if on_cpu:
      out[-1] += (
        " A search of CPU-sized recipes (the tiny model, 400 steps, peak lr 0.01 and 0.03, "
        "tiles 32 and 64) found none on which even the paper's BF16 layout, the one that "
        "explodes on the H200, explodes (experiments/results/cpu-2026-12-01-recipe-search); "
        "there it takes thousands of steps of 131k tokens "
        "(docs/studies/instability-anchor-b128.md)."
      )
  if any(_literal_paper_compensation(r["variant"]) for r in calm + ran_away):
    out.append(
      "In the paper layout the compensation's literal shift (m' = 2·max) with the kernel's clamp "
      "of each tile's sum at ≥ 1e−10 scales a tied row's output toward 0 once its max passes "
      "≈ 23.7. With the shift capped instead (`paper+comp+guard`, at 20 or 6, at 6 also with "
      "`+rsum`: the tie bias removed on every tied row, no row switched off) it exploded in 8 "
      "of 8 runs at anchor-b128, so what keeps its loss from exploding is most likely that "
      "switch-off of rows with large tied logits, not the bias removed; "
      "`+center` (dQ from the keys less their mean) holds without it (docs/numerics.md, "
      "docs/studies/instability-anchor-b128.md)."
    )
  if on_cpu:
    out.append(
      "Reproducible bit for bit on the same machine and software (the kernels have no "
      "atomics and a fixed reduction order); on another CPU or GPU XLA may compile "
      "differently (vector width, fused multiply-adds), so losses can differ from the "
      "third decimal on while the verdict above stays."
    )
  elif deterministic:
    out.append(
      "Run with XLA's deterministic GPU ops (--deterministic, or XLA_FLAGS): with them the "
      "tests' training runs repeat bit for bit on a GPU (our kernels have no atomics; H100, "
      "2026-12-07, docs/training.md); on another GPU or software XLA may compile differently."
    )
  else:
    out.append(
      "Not bit for bit from run to run on a GPU unless run with --deterministic "
      "(--xla_gpu_deterministic_ops=true): our kernels have no atomics, but two runs of one "
      "configuration parted (reruns at anchor-b128 beyond 2⁻⁸ at steps 48–49 on the H200; "
      "likely XLA's scatter-adds with atomics), so the verdict is the outcome over seeds, "
      "not the step (docs/training.md)."
    )
  return out


def _literal_paper_compensation(variant) -> bool:
  """Whether a variant is the paper layout with the compensation's literal shift."""
  try:
    cfg = AttentionConfig.parse(variant)
  except ValueError:
    return False
  return (
    cfg.implementation == "flash"
    and cfg.numerics == "paper"
    and cfg.stabilize
    and not cfg.guard_shift
  )


def trained_on(out, rows) -> tuple[str, str]:
  """(device kind, backend) the runs under out were trained on, from the first run's
  config.json; this machine's when no run records it (a report made elsewhere from packed runs
  names the device that trained them)."""
  for r in rows:
    config = run_config(out, r)
    if config.get("backend"):
      return config.get("device") or config["backend"], config["backend"]
  dev = jax.devices()[0]
  return getattr(dev, "device_kind", dev.platform), jax.default_backend()


def run_config(out, row) -> dict:
  """The config.json of the run of report row `row` under out ({} where there is none)."""
  path = pathlib.Path(out) / row["variant"] / f"seed{row['seed']}" / "config.json"
  return json.loads(path.read_text()) if path.exists() else {}


def ran_deterministic(out, rows) -> bool:
  """Whether every run of `rows` under out ran every step with XLA's deterministic GPU ops (its
  config.json's `deterministic_ops`, `train.deterministic_ops_so_far`); False without runs."""
  return bool(rows) and all(run_config(out, r).get("deterministic_ops", False) for r in rows)


def report(
  base: TrainConfig,
  rows,
  command: str | None = None,
  device: tuple[str, str] | None = None,
  deterministic: bool = False,
) -> str:
  """report.md's text: the setting, the findings, a row per run and the rules. `device`:
  (kind, backend) the runs were trained on (`trained_on`; default this machine's);
  `deterministic`: they ran with XLA's deterministic GPU ops (`ran_deterministic`)."""
  kind, backend = device or trained_on(None, [])
  lines = [
    "# flashstable compare",
    "",
    *([f"Command: `{command}`", ""] if command else []),
    f"Date: {datetime.date.today().isoformat()} (report made with jax {jax.__version__}). "
    f"Trained on: {kind}{'' if kind == backend else f' ({backend})'}. Model `{base.model}`"
    f"{' ' + str(dict(base.model_overrides)) if base.model_overrides else ''}, "
    f"{base.steps} steps, batch {base.batch_size} × {base.grad_accum} (sequences a step × "
    "gradient accumulation), seq_len "
    f"{base.seq_len or base.model_config().block_size}, peak lr {base.lr}, warmup "
    f"{base.warmup_steps}, seed {rows[0]['seed'] if rows else base.seed}, data "
    f"{base.data or 'the embedded sample'}.",
    "",
    "## What this run shows",
    "",
  ]
  lines += (
    [f"- {x}" for x in findings(rows, backend == "cpu", deterministic)]
    if rows
    else ["- no run finished"]
  )
  lines += [
    "",
    f"| attention | steps | final loss (mean ± std, last {rows[0]['last_steps'] if rows else NOISE_STEPS} "
    "steps) | min loss "
    "| final val loss | explosion step | runaway step | warning step | dQ warning step "
    "| layer 1 max logit | layer 1 σ(W_Q) max |",
    "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    lines.append(
      f"| {r['variant']} | {r['steps']} | {r['last_mean']:.3f} ± {r['last_std']:.3f} | "
      f"{r['min_loss']:.3f} | {r['final_val_loss']:.3f} | {r['explosion_step'] or '–'} | "
      f"{'n/a' if r.get('runaway_threshold') is None else r['runaway_step'] or '–'} | "
      f"{r['warning_step'] or '–'} | "
      f"{r.get('dq_warning_step') or ('–' if r.get('dq_logged') else 'n/a')} | "
      f"{instability.magnitude(r['max_logit'])} | {instability.cell(r['max_sigma_wq'], '.1f')} |"
    )
  lines += [
    "",
    "Layers count from 0 (layer 1 is the second; Qiu & Yao 2025 found the failure in the "
    "attention of an early layer, whose W_Q takes the low-rank gradient errors). "
    "Explosion: a non-finite loss, or after warmup a 10-step mean loss above 2× its "
    f"running minimum. Runaway: {runaway_rule(rows)}. Warning: "
    "`train.EarlyWarning` "
    f"({EarlyWarning(base.warmup_steps).describe()}); dQ warning: `train.DQErrorWarning` "
    f"({DQErrorWarning(base.warmup_steps).describe()}).",
    "",
    "![curves](curves.png)",
    "",
  ]
  return "\n".join(lines)


def runaway_rule(rows) -> str:
  """The runaway rule as the report states it (`runaway_basis`; n/a: not judged)."""
  threshold, basis = runaway_basis(rows)
  if threshold is None:
    return f"not judged (n/a: {basis})"
  return f"layer 1's max logit above {threshold:,.1f} ({basis})"


def plot(out, rows):
  """out/curves.png: each run's loss (10-step mean, its own colour and dash), its difference
  to the first run (so runs that overlap stay visible), and the gradient norm."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
  styles = ["-", "--", ":", "-."]
  curves = {}
  for i, r in enumerate(rows):
    m = read_metrics(pathlib.Path(out) / r["variant"] / f"seed{r['seed']}")
    curves[r["variant"]] = (
      [x["step"] for x in m],
      _trailing_mean([x["loss"] for x in m], 10),
      [x["grad_norm"] for x in m],
    )
  first = next(iter(curves.values()), None)
  for i, (name, (steps, loss, grad)) in enumerate(curves.items()):
    kw = dict(color=plt.cm.tab10(i), ls=styles[i % 4], lw=1.4)
    axes[0].plot(steps, loss, label=name, **kw)
    n = min(len(loss), len(first[1]))
    axes[1].plot(steps[:n], [a - b for a, b in zip(loss[:n], first[1][:n])], label=name, **kw)
    axes[2].plot(steps, grad, label=name, **dict(kw, lw=0.7))
  axes[0].set(xlabel="step", ylabel="loss, nats (10-step mean)", title="training loss")
  axes[1].set(
    xlabel="step", ylabel="nats", title=f"loss − {next(iter(curves), '')} loss (10-step means)"
  )
  axes[2].set(xlabel="step", ylabel="global grad norm", yscale="log", title="gradient norm")
  for ax in axes:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(pathlib.Path(out) / "curves.png", dpi=100)
  plt.close(fig)


def _trailing_mean(xs, window):
  return [
    sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
    for i in range(len(xs))
  ]
