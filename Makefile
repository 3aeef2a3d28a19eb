# The two set-up commands (see README): `make demo` runs the main job, `make test` the whole suite
# (lint and types first, then pytest). Both create .venv on first use. On a CPU-only machine
# torch==2.13.0 installs a CPU build; GPU users may set TORCH_SPEC (e.g. TORCH_SPEC='torch==2.13.0'
# with their CUDA index) first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test lint

# torch is named again in the project's own install, so one resolve keeps the build installed first
# (recent pips otherwise replace a local CPU build with the newest CUDA one the range allows)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]" "$(TORCH_SPEC)"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/aurora demo

test: lint
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
