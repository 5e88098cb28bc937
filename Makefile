# hbench: two commands for a newcomer, `make run` and `make test`.
PY    ?= python3
VENV  ?= .venv
EXTRAS ?= dev
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

## Install, then serve the study's working point on the simulator (S2, budget b83).
run: install
	$(BIN)/hbench run --org s2 --budget b83 --rate 2

## The import layers (pyproject.toml's [tool.importlinter]), then the whole
## test suite (the command CI runs).
test: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

## Benchmarks: numbers go to stdout; see docs/benchmarks.md for recorded figures.
bench: install
	$(BIN)/python benchmarks/bench_workload.py
	$(BIN)/python -m benchmarks.bench_orgs
	$(BIN)/python -m benchmarks.bench_run
	$(BIN)/python -m benchmarks.bench_process
	$(BIN)/python -m benchmarks.bench_cost
	$(BIN)/python -m benchmarks.bench_client
	$(BIN)/python -m benchmarks.bench_torch_model
	$(BIN)/python -m benchmarks.bench_torch_engine

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
