# The README's two commands live here: `make run` and `make test`. Each bootstraps .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
LISTEN ?= 127.0.0.1:8080

.PHONY: run test test-unit lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,postgres]'
	touch $(STAMP)

run: $(STAMP)
	@echo "llmswap on http://$(LISTEN): its status page is http://$(LISTEN)/ui (Ctrl-C stops it)"
	$(VENV)/bin/llmswap --config examples/demo.yaml --listen $(LISTEN)

test: $(STAMP)
	$(PY) -m ruff check llmswap tests bench
	$(PY) -m mypy
	$(PY) -m pytest -q tests

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	$(PY) -m ruff check llmswap tests bench
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
