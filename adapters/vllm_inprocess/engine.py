"""`--engine vllm` without a server: vLLM's scheduler in its own venv
(``HBENCH_VLLM_PYTHON``), run by `adapters.vllm_inprocess.worker` through
`adapters.venv_worker`. A refusal in the worker (a budget vLLM cannot serve,
a model it is not given) comes back as one `HbenchError` line."""

from __future__ import annotations

from adapters.venv_worker import run_worker, venv_python


def vllm_python() -> str:
    return venv_python("HBENCH_VLLM_PYTHON",
                       "--engine vllm without --endpoint or --launch runs vLLM's scheduler "
                       "in process", "scripts/setup_vllm_cpu.sh")


def run_in_process(workload, setup, python: str | None = None):
    """The `EngineRun` of ``workload`` decided by vLLM's scheduler and block pool."""
    # HBENCH_ORG empty: vLLM's plugin loader leaves hbench's plugin inert; the
    # worker installs it itself for a plugin organization
    return run_worker(python or vllm_python(), "adapters.vllm_inprocess.worker", workload,
                      setup, failed="vLLM's scheduler failed", env={"HBENCH_ORG": ""})
