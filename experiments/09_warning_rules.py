"""Early-warning rules tried on the anchor-b128 runs kept in git: for each rule, the runs it
warned before their event (the first of explosion and runaway, the runaway threshold 10× the
largest layer-1 max logit of the packs' reference-fp32 runs and of a value given), the lead in
steps to the event and to the explosion, the runs it missed and its false alarms (a warning on
a finished run with neither event; an unfinished run without one is undecided).
The rules read the diagnostics rows (every 100 steps) after warmup (one row each, or the
history: `grown`); `train.EarlyWarning` and
`train.DQErrorWarning` are the report's own rules; the dQ error's rules are judged on the runs
that logged it.

    PYTHONPATH=. python3 experiments/09_warning_rules.py [reference_max_logit]

Runs that logged `dq_common` (2026-12-04 on) get a third table: the rules on the dQ error along
each row's keys' mean.
"""

import json
import math
import pathlib
import statistics
import sys
import tempfile

from jax_flashstable.experiment import instability
from jax_flashstable.training.train import DQErrorWarning, TrainConfig

REFERENCE_MAX = float(sys.argv[1]) if len(sys.argv) > 1 else None
PACKS = sorted(str(p) for p in pathlib.Path("experiments/results").glob("*b128/runs*.jsonl.xz"))
WARMUP = instability.RECIPES["anchor-b128"]["warmup_steps"]

layer1 = lambda d: max(d["max_logit"][1])  # noqa: E731
any_layer = lambda d: max(max(heads) for heads in d["max_logit"])  # noqa: E731
RULES = {f"layer-1 max logit ≥ {t}": (lambda d, t=t: layer1(d) >= t) for t in (50, 100, 160)}
RULES |= {f"any layer's max logit ≥ {t}": (lambda d, t=t: any_layer(d) >= t) for t in (60, 100)}
RULES |= {f"layer-1 σ(W_Q) ≥ {s}": (lambda d, s=s: d["sn_q_full"][1] >= s) for s in (8, 12)}

with tempfile.TemporaryDirectory() as out:
  instability.unpack_runs(",".join(PACKS), out)
  base = TrainConfig(**{k: v for k, v in instability.RECIPES["anchor-b128"].items()})
  rows = [r for r in instability.collect(out, base, 1, REFERENCE_MAX) if r["steps"]]
  diag = {
    (r["variant"], r["seed"]): [
      json.loads(line)
      for line in (pathlib.Path(out) / r["variant"] / f"seed{r['seed']}" / "diagnostics.jsonl")
      .read_text()
      .splitlines()
    ]
    for r in rows
  }


def event(r):
  steps = [s for s in (r["explosion_step"], r["runaway_step"]) if s is not None]
  return min(steps, default=None)


def assess(warned_at, runs=None):
  """warned_at(row) → the warning step or None, over `runs` (default: all); the table row's
  cells."""
  leads, to_explosion, missed, false = [], [], [], []
  for r in rows if runs is None else runs:
    w, e, name = warned_at(r), event(r), f"{r['variant']} {r['seed']}"
    if e is None:
      false += [name] if w is not None and r["finished"] else []  # unfinished: undecided
    elif w is None or w > e:
      missed.append(name)
    else:
      leads.append(e - w)
      if r["explosion_step"] is not None:
        to_explosion.append(r["explosion_step"] - w)
  n = len(leads) + len(missed)
  lead = f"{min(leads)} / {statistics.median(leads):g}" if leads else "–"
  return [
    f"{len(leads)} / {n}",
    lead,
    str(min(to_explosion, default="–")),
    ", ".join(missed) or "–",
    f"{len(false)}" + (f" ({', '.join(false)})" if false else ""),
  ]


def first(rule):
  return lambda r: next(
    (d["step"] for d in diag[r["variant"], r["seed"]] if d["step"] > WARMUP and rule(d)), None
  )


def grown(series, rows=4, ratio=2.0, floor=40.0):
  """A rule on the history (the rules above read one row): the first step after warmup where
  `series` rose at every one of the last `rows` diagnostics rows, by ≥ `ratio`× in all, to
  ≥ `floor` — a sustained climb, not one row's jump."""

  def warned_at(r):
    values = [(d["step"], series(d)) for d in diag[r["variant"], r["seed"]]]
    for i in range(rows, len(values)):
      step, window = values[i][0], [v for _, v in values[i - rows : i + 1]]
      rising = all(b >= a for a, b in zip(window, window[1:]))
      if step > WARMUP and rising and window[-1] >= max(floor, ratio * window[0]):
        return step
    return None

  return warned_at


GROWTH = {"layer-1 max logit rose every row of the last 4, ≥ 2× in all, to ≥ 40": grown(layer1)}


def table(runs, extra_rows):
  """The rules' table over `runs`: the report's rules first (name → warned_at), then RULES."""
  print(
    "| rule | warned before the event | lead to the event, min / median | min lead to an "
    "explosion | missed | false alarms |"
  )
  print("|---|---:|---:|---:|---|---|")
  for name, warned_at in extra_rows.items():
    print(f"| {name} | " + " | ".join(assess(warned_at, runs)) + " |")


threshold = rows[0]["runaway_threshold"]
print(f"# {len(rows)} runs of {len(PACKS)} packs; runaway: layer-1 max logit > {threshold:g}")
report_rule = {"`train.EarlyWarning` (100× its lowest over 5 rows)": lambda r: r["warning_step"]}
table(rows, report_rule | GROWTH | {name: first(rule) for name, rule in RULES.items()})
logged = [r for r in rows if r["dq_logged"]]
print(
  f"\nOn the {len(logged)} runs that logged dQ's error (2026-12-02 on), the rules above and the "
  "dQ error's own:\n"
)


def layer1_largest(field):
  """A diagnostics row → layer 1's largest head of `field` (NaN heads skipped)."""
  return lambda d: max((x for x in d[field][1] if x == x), default=math.nan)


dq1 = layer1_largest("dq_err")
DQ_RULES = {
  f"layer-1 dQ error ≥ {t} (one row)": (lambda d, t=t: dq1(d) >= t) for t in (0.035, 0.05)
}


def rank1_of_largest(d):
  """The rank-one share (`dq_rank1`) of layer 1's head with the largest dQ error: the
  mechanism's term is rank one along c, but so, at 0.8–0.9, is the error of runs that stay calm
  (tried 2026-12-04: no threshold separates)."""
  pairs = [(e, s) for e, s in zip(d["dq_err"][1], d["dq_rank1"][1]) if e == e and s == s]
  return max(pairs)[1] if pairs else math.nan


def rows_running(value, threshold, rows):
  """`train.DQErrorWarning`'s count (the first step after warmup ending `rows` diagnostics rows
  running with value ≥ threshold; a NaN row leaves the count as it was) on value(row)."""

  def warned_at(r):
    monitor = DQErrorWarning(WARMUP, threshold, rows, layer=0)
    for d in diag[r["variant"], r["seed"]]:
      monitor.update(d["step"], [[value(d)]])  # one layer, one head: the value
    return monitor.step

  return warned_at


RANK1 = {
  f"layer-1 dQ error's rank-one share (largest head) ≥ {t}, {k} rows running": rows_running(
    rank1_of_largest, t, k
  )
  for t, k in ((0.8, 2), (0.9, 3))
}
dq_rule = {
  "`train.DQErrorWarning` (layer 1's dQ error ≥ 0.03, 2 rows running)": (
    lambda r: r["dq_warning_step"]
  )
}
table(
  logged,
  report_rule
  | dq_rule
  | GROWTH
  | {name: first(rule) for name, rule in (RULES | DQ_RULES).items()}
  | RANK1,
)
common = [r for r in rows if r["dqc_logged"]]
if common:  # the dQ error along each row's keys' mean (`dq_common`, logged since 2026-12-04)
  print(
    f"\nOn the {len(common)} runs that logged dQ's error along the keys' mean (2026-12-04 on):\n"
  )
  dqc1 = layer1_largest("dq_common")
  table(
    common,
    report_rule
    | dq_rule
    | {
      '`train.DQErrorWarning(reads="dq_common")` (≥ 0.03, 2 rows running)': (
        lambda r: r["dqc_warning_step"]
      )
    }
    | {
      f"layer-1 dQ error along the keys' mean ≥ {t} (one row)": first(lambda d, t=t: dqc1(d) >= t)
      for t in (0.01, 0.02, 0.05)
    },
  )
