# Switchyard developer commands. `make test` is what CI runs (.ci/run); `make serve` is the README's first command.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SY := $(BIN)/switchyard
REPO ?= model_repository
PACKAGES := exporter services examples loadtests
empty :=
space := $(empty) $(empty)

.PHONY: install install-gpu triton-install triton models zoo serve test test-fast lint typecheck pytest docs docs-serve bench loadtest gpu-check gpu-wheels console-screens clean-models

KSERVE := .kserve
KSERVE_SPEC := kserve==0.21.0

install: $(VENV)/.installed triton-install $(KSERVE)/.installed-$(KSERVE_SPEC)

# The installer of the three environments: uv resolves and installs what pip does (same indexes, same find-links) in
# a fraction of its time (the project's venv: ~17 s against pip's ~60 s, bytecode compiled as pip does). The
# environments are ordinary venvs with pip in them; uv lives in a venv of its own.
UV_VERSION := 0.13.9
UV_HOME := .tools/uv
UV := $(UV_HOME)/bin/uv
# BYTECODE: every module compiled at install, so the first `switchyard` command starts as fast as the later ones
# (and every one does where PYTHONDONTWRITEBYTECODE is set); .ci/run sets it empty and lets Python write the cache
# as its tests first import each module (a small part of torch): ~20 s less install on the 2-core machine.
BYTECODE ?= --compile-bytecode
UV_INSTALL = $(UV) pip install --quiet $(BYTECODE) $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

$(UV):
	rm -rf $(UV_HOME) && $(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet 'uv==$(UV_VERSION)'

# Re-runs only when pyproject.toml changes; the torch==2.13.0 CPU wheel is found on local disk via PIP_FIND_LINKS.
$(VENV)/.installed: pyproject.toml | $(UV)
	@echo "make install: $(VENV)/ (the project, torch CPU, onnxruntime, the test tools; ~15 s the first time)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV_INSTALL) --python $(BIN)/python -e '.[export,dev]'
	touch $@

# A GPU node (docs/install.md, GPU nodes; the Dockerfile's build-gpu stage runs the same lines): the gpu extra, then
# onnxruntime-gpu in place of the CPU wheel, since both install the module `onnxruntime` and an extra cannot remove a
# dependency; the cuda/cudnn extras bring CUDA 12 and cuDNN 9 as wheels. The last line says whether onnxruntime
# offers CUDAExecutionProvider (fails when not) and whether this machine has a GPU (NVML). Run it again after
# `make install` re-runs (a pyproject.toml change), which puts the CPU wheel back.
GPU_ONNXRUNTIME := onnxruntime-gpu[cuda,cudnn]>=1.20
install-gpu: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[gpu]'
	$(BIN)/python -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu
	$(BIN)/python -m pip install --quiet '$(GPU_ONNXRUNTIME)'
	$(BIN)/python -m services.gateway.backends.nvml

# KServe's own Python SDK, which tests/kserve_sdk.py drives against the gateway, in an environment of its own: its gRPC
# stubs and tritonclient's define the same protobuf package (one interpreter cannot load both), and it would hold
# psutil and python-dateutil back in the project's. Installs beside the other two with `make -j 2 install`.
$(KSERVE)/.installed-$(KSERVE_SPEC): | $(UV)
	@echo "make install: $(KSERVE)/ (KServe's SDK, a client the protocol tests drive; ~10 s the first time)"
	rm -rf $(KSERVE) && $(PYTHON) -m venv $(KSERVE)
	$(UV_INSTALL) --python $(KSERVE)/bin/python '$(KSERVE_SPEC)'
	touch $@

# Local CPU Triton (nvidia-pytriton wheel + python-backend stub env) under .triton/; idempotent, ~1 s when done.
triton-install: | $(UV)
	PYTHON=$(PYTHON) UV=$(UV) deploy/triton/install.sh

# A real Triton (CPU, explicit model control) serving the repository through a derived python-backend copy.
triton: install
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	$(SY) triton --repository $(REPO) --load classifier --load mlp

# Versions 1 and 2 of each example (v2 has other weights); existing versions are kept, so this is idempotent.
models: $(VENV)/.installed
	$(BIN)/python -m examples.export_examples --repository $(REPO)

# Every zoo model (examples/zoo) in both formats into a throwaway repository; prints the README's zoo table.
zoo: install
	$(BIN)/python -m examples.zoo

# The embedded backend needs only the project's venv: a first `make serve` does not wait for the local Triton.
serve: $(VENV)/.installed
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	@if [ -n "$$SWITCHYARD_ADMIN_TOKEN" ]; then $(SY) console --url "$${SWITCHYARD_ADMIN_URL:-http://127.0.0.1:$${SWITCHYARD_PORT:-8000}}"; fi
	$(SY) serve --repository $(REPO)

# The static checks need only the project's venv: with `make -j 3 install lint typecheck docs` they run while the local
# Triton and KServe's SDK still install (what .ci/run does).
lint: $(VENV)/.installed
	$(BIN)/ruff check .

typecheck: $(VENV)/.installed
	$(BIN)/mypy --strict $(PACKAGES)

# Four workers (pytest-xdist) on the 2-core CI machine: much of a test's time is spent waiting on a server, a browser
# or a subprocess, which more workers fill (the whole suite: 348 s with three against 420 s with two; on 2026-12-05,
# 424 s with four against 447 s with three, run one after the other; sampled, the cores were busy about 80 % of the
# run with three). Tests sharing a server stay on one worker (the groups in tests/xdist_groups.py).
pytest: install
	$(BIN)/pytest -n 4 --dist loadgroup

# The edit loop: every test not marked slow (no server, browser, export, venv or timed run), in well under 2 minutes.
test-fast: install
	$(BIN)/pytest -m "not slow"

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or a page left out of the nav.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

test: lint typecheck docs pytest

bench: install
	@if [ -z "$$(ls -d $(REPO)/*/ 2>/dev/null)" ]; then $(MAKE) --no-print-directory models; fi
	$(BIN)/python loadtests/bench.py --repository $(REPO)
	$(BIN)/python loadtests/bench_triton.py --repository $(REPO)
	$(BIN)/python loadtests/bench_workers.py --repository $(REPO)
	$(BIN)/python loadtests/bench_observability.py --repository $(REPO)
	$(BIN)/python loadtests/bench_model_cache.py --repository $(REPO)

# The GPU check (loadtests/gpu_check.py; docs/benchmarks.md, GPU check): the example classifier as TorchScript on CUDA
# through the embedded backend, its answers against the CPU's, req/s at 1, 32 and 128 clients with 1 worker and one
# per core against the in-process GPU figure; ~3-5 minutes, sized for a lent GPU machine. It runs from the checkout
# as it is, without `make install` (such a machine has no network): the venv's python where there is one, else
# python3. GPU_CHECK_ARGS passes options, e.g. '--device cpu --seconds 2 --workers 2' for the dry run on a CPU.
GPU_CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_CHECK_PYTHON) loadtests/gpu_check.py $(GPU_CHECK_ARGS)

# The gateway's own packages that a lent GPU machine lacks (it has PyTorch with CUDA, numpy, grpcio, protobuf, uvloop,
# prometheus-client, httpx, typer, rich; Python 3.12; no network), as wheels in .whl/ (git ignores it), at the versions
# this venv runs: carried with the checkout and installed there before `make gpu-check` (docs/benchmarks.md).
GPU_WHEELS := annotated-types fastapi fastapi-offline grpcio-health-checking httptools opentelemetry-api orjson \
	pydantic pydantic-core pydantic-settings python-dotenv redis starlette tritonclient typing-inspection uvicorn
GPU_WHEEL_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64,--platform $(p))
gpu-wheels: $(VENV)/.installed
	rm -rf .whl && mkdir .whl
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_WHEEL_PLATFORMS) -d .whl \
		$$($(BIN)/python -m pip freeze | tr '_' '-' | grep -i -E '^($(subst $(space),|,$(GPU_WHEELS)))==' | tr '\n' ' ')
	@ls .whl | wc -l | xargs -I{} echo "gpu-wheels: {} wheels in .whl/ ($$(du -sh .whl | cut -f1))"

# Headless locust (loadtests/locustfile.py) against a running gateway: HTTP JSON + binary, gRPC and the ops user
# switching versions (needs SWITCHYARD_ADMIN_TOKEN in the environment). gRPC goes to GRPC_TARGET (HOST:PORT); left
# empty, to URL's host at the gRPC port the gateway advertises in GET /v2, else at URL's port + 1 (the log says
# which). The SLO gates set the exit code; CSV and HTML reports go to loadtests/results/.
URL ?= http://127.0.0.1:8000
GRPC_TARGET ?=
DURATION ?= 60s
USERS ?= 16
SPAWN_RATE ?= 4
MODEL ?= mlp
OPS_INTERVAL ?= 10
SLO_ERROR_RATIO ?= 0.001
SLO_P99_MS ?= infer-json=100,infer-binary=100,grpc-infer=100
LOCUST_ARGS ?=
loadtest: install
	LOCUST_GRPC_TARGET='$(GRPC_TARGET)' $(BIN)/locust -f loadtests/locustfile.py --headless --host '$(URL)' \
		--users $(USERS) --spawn-rate $(SPAWN_RATE) --run-time $(DURATION) --model '$(MODEL)' \
		--ops-interval $(OPS_INTERVAL) --slo-error-ratio $(SLO_ERROR_RATIO) --slo-p99-ms '$(SLO_P99_MS)' \
		--csv loadtests/results/locust --html loadtests/results/locust.html $(LOCUST_ARGS)

# The README's screenshots of the ops console (docs/ops-console-*.png), from a live gateway in Debian's chromium (~45 s).
console-screens: install
	$(BIN)/python -m tests.console_screens --repository $(REPO)

clean-models:
	rm -rf $(REPO)/classifier $(REPO)/mlp
