#!/usr/bin/env bash
# Latte's GPU checks on a machine with a CUDA GPU and no package registry (CUDA toolkit, torch
# with CUDA, numpy, nanobind, scikit-build-core and pytest installed system-wide; what else the
# tests import travels as wheels in .whl/, see docs/gpu.md).
#   1. builds the native core with CUDA into build/gpu-site, over the machine's own python3;
#   2. builds the C++ suites with CUDA and invariant checks, runs them (ctest), and runs the
#      device suites under compute-sanitizer's memcheck where that tool exists (exit 77, no
#      CUDA device, counts as skipped);
#   3. runs `pytest -m gpu tests/unit`.
# Reports land in $OUT (default build/gpu): build.txt, ctest.txt, memcheck.txt, pytest.txt,
# gpu-junit.xml. On a machine without a GPU every test it selects skips.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu}"
mkdir -p "$out"
status=0
# A fresh folder each run: a wheel left from an earlier run can shadow the machine's own package.
rm -rf build/gpu-site
if compgen -G ".whl/*.whl" > /dev/null; then
  # Wheels the machine lacks (tritonclient for Triton's ModelConfig protobuf, its protobuf).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target build/gpu-site .whl/*.whl \
    || exit 1
  export PYTHONPATH="$PWD/build/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
# Latte goes into build/gpu-site beside those wheels, over the machine's own python3 (its torch
# with CUDA and its build tools; that python3 may itself be a venv, so no venv is made over it).
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target build/gpu-site . 2>&1 | tail -5
export PYTHONPATH="$PWD/build/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY' | tee "$out/build.txt" || exit 1
import torch
from latte import _native
print("native core:", _native.build_info())
print("torch", torch.__version__, "cuda", torch.version.cuda, "device:",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY

jobs=$(nproc)
cmake -S . -B build/gpu-cpp -DLATTE_BUILD_PYTHON=OFF -DLATTE_BUILD_TESTS=ON -DLATTE_DEBUG_CHECKS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$out/ctest.txt" 2>&1 \
  && cmake --build build/gpu-cpp -j"$jobs" >> "$out/ctest.txt" 2>&1 \
  && ctest --test-dir build/gpu-cpp --output-on-failure 2>&1 | tee -a "$out/ctest.txt" | tail -15 \
  || status=1
# The device suites under memcheck; one that finds no CUDA device exits 77 (CTest's
# SKIP_RETURN_CODE), which counts as skipped, not as a failure.
if command -v compute-sanitizer > /dev/null; then
  : > "$out/memcheck.txt"
  for suite in test_cuda_arena_stress test_device_pages; do
    exe=build/gpu-cpp/csrc/tests/$suite
    [ -x "$exe" ] || continue
    LATTE_STRESS_OPS=300 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 "$exe" \
      2>&1 | tee -a "$out/memcheck.txt" | tail -4
    code=${PIPESTATUS[0]}
    case $code in
      0) verdict="passed" ;;
      77) verdict="skipped (no CUDA device)" ;;
      *) verdict="failed (exit $code)"; status=1 ;;
    esac
    echo "memcheck $suite: $verdict" | tee -a "$out/memcheck.txt"
  done
fi

python3 -m pytest -m gpu tests/unit -p no:cacheprovider -q -rs --junitxml="$out/gpu-junit.xml" \
  2>&1 | tee "$out/pytest.txt" | tail -25 || status=1
exit $status
