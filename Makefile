# hbench: two commands for a newcomer, `make run` and `make test`.
PY    ?= python3
VENV  ?= .venv
EXTRAS ?= dev
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast test-kernel-paths lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

## Install, then serve the study's working point on the simulator (S2, budget b83).
run: install
	$(BIN)/hbench run --org s2 --budget b83 --rate 2

## The tests, laid out like the code (docs/testing.md):
##   tests/unit/PACKAGE   each package's own tests    tests/cli   the CLI end to end
##   tests/integration/ENGINE   real engines: vLLM's CPU build, SGLang's memory code
##                              (each skipped unless its venv is named, see .ci/run)
## `make test` (the README's command, what CI runs) checks the import layers
## (pyproject.toml's [tool.importlinter]) and runs every test once, in three tiers:
##   fast   unit and CLI tests not marked `slow`; alone, `make test-fast`
##   slow   the rest but `alone`: slow unit and CLI tests and the real engines. Each
##          test file runs whole on one worker (its module fixtures, e.g. a vLLM
##          server, are made once); servers mostly wait, so a second worker's CPU work
##          fills their waits on two cores
##   alone  tests that time a real server from outside (vLLM's calibration): one at a
##          time, with the CPU to themselves
## Each tier runs under a wall-time budget in seconds (tests/support/budget.py): past
## it the tier fails and names its slowest tests. A budget is the tier's time measured
## by .ci/run on the 2-core machine with room for a noisy host (docs/testing.md).
TEST_WORKERS ?= 2
BUDGET_FAST ?= 180
BUDGET_SLOW ?= 1650
BUDGET_ALONE ?= 300
FAST := --dist loadfile -m "not slow and not alone" tests/unit tests/cli
test: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(FAST) --time-budget $(BUDGET_FAST)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "slow and not alone" \
		--time-budget $(BUDGET_SLOW) --durations 15
	$(BIN)/python -m pytest -m alone --time-budget $(BUDGET_ALONE)

test-fast: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(FAST) --time-budget $(BUDGET_FAST)

## The float-comparing tests once per CPU kernel path (AVX2, scalar, two threads).
test-kernel-paths: install
	PYTHON=$(BIN)/python bash scripts/kernel_paths.sh

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
	@if [ -n "$$HBENCH_VLLM_PYTHON" ]; then $(BIN)/python -m benchmarks.bench_vllm_inprocess; \
	else echo "bench_vllm_inprocess skipped: set HBENCH_VLLM_PYTHON (scripts/setup_vllm_cpu.sh)"; fi
	$(BIN)/python -m benchmarks.bench_torch_model
	$(BIN)/python -m benchmarks.bench_torch_engine

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
