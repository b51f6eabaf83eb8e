#!/usr/bin/env bash
# Latte's GPU tests on a machine with a CUDA GPU and no package registry (CUDA toolkit,
# torch with CUDA, numpy, nanobind, scikit-build-core and pytest installed system-wide). Builds the native core with CUDA into a venv that sees the
# system's packages, runs `pytest -m gpu` and leaves a JUnit report in $OUT (or build/gpu).
# On a machine without a GPU every test it selects skips.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu}"
mkdir -p "$out"
venv=build/gpu-venv
# --system-site-packages: the machine's torch (CUDA build) and build tools, nothing downloaded.
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -5
"$venv/bin/python" - <<'PY' | tee "$out/build.txt"
import torch
from latte import _native
print("native core:", _native.build_info())
print("torch", torch.__version__, "cuda", torch.version.cuda, "device:",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
"$venv/bin/python" -m pytest -m gpu tests/unit/memory -p no:cacheprovider -q --junitxml="$out/gpu-junit.xml" \
  2>&1 | tee "$out/pytest.txt"
