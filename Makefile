# Switchyard developer commands. `make test` is what CI runs (.ci/run); `make serve` is the README's first command.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SY := $(BIN)/switchyard
REPO ?= model_repository
PACKAGES := exporter services examples

.PHONY: install triton-install triton models zoo serve test lint typecheck pytest bench clean-models

install: $(VENV)/.installed triton-install

# Re-runs only when pyproject.toml changes; the torch==2.13.0 CPU wheel is found on local disk via PIP_FIND_LINKS.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[export,dev]'
	touch $@

# Local CPU Triton (nvidia-pytriton wheel + python-backend stub env) under .triton/; idempotent, ~1 s when done.
triton-install:
	PYTHON=$(PYTHON) deploy/triton/install.sh

# A real Triton (CPU, explicit model control) serving the repository through a derived python-backend copy.
triton: install
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	$(SY) triton --repository $(REPO) --load classifier --load mlp

# Versions 1 and 2 of each example (v2 has other weights); existing versions are kept, so this is idempotent.
models: install
	$(BIN)/python -m examples.export_examples --repository $(REPO)

# Every zoo model (examples/zoo) in both formats into a throwaway repository; prints the README's zoo table.
zoo: install
	$(BIN)/python -m examples.zoo

serve: install
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	$(SY) serve --repository $(REPO)

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy --strict $(PACKAGES)

pytest: install
	$(BIN)/pytest

test: lint typecheck pytest

bench: install
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	$(BIN)/python loadtests/bench.py --repository $(REPO)
	$(BIN)/python loadtests/bench_triton.py --repository $(REPO)

clean-models:
	rm -rf $(REPO)/classifier $(REPO)/mlp
