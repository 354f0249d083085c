"""Data-parallel training on 4 simulated CPU devices (a subprocess, since the device count is
fixed when JAX starts): same losses as one device, and no all-gather of query/key/value."""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import jax, numpy as np
    from flax import nnx
    from jax_flashstable.data import Dataset
    from jax_flashstable.parallel import data_mesh
    from jax_flashstable.train import TrainConfig, init_state, make_steps, read_metrics, train_and_evaluate
    assert jax.device_count() == 4, jax.devices()
    base = dict(model="tiny", model_overrides=(("block_size", 32),), steps=3, batch_size=8,
                warmup_steps=1, eval_interval=0, progress=False)
    losses = {}
    for dp in (False, True):
        out = tempfile.mkdtemp()
        train_and_evaluate(TrainConfig(**base, data_parallel=dp, out_dir=out))
        losses[dp] = [r["loss"] for r in read_metrics(out)]
    cfg = TrainConfig(**base, data_parallel=True)
    _, graphdef, params, tx, opt_state = init_state(cfg)
    step, _ = make_steps(graphdef, tx, data_mesh())
    x, y = Dataset().batch("train", 0, 1, 8, 32)
    hlo = step.lower((params, opt_state), x[None], y[None]).compile().as_text()
    print(json.dumps(dict(single=losses[False], sharded=losses[True],
                          all_gathers=hlo.count("all-gather"), all_reduces=hlo.count("all-reduce"))))
""")


def test_sharded_step_matches_single_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(r["single"]) == 3
  for a, b in zip(r["single"], r["sharded"]):
    assert abs(a - b) <= 1e-4 * abs(a), (r["single"], r["sharded"])
  assert r["all_gathers"] == 0 and r["all_reduces"] > 0, r
