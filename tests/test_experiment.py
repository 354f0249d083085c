"""`flashstable experiment instability` on CPU: a small matrix, resumption, the report, and the
early stop after an explosion."""
import dataclasses
import json
import math
import pathlib

import pytest

from jax_flashstable import cli, experiment, train
from jax_flashstable.train import TrainConfig

TINY = dataclasses.replace(TrainConfig(**experiment.RECIPES["tiny"]), steps=12, diag_interval=6,
                           progress=False)


def test_variant_configs_are_what_they_say():
  c = experiment.variant_config(TINY, "paper@layer", 3, "/x", tiles=64, layer=1)
  assert c.seed == 3 and c.attention == "xla"
  assert c.attention_overrides == ((1, "flash:numerics=paper,block_q=64,block_k=64"),)
  m = c.model_config()
  assert m.attention_for(1).numerics == "paper" and m.attention_for(0).implementation == "xla"
  assert experiment.variant_config(TINY, "paper+comp", 0, "/x").model_config().attention.stabilize
  with pytest.raises(ValueError, match="'nope'"):
    experiment.variant_config(TINY, "nope", 0, "/x")
  with pytest.raises(ValueError, match="layer=5"):
    experiment.variant_config(TINY, "paper", 0, "/x", layer=5)


def test_small_matrix_runs_resumes_and_reports(tmp_path):
  logs = []
  rows = experiment.run_matrix(TINY, ["paper", "stochastic"], [0], tmp_path, tiles=64, log=logs.append)
  assert [(r["variant"], r["seed"], r["steps"], r["finished"]) for r in rows] == [
      ("paper", 0, 12, True), ("stochastic", 0, 12, True)]
  for r in rows:
    assert 0.0 <= r["mean_tie_rate"] <= 1.0 and r["max_sigma_wq"] > 0 and r["min_loss"] < 11.0
    assert math.isfinite(r["max_logit"])
    assert r["outcome"] == "stable to step 12" and r["steps_per_s"] > 0
  # same seed, same data: the first losses agree closely, but the layouts differ in the bits
  loss = lambda v: [json.loads(l)["loss"] for l in open(tmp_path / v / "seed0" / "metrics.jsonl")]
  assert loss("paper")[0] == pytest.approx(loss("stochastic")[0], abs=1e-3) and loss("paper") != loss("stochastic")
  logs.clear()
  experiment.run_matrix(TINY, ["paper", "stochastic"], [0], tmp_path, tiles=64, log=logs.append)
  assert all("done before" in line for line in logs)
  rows = experiment.run_matrix(TINY, ["fa2"], [0], tmp_path, time_budget=1e-3, log=logs.append)
  assert "time budget is spent" in logs[-1] and {r["variant"] for r in rows} == {"paper", "stochastic"}
  path = experiment.write_report(tmp_path, rows, TINY)
  text = path.read_text()
  assert "| paper | 0 | 12 |" in text and "| stochastic | 0 / 1 |" in text
  assert (tmp_path / "curves.png").stat().st_size > 0


def test_explosion_stops_the_run_and_is_reported(tmp_path):
  """A learning rate far too large for the tiny model makes it explode; the run stops a fixed
  number of steps later and the report says so."""
  cfg = dataclasses.replace(TINY, lr=3.0, min_lr=3.0, steps=60, warmup_steps=2, diag_interval=0,
                            stop_after_explosion=2)
  rows = experiment.run_matrix(cfg, ["fa2"], [0], tmp_path)
  (r,) = rows
  assert r["outcome"] == "exploded" and r["explosion_step"] is not None
  # stops two steps after the explosion, or earlier at a non-finite loss
  assert r["explosion_step"] < r["steps"] <= r["explosion_step"] + 2 < 60
  assert r["stopped"] in ("explosion", "non-finite") and r["finished"]


def test_cli_experiment_tiny(tmp_path):
  rc = cli.main(["experiment", "instability", "--recipe", "tiny", "--variants", "fa2+comp", "--steps", "4",
                 "--diag-interval", "2", "--no-progress", "--out", str(tmp_path)])
  assert rc == 0
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["recipe"]["steps"] == 4 and report["rows"][0]["variant"] == "fa2+comp"
  assert cli.main(["experiment", "instability", "--recipe", "tiny", "--report-only", "--out", str(tmp_path)]) == 0
  with pytest.raises(SystemExit, match="unknown variant"):
    cli.main(["experiment", "instability", "--recipe", "tiny", "--variants", "paper,bogus", "--out", str(tmp_path)])


def test_collect_skips_odd_folders_and_a_cut_last_line(tmp_path):
  """A process killed mid-write leaves a partial last line: it is dropped, not fatal; folders
  that are not seed<k> are ignored; seeds sort numerically."""
  rows = [dict(step=s, loss=3.0, grad_norm=0.5, step_time_s=0.1) for s in range(1, 13)]
  for seed in (10, 2):
    run = tmp_path / "fa2" / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 13, "lo')
  (tmp_path / "fa2" / "seed2-old").mkdir()
  got = experiment.collect(tmp_path, TINY)
  assert [(r["seed"], r["steps"], r["outcome"]) for r in got] == [
      (2, 12, "unfinished (stable so far)"), (10, 12, "unfinished (stable so far)")]
  bad = tmp_path / "fa2" / "seed2" / "metrics.jsonl"
  bad.write_text('{"step": 1, "lo\n' + json.dumps(rows[1]) + "\n")
  with pytest.raises(json.JSONDecodeError):
    experiment.collect(tmp_path, TINY)


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
  (pathlib.Path(cfg.out_dir) / "config.json").write_text(json.dumps(
      dict(train=json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))))
  (pathlib.Path(cfg.out_dir) / "summary.json").write_text("{}")
  assert train.config_changes(cfg.out_dir, cfg) == {}
  assert train.config_changes(cfg.out_dir, dataclasses.replace(cfg, max_seconds=5.0)) == {}
  changed = dataclasses.replace(TINY, lr=0.03)
  assert train.config_changes(cfg.out_dir, experiment.variant_config(
      changed, "paper", 0, cfg.out_dir, tiles=32)) == {"lr": (TINY.lr, 0.03)}
  with pytest.raises(ValueError, match=r"lr: 0.003 → 0.03"):
    experiment.run_matrix(changed, ["paper"], [0], tmp_path, tiles=32, log=lambda *a: None)
  with pytest.raises(ValueError, match=r"attention: .*block_k=32.* → .*block_k=64"):
    experiment.run_matrix(TINY, ["paper"], [0], tmp_path, tiles=64, log=lambda *a: None)
  with pytest.raises(ValueError, match=r"tiles=100"):
    experiment.run_matrix(TINY, ["xla", "paper"], [0], tmp_path, tiles=100, log=lambda *a: None)
  # steps may change when the cosine length is fixed (a capped run extended), not otherwise
  fixed = dataclasses.replace(cfg, decay_steps=100)
  (pathlib.Path(cfg.out_dir) / "config.json").write_text(json.dumps(
      dict(train=json.loads(json.dumps(dataclasses.asdict(fixed), default=str)))))
  assert train.config_changes(cfg.out_dir, dataclasses.replace(fixed, steps=fixed.steps + 10)) == {}
  assert "steps" in train.config_changes(cfg.out_dir, dataclasses.replace(cfg, steps=cfg.steps + 10))
