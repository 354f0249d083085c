"""The Optax training loop on the embedded real-text sample: learning, determinism, resume,
non-finite stop, explosion detection."""

import dataclasses
import gc
import json
import math
import pathlib
import re

import numpy as np
import pytest

from jax_flashstable.training.data import Dataset
from jax_flashstable.training.train import (
  CheckpointError,
  ConfigError,
  NonFiniteError,
  TrainConfig,
  TrainingInterrupted,
  explosion_step,
  read_metrics,
  train_and_evaluate,
)

SMALL = (("block_size", 32),)


def cfg(tmp_path, name, **kw):
  """A tiny run; the cosine's length is fixed (decay_steps), so runs that differ only in their
  steps share one compiled step (`train.shared_steps`, the persistent compilation cache)."""
  base = dict(
    model="tiny",
    model_overrides=SMALL,
    steps=8,
    decay_steps=10,
    batch_size=4,
    lr=3e-3,
    warmup_steps=2,
    eval_interval=4,
    eval_batches=2,
    progress=False,
    out_dir=str(tmp_path / name),
  )
  base.update(kw)
  return TrainConfig(**base)


def losses(run):
  return [r["loss"] for r in read_metrics(run.out_dir)]


def test_loss_decreases_determinism_and_resume(tmp_path, monkeypatch):
  a = cfg(tmp_path, "a", checkpoint_interval=4, attention="fa2+comp", grad_accum=2)
  s = train_and_evaluate(a)
  la = losses(a)
  assert len(la) == 8 and la[-1] < la[0] - 0.5  # learns on real text
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
  c = dataclasses.replace(a, out_dir=str(tmp_path / "c"), steps=4)
  train_and_evaluate(c)
  said = lambda: json.load(open(tmp_path / "c" / "config.json"))["deterministic_ops"]  # noqa: E731
  assert said() is True  # conftest's XLA_FLAGS
  with monkeypatch.context() as m:  # resumed to 6 as if without it (XLA read it at the start)
    m.setenv("XLA_FLAGS", "")
    train_and_evaluate(dataclasses.replace(c, steps=6))
  assert said() is False
  train_and_evaluate(dataclasses.replace(c, steps=8))  # with it again: not every step had it
  assert said() is False and losses(c) == la
  from jax_flashstable.training import train  # b, c and c resumed from its checkpoint reused

  step, evaluate = train._SHARED_STEPS[train.step_key(a)]  # a's step: one program each
  assert step._cache_size() == 1 and evaluate._cache_size() == 1
  assert json.load(open(tmp_path / "c" / "config.json"))["n_params"] == s["n_params"]
  # running again into the same folder starts a fresh metrics file (no mixed runs)
  train_and_evaluate(dataclasses.replace(b, steps=3))
  assert [r["step"] for r in read_metrics(b.out_dir)] == [1, 2, 3]


def test_non_finite_stops_with_a_clear_message(tmp_path):
  bad = cfg(
    tmp_path, "bad", lr=1e30, warmup_steps=0, steps=6, checkpoint_interval=1, eval_interval=0
  )
  with pytest.raises(
    NonFiniteError, match=r"non-finite loss or gradient at step (\d).*last finite checkpoint: step"
  ):
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

  monkeypatch.setattr(
    train, "EarlyWarning", functools.partial(train.EarlyWarning, factor=0.0, window=1)
  )
  c = cfg(  # XLA's attention: the interrupt test's compiled step (the rule does not look at it)
    tmp_path, action, attention="xla", steps=10, diag_interval=2, diag_rows=4, warning_action=action
  )
  s = train_and_evaluate(c)
  assert s["warning_step"] == 4 and "early warning at step 4" in capsys.readouterr().out
  if action == "log":
    assert s["stopped"] is None and s["step"] == 10
  else:
    assert s["stopped"] == "warning" and s["step"] == 4
    assert sorted(p.name for p in (tmp_path / action / "checkpoints").iterdir()) == ["4"]
  with pytest.raises(ValueError, match="warning_action='shout'"):
    train_and_evaluate(dataclasses.replace(c, warning_action="shout"))


def test_dq_error_warning_in_the_loop(tmp_path, monkeypatch, capsys):
  """warning_rule="dq_error" puts `DQErrorWarning` in the loop, on warning_layer, reading the
  rows' dQ error: with a threshold of 0 it fires at the second diagnostics row after warmup
  (two rows running), here across a resume (the first part's row is replayed), and "stop"
  stops there. A rule or a layer the model lacks is one line naming it."""
  import functools
  from jax_flashstable.training import train

  monkeypatch.setattr(
    train, "DQErrorWarning", functools.partial(train.DQErrorWarning, threshold=0.0)
  )
  kw = dict(attention="xla", diag_interval=2, diag_rows=4, warning_action="stop")
  c = cfg(tmp_path, "dq", steps=4, warning_rule="dq_error", warning_layer=0, **kw)
  first = train_and_evaluate(c)  # rows at 2 (warmup) and 4: one row after warmup
  assert first["warning_step"] is None and first["step"] == 4
  assert first["warning_rule"] == "dq_error"
  s = train_and_evaluate(dataclasses.replace(c, steps=8))  # resumed: 4 replayed, 6 fires
  out = capsys.readouterr().out
  assert s["warning_step"] == c.warmup_steps + 4 == 6 and s["stopped"] == "warning"
  assert "early warning at step 6 in layer 0 (DQErrorWarning: layer 0's dQ error" in out
  rows = [json.loads(x) for x in (tmp_path / "dq" / "diagnostics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 4, 6]
  assert all(math.isfinite(max(r["dq_err"][0])) for r in rows)
  # "dq_common" reads the error's part along the keys' mean from the same rows: the rule on
  # it replays to the same step at a threshold of 0; its field name is not the rule's name
  n_layer = c.model_config().n_layer
  common = train.replay(train.early_warning(dataclasses.replace(c, warning_rule="dq_common")), rows)
  assert (common.step, common.layer, common.reads) == (6, 0, "dq_common")
  assert "layer 0's dQ error along each row's keys' mean against" in common.describe()
  with pytest.raises(
    ValueError, match=r"^reads='dq_error' must be one of \('dq_err', 'dq_common'\)$"
  ):
    train.DQErrorWarning(0, reads="dq_error")  # the rule's name, not the field's
  with pytest.raises(ValueError, match="warning_rule='dq_common' watches it"):
    dataclasses.replace(c, warning_rule="dq_common", warning_layer=n_layer).validate()
  logit = train_and_evaluate(  # the same rows under the logit rule: no warning, no stop
    cfg(tmp_path, "logit", steps=6, **kw)
  )
  assert logit["warning_step"] is None and logit["warning_rule"] == "logit"
  with pytest.raises(ValueError, match="warning_rule='loud' is not one of"):
    dataclasses.replace(c, warning_rule="loud")
  with pytest.raises(ValueError, match=f"warning_layer={n_layer} is not a layer of model"):
    dataclasses.replace(c, warning_layer=n_layer).validate()
  with pytest.raises(ValueError, match="warning_layer=-1 must be an integer ≥ 0"):
    dataclasses.replace(c, warning_layer=-1)
  # a warning asked for with nothing to watch (no diagnostics rows) is refused, not ignored
  with pytest.raises(ValueError, match=r"warning_rule='dq_error' needs diag_interval > 0"):
    dataclasses.replace(c, diag_interval=0)
  with pytest.raises(ValueError, match=r"warning_action='stop' needs diag_interval > 0"):
    dataclasses.replace(c, diag_interval=0, warning_rule="logit")
  assert dataclasses.replace(c, diag_interval=0, warning_rule="logit", warning_action="log")


# --- nothing lost, nothing silently wrong -------------------------------------------------------


def test_deterministic_sets_xlas_flag_before_jax_starts_and_refuses_after(tmp_path, monkeypatch):
  """`TrainConfig.deterministic` (`xla_cpu.deterministic_gpu_ops`): before JAX starts it adds
  --xla_gpu_deterministic_ops=true to XLA_FLAGS, and JAX then starts with it (XLA aborts on a
  flag it does not know); once JAX has started on a CPU it needs nothing (a CPU's runs repeat)
  and adds nothing; once started on a GPU without the flag, validate() refuses in one line
  before any work."""
  import os
  import subprocess
  import sys

  import jax

  from jax_flashstable.experiment.instability import check_base
  from jax_flashstable.xla_cpu import DETERMINISTIC_GPU_OPS, deterministic_gpu_ops

  def fresh(code):  # its printed lines, in a fresh interpreter on the CPU
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=1", JAX_PLATFORMS="cpu")
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout.splitlines()

  flags = f"--xla_backend_optimization_level=1 {DETERMINISTIC_GPU_OPS}"
  assert fresh(
    "import os; from jax_flashstable.xla_cpu import deterministic_gpu_ops as d; print(d()); "
    "import jax; jax.numpy.zeros(1).block_until_ready(); print(os.environ['XLA_FLAGS'])"
  ) == ["None", flags]
  # an experiment's variant (`instability.variant_config`, whose checks start JAX) adds it first
  assert fresh(
    "import os; from jax_flashstable.experiment.instability import variant_config as v\n"
    "from jax_flashstable.training.config import TrainConfig\n"
    f"v(TrainConfig(deterministic=True, out_dir={str(tmp_path / 'v')!r}), 'fa2', 0, "
    f"{str(tmp_path / 'v')!r})\n"
    "from jax._src import xla_bridge; print(xla_bridge.backends_are_initialized())\n"
    "print(os.environ['XLA_FLAGS'])"
  ) == ["True", flags]
  monkeypatch.setenv("XLA_FLAGS", "")  # this process: JAX started (conftest), on the CPU here
  if jax.default_backend() == "cpu":
    assert deterministic_gpu_ops() is None and os.environ["XLA_FLAGS"] == ""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  why = (
    f"JAX's gpu backend started without {DETERMINISTIC_GPU_OPS} in XLA_FLAGS, and XLA reads "
    "its flags once a process: set it before JAX starts"
  )
  assert deterministic_gpu_ops() == why and os.environ["XLA_FLAGS"] == ""
  with pytest.raises(ConfigError, match=f"^deterministic=True: {re.escape(why)}$"):
    cfg(tmp_path, "d", deterministic=True).validate()
  with pytest.raises(ConfigError, match=f"^deterministic=True: {re.escape(why)}$"):
    check_base(cfg(tmp_path, "d", deterministic=True))  # the experiments' first check
  monkeypatch.setenv("XLA_FLAGS", DETERMINISTIC_GPU_OPS)  # set before JAX started: nothing to say
  assert deterministic_gpu_ops() is None
  # XLA's cuDNN attention failed at the first step under the flag (jax 0.11.2, H200): refused
  # before any work, whichever layer has it, and whether the option or XLA_FLAGS set the flag
  for kw in (dict(attention="cudnn"), dict(attention_overrides=((1, "cudnn"),))):
    for flagged, by in (
      (True, "deterministic=True"),
      (False, f"XLA_FLAGS has {DETERMINISTIC_GPU_OPS}"),
    ):
      with pytest.raises(
        ConfigError, match=rf"^{by} with attention(_overrides: layer 1)?='cudnn': XLA's cuDNN "
      ):
        cfg(tmp_path, "d", deterministic=flagged, **kw).validate()
  with pytest.raises(ConfigError, match=r"^deterministic='yes' must be True or False$"):
    cfg(tmp_path, "d", deterministic="yes")


def test_a_run_is_deterministic_only_if_every_segment_was(tmp_path, monkeypatch):
  """config.json's `deterministic_ops` (`train.deterministic_ops_so_far`): the flag in this
  process and, for a resumed run, in every earlier segment; a stored config without the key
  (older versions) counts as without."""
  from jax_flashstable.training.train import deterministic_ops_so_far
  from jax_flashstable.xla_cpu import DETERMINISTIC_GPU_OPS

  run = tmp_path / "r"
  run.mkdir()
  for flags, stored, start, said in (
    (DETERMINISTIC_GPU_OPS, None, 0, True),  # a fresh run (no config.json)
    ("", None, 0, False),
    (DETERMINISTIC_GPU_OPS, {"deterministic_ops": True}, 5, True),
    (DETERMINISTIC_GPU_OPS, {"deterministic_ops": False}, 5, False),  # resumed with it
    (DETERMINISTIC_GPU_OPS, {}, 5, False),  # stored by an older version
    ("", {"deterministic_ops": True}, 5, False),  # resumed without it
    (DETERMINISTIC_GPU_OPS, {"deterministic_ops": False}, 0, True),  # trained afresh there
    (DETERMINISTIC_GPU_OPS, None, 5, False),  # resumed where no config.json says
  ):
    monkeypatch.setenv("XLA_FLAGS", flags)
    (run / "config.json").unlink(missing_ok=True)
    if stored is not None:
      (run / "config.json").write_text(json.dumps(stored))
    assert deterministic_ops_so_far(run, start) is said, (flags, stored, start)


def test_out_dir_spelling_is_not_a_configuration_change(tmp_path, monkeypatch):
  """The folder is where a run lives: `runs/r`, `runs/r/`, its absolute path, another working
  directory and a moved folder are the same run; another lr is a change, refused before any
  work with a message that names the stored value and keeps the work (no "delete")."""
  import os
  import shutil
  from jax_flashstable.training.train import ConfigError, config_changes

  monkeypatch.chdir(tmp_path)
  c = cfg(tmp_path, "r", attention="xla", out_dir="runs/r")
  pathlib.Path("runs/r/checkpoints/4").mkdir(parents=True)  # a run with a checkpoint
  pathlib.Path("runs/r/config.json").write_text(
    json.dumps(dict(train=json.loads(json.dumps(dataclasses.asdict(c), default=str))))
  )
  for spelling in ("runs/r/", "./runs/r", str(tmp_path / "runs" / "r")):
    assert config_changes("runs/r", dataclasses.replace(c, out_dir=spelling)) == {}
  (tmp_path / "elsewhere").mkdir()
  os.chdir(tmp_path / "elsewhere")
  assert config_changes("../runs/r", dataclasses.replace(c, out_dir="../runs/r")) == {}
  shutil.move(str(tmp_path / "runs" / "r"), str(tmp_path / "moved"))
  assert config_changes(tmp_path / "moved", dataclasses.replace(c, out_dir="../moved")) == {}
  # XLA's deterministic GPU ops change the order of a GPU's sums, not what the run is
  assert config_changes(tmp_path / "moved", dataclasses.replace(c, deterministic=True)) == {}
  other = dataclasses.replace(c, out_dir="../moved/", lr=0.01)
  assert config_changes("../moved/", other) == {"lr": (0.003, 0.01)}
  with pytest.raises(
    ConfigError,
    match=re.escape(
      "(lr: 0.003 → 0.01); to resume it, use its "
      "settings (lr=0.003); to train this "
      "configuration, use another out_dir"
    ),
  ) as e:
    train_and_evaluate(other)  # refused before the data or the model
  assert "delete" not in str(e.value)
  # the data folder compares as the folder it names, from any working directory
  (tmp_path / "corpus").mkdir()
  os.chdir(tmp_path)
  d = dataclasses.replace(c, data="corpus", out_dir="runs/d")
  pathlib.Path("runs/d").mkdir(parents=True)
  pathlib.Path("runs/d/config.json").write_text(
    json.dumps(
      dict(
        train=json.loads(json.dumps(dataclasses.asdict(d), default=str)),
        data_path=str(tmp_path / "corpus"),
      )
    )
  )
  os.chdir(tmp_path / "elsewhere")
  for spelling in ("../corpus", "../corpus/", str(tmp_path / "corpus")):
    assert config_changes("../runs/d", dataclasses.replace(d, data=spelling)) == {}
  assert config_changes("../runs/d", dataclasses.replace(d, data="../moved")) == {
    "data": ("corpus", "../moved")
  }


def test_run_matrix_refusal_keeps_the_run(tmp_path):
  from jax_flashstable.experiment import instability

  base = cfg(tmp_path, "unused", attention="xla")
  run = instability.variant_config(base, "xla", 0, tmp_path / "xla" / "seed0")
  pathlib.Path(run.out_dir).mkdir(parents=True)
  (pathlib.Path(run.out_dir) / "config.json").write_text(
    json.dumps(dict(train=json.loads(json.dumps(dataclasses.asdict(run), default=str))))
  )
  (pathlib.Path(run.out_dir) / "summary.json").write_text("{}")
  with pytest.raises(
    ValueError,
    match=r"lr: 0.003 → 0.01\); to keep it and train this one, use "
    r"another --out; to continue it, use its settings "
    r"\(lr=0.003\)",
  ) as e:
    instability.run_matrix(
      dataclasses.replace(base, lr=0.01), ["xla"], [0], tmp_path, log=lambda *a: None
    )
  assert "delete" not in str(e.value)


class _Interrupting(Dataset):
  """The embedded sample; Ctrl-C (a KeyboardInterrupt) when the loop asks for step `at`'s batch."""

  def __init__(self, at):
    super().__init__()
    self.at = at

  def batch(self, split, seed, step, batch_size, seq_len):
    if split == "train" and step == self.at:
      raise KeyboardInterrupt
    return super().batch(split, seed, step, batch_size, seq_len)


def test_interrupt_saves_a_checkpoint_and_resumes_exactly(tmp_path):
  """Ctrl-C at step 4 of a run without checkpoint_interval saves step 3 and says how to resume;
  the same call (out_dir spelled with a slash now) continues bit for bit as the uninterrupted
  run; once finished, a rerun trains nothing and reports the finished run (item 4)."""
  ref = cfg(tmp_path, "ref", attention="xla", steps=6, eval_interval=0, checkpoint_interval=0)
  train_and_evaluate(ref)
  want = losses(ref)
  c = dataclasses.replace(ref, out_dir=str(tmp_path / "c"))
  with pytest.raises(
    TrainingInterrupted,
    match=r"after step 3: checkpoint of step 3 in .*c/"
    r"checkpoints; to resume, rerun the same command",
  ):
    train_and_evaluate(c, _Interrupting(at=4))
  assert issubclass(TrainingInterrupted, KeyboardInterrupt)
  assert sorted(p.name for p in (tmp_path / "c" / "checkpoints").iterdir()) == ["3"]
  assert [r["step"] for r in read_metrics(c.out_dir)] == [1, 2, 3]
  s = train_and_evaluate(dataclasses.replace(c, out_dir=c.out_dir + "/"))
  assert losses(c) == want and s["step"] == 6 and "already_finished" not in s
  assert sorted(p.name for p in (tmp_path / "c" / "checkpoints").iterdir()) == ["3", "6"]
  rows = read_metrics(c.out_dir)
  again = train_and_evaluate(c)  # finished: its summary, nothing trained
  assert again["already_finished"] is True and read_metrics(c.out_dir) == rows
  assert {k: again[k] for k in rows[-1]} == rows[-1] and again["explosion_step"] is None
  assert again["n_params"] == s["n_params"] and again["warning_step"] is None


def _truncate_largest(step_dir: pathlib.Path):
  f = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  with open(f, "r+b") as fh:
    fh.truncate(f.stat().st_size // 2)


# A failed Orbax restore leaves coroutines that raise into a closed event loop when collected
# ("Exception ignored in: <coroutine _read_array_index_and_device_put>"): Orbax's, collected
# here so that the warnings are not reported under later tests.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
  c = cfg(tmp_path, "d", attention="xla", steps=4, eval_interval=0, checkpoint_interval=2)
  train_and_evaluate(c)
  want = losses(c)
  ckpt = tmp_path / "d" / "checkpoints"
  _truncate_largest(ckpt / "4")
  capsys.readouterr()
  s = train_and_evaluate(c)  # step 4 unreadable: resumes from 2
  line = capsys.readouterr().out
  assert re.search(
    r"checkpoint of step 4 in .*checkpoints cannot be read \(.*\); moved to "
    r".*checkpoints_damaged/4; resuming from step 2",
    line,
  ), line
  assert len(line.strip().splitlines()) == 1
  assert (tmp_path / "d" / "checkpoints_damaged" / "4").is_dir()  # kept, not deleted
  assert losses(c) == want and s["step"] == 4
  for step in ("2", "4"):  # none readable: stop, touch nothing
    _truncate_largest(ckpt / step)
  with pytest.raises(
    CheckpointError,
    match=r"no checkpoint in .*d/checkpoints can be read "
    r"\(step 4, 2: .*\); the folder is left as it is",
  ):
    train_and_evaluate(c)
  assert sorted(p.name for p in ckpt.iterdir()) == ["2", "4"] and losses(c) == want
  gc.collect()


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("steps", -5, "steps=-5 must be an integer ≥ 1"),
    ("steps", 0, "steps=0"),
    ("batch_size", 0, "batch_size=0"),
    ("grad_accum", 0, "grad_accum=0"),
    ("lr", -1.0, "lr=-1.0 must be a finite number > 0"),
    ("lr", float("nan"), "lr=nan"),
    ("grad_clip", -1.0, r"grad_clip=-1.0 must be .* ≥ 0 \(0: no clipping\)"),
    ("beta2", 1.0, "beta2=1.0"),
    ("seed", -1, "seed=-1"),
    # the cosine's length counts the warmup: a shorter one was lengthened unsaid
    ("decay_steps", 20, r"^decay_steps=20 must be more than warmup_steps=20: the cosine.s"),
    ("eval_batches", 0, "eval_batches=0"),
    ("seq_len", 0, "seq_len=0"),
    ("steps", 2.5, "steps=2.5"),
    ("progress", "yes", "progress='yes'"),
    ("warning_action", "shout", "warning_action='shout'"),
    # one key twice: which value wins would be silent (`checks.distinct`)
    ("model_overrides", (("n_head", 2), ("n_head", 4)), r"^model_overrides: 'n_head' given twice$"),
    ("attention_overrides", ((0, "xla"), (0, "fa2")), r"^attention_overrides: 0 given twice$"),
  ],
)
def test_bad_values_are_refused_on_construction(field, value, message):
  with pytest.raises(ConfigError, match=message):
    dataclasses.replace(TrainConfig(), **{field: value})
  assert issubclass(ConfigError, ValueError)


def test_validate_names_the_setting(tmp_path):
  ok = TrainConfig(out_dir=str(tmp_path / "new" / "run"), data=None)
  assert ok.validate() is ok and not (tmp_path / "new").exists()  # creates nothing
  (tmp_path / "file").write_text("")
  for kw, message in (
    (dict(seq_len=5000), r"seq_len=5000 exceeds the context of model 'tiny' \(block_size=128\)"),
    (dict(model="nope"), r"model='nope': unknown model preset 'nope'"),
    (dict(attention="nope"), r"attention='nope': .*'nope'"),
    (dict(attention_overrides=((5, "xla"),)), "layer 5, but n_layer=2"),
    (dict(model_overrides=(("n_head", 0),)), r"model_overrides=.*n_head=0 must be an integer ≥ 1"),
    (dict(data=str(tmp_path / "missing")), r"data='.*missing': folder not found"),
    (dict(data=str(tmp_path / "file")), r"data='.*file' is a file, not a folder"),
    (dict(out_dir=str(tmp_path / "file")), r"out_dir='.*file' is a file, not a folder"),
    (dict(out_dir=str(tmp_path / "file" / "run")), r"out_dir='.*run' cannot be created"),
    (dict(out_dir="/proc/no/such/run"), r"out_dir='/proc/no/such/run' cannot be created"),
  ):
    with pytest.raises(ConfigError, match=message):
      dataclasses.replace(ok, **kw).validate()


# An attention the model's compute_dtype or head_dim does not allow: (TrainConfig fields, the
# field the error names, the layer whose attention it is)
_ATTENTION_NOT_IN_MODEL = [
  (dict(model_overrides=(("n_embd", 600), ("n_head", 2))), "attention='fa2'", 0),
  (dict(model_overrides=(("n_embd", 600), ("n_head", 2)), attention="reference-fp32"), None, 0),
  (
    dict(model_overrides=(("compute_dtype", "float16"),), attention="fa2+comp:max_shift=10"),
    None,
    0,
  ),
  (dict(model_overrides=(("compute_dtype", "float16"),), attention="fa2+rsum"), None, 0),
  (
    dict(model_overrides=(("compute_dtype", "float16"),), attention_overrides=((1, "fa2+rsum"),)),
    "attention_overrides: layer 1='fa2+rsum'",
    1,
  ),
  (dict(model_overrides=(("compute_dtype", "float32"),), attention="stochastic"), None, 0),
]


@pytest.mark.parametrize("kw,field,layer", _ATTENTION_NOT_IN_MODEL)
def test_validate_refuses_an_attention_the_model_cannot_run(tmp_path, kw, field, layer):
  """An attention that cannot run at the model's compute_dtype or head_dim (a traceback from
  the first training step, after the model's setup, until 2026-12-06) is refused by validate,
  before anything is built or written, in one line: the field, the model's compute_dtype and
  head_dim, then word for word the error that the attention's first call in the model raises
  (`attend` on arrays of the model's dtype and head_dim)."""
  import jax
  import jax.numpy as jnp

  from jax_flashstable.attention.flax_adapter import attend

  c = TrainConfig(out_dir=str(tmp_path / "run"), **kw)
  with pytest.raises(ConfigError) as refused:
    c.validate()
  assert not (tmp_path / "run").exists()
  m = c.model_config()
  x = jnp.zeros((1, 16, m.n_head, m.head_dim), m.compute_dtype)
  with pytest.raises((ValueError, TypeError)) as called:
    attend(x, x, x, m.attention_for(layer), causal=True, rng_key=jax.random.key(0))
  field = field or f"attention={c.attention!r}"
  assert str(refused.value) == (
    f"{field} cannot run in model 'tiny' (compute_dtype={m.compute_dtype!r}, "
    f"head_dim={m.head_dim}): {called.value}"
  )


def test_validate_keeps_the_attentions_the_model_can_run(tmp_path):
  """The same check passes what the kernels take, and the model's call of each layer's
  attention, forward and backward, traces (`jax.eval_shape`: the checks a training step's trace
  makes): the stochastic layout in bfloat16, the compensation's shift capped at 6 and the paper
  layout's rounded row sum in float16, the rounded row sum in float32, the reference and XLA at
  head_dim 256; and it creates nothing."""
  import jax
  import jax.numpy as jnp

  from jax_flashstable.attention.flax_adapter import attend

  for kw in (
    dict(attention="stochastic"),
    dict(model_overrides=(("compute_dtype", "float16"),), attention="fa2+comp:max_shift=6"),
    dict(model_overrides=(("compute_dtype", "float16"),), attention="paper+comp+rsum"),
    dict(model_overrides=(("compute_dtype", "float32"),), attention="fa2+rsum"),
    dict(
      model_overrides=(("n_embd", 512), ("n_head", 2)),
      attention="reference-fp32",
      attention_overrides=((1, "xla"),),
    ),
  ):
    c = TrainConfig(out_dir=str(tmp_path / "run"), **kw)
    assert c.validate() is c, kw
    m = c.model_config()
    x = jax.ShapeDtypeStruct((1, m.block_size, m.n_head, m.head_dim), jnp.dtype(m.compute_dtype))
    for layer in range(m.n_layer):
      loss = lambda q, k, v: (
        attend(q, k, v, m.attention_for(layer), causal=True, rng_key=jax.random.key(0))
        .astype(jnp.float32)
        .sum()
      )
      jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), x, x, x)
  assert not (tmp_path / "run").exists()


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


def test_one_integer_check_serves_every_entry_point(tmp_path):
  """`checks.integer`, the one integer check of the training configuration, the model's sizes,
  the corpus preparation, the early warning and the timings: a NumPy integer is taken (and
  stored as a Python int, so config.json can hold it); a bool, 2.0 or a string is refused in
  one line naming it, as ConfigError where the configuration asks."""
  from jax_flashstable.bench.timing import median_seconds
  from jax_flashstable.checks import integer
  from jax_flashstable.models.gpt2 import GPTConfig
  from jax_flashstable.training.data import prepare_text_folder
  from jax_flashstable.training.train import DQErrorWarning

  cfg = dataclasses.replace(TrainConfig(), steps=np.int64(7))
  assert cfg.steps == 7 and type(cfg.steps) is int and json.dumps(cfg.steps) == "7"
  model = GPTConfig(n_layer=np.int32(2), n_head=2, n_embd=32, block_size=16, vocab_size=64)
  assert type(model.n_layer) is int
  assert integer("x", np.uint8(3), 0) == 3
  for bad in (True, 2.0, "3", None):
    with pytest.raises(ConfigError, match=rf"^steps={bad!r} must be an integer ≥ 1$"):
      dataclasses.replace(TrainConfig(), steps=bad)
  with pytest.raises(ValueError, match=r"^n_head=True must be an integer ≥ 1$"):
    GPTConfig(n_head=True)
  with pytest.raises(ValueError, match=r"^val_every=1.0 must be an integer ≥ 1$"):
    prepare_text_folder(tmp_path, tmp_path / "out", val_every=1.0)
  with pytest.raises(ValueError, match=r"^rows=0 must be an integer ≥ 1$"):
    DQErrorWarning(start=0, rows=0)
  with pytest.raises(ValueError, match=r"^reps=False must be an integer ≥ 1$"):
    median_seconds(lambda: None, reps=False)
  # beyond 64 bits NumPy and JAX fail with a traceback: refused in one line, every entry point
  with pytest.raises(ConfigError, match=rf"^steps={2**63} must be an integer below 2\*\*63$"):
    dataclasses.replace(TrainConfig(), steps=2**63)
  with pytest.raises(ValueError, match=rf"^n_layer={2**64} must be an integer below 2\*\*63$"):
    GPTConfig(n_layer=2**64)
  assert integer("x", 2**63 - 1, 0) == 2**63 - 1


def test_a_seed_is_one_jax_tells_apart():
  """Seeds are refused from 2**32 (`checks.random_seed`), because JAX without x64 keeps a
  seed's low 32 bits: 2**32 + 5 would silently repeat seed 5's run (checked here on JAX
  itself, so that the rule goes if JAX ever keeps more)."""
  import jax

  from jax_flashstable.checks import SEED_LIMIT, random_seed

  key = lambda s: np.asarray(jax.random.key_data(jax.random.key(s))).tolist()  # noqa: E731
  assert key(SEED_LIMIT + 5) == key(5) and key(SEED_LIMIT - 1) != key(0)
  assert random_seed("seed", np.int64(SEED_LIMIT - 1)) == SEED_LIMIT - 1
  for bad, message in (
    (SEED_LIMIT + 5, r"^seed=4294967301 must be below 2\*\*32, .*: 4294967301 would be 5\)$"),
    (-1, r"^seed=-1 must be an integer ≥ 0$"),
    (2**70, r"must be an integer below 2\*\*63$"),
    (1.0, r"^seed=1.0 must be an integer ≥ 0$"),
  ):
    with pytest.raises(ConfigError, match=message):
      dataclasses.replace(TrainConfig(), seed=bad)
