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
	$(PY) -m pytest -q tests

test-unit: $(TEST_STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(TEST_STAMP)
	$(PY) -m ruff check llmswap tests bench
	$(PY) -m mypy

bench: $(TEST_STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
