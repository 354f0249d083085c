"""Data-parallel training on 4 simulated CPU devices (a subprocess, since the device count is
fixed when JAX starts): same training and validation losses as one device; the shard_map step
all-reduces and gathers nothing, while the same step under a plain sharded jit gathers (so the
count can fail)."""

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import jax, numpy as np
    from flax import nnx
    from jax_flashstable.training.data import Dataset
    from jax_flashstable.training.parallel import collective_counts, data_mesh, replicate, shard_batch
    from jax_flashstable.training.train import TrainConfig, init_state, make_steps, read_metrics, train_and_evaluate
    assert jax.device_count() == 4, jax.devices()
    base = dict(model="tiny", model_overrides=(("block_size", 32),), steps=3, batch_size=8,
                warmup_steps=1, eval_interval=0, progress=False)
    losses = {}
    for dp in (False, True):
        out = tempfile.mkdtemp()
        train_and_evaluate(TrainConfig(**base, data_parallel=dp, out_dir=out))
        rows = read_metrics(out)
        losses[dp] = [r["loss"] for r in rows] + [rows[-1]["val_loss"]]
    cfg = TrainConfig(**base, data_parallel=True)
    _, graphdef, params, tx, opt_state = init_state(cfg)
    mesh = data_mesh()
    x, y = Dataset().batch("train", 0, 1, 8, 32)
    args = (replicate(mesh, (params, opt_state)), shard_batch(mesh, x[None], 1),
            shard_batch(mesh, y[None], 1))
    counts = {}
    for name, m in (("shard_map", mesh), ("plain", None)):
        step, _ = make_steps(graphdef, tx, m)
        counts[name] = collective_counts(step.lower(*args).compile().as_text())
    try:
        shard_batch(mesh, np.zeros((1, 6, 4), np.int32), 1)
        uneven = "accepted"
    except ValueError as e:
        uneven = str(e)
    print(json.dumps(dict(single=losses[False], sharded=losses[True], uneven=uneven, **counts)))
""")


def test_sharded_step_matches_single_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(r["single"]) == 4  # 3 training losses and the validation loss
  for a, b in zip(r["single"], r["sharded"]):
    assert abs(a - b) <= 1e-4 * abs(a), (r["single"], r["sharded"])
  moved = {k: n for k, n in r["shard_map"].items() if k != "all_reduces" and n}
  assert not moved and r["shard_map"]["all_reduces"] > 0, r  # gradients all-reduced only
  assert r["plain"]["all_gathers"] > 0, r
  assert "batch size 6" in r["uneven"], r["uneven"]
