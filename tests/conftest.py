import os

from jax_flashstable.xla_cpu import DETERMINISTIC_GPU_OPS, add_flag, plain_dots

# XLA's CPU dots as the program states them (no YNNPACK fusions): the tests compare kernels with
# references computed in plain float32 dots, on the CPU also on a GPU (`jax_flashstable.xla_cpu`).
plain_dots()

# XLA's deterministic GPU ops (acts on a GPU only): the tests hold the training loop to the
# same losses for the same seed and to a resumed run equal to the uninterrupted one; without
# the flag two runs of test_train's tiny model parted at step 8, with it they matched (H100,
# 2026-12-07; likely XLA's scatter-adds with atomics; docs/training.md).
add_flag(DETERMINISTIC_GPU_OPS)

# Pallas' GPU interpret mode (the Mosaic GPU kernels on a CPU) runs each warpgroup as a JAX
# computation that blocks in barrier callbacks; some run on the XLA CPU client's thread pool,
# sized to the cores. With 2 cores, inside an outer jit, the caller and one blocked warpgroup
# took both threads and the next warpgroup never started (a hang in about half the runs of a
# jitted Mosaic GPU forward+backward; docs/architecture.md). PJRT_NPROC sizes that pool: 4, the
# caller and one interpreted kernel's three warpgroups (the Mosaic GPU backward runs its two
# kernels one after the other there). Not more: the pool also runs XLA's CPU dots, whose float32
# results change with it (test_golden's float32 head_dim 256 case passes at 1–4, fails at 8).
os.environ.setdefault("PJRT_NPROC", "4")

# Persistent compilation cache: compiles (interpret-mode kernels above all) are most of the
# suite's time and many tests compile the same program; every compile is cached, however short,
# so the tests (and both xdist workers) share them within one run too.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jaxcache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

ON_GPU = jax.default_backend() == "gpu"


def pytest_report_header(config):
  return f"jax {jax.__version__}, backend {jax.default_backend()}, kernels in " + (
    "Triton (GPU)" if ON_GPU else "Pallas interpret mode (CPU)"
  )


@pytest.fixture
def on_gpu():
  return ON_GPU


# The slowest files first (worker-seconds on 2 cores, cold cache, 2026-12-02: Mosaic GPU 242,
# twin 134, bench 125, golden 97, experiment 87, train 78, cli 59): with `--dist loadfile`
# each worker takes the next file when it is free, so a long file started last leaves the other
# worker idle at the end (645 s wall for 1,225 worker-seconds in that run).
_SLOWEST_FIRST = (
  "test_mosaic_gpu.py",
  "test_torch_twin.py",
  "test_bench.py",
  "test_golden.py",
  "test_experiment.py",
  "test_train.py",
  "test_cli.py",
)


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files keep order
