"""Diagnostics inside training: values against direct computations, rows on disk, the plot."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_flashstable.cli import main
from jax_flashstable.training.data import Dataset
from jax_flashstable.training.diagnostics import converge_power_state, diagnose, init_power_state
from jax_flashstable.models.gpt2 import GPT, GPTConfig
from jax_flashstable.training.train import TrainConfig, read_diagnostics, train_and_evaluate


def test_diagnostics_match_direct_computations():
  cfg = GPTConfig.preset("tiny", block_size=64)
  g, p = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  x, y = (jnp.asarray(a) for a in Dataset().batch("train", 0, 1, 2, 64))
  power = converge_power_state(g, p, init_power_state(cfg, jax.random.key(1)), 30)
  m, power = diagnose(g, p, x, y, power, 32)  # one more step: 31 in all
  w = np.asarray(p["h"][1]["attn"]["c_attn"]["kernel"][...], np.float64)
  c, d = cfg.n_embd, cfg.head_dim
  # power iteration approaches σ_max from below; random init has close singular values
  for est, true in (
    (m["sn_q_full"][1], np.linalg.norm(w[:, :c], 2)),
    (m["sn_k"][1, 1], np.linalg.norm(w[:, c + d : c + 2 * d], 2)),
  ):
    assert 0.99 * true <= float(est) <= true * (1 + 1e-5), (est, true)
  assert m["tie_rate"].shape == (2, 2) and np.all((m["tie_rate"] >= 0) & (m["tie_rate"] <= 1))
  assert np.all(m["entropy"] > 0) and np.all(m["entropy"] <= np.log(64) + 1e-5)
  # bf16 flash vs fp32 on sampled rows: small but measured (not identically zero)
  assert np.all(np.abs(m["o_err"]) < 1e-2) and np.any(m["o_err"] != 0)


def test_diagnostics_rows_and_plot(tmp_path):
  cfg = TrainConfig(  # test_train.cfg's step and diagnostics: one compile for both files
    model="tiny",
    model_overrides=(("block_size", 32),),
    steps=4,
    decay_steps=10,
    batch_size=4,
    lr=3e-3,
    warmup_steps=2,
    eval_interval=0,
    diag_interval=2,
    diag_rows=4,
    progress=False,
    out_dir=str(tmp_path / "run"),
  )
  train_and_evaluate(cfg)
  rows = read_diagnostics(cfg.out_dir)
  assert [r["step"] for r in rows] == [2, 4]
  assert np.asarray(rows[0]["sn_q"]).shape == (2, 2) and np.asarray(rows[0]["sn_q_full"]).shape == (
    2,
  )
  assert main(["plot", cfg.out_dir]) == 0
  assert (tmp_path / "run" / "diagnostics.png").read_bytes()[:4] == b"\x89PNG"
