SHELL := /bin/bash
# pipefail: a failing pip stays a failure even though its output is filtered below.
.SHELLFLAGS := -o pipefail -ec
# `make demo` and `make test` work on a fresh machine: each sets up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LATTE  := $(VENV)/bin/latte
# nvidia-pytriton carries a real tritonserver 2.51 and its Python backend; its Python
# API (and its numpy<2 pin chain) is not needed, hence --no-deps.
PYTRITON := nvidia-pytriton==0.7.0

DEPS_STAMP  := $(VENV)/.deps-stamp
LATTE_STAMP := $(VENV)/.latte-stamp
SOURCES := $(shell find csrc src backend generator model_repository_templates -type f -not -name '*.pyc' 2>/dev/null) pyproject.toml CMakeLists.txt

PYTEST_ARGS ?=

.PHONY: setup demo test numpy2 promtool test-unit test-integration test-gpu test-cpp sanitize browser clean help

help:
	@echo "make demo   - set up .venv and run Latte end to end on the bundled examples"
	@echo "make test   - set up .venv and run the test suite"

setup: $(LATTE_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -m pip install -q -r requirements.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -m pip install -q --no-deps $(PYTRITON) 2>&1 | { grep -v "^WARNING: Location" || true; }
	touch $@

$(LATTE_STAMP): $(DEPS_STAMP) $(SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation . 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(LATTE) install-backend
	touch $@

demo: setup
	$(LATTE) demo

test: setup sanitize browser promtool numpy2
	$(PY) -m pytest $(PYTEST_ARGS)

# The unit suite again with numpy 2 and a current tritonclient, so that the package's ranges
# (pyproject.toml) stay true. Its venv holds only what differs from .venv, latte built against
# numpy 2 included; the rest (torch, onnxruntime, pytest) is .venv's, read after its own.
# Tests that start the bundled tritonserver 2.51 (its stub needs numpy<2) stay in .venv's run.
NUMPY2_VENV  := .venv-numpy2
NUMPY2_PY    := $(NUMPY2_VENV)/bin/python
NUMPY2_STAMP := $(NUMPY2_VENV)/.latte-stamp

numpy2: $(NUMPY2_STAMP)
	@$(NUMPY2_PY) -c "import numpy, latte; from importlib.metadata import version; tc = version('tritonclient'); \
	  print(f'unit suite with numpy {numpy.__version__}, tritonclient {tc}, latte from {latte.__path__[0]}')"
	$(NUMPY2_PY) -m pytest -q -p no:cacheprovider -m "not perf_analyzer_2_51" tests/unit

$(NUMPY2_STAMP): $(LATTE_STAMP) requirements-numpy2.txt
	[ -x $(NUMPY2_PY) ] || $(PYTHON) -m venv $(NUMPY2_VENV)
	$(NUMPY2_PY) -m pip install -q -r requirements-numpy2.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(NUMPY2_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/latte-venv.pth"
	$(NUMPY2_PY) -m pip install -q --no-deps --no-build-isolation --config-settings=build-dir=build/numpy2 . \
	  2>&1 | { grep -v "^WARNING: Location" || true; }
	touch $@

# Installs Debian package $(2) unless command $(1) is there, where it can (as root, with apt);
# otherwise the tests that need it skip and say why.
debian_package = if ! command -v $(1) >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q $(2) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(2) >/dev/null 2>&1; } || true; fi

# The report's browser tests render it in Debian's chromium; where it cannot be installed
# (no root, no apt, no network) they skip and say why.
browser:
	@$(call debian_package,chromium,chromium)
	@command -v chromium >/dev/null 2>&1 && echo "browser tests: $$(chromium --version 2>/dev/null)" || \
  echo "browser tests: no chromium (they will skip)"

# The alert rules' tests run Prometheus's promtool, from Debian's prometheus package; where it
# cannot be installed (no root, no apt, no network) they skip and say why.
promtool:
	@$(call debian_package,promtool,prometheus)
	@command -v promtool >/dev/null 2>&1 && echo "alert rule tests: $$(promtool --version 2>&1 | head -1)" || \
  echo "alert rule tests: no promtool (they will skip)"

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

# The tests that need a CUDA device (pytest -m gpu); without one every one of them skips.
# On a GPU machine without a package registry, scripts/gpu_check.sh builds and runs them
# with the machine's own torch (docs/gpu.md).
test-gpu: setup
	$(PY) -m pytest -m gpu tests $(PYTEST_ARGS)

# --- memory (BuddyArena) ---
# The C++ suites without Python: plain, then with AddressSanitizer + UBSan and every
# invariant re-checked after each operation. Separate build trees keep the flags apart.
CMAKE_TESTS := -DLATTE_BUILD_PYTHON=OFF -DLATTE_BUILD_TESTS=ON
test-cpp:
	cmake -S . -B build/cpp-tests $(CMAKE_TESTS) -DCMAKE_BUILD_TYPE=Release > /dev/null
	nice cmake --build build/cpp-tests -j2
	ctest --test-dir build/cpp-tests --output-on-failure

sanitize:
	cmake -S . -B build/cpp-sanitize $(CMAKE_TESTS) -DLATTE_SANITIZE=address,undefined -DLATTE_DEBUG_CHECKS=ON -DLATTE_CUDA=OFF > /dev/null
	nice cmake --build build/cpp-sanitize -j2
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
	  ctest --test-dir build/cpp-sanitize --output-on-failure
# --- end memory ---

clean:
	rm -rf build $(VENV) .latte

# --- scheduling (AffinityScheduler) ---
# C++ tests of the scheduler, built apart from the wheel: Debug with invariants re-checked
# (the LATTE_DEBUG_CHECKS option, the same switch `make sanitize` uses).
SCHED_TEST_BUILD := build/sched-tests
SCHED_TSAN_BUILD := build/sched-tsan
.PHONY: test-scheduling-cpp tsan

test-scheduling-cpp:
	cmake -S . -B $(SCHED_TEST_BUILD) -DLATTE_BUILD_PYTHON=OFF -DLATTE_BUILD_TESTS=ON \
	  -DCMAKE_BUILD_TYPE=Debug -DLATTE_DEBUG_CHECKS=ON > /dev/null
	cmake --build $(SCHED_TEST_BUILD) -j 2 --target test_scheduler_core stress_affinity_scheduler
	$(SCHED_TEST_BUILD)/csrc/tests/test_scheduler_core
	$(SCHED_TEST_BUILD)/csrc/tests/stress_affinity_scheduler

# The seeded multi-threaded stress test under ThreadSanitizer; any report fails the run.
tsan:
	cmake -S . -B $(SCHED_TSAN_BUILD) -DLATTE_BUILD_PYTHON=OFF -DLATTE_BUILD_TESTS=ON \
	  -DLATTE_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
	cmake --build $(SCHED_TSAN_BUILD) -j 2 --target stress_affinity_scheduler
	TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
	  $(SCHED_TSAN_BUILD)/csrc/tests/stress_affinity_scheduler
# --- end scheduling ---
