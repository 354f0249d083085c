"""The Optax training loop on the embedded real-text sample: learning, determinism, resume,
non-finite stop, explosion detection."""
import dataclasses
import json

import numpy as np
import pytest

from jax_flashstable.training.train import (ConfigError, NonFiniteError, TrainConfig,
                                            explosion_step, read_metrics, train_and_evaluate)

SMALL = (("block_size", 32),)


def cfg(tmp_path, name, **kw):
  base = dict(model="tiny", model_overrides=SMALL, steps=8, batch_size=4, lr=3e-3, warmup_steps=2,
              eval_interval=4, eval_batches=2, progress=False, out_dir=str(tmp_path / name))
  base.update(kw)
  return TrainConfig(**base)


def losses(run):
  return [r["loss"] for r in read_metrics(run.out_dir)]


def test_loss_decreases_determinism_and_resume(tmp_path):
  a = cfg(tmp_path, "a", checkpoint_interval=4, attention="fa2+comp", grad_accum=2)
  s = train_and_evaluate(a)
  la = losses(a)
  assert len(la) == 8 and la[-1] < la[0] - 0.5          # learns on real text
  rows = read_metrics(a.out_dir)
  for key in ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "param_norm"):
    assert all(np.isfinite(r[key]) for r in rows), key
  assert "val_loss" in rows[3] and "val_loss" not in rows[4]
  assert s["val_loss"] == rows[7]["val_loss"] < rows[3]["val_loss"]
  assert rows[0]["lr"] == 0.0 and rows[1]["lr"] == pytest.approx(1.5e-3)
  # same seed, same data order -> bit-identical losses
  b = dataclasses.replace(a, out_dir=str(tmp_path / "b"), checkpoint_interval=0)
  train_and_evaluate(b)
  assert losses(b) == la
  # stop after 4 steps (checkpoint at 4), resume to 8: identical to the uninterrupted run
  c = dataclasses.replace(a, out_dir=str(tmp_path / "c"), steps=4, decay_steps=8)
  train_and_evaluate(c)
  train_and_evaluate(dataclasses.replace(c, steps=8))
  assert losses(c) == la
  assert json.load(open(tmp_path / "c" / "config.json"))["n_params"] == s["n_params"]
  # running again into the same folder starts a fresh metrics file (no mixed runs)
  train_and_evaluate(dataclasses.replace(b, steps=3))
  assert [r["step"] for r in read_metrics(b.out_dir)] == [1, 2, 3]


def test_non_finite_stops_with_a_clear_message(tmp_path):
  bad = cfg(tmp_path, "bad", lr=1e30, warmup_steps=0, steps=6, checkpoint_interval=1, eval_interval=0)
  with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient at step (\d).*last finite checkpoint: step"):
    train_and_evaluate(bad)


def test_explosion_detection():
  assert explosion_step([(1, 5.0), (2, 3.0), (3, float("nan"))], 0) == 3
  steady = [(i, 3.0 + 0.5 * (i % 2)) for i in range(1, 40)]
  assert explosion_step(steady, 5) is None
  jump = steady + [(i, 9.0) for i in range(40, 60)]
  assert 40 < explosion_step(jump, 5) < 50
  assert explosion_step([(i, 9.0 if i < 5 else 3.0) for i in range(1, 30)], 10) is None


@pytest.mark.parametrize("action", ["log", "stop"])
def test_early_warning_action(tmp_path, monkeypatch, capsys, action):
  """The loop acts on the early warning as configured: "log" notes it and trains on, "stop"
  saves a checkpoint at the warning step and stops there (a rule that fires at the first
  diagnostics row after warmup that has a row before it stands in for a real logit jump)."""
  import functools
  from jax_flashstable.training import train
  monkeypatch.setattr(train, "EarlyWarning", functools.partial(train.EarlyWarning, factor=0.0, window=1))
  c = cfg(tmp_path, action, steps=10, diag_interval=2, diag_rows=4, warning_action=action)
  s = train_and_evaluate(c)
  assert s["warning_step"] == 4 and "early warning at step 4" in capsys.readouterr().out
  if action == "log":
    assert s["stopped"] is None and s["step"] == 10
  else:
    assert s["stopped"] == "warning" and s["step"] == 4
    assert sorted(p.name for p in (tmp_path / action / "checkpoints").iterdir()) == ["4"]
  with pytest.raises(ValueError, match="warning_action='shout'"):
    train_and_evaluate(dataclasses.replace(c, warning_action="shout"))


# --- bad values: refused with a message naming them ----------------------------------------

@pytest.mark.parametrize("field,value,message", [
    ("steps", -5, "steps=-5 must be an integer ≥ 1"), ("steps", 0, "steps=0"),
    ("batch_size", 0, "batch_size=0"), ("grad_accum", 0, "grad_accum=0"),
    ("lr", -1.0, "lr=-1.0 must be a finite number > 0"), ("lr", float("nan"), "lr=nan"),
    ("grad_clip", -1.0, r"grad_clip=-1.0 must be .* ≥ 0 \(0: no clipping\)"),
    ("beta2", 1.0, "beta2=1.0"), ("seed", -1, "seed=-1"), ("eval_batches", 0, "eval_batches=0"),
    ("seq_len", 0, "seq_len=0"), ("steps", 2.5, "steps=2.5"), ("progress", "yes", "progress='yes'"),
    ("warning_action", "shout", "warning_action='shout'")])
def test_bad_values_are_refused_on_construction(field, value, message):
  with pytest.raises(ConfigError, match=message):
    dataclasses.replace(TrainConfig(), **{field: value})
  assert issubclass(ConfigError, ValueError)


def test_validate_names_the_setting(tmp_path):
  ok = TrainConfig(out_dir=str(tmp_path / "new" / "run"), data=None)
  assert ok.validate() is ok and not (tmp_path / "new").exists()       # creates nothing
  (tmp_path / "file").write_text("")
  for kw, message in (
      (dict(seq_len=5000), r"seq_len=5000 exceeds the context of model 'tiny' \(block_size=128\)"),
      (dict(model="nope"), r"model='nope': unknown model preset 'nope'"),
      (dict(attention="nope"), r"attention='nope': .*'nope'"),
      (dict(attention_overrides=((5, "xla"),)), "layer 5, but n_layer=2"),
      (dict(model_overrides=(("n_head", 0),)), r"model_overrides=.*n_head=0 must be an integer ≥ 1"),
      (dict(data=str(tmp_path / "missing")), r"data='.*missing': folder not found"),
      (dict(out_dir=str(tmp_path / "file")), r"out_dir='.*file' is a file, not a folder"),
      (dict(out_dir=str(tmp_path / "file" / "run")), r"out_dir='.*run' cannot be created"),
      (dict(out_dir="/proc/no/such/run"), r"out_dir='/proc/no/such/run' cannot be created")):
    with pytest.raises(ConfigError, match=message):
      dataclasses.replace(ok, **kw).validate()


def test_grad_clip_zero_means_no_clipping():
  """nanoGPT's grad_clip=0 is "off": the update is AdamW's own (not 0), and a zero gradient
  gives a zero update (not NaN, which clip_by_global_norm(0) gives)."""
  import jax.numpy as jnp
  import optax
  from jax_flashstable.training.train import make_optimizer
  c = TrainConfig(grad_clip=0.0, warmup_steps=0, lr=1e-2)
  params = {"w": jnp.ones((3, 3))}
  tx = make_optimizer(c)
  plain = optax.adamw(c.schedule(), b1=c.beta1, b2=c.beta2, eps=c.eps, weight_decay=0.0)
  grads = {"w": jnp.full((3, 3), 10.0)}
  got, _ = tx.update(grads, tx.init(params), params)
  want, _ = plain.update(grads, plain.init(params), params)
  np.testing.assert_array_equal(got["w"], want["w"])
  assert float(jnp.abs(got["w"]).min()) > 0
  zero, _ = tx.update({"w": jnp.zeros((3, 3))}, tx.init(params), params)
  assert np.isfinite(np.asarray(zero["w"])).all() and float(jnp.abs(zero["w"]).max()) == 0.0
