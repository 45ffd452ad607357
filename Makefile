# clef — the two commands a newcomer needs are `make demo` and `make test`.
# Everything else here is what those two build on.  Expensive things (uv, the package
# cache, the Kubernetes binaries) live under ~/.cache/clef keyed by their pins, so a
# fresh clone reuses them.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
CLEF_CACHE ?= $(HOME)/.cache/clef
UV_VERSION := 0.13.8
UV_HOME := $(CLEF_CACHE)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
export UV_CACHE_DIR ?= $(CLEF_CACHE)/uv-cache
export UV_LINK_MODE ?= hardlink
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.clef-installed

.PHONY: help
help:
	@echo "make demo    run clef on the embedded local cluster (verified rollout, a caught fault, a fixed swap)"
	@echo "make test    lint, type-check and run every test tier that this machine can run"

$(UV):
	@mkdir -p $(CLEF_CACHE)
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install -q uv==$(UV_VERSION)

$(STAMP): pyproject.toml constraints.txt | $(UV)
	$(UV) venv -q --allow-existing --python $(PYTHON) $(VENV)
	$(UV) pip install -q --python $(VPY) -c constraints.txt -e '.[operator,runtime,dev]'
	@touch $@

.PHONY: venv
venv: $(STAMP)

# Re-pin the transitive dependencies (run after changing pyproject.toml's pins).
.PHONY: lock
lock: | $(UV)
	$(UV) pip compile -q --python-version 3.11 --extra operator --extra runtime --extra dev \
	  --no-header -o constraints.txt pyproject.toml

.PHONY: lint
lint: $(STAMP)
	$(VENV)/bin/ruff check operator runtime contract devcluster tests bench
	$(VENV)/bin/ruff format --check operator runtime contract devcluster tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy bench
	bash -n bench/gpu_check.sh

.PHONY: fmt
fmt: $(STAMP)
	$(VENV)/bin/ruff format operator runtime contract devcluster tests bench
	$(VENV)/bin/ruff check --fix operator runtime contract devcluster tests bench

-include mk/*.mk

# The runtime tier is CPU-bound (Triton's interpreter); the cluster tier mostly waits on the
# control plane and the operator's loop.  So `make test` runs the two at once: each one's output is
# printed in one piece when it ends (--output-sync), and either one failing fails `make test`
# (after the other has finished).  `make test-runtime` / `make test-cluster` run one alone.  Each
# ends with its slowest tests (--durations), so a log shows where a tier's time goes.
.PHONY: test
test: $(STAMP) lint cluster-build-if-possible test-unit
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-runtime test-cluster

.PHONY: test-unit
test-unit: $(STAMP)
	$(VPY) -m pytest tests/unit -q

.PHONY: test-runtime
test-runtime: $(STAMP)
	TRITON_INTERPRET=1 $(VPY) -m pytest tests/runtime -q --durations=25 --durations-min=10

# CLEF_REQUIRE_GPU: without a usable GPU every gpu test fails instead of skipping.
.PHONY: test-gpu
test-gpu: $(STAMP)
	CLEF_REQUIRE_GPU=1 $(VPY) -m pytest tests/runtime -q -m gpu

.PHONY: clean
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
