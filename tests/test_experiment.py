"""`flashstable experiment instability` on CPU: a small matrix, resumption, the report, and the
early stop after an explosion."""

import dataclasses
import json
import lzma
import math
import pathlib
import shutil

import numpy as np

import pytest

from jax_flashstable import cli
from jax_flashstable.experiment import instability as experiment
from jax_flashstable.training import train
from jax_flashstable.training.train import TrainConfig

RESULTS = pathlib.Path(__file__).parent.parent / "experiments" / "results"

# The CPU recipe at a context of 32 (block_size, also in the CLI test): what these tests check,
# the matrix, resumption, reports and stops, does not depend on the sequence length, and the
# runs are shorter than at the recipe's 128 (this file: 77 → 66 s alone on 2 cores).
TINY = dataclasses.replace(
  TrainConfig(**experiment.RECIPES["tiny"]),
  model_overrides=(("block_size", 32),),
  steps=12,
  diag_interval=6,
  progress=False,
)


def test_variant_configs_are_what_they_say():
  c = experiment.variant_config(TINY, "paper@layer", 3, "/x", tiles=64, layer=1)
  assert c.seed == 3 and c.attention == "xla"
  # the flash variants run the Triton kernels (EXPERIMENT_BACKEND), as every run of the study
  assert c.attention_overrides == ((1, "paper+triton:block_q=64,block_k=64"),)
  m = c.model_config()
  assert m.attention_for(1).numerics == "paper" and m.attention_for(0).implementation == "xla"
  assert experiment.variant_config(TINY, "paper+comp", 0, "/x").model_config().attention.stabilize
  with pytest.raises(ValueError, match="'nope'"):
    experiment.variant_config(TINY, "nope", 0, "/x")
  with pytest.raises(ValueError, match="layer=5"):
    experiment.variant_config(TINY, "paper", 0, "/x", layer=5)
  # any spec of the grammar is a variant; the paper layout's tile is the experiment's unless set
  c = experiment.variant_config(TINY, "fa2+delta32+comp", 0, "/x").model_config().attention
  assert c.delta_float32 and c.stabilize and not c.center_keys and c.block_k is None
  assert (
    experiment.variant_config(TINY, "paper:block_k=32", 0, "/x", tiles=64).attention
    == "paper+triton:block_k=32"
  )
  assert experiment.variant_config(TINY, "fa2+mgpu", 0, "/x").attention == "fa2+mgpu"
  # Mosaic GPU options run with +mgpu; with 'auto' (Triton here) the variant names the fix
  assert (
    experiment.variant_config(TINY, "fa2+mgpu:items_early=true", 0, "/x").attention
    == "fa2+mgpu:items_early=true"
  )
  with pytest.raises(ValueError, match="runs backend 'auto' as 'triton'.*add '\\+mgpu'"):
    experiment.variant_config(TINY, "fa2:items_early=true", 0, "/x")


def test_a_matrix_refuses_what_its_runs_would_drop_or_not_run(tmp_path):
  """A setting of the base that each variant's run would silently replace (its per-layer
  attentions: every variant sets every layer's; max_seconds: the time budget replaces it) is
  refused, naming it, before anything is written (`flashstable compare --layer-attention 1=…`
  trained every variant without it until 2026-12-06); so is a variant that cannot run in the
  model (stochastic rounding at compute_dtype float32), naming the variant, the model's dtype
  and the kernel's check, also as the watched layer's attention alone (SPEC@layer)."""
  from jax_flashstable.experiment import compare

  layered = dataclasses.replace(TINY, attention_overrides=((1, "stochastic"),))
  for base, message in (
    (layered, r"^attention_overrides='1=stochastic': each variant sets the attention of every"),
    (dataclasses.replace(TINY, max_seconds=5.0), r"^max_seconds=5.0: the runs stop by the matrix"),
  ):
    with pytest.raises(ValueError, match=message):
      experiment.variant_config(base, "fa2", 0, tmp_path / "fa2" / "seed0")
    with pytest.raises(ValueError, match=message):
      compare.run_compare(base, tmp_path / "cmp", ("fa2", "reference-fp32"), 0, log=print)
  float32 = dataclasses.replace(TINY, model_overrides=(("compute_dtype", "float32"),))
  for variant in ("stochastic", "stochastic@layer"):
    with pytest.raises(
      ValueError,
      match=rf"^variant '{variant}' cannot run in model 'tiny' \(compute_dtype='float32', "
      r"head_dim=32\): numerics='stochastic' rounds to bfloat16 and needs bfloat16 inputs",
    ):
      experiment.run_matrix(float32, ["fa2", variant], [0], tmp_path / "m", log=print)
  assert experiment.variant_config(float32, "fa2+comp", 0, "/x").attention == "fa2+comp+triton"
  assert not list(tmp_path.iterdir())


def test_a_run_stored_with_an_older_spelling_is_the_same_run(tmp_path):
  cfg = experiment.variant_config(TINY, "paper+comp", 0, tmp_path, tiles=32)
  old = dataclasses.replace(
    cfg, attention="flash:numerics=paper,block_q=32,block_k=32,stabilize=true,backend=triton"
  )
  (tmp_path / "config.json").write_text(
    json.dumps(dict(train=json.loads(json.dumps(dataclasses.asdict(old), default=str))))
  )
  assert train.config_changes(tmp_path, cfg) == {}
  assert "attention" in train.config_changes(tmp_path, dataclasses.replace(cfg, attention="paper"))


def test_small_matrix_runs_resumes_and_reports(tmp_path):
  logs = []
  rows = experiment.run_matrix(
    TINY, ["paper", "stochastic"], [0], tmp_path, tiles=64, log=logs.append
  )
  assert [(r["variant"], r["seed"], r["steps"], r["finished"]) for r in rows] == [
    ("paper", 0, 12, True),
    ("stochastic", 0, 12, True),
  ]
  for r in rows:
    assert 0.0 <= r["mean_tie_rate"] <= 1.0 and r["max_sigma_wq"] > 0 and r["min_loss"] < 11.0
    assert math.isfinite(r["max_logit"])
    assert r["outcome"] == "stable to step 12" and r["steps_per_s"] > 0
  # same seed, same data: the first losses agree closely, but the layouts differ in the bits
  loss = lambda v: [json.loads(l)["loss"] for l in open(tmp_path / v / "seed0" / "metrics.jsonl")]
  assert loss("paper")[0] == pytest.approx(loss("stochastic")[0], abs=1e-3) and loss(
    "paper"
  ) != loss("stochastic")
  logs.clear()
  experiment.run_matrix(TINY, ["paper", "stochastic"], [0], tmp_path, tiles=64, log=logs.append)
  assert all("done before" in line for line in logs)
  rows = experiment.run_matrix(TINY, ["fa2"], [0], tmp_path, time_budget=1e-3, log=logs.append)
  assert "time budget is spent" in logs[-1] and {r["variant"] for r in rows} == {
    "paper",
    "stochastic",
  }
  path = experiment.write_report(tmp_path, rows, TINY)
  text = path.read_text()
  assert "| paper | 0 | 12 |" in text and "| stochastic | 0 / 1 |" in text
  assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_run_out_of_device_memory_is_one_line_and_the_matrix_goes_on(tmp_path, monkeypatch):
  """A run whose step exhausts the device memory (XLA's RESOURCE_EXHAUSTED, e.g. two processes
  on one GPU) is logged in one line naming the failed allocation and left unfinished; the next
  run trains. Any other runtime error is a bug and propagates."""
  import jax

  trained = []

  def fake_train(cfg, dataset):
    if "stochastic" in cfg.attention:
      raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 49.62GiB with allocator "
        "GPU_0_bfc on device 0. [executable_name='jit_train_step']"
      )
    trained.append(cfg.attention)
    return dict(stopped=None, step=cfg.steps)

  monkeypatch.setattr(experiment, "train_and_evaluate", fake_train)
  monkeypatch.setattr(experiment, "load_dataset", lambda cfg: None)
  given = []
  monkeypatch.setattr(experiment, "collect", lambda out, base, layer, ref: given.append(ref) or [])
  logs = []
  experiment.run_matrix(
    TINY, ["stochastic", "fa2"], [0], tmp_path, reference_max_logit=np.float32(24), log=logs.append
  )
  assert given == [24.0]  # checked, converted and passed on
  assert logs[1] == (
    "stochastic seed 0: out of device memory (an allocation of 49.62GiB failed; other "
    "processes on the device count too); left unfinished, it runs next time"
  )
  assert trained == ["fa2+triton"] and (tmp_path / "fa2" / "seed0" / "summary.json").exists()
  assert not (tmp_path / "stochastic" / "seed0" / "summary.json").exists()

  def broken(cfg, dataset):
    raise jax.errors.JaxRuntimeError("INTERNAL: a kernel failed")

  monkeypatch.setattr(experiment, "train_and_evaluate", broken)
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    experiment.run_matrix(TINY, ["stochastic"], [0], tmp_path, log=logs.append)


def test_explosion_stops_the_run_and_is_reported(tmp_path):
  """A learning rate far too large for the tiny model makes it explode; the run stops a fixed
  number of steps later and the report says so."""
  cfg = dataclasses.replace(
    TINY, lr=30.0, min_lr=30.0, steps=60, warmup_steps=2, diag_interval=0, stop_after_explosion=2
  )
  rows = experiment.run_matrix(cfg, ["fa2"], [0], tmp_path)
  (r,) = rows
  assert r["outcome"] == "exploded" and r["explosion_step"] is not None
  # stops two steps after the explosion, or earlier at a non-finite loss
  assert r["explosion_step"] < r["steps"] <= r["explosion_step"] + 2 < 60
  assert r["stopped"] in ("explosion", "non-finite") and r["finished"]


def test_cli_experiment_tiny(tmp_path):
  rc = cli.main(
    [
      "experiment",
      "instability",
      "--recipe",
      "tiny",
      "--variants",
      "fa2+comp",
      "--steps",
      "4",
      "--diag-interval",
      "2",
      "--model-set",
      "block_size=32",
      "--no-progress",
      "--out",
      str(tmp_path),
    ]
  )
  assert rc == 0
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["recipe"]["steps"] == 4 and report["rows"][0]["variant"] == "fa2+comp"
  # a report of runs already made: with the recipe and options they were made with
  only = ["experiment", "instability", "--recipe", "tiny", "--report-only", "--out", str(tmp_path)]
  only += ["--diag-interval", "2", "--model-set", "block_size=32"]
  assert cli.main(only) == 0
  assert "runaway: layer 1 not defined" in (tmp_path / "report.md").read_text()
  assert cli.main(only + ["--reference-max-logit", "60"]) == 0  # reaches the report's rule
  text = (tmp_path / "report.md").read_text()
  assert "runaway: layer 1 max logit > 600 (10 × 60 given)" in text
  # every table's header, separator and rows have as many cells (4 steps: no survival marks)
  lines = text.splitlines() + [""]
  heads = [i for i, x in enumerate(lines) if x.startswith("|") and lines[i + 1].startswith("|---")]
  assert len(heads) >= 3
  for i in heads:
    table = lines[i : next(j for j in range(i, len(lines)) if not lines[j].startswith("|"))]
    assert len({x.count("|") for x in table}) == 1, table[:2]
  empty = ["experiment", "instability", "--recipe", "tiny", "--report-only"]
  with pytest.raises(SystemExit, match=r"^flashstable experiment: --out .*empty. holds no runs"):
    cli.main([*empty, "--out", str(tmp_path / "empty")])
  with pytest.raises(SystemExit, match="variant .bogus.: unknown attention .bogus."):
    cli.main(
      [
        "experiment",
        "instability",
        "--recipe",
        "tiny",
        "--variants",
        "paper,bogus",
        "--out",
        str(tmp_path),
      ]
    )


def test_collect_skips_odd_folders_and_a_cut_last_line(tmp_path):
  """A process killed mid-write leaves a partial last line: it is dropped, not fatal; folders
  that are not seed<k> are ignored; seeds sort numerically."""
  rows = [dict(step=s, loss=3.0, grad_norm=0.5, step_time_s=0.1) for s in range(1, 13)]
  for seed in (10, 2):
    run = tmp_path / "fa2" / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 13, "lo'
    )
  (tmp_path / "fa2" / "seed2-old").mkdir()
  (tmp_path / "fa2" / "seed3").mkdir()  # a run that died in its first step: empty metrics
  (tmp_path / "fa2" / "seed3" / "metrics.jsonl").write_text("")
  got = experiment.collect(tmp_path, TINY)
  assert [(r["seed"], r["steps"], r["outcome"]) for r in got] == [
    (2, 12, "unfinished (stable so far)"),
    (3, 0, "not started (no step logged)"),
    (10, 12, "unfinished (stable so far)"),
  ]
  bad = tmp_path / "fa2" / "seed2" / "metrics.jsonl"
  bad.write_text('{"step": 1, "lo\n' + json.dumps(rows[1]) + "\n")
  with pytest.raises(ValueError, match=rf"^{bad}: line 1 is not JSON \(Unterminated string"):
    experiment.collect(tmp_path, TINY)  # not the last line: an error naming file and line


def test_search_recipes_change_only_their_knob():
  """The recipe search varies one knob of the anchor at a time (issue 6)."""
  anchor = TrainConfig(**experiment.RECIPES["anchor"])
  for name, field, value in (("anchor-lr0.004", "lr", 4e-3), ("anchor-lr0.006", "lr", 6e-3)):
    cfg = TrainConfig(**experiment.RECIPES[name])
    assert getattr(cfg, field) == value
    assert dataclasses.replace(cfg, **{field: getattr(anchor, field)}) == anchor
  for n in (4, 12):
    cfg = TrainConfig(**experiment.RECIPES[f"anchor-{n}l"])
    model, base = cfg.model_config(), anchor.model_config()
    assert model.n_layer == n and dataclasses.replace(model, n_layer=base.n_layer) == base
    assert dataclasses.replace(cfg, model_overrides=()) == anchor


def test_a_run_of_other_settings_is_refused_not_reused(tmp_path):
  """A finished run is skipped only when its settings match (a longer cap may extend it); with
  another learning rate it is refused before anything trains, naming the field."""
  cfg = experiment.variant_config(TINY, "paper", 0, tmp_path / "paper" / "seed0", tiles=32)
  pathlib.Path(cfg.out_dir).mkdir(parents=True)
  (pathlib.Path(cfg.out_dir) / "config.json").write_text(
    json.dumps(dict(train=json.loads(json.dumps(dataclasses.asdict(cfg), default=str))))
  )
  (pathlib.Path(cfg.out_dir) / "summary.json").write_text("{}")
  assert train.config_changes(cfg.out_dir, cfg) == {}
  assert train.config_changes(cfg.out_dir, dataclasses.replace(cfg, max_seconds=5.0)) == {}
  changed = dataclasses.replace(TINY, lr=0.03)
  assert train.config_changes(
    cfg.out_dir, experiment.variant_config(changed, "paper", 0, cfg.out_dir, tiles=32)
  ) == {"lr": (TINY.lr, 0.03)}
  with pytest.raises(ValueError, match=r"lr: 0.003 → 0.03"):
    experiment.run_matrix(changed, ["paper"], [0], tmp_path, tiles=32, log=lambda *a: None)
  with pytest.raises(ValueError, match=r"attention: .*block_k=32.* → .*block_k=64"):
    experiment.run_matrix(TINY, ["paper"], [0], tmp_path, tiles=64, log=lambda *a: None)
  with pytest.raises(ValueError, match=r"tiles=100"):
    experiment.run_matrix(TINY, ["xla", "paper"], [0], tmp_path, tiles=100, log=lambda *a: None)
  # steps may change when the cosine length is fixed (a capped run extended), not otherwise
  fixed = dataclasses.replace(cfg, decay_steps=100)
  (pathlib.Path(cfg.out_dir) / "config.json").write_text(
    json.dumps(dict(train=json.loads(json.dumps(dataclasses.asdict(fixed), default=str))))
  )
  assert train.config_changes(cfg.out_dir, dataclasses.replace(fixed, steps=fixed.steps + 10)) == {}
  assert "steps" in train.config_changes(
    cfg.out_dir, dataclasses.replace(cfg, steps=cfg.steps + 10)
  )


def _fake_run(root, variant, seed, losses, logits, finished=True, layer=1):
  """A run folder as train_and_evaluate leaves it: per-step losses, diagnostics every 10 steps
  with the watched layer's per-head max logit `logits[i]` at step 10·(i+1)."""
  run = root / variant / f"seed{seed}"
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text(
    "".join(
      json.dumps(dict(step=s, loss=l, grad_norm=0.5, step_time_s=0.1234567)) + "\n"
      for s, l in enumerate(losses, 1)
    )
  )
  (run / "diagnostics.jsonl").write_text(
    "".join(
      json.dumps(
        dict(
          step=10 * (i + 1),
          sn_q_full=[1.0, 2.0 + i],
          max_logit=[[1.0], [x, x / 2]],
          tie_rate=[[0.5], [0.25, 0.75]],
          diag_time_s=0.01,
        )
      )
      + "\n"
      for i, x in enumerate(logits)
    )
  )
  (run / "config.json").write_text(json.dumps(dict(train={"seed": seed}, device="test")))
  if finished:
    (run / "summary.json").write_text(json.dumps(dict(variant=variant, seed=seed)))


def test_a_run_that_ends_within_warmup_is_undecided(tmp_path):
  """The explosion rule starts after warmup: a finished run without an event that ended within
  it is undecided ("too short"), not "stable", and counts in neither side of the Fisher test
  (one `outcome` with the twin's report); one step past warmup it is calm."""
  cfg = dataclasses.replace(TINY, warmup_steps=5)
  _fake_run(tmp_path, "paper", 0, [3.0] * 5, [10.0])  # finished at step 5: within warmup
  _fake_run(tmp_path, "paper", 1, [3.0] * 6, [10.0])  # at step 6: past it, calm
  _fake_run(tmp_path, "paper", 2, [3.0] * 9 + [100.0] * 3, [10.0])  # exploded at 10
  _fake_run(tmp_path, "paper+comp", 0, [3.0] * 4, [10.0])  # within warmup
  rows = {(r["variant"], r["seed"]): r for r in experiment.collect(tmp_path, cfg)}
  assert [experiment.outcome(rows["paper", s]) for s in range(3)] == [
    "too short",
    "calm",
    "exploded",
  ]
  assert rows["paper", 0]["outcome"] == "ended at step 5, within warmup (undecided)"
  assert rows["paper", 1]["outcome"] == "stable to step 6"
  text = experiment.format_report(list(rows.values()), dict(warmup_steps=5), 1)
  assert "| paper | 1 / 2 (1 within warmup) |" in text
  assert "| paper+comp | 0 / 0 (1 within warmup) |" in text
  assert experiment.fisher_p(list(rows.values()), "paper") is None  # no decided paper+comp


def test_runaway_survival_fisher_and_pack(tmp_path):
  """The report's rules on runs whose answers are known by construction: explosions at given
  steps, logits crossing 10× the fp32 reference's largest, Kaplan–Meier survival, the Fisher
  p-value of 5 exploded of 5 against 0 of 4 (1/126), and a pack that rebuilds the same rows."""
  cfg = dataclasses.replace(TINY, warmup_steps=5)
  calm, n = [3.0] * 60, 60
  boom = lambda at: [3.0] * (at - 1) + [100.0] * (n - at + 1)  # explodes at step `at`
  for seed, at in zip(range(5), (20, 30, 30, 45, 50)):
    _fake_run(tmp_path, "paper", seed, boom(at)[: at + 5], [10.0, 500.0, 2000.0], finished=True)
  for seed in range(4):
    _fake_run(tmp_path, "paper+comp", seed, calm, [10.0, 20.0 + seed, 30.0])
  _fake_run(tmp_path, "paper+comp", 4, calm[:25], [10.0, 900.0], finished=False)  # unfinished
  _fake_run(tmp_path, "reference-fp32", 0, calm, [12.0, 40.0, 35.0])
  rows = experiment.collect(tmp_path, cfg)
  by = {(r["variant"], r["seed"]): r for r in rows}
  assert experiment.runaway_threshold(rows) == 400.0  # 10 × 40
  assert [by["paper", s]["explosion_step"] for s in range(5)] == [20, 30, 30, 45, 50]
  assert all(by["paper", s]["runaway_step"] == 20 for s in range(5))  # 500 > 400 at step 20
  assert by["paper+comp", 4]["runaway_step"] == 20 and not by["paper+comp", 4]["finished"]
  assert (
    by["paper+comp", 0]["runaway_step"] is None and by["reference-fp32", 0]["runaway_step"] is None
  )
  steps, frac = experiment.survival([r for r in rows if r["variant"] == "paper"])
  assert steps == [0, 20, 30, 45, 50] and frac == pytest.approx([1.0, 0.8, 0.4, 0.2, 0.0])
  # censoring: of two runs one is cut (unfinished) at 25 and leaves the risk set; the other,
  # then the only one at risk, explodes at 40
  cut = [dict(explosion_step=None, steps=25), dict(explosion_step=40, steps=45)]
  assert experiment.survival(cut) == ([0, 25, 40], pytest.approx([1.0, 1.0, 0.0]))
  assert experiment.fisher_p(rows, "paper") == pytest.approx(1 / 126)  # C(9,5) = 126
  # runaway: paper 5/5, paper+comp 0/4 decided (the unfinished run ran away: 1/5 decided)
  assert experiment.fisher_p(rows, "paper", "runaway") == pytest.approx(6 / 252)  # C(6,5)/C(10,5)
  # every variant against the same with one fix more, however spelled; other modifiers, a
  # different layer setting or tile size, what does not parse, and another spelling of an
  # earlier variant (paper+triton: the experiment's paper; its runs repeat paper's seeds) make
  # no pair
  assert experiment.option_pairs(
    ["paper", "paper+triton", "paper+comp", "paper+center+comp", "fa2+lse", "fa2"]
    + ["paper+comp@layer"]
    + ["paper@layer", "fa2+comp:block_q=256", "xla", "bogus", "paper+guard+comp"]
    + ["paper+comp+guard:max_shift=6", "paper+comp+guard+rsum:max_shift=6", "fa2+comp+rsum"]
    + ["cudnn+center", "cudnn", "paper+comp:shift_above=23.7", "paper+center+comp:shift_above=23.7"]
  ) == [
    ("paper", "paper+comp", "comp"),
    ("paper", "paper+comp:shift_above=23.7", "comp:shift_above=23.7"),  # a test variant
    ("paper", "paper+guard+comp", "comp+guard"),
    ("paper", "paper+comp+guard:max_shift=6", "comp+guard"),
    ("paper", "paper+comp+guard+rsum:max_shift=6", "comp+guard+rsum"),
    ("paper+comp", "paper+center+comp", "center"),
    ("fa2", "fa2+comp+rsum", "comp+rsum"),
    ("paper@layer", "paper+comp@layer", "comp"),
    ("paper+comp+guard:max_shift=6", "paper+comp+guard+rsum:max_shift=6", "rsum"),
    ("cudnn", "cudnn+center", "center"),  # the one fix an implementation not ours takes
    ("paper+comp:shift_above=23.7", "paper+center+comp:shift_above=23.7", "center"),
  ]
  assert experiment.fisher_p(rows, "paper", other="paper+center") is None  # no such runs
  text = experiment.format_report(rows, dict(warmup_steps=cfg.warmup_steps), 1)
  assert "| paper | 5 / 5 | 5 / 5 | 0.00 |" not in text  # only 60 steps: no 500 mark
  assert (
    "| paper+comp | 0 / 4 (1 unfinished) | 1 / 5 |" in text
    and "| paper vs paper+comp | comp | 0.0079 | 0.024 |" in text
  )
  # no run logged dQ's error: its warning columns say n/a, its table says why (and none
  # for the rule along the keys' mean); rows made before the report gave the dQ rule (an
  # old report.json) say so
  assert (
    "| 20 | 20 | – | n/a | n/a | 3.000 |" in text and "no run here logged the dQ error." in text
  )
  assert 'reads="dq_common"' not in text
  old = [{k: v for k, v in r.items() if not k.startswith(("dq_", "dqc_"))} for r in rows]
  text = experiment.format_report(old, dict(warmup_steps=cfg.warmup_steps), 1)
  assert "not in these rows (made before the report gave it); report the runs again." in text
  # pack → unpack gives the same rows (timings kept to 4 digits)
  pack = experiment.pack_runs(tmp_path, tmp_path / "runs.jsonl.xz")
  assert set(experiment.unpack_runs(pack, tmp_path / "again")) == {f"{v}/seed{s}" for v, s in by}
  again = experiment.collect(tmp_path / "again", cfg)
  strip = lambda rs: [
    {k: v for k, v in r.items() if k not in ("steps_per_s", "diag_cost")} for r in rs
  ]
  assert strip(again) == strip(rows)
  assert again[0]["steps_per_s"] == pytest.approx(rows[0]["steps_per_s"], rel=1e-3)
  # a reference's largest measured elsewhere (--reference-max-logit): the threshold is 10× the
  # largest of it and of the matrix's reference runs; without reference runs it stands alone
  given = experiment.collect(tmp_path, cfg, reference_max_logit=60.0)  # 10 × 60 = 600 > 500
  assert given[0]["runaway_threshold"] == 600.0
  assert all(r["runaway_step"] == 30 for r in given if r["variant"] == "paper")  # 2,000 at 30
  text = experiment.format_report(given, dict(warmup_steps=cfg.warmup_steps), 1)
  assert "max logit > 600 (10 × 60 given (sets it); the reference-fp32 runs' largest, 40)" in text
  low = experiment.collect(tmp_path, cfg, reference_max_logit=np.int64(1))  # the runs' 40 sets it
  assert low[0]["runaway_threshold"] == 400.0 and "40 (sets it); 1 given" in low[0]["runaway_basis"]
  shutil.rmtree(tmp_path / "reference-fp32")
  alone = experiment.collect(tmp_path, cfg, reference_max_logit=60.0)
  assert alone[0]["runaway_basis"] == "60 given"
  assert experiment.fisher_p(alone, "paper", "runaway") is not None  # a threshold, no runs
  assert experiment.collect(tmp_path, cfg)[0]["runaway_threshold"] is None
  for bad, error in ((0.0, ValueError), (-1.0, ValueError), (math.nan, ValueError)) + (
    (math.inf, ValueError),
    ("60", TypeError),
    (True, TypeError),
  ):
    with pytest.raises(error, match="reference_max_logit="):
      experiment.collect(tmp_path, cfg, reference_max_logit=bad)
  assert experiment.plot_report(tmp_path, rows).stat().st_size > 0
  # packs of two sessions: a run in both comes whole from the pack where it trained furthest,
  # whichever comes first (here a later session's failed start: its config, no steps)
  failed = tmp_path / "failed"
  (failed / "paper" / "seed0").mkdir(parents=True)
  (failed / "paper" / "seed0" / "config.json").write_text(
    (tmp_path / "paper" / "seed0" / "config.json").read_text()
  )
  pack2 = experiment.pack_runs(failed, tmp_path / "failed.jsonl.xz")
  for n, order in enumerate((f"{pack},{pack2}", [pack2, pack])):
    out = tmp_path / f"merged{n}"
    assert set(experiment.unpack_runs(order, out)) == {f"{v}/seed{s}" for v, s in by}
    assert strip(experiment.collect(out, cfg)) == strip(rows)
  with pytest.raises(FileNotFoundError, match="nope.xz"):
    experiment.unpack_runs(f"{pack},nope.xz", tmp_path / "x")
  for n, data in enumerate((b"not xz", lzma.compress(b"[1, 2]\n"), lzma.compress(b"{"))):
    (tmp_path / f"bad{n}.xz").write_bytes(data)  # not xz; not runs; not JSON: one line each
    with pytest.raises(ValueError, match=f"pack '.*bad{n}.xz' is not a pack of runs"):
      experiment.unpack_runs(f"{pack},{tmp_path / f'bad{n}.xz'}", tmp_path / "x")
  assert not (tmp_path / "x").exists()  # nothing written before every pack is read


def test_early_warning_fires_at_a_jump_and_at_a_steep_climb():
  """A layer whose max logit reaches ≥ 100× its lowest over the previous five rows fires the
  warning at that row, whether by one jump or by a steady climb (3× a row: 3⁵ = 243× in five
  rows); a 2×-a-row climb (32×), a 90× jump and a jump before `start` do not."""
  rows_of = lambda xs: [dict(step=100 * (i + 1), max_logit=x) for i, x in enumerate(xs)]
  climb = lambda f: [[[1.0], [10.0 * f**i]] for i in range(10)]
  # from step 200 on (warmup rows are no baseline): at row 7 the lowest of rows 2–6 is 3⁵ = 243×
  assert train.warning_step(rows_of(climb(3.0)), 200) == (700, 1)
  assert train.warning_step(rows_of(climb(2.0)), 200) == (None, None)
  calm = [[[20.0, 30.0], [10.0]], [[16.0, 12.0], [10.0]]] * 3  # layer 0: max over heads
  jump = calm + [[[20.0, 1600.0], [10.0]]]  # layer 0: 1600 / 16 = 100×
  assert train.warning_step(rows_of(jump), 200) == (700, 0)
  assert train.warning_step(rows_of(jump), 700) == (None, None)  # not after `start`
  near = calm + [[[20.0, 1440.0], [10.0]]]  # 90×: no warning
  assert train.warning_step(rows_of(near), 200) == (None, None)
  w = train.EarlyWarning(start=0, window=2)
  assert [w.update(s, [[x]]) for s, x in ((1, 1.0), (2, 2.0), (3, 200.0), (4, 1.0))] == [
    None,
    None,
    3,
    3,
  ]
  assert "100× its lowest over its previous 5" in train.EarlyWarning(200).describe()


def test_dq_error_warning_needs_its_rows_running():
  """`DQErrorWarning` fires at the row that ends `rows` consecutive rows with the watched
  layer's dQ error (largest over heads, NaN heads skipped) ≥ the threshold, after `start`:
  not on one high row between low ones, not on another layer, not on rows up to `start`."""
  rows_of = lambda xs: [dict(step=100 * (i + 1), dq_err=x) for i, x in enumerate(xs)]
  row = lambda x, other=0.0: [[other], [0.001, x, math.nan]]  # layer 1: max over heads
  alone = [row(0.01), row(0.01), row(0.05), row(0.01), row(0.03), row(0.01)]
  assert train.warning_step(rows_of(alone), 200, train.DQErrorWarning) == (None, None)
  running = alone + [row(0.03), row(0.031), row(0.01)]  # rows 7 and 8: two running
  assert train.warning_step(rows_of(running), 200, train.DQErrorWarning) == (800, 1)
  assert train.warning_step(rows_of(running), 200, train.DQErrorWarning, rows=3) == (None, None)
  assert train.warning_step(rows_of(running), 200, train.DQErrorWarning, layer=0) == (None, None)
  other = [row(0.01, 0.5)] * 6  # layer 0 high: not the watched layer
  assert train.warning_step(rows_of(other), 200, train.DQErrorWarning) == (None, None)
  assert train.warning_step(rows_of(other), 200, train.DQErrorWarning, layer=0) == (400, 0)
  early = [row(0.05)] * 3 + [row(0.01)] * 3  # rows 100 and 200 are not after start: no run of 2
  assert train.warning_step(rows_of(early), 200, train.DQErrorWarning) == (None, None)
  blank = [row(0.01)] * 2 + [row(0.05), [[0.0], [math.nan] * 3], row(math.inf)]  # all NaN: no row
  assert train.warning_step(rows_of(blank), 200, train.DQErrorWarning) == (500, 1)
  with pytest.raises(ValueError, match="rows=0 must be an integer ≥ 1"):
    train.DQErrorWarning(200, rows=0)
  with pytest.raises(ValueError, match="threshold=nan must be a finite number ≥ 0"):
    train.DQErrorWarning(200, threshold=math.nan)
  old = [dict(step=100 * i, max_logit=[[1.0], [1.0]]) for i in range(1, 6)]  # no dq_err logged
  assert train.warning_step(old, 200, train.DQErrorWarning) == (None, None)
  assert "≥ 0.03 in 2 diagnostics rows running" in train.DQErrorWarning(200).describe()


# The dQ-error rule on the anchor-b128 runs that logged dQ's error to its calibration
# (2026-12-02/03): the warning steps. Calibrated with a provisional runaway threshold (240);
# at the measured one (465) each precedes an explosion or a runaway, except paper + comp
# 30's (a false alarm)
B128_DQ_WARNINGS = {
  "cudnn/seed21": 1800,
  "cudnn/seed25": 2000,
  "paper+comp/seed29": 400,
  "paper+comp/seed30": 400,
  "paper+comp/seed31": 400,
  "paper+comp+guard/seed28": 400,
  "paper+comp+guard/seed31": 600,
  "paper+comp+guard+rsum:max_shift=6/seed25": 700,
  "paper+comp+guard+rsum:max_shift=6/seed28": 600,
  "paper+comp+guard+rsum:max_shift=6/seed31": 400,
  "paper+comp+guard:max_shift=6/seed25": 900,
  "paper+comp+guard:max_shift=6/seed28": 400,
  "paper+comp+guard:max_shift=6/seed31": 700,
  "paper+comp:shift_above=23.7/seed28": 400,
  "paper+comp:shift_above=23.7/seed31": 400,
  "stochastic/seed25": 1300,
}


def test_dq_error_warning_on_the_measured_runs(tmp_path):
  """The dQ-error rule as calibrated, replayed through the report's own definitions
  (`collect`) on the 21 runs that logged dQ's error: it warns at the recorded steps, before
  every explosion (145–949 steps ahead) and every runaway (100–800), and on one of the six
  runs without either (cuDNN + center 21, 24, 25; fa2 25; fa2 + lse 21; paper + comp 30).
  In-sample, with a thin margin (fa2 + lse 21 had 0.035 in one row, 0.027 in two running):
  later runs are its test. It was calibrated with a provisional runaway threshold (240); at
  the measured one (10× the reference-fp32 run's 46.5) paper + comp 30 (layer 1's max logit at
  most 247) did not run away, and its warning at 400 is a false alarm."""
  experiment.unpack_runs([str(RESULTS / p) for p in B128_DQ_PACKS], tmp_path)
  base = b128_config()
  every = experiment.collect(tmp_path, base, 1, B128_REFERENCE_MAX_LOGIT)
  rows = [r for r in every if r["dq_logged"]]  # `every` has the runs that did not log it
  name = lambda r: f"{r['variant']}/seed{r['seed']}"
  assert len(rows) == 21
  assert {name(r): r["dq_warning_step"] for r in rows if r["dq_warning_step"]} == B128_DQ_WARNINGS
  events = [r for r in rows if r["explosion_step"] or r["runaway_step"]]
  assert {name(r) for r in events} == set(B128_DQ_WARNINGS) - {"paper+comp/seed30"}
  exploded = [r for r in events if r["explosion_step"]]
  assert len(exploded) == 10 and min(r["dq_explosion_lead"] for r in exploded) == 145
  leads = [r["dq_runaway_lead"] for r in events if r["runaway_step"]]
  assert (min(leads), max(leads)) == (100, 800)
  assert {name(r) for r in rows if r["dq_false_alarm"]} == {"paper+comp/seed30"}
  text = experiment.format_report(every, dict(warmup_steps=base.warmup_steps), 1)
  assert "on the 21 of 44 runs that logged the dQ error." in text
  assert "| cudnn | 1 / 1 | 949–949 (median 949) | 2 / 2 | 300–600 (median 450) | 0 |" in text
  assert "| cudnn | 24 | 3000 | – | – | – | n/a |" in text  # logged no dQ error
  assert "| cudnn+center | 25 | 3000 | – | – | – | – |" in text  # logged it, not warned


# layer 1's largest max logit in the anchor-b128 reference-fp32 run (seed 21, 3,000 steps; H200,
# 2026-12-03, experiments/results/h200-2026-12-03d-b128): the runaway threshold is 10× this
B128_REFERENCE_MAX_LOGIT = 46.529408


def b128_config() -> TrainConfig:
  """The anchor-b128 recipe as the experiment's TrainConfig (what `collect` judges runs by)."""
  fields = {f.name for f in dataclasses.fields(TrainConfig)}
  return TrainConfig(**{k: v for k, v in experiment.RECIPES["anchor-b128"].items() if k in fields})


# The anchor-b128 packs of 2026-11-30 to 2026-12-02 (H200) on which `train.EarlyWarning` was
# calibrated, and the warning steps it gives there (docs/studies/instability-anchor-b128.md).
B128_PACKS = (
  "h200-2026-11-30-b128/runs.jsonl.xz",
  "h200-2026-12-01-b128/runs.jsonl.xz",
  "h200-2026-12-01c-b128/runs-1.jsonl.xz",
  "h200-2026-12-01c-b128/runs-2.jsonl.xz",
  "h200-2026-12-01d-b128/runs-1.jsonl.xz",
  "h200-2026-12-01d-b128/runs-2.jsonl.xz",
  "h200-2026-12-02-b128/runs.jsonl.xz",
)
B128_WARNINGS = {
  "paper/seed24": 2000,
  "paper/seed25": 1200,
  "paper/seed26": 1300,
  "paper/seed27": 1100,
  "paper/seed28": 900,
  "paper/seed29": 1100,
  "paper/seed30": 800,
  "paper/seed31": 1200,
  "paper+delta32/seed29": 1000,
  "paper+delta32/seed31": 1600,
}


def test_early_warning_on_the_measured_runs(tmp_path):
  """The rule as calibrated, replayed from the logged diagnostics of the calibration runs with
  the report's own definitions (`collect`): it warns at the recorded steps, before each of the
  10 explosions, and gives no false alarm on the 12 runs without one. In-sample: the runs of
  later sessions are the rule's test, in the study, not here."""
  experiment.unpack_runs([str(RESULTS / p) for p in B128_PACKS], tmp_path)
  base = b128_config()
  rows = [r for r in experiment.collect(tmp_path, base) if r["steps"]]  # one never started
  name = lambda r: f"{r['variant']}/seed{r['seed']}"
  assert {name(r): r["warning_step"] for r in rows if r["warning_step"]} == B128_WARNINGS
  exploded = [r for r in rows if r["explosion_step"] is not None]
  assert {name(r) for r in exploded} == set(B128_WARNINGS)
  assert all(r["explosion_lead"] > 0 for r in exploded)
  assert len(rows) - len(exploded) == 12 and not any(r["false_alarm"] for r in rows)


# anchor-b128 packs made after the calibration: the rule's out-of-sample runs, with the warning
# and explosion steps they gave and how many runs each pack holds
B128_LATER = {
  "h200-2026-12-02b-b128/runs-1.jsonl.xz": ({}, {}, 2),
  "h200-2026-12-02c-b128/runs.jsonl.xz": (
    {"paper+comp+guard/seed28": 900, "paper+comp+guard/seed31": 800},
    {"paper+comp+guard/seed28": 917, "paper+comp+guard/seed31": 745},
    2,
  ),
  "h200-2026-12-02d-b128/runs.jsonl.xz": (
    {f"paper+comp+guard:max_shift=6/seed{s}": w for s, w in ((25, 1200), (28, 800), (31, 1200))},
    {f"paper+comp+guard:max_shift=6/seed{s}": e for s, e in ((25, 1174), (28, 798), (31, 1219))},
    6,  # and paper + comp 30, 31 calm to 3,000; fa2 25 calm to 1,913
  ),
  "h200-2026-12-02e-b128/runs.jsonl.xz": (
    {f"paper+comp+guard+rsum:max_shift=6/seed{s}": 1100 + 100 * (s == 28) for s in (25, 28, 31)},
    {
      f"paper+comp+guard+rsum:max_shift=6/seed{s}": e
      for s, e in ((25, 1185), (28, 1236), (31, 1169))
    },
    5,  # and fa2 + lse 21, cudnn 21 calm to 3,000 by these rules (cudnn 21: layer 1 ran away at 2,400)
  ),
  # cudnn + center 21 and paper + comp with shift_above 23.7 at 28 calm to 3,000 (layer 1's max
  # logit 29 and 7,153, the latter climbing over 2,000 steps), 31 to 744: no warning
  "h200-2026-12-02f-b128/runs.jsonl.xz": ({}, {}, 3),
  # cudnn 25 exploded at 2,949 (warned at 2,400: 549 ahead) and stochastic 25 at 1,736 (warned
  # at 1,500); cudnn + center 24 and 25 calm; paper + comp with shift_above 23.7 at 31 calm to
  # 3,000 but warned at 700: the rule's first false alarm (its layer-1 logit ran away, 19 → 2,354)
  "h200-2026-12-03-b128/runs.jsonl.xz": (
    {"cudnn/seed25": 2400, "stochastic/seed25": 1500, "paper+comp:shift_above=23.7/seed31": 700},
    {"cudnn/seed25": 2949, "stochastic/seed25": 1736},
    5,
    {"paper+comp:shift_above=23.7/seed31"},
  ),
  # cudnn 26 and 27 exploded at 2,942 and 2,896 (warned at 1,800 and 2,000: 1,142 and 896
  # ahead; layer 1 ran away at 1,800 and 2,000); cudnn + center 26 and 27 calm, not warned
  "h200-2026-12-03b-b128/runs.jsonl.xz": (
    {"cudnn/seed26": 1800, "cudnn/seed27": 2000},
    {"cudnn/seed26": 2942, "cudnn/seed27": 2896},
    4,
  ),
  # cudnn 28 calm by the explosion rule to 3,000 but warned at 2,600: a false alarm by that rule
  # only (layer 1 ran away at 2,600, 56 → 3,339 over 2,400–2,600; 2.1·10⁶ at the end, loss
  # 1.385 → 2.494); cudnn + center 28 calm (max logit at most 59), not warned
  "h200-2026-12-03c-b128/runs.jsonl.xz": ({"cudnn/seed28": 2600}, {}, 2, {"cudnn/seed28"}),
  # reference-fp32 21 calm to 3,000 (layer 1's max logit at most 46.5: the runaway threshold's
  # basis), not warned
  "h200-2026-12-03d-b128/runs.jsonl.xz": ({}, {}, 1),
  # paper 29 and 31 again (`paper+triton`: the experiment's paper, in folders of its own, now
  # with dQ logged): exploded at 2,916 and 2,844 (the first runs: 1,452 and 1,306), warned at
  # 1,300 and 1,000, when layer 1 ran away
  "h200-2026-12-03e-b128/runs.jsonl.xz": (
    {"paper+triton/seed29": 1300, "paper+triton/seed31": 1000},
    {"paper+triton/seed29": 2916, "paper+triton/seed31": 2844},
    2,
  ),
  # stochastic 24 and 26 exploded at 2,267 and 1,601, warned at 2,100 and 1,200 (167 and 401
  # ahead); fa2 26 calm to 3,000, not warned (its layer-1 max logit 10 → 431 over 1,300–3,000)
  "h200-2026-12-03f-b128/runs.jsonl.xz": (
    {"stochastic/seed24": 2100, "stochastic/seed26": 1200},
    {"stochastic/seed24": 2267, "stochastic/seed26": 1601},
    3,
  ),
  # stochastic + delta32 24 calm to 3,000 and stochastic + center 24 to 1,816 (cut by the
  # session's end), not warned (layer 1's max logit at most 31 and 33)
  "h200-2026-12-03g-b128/runs.jsonl.xz": ({}, {}, 2),
  # stochastic + center 24 (again, to 3,000) and 26 (to 2,037), stochastic + delta32 26 calm,
  # not warned (layer 1's max logit at most 30, 33, 29); stochastic alone exploded at these seeds
  "h200-2026-12-03h-b128/runs.jsonl.xz": ({}, {}, 3),
  # fa2 + comp 25 exploded at 2,379, warned at 1,900 (479 ahead); fa2 + comp 21 calm by the
  # explosion rule to 3,000 but warned at 2,600, when layer 1 ran away (277 → 37,390 over
  # 2,500–2,800; 138,714 at the end): a false alarm by that rule only; fa2 + comp 24 and
  # fp32_out 24 and 25 calm, not warned
  "h200-2026-12-04-b128/runs.jsonl.xz": (
    {"fa2+comp/seed21": 2600, "fa2+comp/seed25": 1900},
    {"fa2+comp/seed25": 2379},
    5,
    {"fa2+comp/seed21"},
  ),
  # fp32_out 21 and paper + center + comp 29 and 31 calm to 3,000 (layer 1's max logit at most
  # 26, 127 and 212), not warned
  "h200-2026-12-04b-b128/runs.jsonl.xz": ({}, {}, 3),
  # paper + delta32 + comp 24, 29, 31 and paper + center + comp 24 calm by the explosion rule to
  # 3,000, not warned, although 29 and 31 ran away (layer 1's max logit to 744 and 3,536, at
  # most 17× and 61× its lowest over the previous 5 rows), as paper + comp's runaways were
  "h200-2026-12-04c-b128/runs.jsonl.xz": ({}, {}, 4),
  # xla 21 calm to 3,000 (layer 1's max logit at most 39.3), not warned
  "h200-2026-12-04d-b128/runs.jsonl.xz": ({}, {}, 1),
}
# anchor-b128 packs made after `train.DQErrorWarning` was calibrated (2026-12-03, on the packs
# up to the eleventh session): per pack, the runs with an event, each with its dQ warning step,
# runaway step (> 465, 10× the reference-fp32 run's largest) and explosion step (None: none by
# 3,000), and the calm runs, each with its largest layer-1 dQ error after warmup and its dQ
# warning step (None: not warned; a step: a false alarm)
B128_DQ_LATER = {
  "h200-2026-12-03b-b128/runs.jsonl.xz": (
    {"cudnn/seed26": (1500, 1800, 2942), "cudnn/seed27": (1500, 2000, 2896)},
    {"cudnn+center/seed26": (0.021, None), "cudnn+center/seed27": (0.022, None)},
  ),
  "h200-2026-12-03c-b128/runs.jsonl.xz": (
    {"cudnn/seed28": (1300, 2600, None)},
    {"cudnn+center/seed28": (0.116, 700)},
  ),
  "h200-2026-12-03d-b128/runs.jsonl.xz": ({}, {"reference-fp32/seed21": (0.002, None)}),
  "h200-2026-12-03e-b128/runs.jsonl.xz": (
    {"paper+triton/seed29": (400, 1300, 2916), "paper+triton/seed31": (600, 1000, 2844)},
    {},
  ),
  "h200-2026-12-03f-b128/runs.jsonl.xz": (
    {"stochastic/seed24": (2000, 2000, 2267), "stochastic/seed26": (1000, 1200, 1601)},
    {"fa2/seed26": (1.08, 1500)},
  ),
  "h200-2026-12-03g-b128/runs.jsonl.xz": (
    {},
    {"stochastic+center/seed24": (0.021, None), "stochastic+delta32/seed24": (0.017, None)},
  ),
  "h200-2026-12-03h-b128/runs.jsonl.xz": (
    {},
    {
      "stochastic+center/seed24": (0.022, None),
      "stochastic+center/seed26": (0.02, None),
      "stochastic+delta32/seed26": (0.01, None),
    },
  ),
  "h200-2026-12-04-b128/runs.jsonl.xz": (
    {"fa2+comp/seed21": (2600, 2600, None), "fa2+comp/seed25": (1700, 1900, 2379)},
    {
      "fa2+comp/seed24": (0.026, None),
      "fp32_out/seed24": (0.019, None),
      "fp32_out/seed25": (0.012, None),
    },
  ),
  "h200-2026-12-04b-b128/runs.jsonl.xz": (
    {},
    {
      "fp32_out/seed21": (0.013, None),
      "paper+center+comp/seed29": (0.889, 500),
      "paper+center+comp/seed31": (1.052, 400),
    },
  ),
  # the first runs with dq_common logged; third: each run's dq_common warning step (leads to
  # the runaways 700 and 200)
  "h200-2026-12-04c-b128/runs.jsonl.xz": (
    {"paper+delta32+comp/seed29": (400, 1400, None), "paper+delta32+comp/seed31": (400, 600, None)},
    {"paper+center+comp/seed24": (0.812, 600), "paper+delta32+comp/seed24": (1.294, 400)},
    {
      "paper+center+comp/seed24": 2300,
      "paper+delta32+comp/seed24": 400,
      "paper+delta32+comp/seed29": 700,
      "paper+delta32+comp/seed31": 400,
    },
  ),
  # xla 21 calm (layer 1's dQ error at most 0.012, along the keys' mean 0.010), warned by neither
  "h200-2026-12-04d-b128/runs.jsonl.xz": ({}, {"xla/seed21": (0.012, None)}, {"xla/seed21": None}),
}
B128_DQ_PACKS = (*B128_PACKS, *(p for p in B128_LATER if p not in B128_DQ_LATER))


def test_unpack_finished_puts_back_the_finished_runs_only(tmp_path, capsys):
  """`experiments/unpack_finished.py` (h200_hold.sh's PREVIOUS, after a machine went back with
  its queues): the packs' finished runs (summary.json) go under OUT_DIR as the experiment's
  run folders, the same files bit for bit; a run the packs hold unfinished is left out (it
  starts over); a run already there is kept; a pack that does not exist stops it, in one line
  naming it (`unpack_runs`'s own check), before anything is written."""
  import runpy

  script = runpy.run_path(str(RESULTS.parent / "unpack_finished.py"))
  packs = [str(RESULTS / f"h200-2026-12-03{s}-b128/runs.jsonl.xz") for s in "gh"]
  out = tmp_path / "anchor-b128"
  with pytest.raises(SystemExit, match="^unpack_finished: pack 'nope.xz': no such file$"):
    script["main"]([str(out), *packs, "nope.xz"])
  assert not out.exists()
  assert script["main"]([str(out), *packs]) == 0
  kept = sorted(str(p.relative_to(out)) for p in out.glob("*/seed*"))
  assert kept == [
    "stochastic+center/seed24",  # from 03h (3,000 steps), not 03g's cut copy
    "stochastic+delta32/seed24",
    "stochastic+delta32/seed26",
  ]
  assert "stochastic+center/seed26: unfinished in the packs, starts over" in capsys.readouterr().out
  rows = train.read_metrics(out / "stochastic+center" / "seed24")
  assert len(rows) == 3000 and (out / "stochastic+center/seed24/summary.json").exists()
  experiment.unpack_runs(packs, tmp_path / "all")
  for run in kept:
    for f in (tmp_path / "all" / run).iterdir():
      assert (out / run / f.name).read_bytes() == f.read_bytes(), (run, f.name)
  script["main"]([str(out), packs[1]])
  assert "already under" in capsys.readouterr().out


def test_the_runaway_threshold_comes_from_the_reference_run(tmp_path):
  """The reference-fp32 run (seed 21, 3,000 steps, H200) sets the runaway threshold with no
  value given: 10× layer 1's largest max logit over its diagnostics rows, 46.529408, read
  from the pack itself; a value given above it raises the threshold, one below does not."""
  experiment.unpack_runs([str(RESULTS / "h200-2026-12-03d-b128/runs.jsonl.xz")], tmp_path)
  base = b128_config()
  diags = train.read_diagnostics(tmp_path / "reference-fp32" / "seed21")
  largest = max(max(d["max_logit"][1]) for d in diags)
  assert largest == pytest.approx(B128_REFERENCE_MAX_LOGIT, abs=1e-6) and len(diags) == 30
  for given, threshold in ((None, 10 * largest), (24.0, 10 * largest), (60.0, 600.0)):
    (row,) = experiment.collect(tmp_path, base, 1, given)
    assert row["runaway_threshold"] == pytest.approx(threshold, rel=1e-6)
    assert (row["steps"], row["runaway_step"], row["explosion_step"]) == (3000, None, None)


def test_a_rerun_of_a_seed_parts_early_and_explodes_again(tmp_path):
  """paper 29 and 31 trained twice on the H200 with one configuration (2026-12-01 and, as
  `paper+triton`, 2026-12-03; the experiment's flash variants run Triton): the same weights and
  batches, the loss at steps 1–2 within float32 rounding (29: equal; 31: 8.9e-8 apart), then the runs part beyond τ = 2⁻⁸ at steps 48 and 49
  (as JAX's null does in the twin: 48–53), and each explodes again, ~1,500 steps later. The
  explosion step of a seed does not reproduce; its outcome does."""
  from jax_flashstable.experiment import twin

  first = [str(RESULTS / f"h200-2026-12-01c-b128/runs-{i}.jsonl.xz") for i in (1, 2)]
  experiment.unpack_runs(first, tmp_path / "a")
  experiment.unpack_runs([str(RESULTS / "h200-2026-12-03e-b128/runs.jsonl.xz")], tmp_path / "b")
  rows = {
    (side, r["seed"]): r
    for side in ("a", "b")
    for r in experiment.collect(tmp_path / side, b128_config(), 1, B128_REFERENCE_MAX_LOGIT)
    if r["variant"] in ("paper", "paper+triton") and r["seed"] in (29, 31)
  }
  for seed, apart, explosions in ((29, 48, (1452, 2916)), (31, 49, (1306, 2844))):
    a, b = (
      tmp_path / side / v / f"seed{seed}" for side, v in (("a", "paper"), ("b", "paper+triton"))
    )
    ca, cb = (json.loads((d / "config.json").read_text())["train"] for d in (a, b))
    bookkeeping = {"out_dir", "max_seconds", "checkpoint_interval", "warning_rule", "warning_layer"}
    assert {k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k)} <= bookkeeping
    assert ca["attention"] == cb["attention"] == "paper+triton:block_q=512,block_k=512"
    c = twin.compare_losses(train.read_metrics(a), train.read_metrics(b))
    assert c["start_rel"] < 1e-6 and c["first_apart"] == apart, c  # 0 and 8.9e-8 at steps 1–2
    assert tuple(rows[side, seed]["explosion_step"] for side in "ab") == explosions


@pytest.mark.parametrize("pack", B128_DQ_LATER)
def test_dq_error_warning_out_of_sample(pack, tmp_path):
  """The dQ-error rule on runs made after its calibration, with the measured runaway threshold
  (layer 1's max logit > 465): cudnn 26 and 27 warned at 1,500, before their runaways
  (1,800 and 2,000: 300 and 500 ahead) and explosions (2,942 and 2,896: 1,442 and 1,396
  ahead); cudnn 28 warned at 1,300, 1,300 before its runaway (2,600; no explosion by 3,000);
  cudnn + center 26 and 27 calm to 3,000 (layer 1's dQ error at most 0.021 and 0.022), not
  warned; cudnn + center 28 calm to 3,000 (layer 1's max logit at most 59) but warned at 700
  (dQ error 0.038 and 0.031 at 600 and 700, at most 0.116): the rule's first false alarm;
  reference-fp32 21 calm (its own dQ against the diagnostics' FP32 dQ: at most 0.002, the
  floor of the measure), not warned; the paper layout (29 and 31 again, the first of its runs
  with dQ logged) warned at 400 and 600, 900 and 400 before its runaways (1,300 and 1,000)
  and 2,516 and 2,244 before its explosions (2,916 and 2,844); stochastic rounding 24 and 26
  warned at 2,000 and 1,000, at and 200 before the runaways (2,000, 1,200), 267 and 601 before
  the explosions (2,267, 1,601); fa2 26 calm to 3,000 but warned at 1,500: a false alarm at the
  horizon of a run on its way (layer 1's dQ error 0.05 → 1.08 and max logit 14 → 431 over
  1,500–3,000, 93% of the runaway threshold at the last row); stochastic rounding with delta
  from the float32 O (24, 26) or with the keys centred (24 twice, 26 to 2,037) calm, layer 1's
  dQ error at most 0.010–0.022, not warned; fa2 + comp 25 warned at 1,700, 200 before its
  runaway (1,900) and 679 before its explosion (2,379), 21 at 2,600, its runaway's row (no
  explosion by 3,000); fa2 + comp 24 and fp32_out 24, 25 calm (at most 0.026, 0.019, 0.012),
  not warned; fp32_out 21 calm (at most 0.013), not warned; paper + center + comp 29 and 31
  calm to 3,000 but warned at 500 and 400: false alarms from the literal compensation, which
  switches tied rows with large scores off (docs/numerics.md), so layer 1's dQ errs by up to
  0.889 and 1.052 of its size once its max logit passes ~24, with no runaway (at most 127 and
  212). The first runs with `dq_common` logged (2026-12-04, twenty-second session): paper +
  delta32 + comp 29 and 31 ran away at 1,400 and 600 without exploding, warned by dq_err at 400
  (1,000 and 200 ahead) and by dq_common at 700 and 400 (700 and 200 ahead); paper + delta32 +
  comp 24 calm (layer 1's max logit at most 305, at step 600) but warned at 400 by both, paper +
  center + comp 24 calm (at most 149) but warned at 600 by dq_err (at most 0.812) and at 2,300
  by dq_common: no separation of the compensation's own error on these runs. xla 21 (standard
  attention, 2026-12-04, twenty-third session) calm (dQ error at most 0.012), warned by
  neither."""
  warned, calm, *dqc = B128_DQ_LATER[pack]
  experiment.unpack_runs([str(RESULTS / pack)], tmp_path)
  base = b128_config()
  rows = experiment.collect(tmp_path, base, 1, B128_REFERENCE_MAX_LOGIT)
  name = lambda r: f"{r['variant']}/seed{r['seed']}"
  assert sorted(map(name, rows)) == sorted([*warned, *calm])
  assert all(r["dq_logged"] and r["dqc_logged"] == bool(dqc) for r in rows)  # dq_common: 12-04c on
  text = experiment.format_report(rows, dict(warmup_steps=base.warmup_steps), 1)
  assert ("no run here logged the dQ error along each row's keys' mean." in text) != bool(dqc)
  if dqc:  # the dq_common rule: its warning steps (None: not warned), its leads to the runaways
    (steps,) = dqc  # a warned calm run is a false alarm
    assert {name(r): r["dqc_warning_step"] for r in rows} == steps
    false_alarms = {n for n, w in steps.items() if w is not None and n in calm}
    assert {name(r) for r in rows if r["dqc_false_alarm"]} == false_alarms
    for n, (_, runaway, _) in warned.items():
      row = next(r for r in rows if name(r) == n)
      assert row["dqc_runaway_lead"] == (runaway - steps[n] if steps[n] is not None else None)
  steps = ("dq_warning_step", "runaway_step", "explosion_step")
  assert {name(r): tuple(r[k] for k in steps) for r in rows if name(r) in warned} == warned
  for r in rows:
    if name(r) in warned:
      w, runaway, explosion = warned[name(r)]
      leads = (runaway - w, explosion - w if explosion else None)
      assert (r["dq_runaway_lead"], r["dq_explosion_lead"]) == leads
      assert not r["dq_false_alarm"]
    else:  # layer 1's largest dQ error over heads and rows, after warmup
      largest, w = calm[name(r)]
      assert (r["runaway_step"], r["explosion_step"], r["dq_warning_step"]) == (None, None, w)
      assert r["dq_false_alarm"] == (w is not None)
      diags = train.read_diagnostics(tmp_path / r["variant"] / f"seed{r['seed']}")
      errs = [np.nanmax(d["dq_err"][1]) for d in diags if d["step"] > base.warmup_steps]
      assert round(float(max(errs)), 3) == largest


@pytest.mark.parametrize("pack", B128_LATER)
def test_early_warning_out_of_sample(pack, tmp_path):
  """The calibrated rule on runs made after it, as the study reports them: paper + comp 29
  calm to 3,000 (layer 1's max logit climbing slowly to 5,446) and 30 calm to 1,168, no
  warning; paper + comp + guard 28 and 31 exploded at 917 and 745, warned at 900 (17 steps
  ahead) and at 800 (after the explosion); the same at max_shift 6, seeds 25, 28 and 31,
  exploded at 1,174, 798 and 1,219, warned at 1,200, 800 and 1,200 (after, 2 after, 19
  ahead); paper + comp 30 and 31 calm to 3,000 and fa2 25 to 1,913, no warning; with +rsum
  at max_shift 6, seeds 25, 28 and 31 exploded at 1,185, 1,236 and 1,169, warned at 1,100,
  1,200 and 1,100 (85, 36 and 69 steps ahead); fa2 + lse 21 and cudnn 21 not warned; nor
  cudnn + center 21 and paper + comp with shift_above 23.7 at 28 (calm to 3,000) and 31 (to
  744). No false alarm until 2026-12-03: cudnn 25 and stochastic 25 exploded at 2,949 and
  1,736, warned at 2,400 and 1,500 (549 and 236 ahead); cudnn + center 24 and 25 calm, not
  warned; shift_above 23.7 at 31 calm to 3,000, warned at 700 (layer 1: 19 → 2,354 within
  five rows), the first false alarm by the explosion rule; cudnn 26 and 27 exploded at 2,942
  and 2,896, warned at 1,800 and 2,000; cudnn 28 warned at 2,600, when layer 1 ran away, and
  did not explode by 3,000 (a false alarm by the explosion rule); cudnn + center 26–28 calm,
  not warned; reference-fp32 21 calm to 3,000, not warned; paper 29 and 31 again exploded at
  2,916 and 2,844, warned at 1,300 and 1,000 (1,616 and 1,844 ahead); stochastic 24 and 26
  exploded at 2,267 and 1,601, warned at 2,100 and 1,200; fa2 26 calm, not warned; stochastic
  + delta32 (24, 26) and stochastic + center (24 twice, 26 to 2,037) calm, not warned;
  fa2 + comp 25 exploded at 2,379, warned at 1,900 (479 ahead), 21 warned at 2,600, when its
  layer 1 ran away, and did not explode by 3,000 (a false alarm by the explosion rule); fa2 +
  comp 24 and fp32_out 24 and 25 calm, not warned; fp32_out 21 and paper + center + comp 29
  and 31 calm, not warned; paper + delta32 + comp 24, 29, 31 and paper + center + comp 24 not
  warned (29 and 31 ran away: missed, as paper + comp's runaways were); xla 21 calm, not
  warned."""
  warnings, explosions, n_runs, *false_alarms = B128_LATER[pack]
  experiment.unpack_runs([str(RESULTS / pack)], tmp_path)
  base = b128_config()
  rows = experiment.collect(tmp_path, base)
  name = lambda r: f"{r['variant']}/seed{r['seed']}"
  assert len(rows) == n_runs
  assert {name(r): r["warning_step"] for r in rows if r["warning_step"]} == warnings
  assert {name(r): r["explosion_step"] for r in rows if r["explosion_step"]} == explosions
  assert {name(r) for r in rows if r["false_alarm"]} == (false_alarms[0] if false_alarms else set())


def test_compare_findings_name_the_literal_compensations_caveat():
  """The main job's report says, beside a calm paper + comp run, that its literal shift
  switches tied rows off (docs/numerics.md); not beside the clipped shift's run or fa2's."""
  from jax_flashstable.experiment import compare

  row = lambda v, step: dict(
    variant=v,
    explosion_step=step,
    steps=3000,
    min_loss=1.5,
    final_loss=4.0,
    max_logit=1e5,
    max_sigma_wq=70.0,
  )
  caveat = "literal shift"
  text = " ".join(compare.findings([row("paper", 1500), row("paper+comp", None)]))
  assert caveat in text and "paper exploded at step 1,500" in text
  for calm in ("paper+comp+guard:max_shift=6", "fa2+comp", "paper+center"):
    assert caveat not in " ".join(compare.findings([row("paper", 1500), row(calm, None)]))


def test_a_report_refuses_runs_of_another_recipe(tmp_path):
  """`experiment instability --runs` judges runs by the command's recipe (warmup, diagnostics
  interval) and states it as theirs: runs made with other recipe fields are refused in one
  line naming the run and the field, not misjudged (e.g. --warmup-steps 2999 would have
  called cudnn 28's runaway calm; --recipe tiny would head a gpt-6l report as tiny). A
  misspelled --attention is an error there too (it chooses nothing in a report, which covers
  every run, but was silently ignored until 2026-12-03), and the report's header records the
  variants and seeds it covers, not the options' defaults."""
  pack = str(RESULTS / "h200-2026-12-03c-b128/runs.jsonl.xz")
  argv = ["experiment", "instability", "--runs", pack, "--out", str(tmp_path / "r")]
  for extra, message in (
    (["--recipe", "tiny"], "cudnn seed28 under .* was trained with model='gpt-6l', not 'tiny'"),
    (
      ["--recipe", "anchor-b128", "--warmup-steps", "2999"],
      "cudnn seed28 under .* was trained with warmup_steps=200, not 2999",
    ),
    (["--recipe", "anchor-b128", "--attention", "fa3"], "unknown attention 'fa3'"),
  ):
    with pytest.raises(SystemExit, match=f"^flashstable experiment: {message}") as e:
      cli.main([*argv, *extra])
    assert "\n" not in str(e.value.code)
  assert cli.main([*argv, "--recipe", "anchor-b128"]) == 0  # its own recipe: reported
  args = json.loads((tmp_path / "r" / "report.json").read_text())["meta"]["args"]
  assert (args["variants"], args["seeds"]) == ("cudnn,cudnn+center", "28")


def test_the_main_jobs_gpu_runs_show_the_explosion_and_the_runaway(tmp_path):
  """`flashstable compare` on the H200 (2026-12-04, its GPU setting: anchor-b128, seed 25):
  paper exploded at 1,404 (its layer 1 ran away at 1,000); paper + comp did not explode by
  3,000 but its layer 1 ran past 465, 10× the study's measured FP32 reference, at 900 and
  reached 6,167. The report, made from the packed runs on any machine, names the H200 they were
  trained on and says paper + comp held the loss, not the logits (its first report, on the
  device, called it stable: the setting had no runaway rule). With another recipe, or the
  embedded sample for data, the setting's reference does not apply: the report says runaways
  are not judged, and calls paper + comp neither calm nor a fix."""
  from jax_flashstable.experiment import compare

  pack = RESULTS / "h200-2026-12-04d-b128/compare-runs.jsonl.xz"
  experiment.unpack_runs([str(pack)], tmp_path)
  gpu = compare.setting(gpu=True)
  base = dataclasses.replace(b128_config(), data=".data")
  given = compare.reference_max_logit(gpu, base)
  assert given == pytest.approx(B128_REFERENCE_MAX_LOGIT)
  rows = experiment.collect(tmp_path, base, 1, given)
  steps = ("explosion_step", "runaway_step", "warning_step", "dq_warning_step", "steps")
  assert {r["variant"]: tuple(r[k] for k in steps) for r in rows} == {
    "paper": (1404, 1000, 1000, 900, 1704),
    "paper+comp": (None, 900, None, 400, 3000),
  }
  assert round(rows[1]["max_logit"]) == 6167
  rows = [dict(r, **compare.noise_band(tmp_path / r["variant"] / "seed25")) for r in rows]
  text = compare.report(base, rows, None, compare.trained_on(tmp_path, rows))
  assert "Trained on: NVIDIA H200 (gpu)." in text and "**paper exploded at step 1,404**" in text
  assert (
    "**paper+comp did not explode by step 3,000, but its layer 1 ran away**: its max logit "
    "passed 465 (10× the FP32 reference's 46.5, measured at this recipe by the study's "
    "reference-fp32 run) at step 900 and reached 6,167"
  ) in text
  assert "stayed calm" not in text and "its fix" not in text
  assert "| paper+comp | 3000 | 1.630 ± 0.065 | 1.455 | 2.433 | – | 900 | – | 400 |" in text
  assert "Runaway: layer 1's max logit above 465.3 (10× the FP32 reference's 46.5, measured" in text
  repeat = "Not bit for bit from run to run on a GPU unless run with --deterministic"
  deterministic = "Run with XLA's deterministic GPU ops (--deterministic, or XLA_FLAGS)"
  assert repeat in text and deterministic not in text
  # what the runs' config.json say (`train.deterministic_ops_so_far`), not the command's option
  configs = [tmp_path / r["variant"] / "seed25" / "config.json" for r in rows]
  for n, said in ((1, False), (2, True)):  # one run with the flag, then both
    path = configs[n - 1]
    path.write_text(json.dumps(dict(json.loads(path.read_text()), deterministic_ops=True)))
    assert compare.ran_deterministic(tmp_path, rows) is said
  text = compare.report(base, rows, None, compare.trained_on(tmp_path, rows), True)
  assert deterministic in text and repeat not in text
  for other in (
    dataclasses.replace(base, batch_size=32),
    dataclasses.replace(base, diag_rows=8),
    dataclasses.replace(base, data=None),  # the embedded sample
  ):
    assert compare.reference_max_logit(gpu, other) is None
  rows = experiment.collect(tmp_path, base, 1, None)
  text = " ".join(compare.findings(rows))
  assert "Runaways are not judged here: no reference-fp32 run" in text
  assert "its layer 1 ran away" not in text
  assert "paper+comp did not explode by step 3,000" in text
  assert "stayed calm" not in text and "its fix" not in text


def test_compare_gets_its_settings_reference_only_at_its_recipe(tmp_path, monkeypatch):
  """`flashstable compare` on a GPU passes the setting's measured reference max logit to the
  run (its runaway rule) with the setting's recipe and a corpus given, and none with the
  embedded sample or another recipe (wired through the CLI, whose options override the
  recipe's fields)."""
  from jax_flashstable.experiment import compare

  got = {}

  def fake_run_compare(cfg, out, variants, seed, **kw):
    got.update(kw)
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(out) / "report.md").write_text("# flashstable compare\n")

  monkeypatch.setattr(compare, "setting", lambda gpu=None: compare.SETTINGS["gpu"])
  monkeypatch.setattr(compare, "run_compare", fake_run_compare)
  data = str(tmp_path / "corpus")
  for argv, given in (
    (["--data", data], B128_REFERENCE_MAX_LOGIT),
    ([], None),
    (["--data", data, "--batch-size", "32"], None),
  ):
    got.clear()
    assert cli.main(["compare", "--out-dir", str(tmp_path / "out"), *argv]) == 0
    assert got["reference_max_logit"] == given, argv


def test_packs_of_no_run_new_folders_and_failures(tmp_path, capsys):
  """`--pack` and the packs themselves, where runs could be lost or a traceback come: a pack of
  a folder with no run reads back as no run (also one written before 2026-12-05, a lone
  newline); a pack's folder is made; `--pack` inside a run folder is refused before any work
  (it would replace a run's file); a report that fails on a run's file that is not JSON says
  which file and line, in one line, after one line saying the pack could not be written; bad
  input (a corpus that is not there) writes no pack."""
  empty = experiment.pack_runs(tmp_path / "none", tmp_path / "new" / "sub" / "p.jsonl.xz")
  assert empty.exists() and experiment.read_packs(empty) == {}
  assert empty.stat().st_mode & 0o777 == 0o644  # readable as any result file
  (tmp_path / "old.jsonl.xz").write_bytes(lzma.compress(b"\n"))
  (tmp_path / "taken").mkdir()  # a pack that cannot be renamed into place leaves no temporary
  with pytest.raises(OSError):
    experiment.write_pack(["{}"], tmp_path / "taken")
  assert not list(tmp_path.glob(".taken*"))
  assert experiment.read_packs(tmp_path / "old.jsonl.xz") == {}
  run = tmp_path / "c" / "paper" / "seed0"
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text('garbage\n{"step": 1, "loss": 2.0}\n')
  report = ["experiment", "instability", "--recipe", "tiny", "--report-only"]
  for inside in (run / "metrics.jsonl", run.parent / "seed1"):  # a run's file, a run's folder
    with pytest.raises(SystemExit, match=r"--pack '.*' is a run folder of --out or in one$"):
      cli.main([*report, "--out", str(tmp_path / "c"), "--pack", str(inside)])
  assert (run / "metrics.jsonl").read_text().startswith("garbage")
  bad = (
    rf"^flashstable experiment: {run / 'metrics.jsonl'}: line 1 is not JSON \(Expecting value\)$"
  )
  elsewhere = tmp_path / "w" / "seed42" / "c.jsonl.xz"  # a seedN folder outside --out: allowed
  with pytest.raises(SystemExit, match=bad):
    cli.main([*report, "--out", str(tmp_path / "c"), "--pack", str(elsewhere)])
  err = capsys.readouterr().err
  assert "flashstable: runs not packed (ValueError: " in err and err.count("\n") == 1, err
  assert not elsewhere.exists() and not any(elsewhere.parent.glob("*"))  # no temporary left
  argv = ["experiment", "instability", "--recipe", "tiny", "--steps", "2", "--seeds", "0"]
  with pytest.raises(SystemExit, match="folder not found"):
    cli.main([*argv, "--data", str(tmp_path / "nodata"), "--out", str(tmp_path / "o")]
             + ["--pack", str(tmp_path / "o.jsonl.xz")])  # fmt: skip
  assert not (tmp_path / "o.jsonl.xz").exists()


def test_a_command_that_fails_after_training_packs_what_it_trained(tmp_path, monkeypatch):
  """A run trained, then the command fails (here its report: `write_report` made to raise):
  the pack holds the run, written on the way out; run again over the same folder, a command
  that fails before writing any run (a corpus that is not there) packs nothing, although
  --out holds that earlier run (it was packed by the command that made it)."""
  argv = ["experiment", "instability", "--recipe", "tiny", "--steps", "2", "--seeds", "0"]
  argv += ["--attention", "fa2", "--tiles", "64", "--seq-len", "32", "--eval-batches", "1"]
  out, pack = tmp_path / "o", tmp_path / "o.jsonl.xz"

  def boom(*args, **kwargs):
    raise RuntimeError("the report failed")

  monkeypatch.setattr(experiment, "write_report", boom)
  with pytest.raises(RuntimeError, match="the report failed"):
    cli.main([*argv, "--no-progress", "--out", str(out), "--pack", str(pack)])
  runs = experiment.read_packs(pack)
  assert list(runs) == ["fa2/seed0"] and runs["fa2/seed0"]["steps"] == 2
  again = tmp_path / "again.jsonl.xz"
  with pytest.raises(SystemExit, match="folder not found"):
    cli.main([*argv, "--data", str(tmp_path / "nodata"), "--out", str(out), "--pack", str(again)])
  assert not again.exists()
