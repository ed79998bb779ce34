# gangctl: `make demo` and `make test` work on a fresh machine with Python 3.11+ and Go 1.26+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test checks unit integration lint build image clean-cluster cold-ci

# Every dependency at the version and hashes of requirements-dev.lock, then gangctl itself (built with
# the locked setuptools, so nothing unhashed is downloaded).
$(STAMP): pyproject.toml requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

build: $(STAMP)  ## the pinned control-plane binaries (cached outside the repo)
	$(BIN)/gangctl cluster build

image: $(STAMP)  ## the controller image: podman (vfs), on a base made from Debian's packages (both cached outside the repo)
	$(BIN)/python -m gangctl.cluster.image

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m gangctl.api.crds --check

unit: $(STAMP)  ## no cluster; stops at the first failure
	$(BIN)/python -m pytest tests/unit -q -x --durations=5

integration: build  ## on real local clusters: the scheduler backends' modules (clusters of their own) beside the rest
	$(BIN)/python tests/run_integration.py

checks: lint unit  ## everything that needs no cluster

# The checks run beside the control-plane build (a Go build under nice that leaves a core idle while it
# downloads modules and links), and no cluster starts unless both succeed.
test: $(STAMP)  ## lint and unit tests beside the build, then integration
	$(MAKE) --no-print-directory -j2 build checks
	$(MAKE) --no-print-directory integration

cold-ci:  ## CI's own run from a fresh clone with empty caches, timed (run it on an idle machine)
	.ci/cold

demo: build
	$(BIN)/gangctl demo

clean-cluster: $(STAMP)
	$(BIN)/gangctl cluster down
