#!/usr/bin/env bash
# Creates .venv with Python >= 3.12 (JAX 0.11 needs it) and installs the project pinned to the
# versions of the H200 image (constraints.txt). `bash scripts/setup.sh test` adds pytest and
# ruff, and the PyTorch environment of the cross-check tests (.torchvenv, a CPU build of torch,
# about 1 GB on disk). `bash scripts/setup.sh ptxas` makes only .venv-ptxas (about 1 GB): JAX with
# its CUDA 13 plugin and nvdisasm, for experiments/20_ptxas_report.py (ptxas's registers and
# spills of the Mosaic GPU kernels, compiled on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "test" ] && extras="[test]"

# The first Python >= MIN among $PYTHON, the usual names on PATH, pyenv, uv, Homebrew and
# /usr/local installs.
find_python() {
  local min=$1 c
  for c in "${PYTHON:-}" python3.12 python3.13 python3.14 python3 python \
      "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 /root/.pyenv/versions/3.1[2-9]*/bin/python3 \
      "$HOME"/.local/share/uv/python/cpython-3.1[2-9]*/bin/python3 \
      /opt/homebrew/bin/python3.1[2-9] /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
    [ -n "$c" ] || continue
    if "$c" -c "import sys; sys.exit(sys.version_info < $min)" 2>/dev/null; then echo "$c"; return; fi
  done
  return 1
}
if [ "${1:-}" = "ptxas" ]; then
  if [ ! -x .venv-ptxas/bin/python ]; then
    py=$(find_python "(3, 12)") || {
      echo "setup: ptxas needs Python >= 3.12 (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    "$py" -m venv .venv-ptxas
  fi
  .venv-ptxas/bin/python -m pip install -q -c constraints.txt jax jaxlib \
    jax-cuda13-plugin==0.11.2 jax-cuda13-pjrt==0.11.2 nvidia-cuda-nvdisasm absl-py 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
  command -v ptxas > /dev/null || echo "setup: no ptxas on PATH: Mosaic GPU runs the first" \
    "one (a CUDA toolkit's, or pip's nvidia-cuda-nvcc); experiments/20_ptxas_report.py needs it"
  echo "ready: PYTHONPATH=. .venv-ptxas/bin/python experiments/20_ptxas_report.py"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  py=$(find_python "(3, 12)") || {
    echo "setup: needs Python >= 3.12 (JAX 0.11 does) with venv and pip; none found on PATH," \
      "in pyenv, uv or /usr/local. Install one, or set PYTHON=/path/to/python3.12" >&2; exit 1; }
  "$py" -m venv .venv
fi
# pip's own exit status (pipefail), its location warnings filtered out and Python's warnings
# off (setuptools' ten-line note on every editable install; pip's errors are not warnings)
pip_quiet() { PYTHONWARNINGS=ignore "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
pip_quiet .venv/bin/python -m pip install -q --upgrade pip \
  || echo "setup: pip could not upgrade itself (above); going on with the one the venv has" >&2
pip_quiet .venv/bin/python -m pip install -q -c constraints.txt -e ".$extras" \
  || { echo "setup: installing the project into .venv failed (pip's output above)" >&2; exit 1; }
.venv/bin/python -c "import jax_flashstable, jax; print('jax-flashstable ready: jax', jax.__version__)"

# The PyTorch side of `flashstable crosscheck` and of the training twin runs in its own
# environment (torch never enters the JAX one), with torch's CPU build (torch==2.13.0+cpu,
# ~200 MB download, ~1 GB installed; PyPI's default torch is a CUDA build of several GB): from a
# local wheel where pip's configuration has one (Python 3.11 here), else from PyTorch's CPU
# index. If it cannot be made, the PyTorch tests are skipped with the reason.
if [ "${1:-}" = "test" ] && [ ! -x .torchvenv/bin/python ]; then
  tpy=$(command -v python3.11 || echo .venv/bin/python)
  if "$tpy" -m venv .torchvenv && .torchvenv/bin/python -m pip install -q "torch==2.13.0+cpu" numpy \
      --extra-index-url https://download.pytorch.org/whl/cpu > .torchvenv/pip.log 2>&1; then
    echo "PyTorch environment ready: .torchvenv ($(.torchvenv/bin/python -c 'import torch; print(torch.__version__)'))"
  else
    echo "PyTorch environment not set up (see .torchvenv/pip.log); its tests will be skipped"
  fi
fi
