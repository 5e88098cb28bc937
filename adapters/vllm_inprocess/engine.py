"""`--engine vllm` without a server: vLLM's scheduler in its own venv.

Runs in hbench's process. vLLM lives only in the venv made by
scripts/setup_vllm_cpu.sh, so `run_in_process` hands the resolved
``(workload, setup)`` to `adapters.vllm_inprocess.worker` under that venv's
interpreter (``HBENCH_VLLM_PYTHON``) through a pickle file and reads the
`harness.records.EngineRun` it writes back; hbench's runner then writes the
results directory as for any engine. A refusal in the worker (a budget vLLM
cannot serve, a model it is not given) comes back as one `HbenchError` line.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
from pathlib import Path

from common.errors import HbenchError

REPO = Path(__file__).resolve().parents[2]
#: The worker's refusal line (`adapters.vllm_inprocess.worker.REFUSED`; that
#: module imports vLLM's and is not imported here).
REFUSED = "hbench-refused: "


def vllm_python() -> str:
    python = os.environ.get("HBENCH_VLLM_PYTHON")
    if not python:
        raise HbenchError("--engine vllm without --endpoint or --launch runs vLLM's scheduler "
                          "in process and needs HBENCH_VLLM_PYTHON (the venv of "
                          "scripts/setup_vllm_cpu.sh)")
    return python


def run_in_process(workload, setup, python: str | None = None):
    """The `EngineRun` of ``workload`` decided by vLLM's scheduler and block pool."""
    python = python or vllm_python()
    with tempfile.TemporaryDirectory(prefix="hbench-vllm-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as f:
            pickle.dump((workload, setup), f)
        # HBENCH_ORG empty: vLLM's plugin loader leaves hbench's plugin inert;
        # the worker installs it itself for a plugin organization
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HBENCH_ORG": ""}
        done = subprocess.run([python, "-m", "adapters.vllm_inprocess.worker", str(src),
                               str(dst)], cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode:
            refused = [line for line in done.stderr.splitlines() if line.startswith(REFUSED)]
            if refused:
                raise HbenchError(refused[-1][len(REFUSED):])
            raise HbenchError("vLLM's scheduler failed:\n" + done.stderr[-3000:])
        with open(dst, "rb") as f:
            return pickle.load(f)
