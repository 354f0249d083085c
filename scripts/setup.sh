#!/usr/bin/env bash
# Creates .venv with Python >= 3.12 (JAX 0.11 needs it) and installs the project pinned to the
# versions of the H200 image (constraints.txt). `bash scripts/setup.sh test` adds pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
find_python() {
  for c in "${PYTHON:-}" python3.12 python3.13 python3 /root/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then echo "$c"; return; fi
  done
  echo "no Python >= 3.12 found; set PYTHON=/path/to/python3.12" >&2; exit 1
}
if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".$extras" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import jax_flashstable, jax; print('jax-flashstable ready: jax', jax.__version__)"
# The PyTorch side of `flashstable crosscheck` runs in its own environment (torch never enters
# the JAX one). With `test`, make it where Python 3.11 is there: pip then takes the local
# torch 2.13.0 CPU wheel. Without it the PyTorch tests are skipped with the reason.
if [ "${1:-}" = "test" ] && [ ! -x .torchvenv/bin/python ] && command -v python3.11 >/dev/null 2>&1; then
  if python3.11 -m venv .torchvenv && .torchvenv/bin/python -m pip install -q torch==2.13.0 numpy \
      > .torchvenv/pip.log 2>&1; then
    echo "PyTorch environment ready: .torchvenv ($(.torchvenv/bin/python -c 'import torch; print(torch.__version__)'))"
  else
    echo "PyTorch environment not set up (see .torchvenv/pip.log); its tests will be skipped"
  fi
fi
