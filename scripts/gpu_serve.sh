#!/usr/bin/env bash
# Latte served by a real tritonserver on a GPU, in one call of a lent machine (docs/gpu.md,
# "Served on the GPU"):
#
#   OUT=build/gpu scripts/gpu_serve.sh              # on the GPU machine, KIND_GPU
#   PYTHON=.venv/bin/python scripts/gpu_serve.sh --rehearse   # here: the same steps, KIND_CPU
#   RANKER_S=70 ... scripts/gpu_serve.sh --plan   # whether TOTAL_S holds every part's whole budget
#
# What tritonserver needs travels as one archive built from pinned wheels by
# `python3 scripts/gpu_pack.py --python X.Y` (build/gpu-pack/triton-pyX.Y.tar.xz, X.Y the
# machine's python3; ignored by git). The script unpacks it, makes a venv over the machine's python3
# that reads the machine's packages after its own (numpy 1.26 of the archive first: Triton 2.51's
# stub answers with empty outputs under numpy 2), builds latte there (with CUDA where nvcc is),
# lays out its backend, and measures, each part stopped at its own time limit so the whole
# ends on time, a failed part leaving the next ones to run:
#   1. the ranker, latte KIND_GPU against the stock Python model running the same TorchScript
#      on the same GPU one request at a time (benchmarks/serving.py, interleaved rounds);
#   2. the sequence encoder, the same way;
#   3. the arena against the caching allocator under the server, and fp16 through the accuracy
#      gate (benchmarks/gpu_served.py);
#   4. the fused text pipeline against its Triton ensemble, its encoder TorchScript on the GPU
#      (benchmarks/pipelines.py --format torchscript --gpus 1);
#   5. checks of the device arena's pages: `pytest -m gpu` on the device memory tests, and the C++
#      device-pages and arena stress tests built with invariant checks, under compute-sanitizer;
#   6. PyTorch in process with the paged arena, the plain one and the caching allocator with and
#      without expandable segments, three interleaved rounds, then under a cap of 1.10x the live
#      bytes (benchmarks/gpu_allocator.py).
# Parts run in the order 5, 1, 2, 3, 6, 4.
# Back under $OUT: log.txt (everything printed), env.txt, results.tar.gz (benchmarks/results
# files and the servers' logs). Unpack results.tar.gz into benchmarks/results and render the page
# with `.venv/bin/python -m latte.bench.page`.
set -uo pipefail
cd "$(dirname "$0")/.."
rehearse=0 plan_only=0
case "${1:-}" in
  --rehearse) rehearse=1 ;;
  --plan) plan_only=1 ;;
  "") ;;
  *) echo "gpu_serve: unknown argument ${1} (usage: scripts/gpu_serve.sh [--rehearse | --plan])" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
out="${OUT:-build/gpu}"
if [ "$plan_only" = 0 ]; then
  mkdir -p "$out"
  exec > >(tee "$out/log.txt") 2>&1
fi
began=$SECONDS
say() { echo "[gpu_serve $((SECONDS - began))s] $*"; }

# Seconds of measuring per part (RANKER_S, SEQUENCE_S, MEMORY_S, PIPELINE_S, CHECKS_S, ALLOCATOR_S, CALL_S;
# 0 leaves a part out) and the served-memory run's windows at most (MEMORY_WINDOWS).
if [ "$rehearse" = 1 ]; then
  kind=KIND_CPU; gpus=0; ranker_s=${RANKER_S:-20}; sequence_s=${SEQUENCE_S:-20}; memory_s=${MEMORY_S:-20}
  pipeline_s=${PIPELINE_S:-20}; checks_s=${CHECKS_S:-60}; allocator_s=${ALLOCATOR_S:-0}; call_s=${CALL_S:-0}
else
  kind=KIND_GPU; gpus=1; ranker_s=${RANKER_S:-95}; sequence_s=${SEQUENCE_S:-110}; memory_s=${MEMORY_S:-55}
  pipeline_s=${PIPELINE_S:-60}; checks_s=${CHECKS_S:-90}; allocator_s=${ALLOCATOR_S:-260}; call_s=${CALL_S:-0}
fi
memory_windows=${MEMORY_WINDOWS:-4}
total_s=${TOTAL_S:-540}
for name in ranker_s sequence_s memory_s pipeline_s checks_s allocator_s call_s memory_windows total_s; do
  [[ "${!name}" =~ ^[0-9]+$ ]] || { echo "gpu_serve: ${name^^} must be a whole number of seconds (or windows), got ${!name}"; exit 2; }
done
# Seconds of loads and builds each part may spend before it measures (a model's load, the
# pipeline's generation and profiling): its allowance, on top of its seconds of measuring.
declare -A setup=([checks]=0 [one-call]=40 [ranker]=70 [sequence]=70 [served-memory]=70 [allocator]=30 [pipeline]=170)
order=(checks one-call ranker sequence served-memory allocator pipeline)
declare -A asked=([checks]=$checks_s [one-call]=$call_s [ranker]=$ranker_s [sequence]=$sequence_s
                  [served-memory]=$memory_s [allocator]=$allocator_s [pipeline]=$pipeline_s)
[ "$rehearse" = 1 ] && asked[allocator]=0
# The seconds a part measures for, started `elapsed` seconds into the run: what TOTAL_S leaves it
# after its allowance for loads and 30 s kept back, at most what it asks; 0 (left out) where that
# is under 20 s. The run and --plan both decide by this.
part_seconds() {  # name, seconds asked, seconds elapsed
  local left=$((total_s - $3 - setup[$1] - 30))
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$2" -lt "$left" ]; then echo "$2"; else echo "$left"; fi
}
# --plan walks the parts as the run will, each taking its seconds of measuring and the loads it
# took on an H200 (2026-11-28: the build 16 s; the pipeline's generation about 50 s, a served
# part's loads under 10 s), and says which would measure for less than asked or be left out.
declare -A typical=([checks]=0 [one-call]=10 [ranker]=5 [sequence]=5 [served-memory]=10 [allocator]=0 [pipeline]=55)
if [ "$plan_only" = 1 ]; then
  clock=16 short=0
  for name in "${order[@]}"; do
    want=${asked[$name]}
    [ "$want" -gt 0 ] || continue
    got=$(part_seconds "$name" "$want" "$clock")
    if [ "$got" = 0 ]; then
      echo "  $name: left out (at about ${clock} s, TOTAL_S=${total_s} leaves it under 20 s beside its ${setup[$name]} s allowance for loads)"
      short=1; continue
    fi
    [ "$got" -lt "$want" ] && { echo "  $name: ${got} s of measuring, not ${want} s (from about ${clock} s)"; short=1; } \
      || echo "  $name: ${got} s of measuring (from about ${clock} s)"
    clock=$((clock + got + typical[$name]))
  done
  echo "plan: about ${clock} s of TOTAL_S=${total_s}$([ "$short" = 1 ] && echo "; raise TOTAL_S or lower a part's seconds for every part to get what it asks")"
  exit "$short"
fi

pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  || { echo "gpu_serve: $python does not run"; exit 2; }
archive="${ARCHIVE:-build/gpu-pack/triton-py$pyver.tar.xz}"
if [ ! -f "$archive" ]; then
  echo "gpu_serve: $archive is missing; build it with: python3 scripts/gpu_pack.py --python $pyver"
  exit 2
fi

root=build/gpu-serve
rm -rf "$root" && mkdir -p "$root/results"
tar -xf "$archive" -C "$root" || { echo "gpu_serve: $archive does not unpack"; exit 2; }
"$python" scripts/gpu_pack.py --check "$root/triton" || { echo "gpu_serve: $archive lacks what the server needs"; exit 2; }
say "unpacked $archive ($(du -sh "$root/triton" | cut -f1))"

# A venv without pip of its own: the machine's pip, scikit-build-core, nanobind and torch are read
# through the .pth file (this also works where python3 is itself a venv).
venv="$root/venv"
"$python" -m venv --without-pip "$venv" || { echo "gpu_serve: cannot make a venv with $python"; exit 2; }
machine_site="$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
venv_site="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
echo "$machine_site" > "$venv_site/machine-site.pth"
cp -a "$root/triton/site/." "$venv_site/"
cp -a "$root/triton/bin/perf_analyzer" "$venv/bin/perf_analyzer"
libdir="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')")"
if [ ! -e "$libdir/libpython$pyver.so.1.0" ] && ! ldconfig -p 2>/dev/null | grep -q "libpython$pyver.so.1.0"; then
  # The stub links libpython; this python3 has none: the archive's copy (Ubuntu's) stands in.
  export LD_LIBRARY_PATH="$PWD/$root/triton/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "no libpython$pyver.so.1.0 beside $python: using the archive's"
fi

say "building latte"
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" timeout 240 "$venv/bin/python" -m pip install -q --no-deps --no-index \
  --no-build-isolation --no-cache-dir --config-settings=build-dir=build/gpu-serve-build . > "$root/build.log" 2>&1 \
  || { tail -30 "$root/build.log"; echo "gpu_serve: latte did not build (the log above, $root/build.log)"; exit 2; }
"$venv/bin/latte" install-backend 2>&1 | tail -2 || { echo "gpu_serve: latte did not install"; exit 2; }
"$venv/bin/python" - <<'PY' | tee "$out/env.txt"
import os, numpy, torch
from latte import _native
from latte.triton import find_triton
from latte.triton.perf import find_perf_analyzer
print("python", os.sys.version.split()[0], "| numpy", numpy.__version__, "| torch", torch.__version__,
      "| cuda", torch.version.cuda, "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("native core:", _native.build_info())
print("tritonserver:", find_triton().server)
print("perf_analyzer:", find_perf_analyzer())
print("cores:", os.cpu_count(), "| load average:", os.getloadavg())
PY
[ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu_serve: the venv cannot import what the measurements need"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null >> "$out/env.txt"
say "ready"

# Every part says where it is (the load it found included) and runs on: the machine's minutes count.
export LATTE_QUIET_WAIT_S=0 PYTHONUNBUFFERED=1
# The page names the command as it was typed, its settings included.
settings=""
for name in RANKER_S SEQUENCE_S MEMORY_S PIPELINE_S CHECKS_S ALLOCATOR_S CALL_S MEMORY_WINDOWS TOTAL_S; do
  [ -n "${!name:-}" ] && settings+="$name=${!name} "
done
export LATTE_RESULTS_COMMAND="${settings}scripts/gpu_serve.sh"
# The whole script ends within TOTAL_S of its start (default 540: a call may run 600): a part gets
# what is left of it less the part's own loads and builds, or is left out (part_seconds).
measure() {  # name, seconds of measuring, command (@BUDGET@: the seconds)
  local name="$1" budget="$2"; shift 2
  [ "$budget" -gt 0 ] || { say "$name: left out"; return; }
  local got
  got=$(part_seconds "$name" "$budget" $((SECONDS - began)))
  [ "$got" -gt 0 ] || { say "$name: left out (TOTAL_S=${total_s} would pass)"; return; }
  [ "$got" = "$budget" ] || { say "$name: ${got}s of measuring, not ${budget}s (TOTAL_S)"; budget=$got; }
  local limit=$((budget + setup[$name])) args=() arg
  for arg in "$@"; do args+=("${arg//@BUDGET@/$budget}"); done
  say "$name: at most ${limit}s"
  # SIGINT, not SIGTERM: Python unwinds its `with TritonServer` and stops the server it started,
  # which would otherwise keep the GPU and the ports while the next part measures.
  timeout -s INT -k 30 "$limit" "${args[@]}"
  say "$name: exit $?"
}
device_checks() {  # the paged device arena's tests, before anything measures with it
  set -o pipefail
  local status=0 test
  "$venv/bin/python" -m pytest -m gpu tests/unit/memory/test_memory_cuda.py \
    "tests/unit/test_gpu.py::test_a_served_gpu_instance_holds_its_memory_with_the_chosen_allocator" \
    -p no:cacheprovider -q -rs --junitxml="$root/results/logs/gpu-junit.xml" || status=1
  command -v nvcc > /dev/null || { echo "gpu_serve: no CUDA toolkit (nvcc): the C++ device tests are not built"; return $status; }
  cmake -S . -B build/gpu-serve-cpp -DLATTE_BUILD_PYTHON=OFF -DLATTE_BUILD_TESTS=ON -DLATTE_DEBUG_CHECKS=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$root/results/logs/cpp-build.txt" 2>&1 \
    && cmake --build build/gpu-serve-cpp -j"$(nproc)" --target test_device_pages test_cuda_arena_stress \
      >> "$root/results/logs/cpp-build.txt" 2>&1 \
    || { tail -20 "$root/results/logs/cpp-build.txt"; echo "gpu_serve: the C++ device tests did not build"; return 1; }
  # A suite that finds no CUDA device exits 77 (CTest's SKIP_RETURN_CODE): skipped, not failed.
  local sanitizer=() code
  command -v compute-sanitizer > /dev/null && \
    sanitizer=(compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3)
  for test in test_device_pages test_cuda_arena_stress; do
    LATTE_STRESS_OPS=300 "${sanitizer[@]}" "build/gpu-serve-cpp/csrc/tests/$test" 2>&1 | tail -4
    code=${PIPESTATUS[0]}
    case $code in
      0) ;;
      77) echo "gpu_serve: $test skipped (no CUDA device)" ;;
      *) echo "gpu_serve: $test failed (exit $code)"; status=1 ;;
    esac
  done
  return $status
}
mkdir -p "$root/results/logs"
export -f device_checks
export venv root
measure checks "$checks_s" bash -c device_checks
# One request at a time in process, no server: the stock loop's code, latte's runtime and latte's
# execute, each frozen and not, so a served P50 gap at concurrency 1 is traced to its part.
measure one-call "$call_s" "$venv/bin/python" benchmarks/one_call.py --device "$( [ "$gpus" = 1 ] && echo cuda || echo cpu )" \
  --calls 300 --rounds 5 --profile --json "$root/results/logs/one-call.json" --results-dir "$root/results"
measure ranker "$ranker_s" "$venv/bin/python" benchmarks/serving.py --model ranker --runtime torchscript \
  --kind "$kind" --rounds 3 --concurrency 1,32,128 --measurement-ms 1000 --budget-s @BUDGET@ \
  --results-dir "$root/results"
measure sequence "$sequence_s" "$venv/bin/python" benchmarks/serving.py --model sequence --runtime torchscript \
  --kind "$kind" --rounds 3 --concurrency 1,16,64 --measurement-ms 1000 --budget-s @BUDGET@ \
  --results-dir "$root/results"
measure served-memory "$memory_s" "$venv/bin/python" benchmarks/gpu_served.py --kind "$kind" \
  --budget-s @BUDGET@ --windows "$memory_windows" --results-dir "$root/results"
if [ "$gpus" = 1 ]; then
  measure allocator "$allocator_s" "$venv/bin/python" benchmarks/gpu_allocator.py --models sequence,encoder \
    --contenders caching,expandable,arena,arena_paged --steps "${ALLOCATOR_STEPS:-3000}" --rounds 3 \
    --cap-steps 3000 --cap-ratio 1.10 --budget-s @BUDGET@ --results-dir "$root/results"
else
  say "allocator: left out (it needs a CUDA device)"
fi
# The pipeline's repository is generated (its models profiled, the fused one too) before it measures.
measure pipeline "$pipeline_s" "$venv/bin/python" benchmarks/pipelines.py \
  --pipeline text --format torchscript --gpus "$gpus" --rounds 3 --concurrency 1,16,64 --measurement-ms 1000 \
  --budget-s @BUDGET@ --results-dir "$root/results"

find /tmp -maxdepth 2 -name '*tritonserver.log' -newer "$root/venv" -exec cp {} "$root/results/logs/" \; 2>/dev/null
tar -czf "$out/results.tar.gz" -C "$root/results" .
say "done: $(ls "$root/results" | grep -c json) results files in $out/results.tar.gz"
exec >&- 2>&-
wait  # for tee, so that log.txt is whole when $OUT is collected
