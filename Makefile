# gangctl: `make demo` and `make test` work on a fresh machine with Python 3.11+ and Go 1.26+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test unit integration lint build clean-cluster

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

build: $(STAMP)  ## the pinned control-plane binaries (cached outside the repo)
	$(BIN)/gangctl cluster build

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m gangctl.api.crds --check

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

test: build lint  ## unit tests, then integration tests on one real local cluster
	$(BIN)/python -m pytest tests -q -ra --durations=10

demo: build
	$(BIN)/gangctl demo

clean-cluster: $(STAMP)
	$(BIN)/gangctl cluster down
