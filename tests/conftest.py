import os

# Persistent compilation cache: Triton/interpret compiles dominate the suite's time.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jaxcache"))

import jax  # noqa: E402
import pytest  # noqa: E402

ON_GPU = jax.default_backend() == "gpu"


def pytest_report_header(config):
  return f"jax {jax.__version__}, backend {jax.default_backend()}, kernels in " + (
      "Triton (GPU)" if ON_GPU else "Pallas interpret mode (CPU)")


@pytest.fixture
def on_gpu():
  return ON_GPU
