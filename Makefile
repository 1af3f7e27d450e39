# The README's two commands live here: `make run` and `make test`. Each bootstraps .venv on first use:
# `make run` installs llmswap and what running it needs, nothing more; `make test` adds the test, lint and
# PostgreSQL extras. pip says nothing but errors (-qq), and the build backend's notices about editable
# installs are silenced (PYTHONWARNINGS): llmswap's first line is the first thing a newcomer reads.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := PYTHONWARNINGS=ignore $(PY) -m pip install -qq --disable-pip-version-check
RUN_STAMP  := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
LISTEN ?= 127.0.0.1:8080
# The suite runs in two pytest workers (pytest-xdist): most of its time is spent waiting on the processes it
# starts, so two workers take 8.8 minutes where one took 14.5 on this project's two-core machines.
# `make test TEST_JOBS=0` runs it in this process alone.
TEST_JOBS ?= 2

IMAGE  ?= llmswap
BASE_IMAGE ?= ghcr.io/ggml-org/llama.cpp:server
ENGINE ?= $(shell command -v podman || command -v docker)
ENGINE_ARGS ?=
# podman writes OCI images by default, which drop HEALTHCHECK; Docker's format keeps it.
FORMAT = $(if $(findstring podman,$(ENGINE)),--format docker)

.PHONY: run test test-unit lint bench image clean

$(RUN_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make: installing llmswap into $(VENV) (first run only)"
	@$(PIP) -e .
	@touch $@

$(TEST_STAMP): $(RUN_STAMP)
	@echo "make: installing the test extras into $(VENV) (first run only)"
	@$(PIP) -e '.[test,postgres]'
	@touch $@

run: $(RUN_STAMP)
	@LLMSWAP_LISTEN_HINT="make run LISTEN=HOST:PORT" $(VENV)/bin/llmswap --config examples/demo.yaml --listen $(LISTEN)

test: $(TEST_STAMP)
	$(PY) -m ruff check llmswap tests bench
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(TEST_JOBS) -rR tests --durations=15

test-unit: $(TEST_STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(TEST_STAMP)
	$(PY) -m ruff check llmswap tests bench
	$(PY) -m mypy

bench: $(TEST_STAMP)
	$(PY) -m bench

# The container image (Containerfile): llmswap's wheels and its dependencies' are built here first, so the
# image build needs no package index. BASE_IMAGE=...:server-cuda (or -vulkan) for the GPU variants.
image: $(RUN_STAMP)
	@test -n "$(ENGINE)" || { echo "make image: needs podman or docker" >&2; exit 1; }
	@rm -rf build/wheels
	@PYTHONWARNINGS=ignore $(PY) -m pip wheel -qq --disable-pip-version-check --wheel-dir build/wheels .
	$(ENGINE) build $(FORMAT) $(ENGINE_ARGS) --build-arg BASE_IMAGE=$(BASE_IMAGE) -f Containerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
