"""`--engine sglang` without a server: SGLang's memory code in its own venv
(``HBENCH_SGLANG_PYTHON``), run by `adapters.sglang_cpu.worker` through
`adapters.venv_worker`."""

from __future__ import annotations

from adapters.venv_worker import run_worker, venv_python


def sglang_python() -> str:
    return venv_python("HBENCH_SGLANG_PYTHON",
                       "--engine sglang without --endpoint or --launch runs SGLang's memory "
                       "code in process", "scripts/setup_sglang_cpu.sh")


def run_in_process(workload, setup, python: str | None = None):
    """The `EngineRun` of ``workload`` served by SGLang's pools and radix cache."""
    return run_worker(python or sglang_python(), "adapters.sglang_cpu.worker", workload, setup,
                      failed="SGLang's memory code failed")
