"""The harness core: what a run is and how its memory is organized.

Configs, model geometry, budgets, the organizations, the scheduler, an
engine's records, the results directory and the metrics. Data flows one way:
workloads -> engine (scheduler + organization + executor) -> results ->
analysis. The engines (`adapters`), the statistics (`analysis`) and the
application (`hbench`) sit above this package, which imports only the layers
below it (pyproject.toml's import-linter contract).
"""

__version__ = "0.1.0"
