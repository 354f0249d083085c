import os

# XLA's CPU backend fuses some dots into YNNPACK kernels whose accumulation is not the one the
# program asks for (seen: the float32 reference attention's P·V more accurate than float32
# arithmetic, so the rule err ≤ 2·err(standard) + 1 ulp compared flash with a better-than-fp32
# baseline; bf16 products in backward fusions without float32 accumulation). The tests compare
# kernels and references under the plain dot semantics the GPU has.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type=").strip()

# Persistent compilation cache: compiles (interpret-mode kernels above all) are most of the
# suite's time and many tests compile the same program; every compile is cached, however short,
# so the tests (and both xdist workers) share them within one run too.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jaxcache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

ON_GPU = jax.default_backend() == "gpu"


def pytest_report_header(config):
  return f"jax {jax.__version__}, backend {jax.default_backend()}, kernels in " + (
      "Triton (GPU)" if ON_GPU else "Pallas interpret mode (CPU)")


@pytest.fixture
def on_gpu():
  return ON_GPU
