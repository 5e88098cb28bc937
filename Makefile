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
## test suite (the command CI runs), on TEST_WORKERS processes. Each test file
## runs whole on one worker (its module fixtures, e.g. a vLLM server, are made
## once); much of the suite waits on servers and subprocesses, so two workers
## halve its wall time on two cores. Tests marked `alone` time a real server
## from outside (vLLM's calibration): a second worker's load would be in their
## numbers, so they run afterwards, one at a time.
TEST_WORKERS ?= 2
test: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone"
	$(BIN)/python -m pytest -m alone

lint: install
	$(BIN)/ruff check .

## Benchmarks: numbers go to stdout; see docs/benchmarks.md for recorded figures.
bench: install
	$(BIN)/python benchmarks/bench_workload.py
	$(BIN)/python -m benchmarks.bench_orgs
	$(BIN)/python -m benchmarks.bench_run
	$(BIN)/python -m benchmarks.bench_process
	$(BIN)/python -m benchmarks.bench_grid_cells
	$(BIN)/python -m benchmarks.bench_scale --sizes 240,10000,100000,1000000
	$(BIN)/python -m benchmarks.bench_cost
	$(BIN)/python -m benchmarks.bench_client
	@if [ -n "$$HBENCH_VLLM_PYTHON" ]; then $(BIN)/python -m benchmarks.bench_client_vllm; \
	else echo "bench_client_vllm skipped: set HBENCH_VLLM_PYTHON (scripts/setup_vllm_cpu.sh)"; fi
	$(BIN)/python -m benchmarks.bench_torch_model
	$(BIN)/python -m benchmarks.bench_torch_engine

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
