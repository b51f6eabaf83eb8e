#!/usr/bin/env bash
# Latte served by a real tritonserver on a lent GPU: `backend: "latte"` with KIND_GPU instances
# against Triton's stock Python backend running the same TorchScript file on the same GPU, one
# request at a time (benchmarks/serving.py --runtime torchscript --kind KIND_GPU).
#
# For a GPU machine without a package registry (docs/gpu.md, "Served on the GPU"): the machine's
# python3 brings torch with CUDA and latte's build tools; what else is needed travels as wheels:
#   .whl/         tritonclient 2.51 (its wheel carries perf_analyzer) and python-rapidjson, as
#                 scripts/gpu_check.sh uses them
#   .whl-stub/    numpy 1.26 for the machine's Python: Triton 2.51's stub answers with empty
#                 outputs on numpy 2 (kept out of .whl, which gpu_check.sh installs for its tests)
#   .whl-triton/  nvidia-pytriton 0.7.0: tritonserver 2.51, its Python backend, stubs for 3.8-3.13
# (55 MB, 18 MB and 16 MB: two calls of the device tool carry them, see docs/gpu.md).
# It makes a venv over the machine's python3 that reads the machine's packages after its own
# (a .pth file, so it works where python3 is itself a venv), installs the wheels and latte
# there, lays out latte's backend directory, and runs the benchmark. Results go to $OUT/results.
#
#   KIND=KIND_GPU MODELS=ranker,sequence ROUNDS=3 OUT=build/gpu scripts/gpu_serve.sh
#
# KIND=KIND_CPU rehearses the same steps on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
kind="${KIND:-KIND_GPU}"
models="${MODELS:-ranker,sequence}"
rounds="${ROUNDS:-3}"
out="${OUT:-build/gpu}"
venv=build/gpu-serve-venv
mkdir -p "$out"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
  machine_site="$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  echo "$machine_site" > "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/machine-site.pth"
fi
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir --ignore-installed \
  .whl/*.whl .whl-stub/*.whl .whl-triton/*.whl
# Built over the machine's torch and build tools (read through the .pth file); with CUDA where
# the machine has it.
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
  --config-settings=build-dir=build/gpu-serve-build . 2>&1 | tail -5
"$venv/bin/latte" install-backend | tail -3
"$venv/bin/python" - <<'PY' | tee "$out/serve-env.txt"
import numpy, torch
from latte.triton import find_triton
print("numpy", numpy.__version__, "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("tritonserver:", find_triton().server)
PY
"$venv/bin/python" benchmarks/serving.py --model "$models" --runtime torchscript --kind "$kind" \
  --rounds "$rounds" --decompose --results-dir "$out/results" 2>&1 | tee "$out/serving.txt"
