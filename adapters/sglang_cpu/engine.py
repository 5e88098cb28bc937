"""`--engine sglang` without a server: SGLang's memory code in its own venv.

Runs in hbench's process. SGLang lives only in the venv made by
scripts/setup_sglang_cpu.sh, so `run_in_process` hands the resolved
``(workload, setup)`` to `adapters.sglang_cpu.worker` under that venv's
interpreter (``HBENCH_SGLANG_PYTHON``) through a pickle file and reads the
`harness.records.EngineRun` it writes back; hbench's runner then writes the
results directory as for any engine.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
from pathlib import Path

from common.errors import HbenchError

REPO = Path(__file__).resolve().parents[2]


def sglang_python() -> str:
    python = os.environ.get("HBENCH_SGLANG_PYTHON")
    if not python:
        raise HbenchError("--engine sglang without --endpoint or --launch runs SGLang's memory "
                          "code in process and needs HBENCH_SGLANG_PYTHON (the venv of "
                          "scripts/setup_sglang_cpu.sh)")
    return python


def run_in_process(workload, setup, python: str | None = None):
    """The `EngineRun` of ``workload`` served by SGLang's pools and radix cache."""
    python = python or sglang_python()
    with tempfile.TemporaryDirectory(prefix="hbench-sglang-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as f:
            pickle.dump((workload, setup), f)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run([python, "-m", "adapters.sglang_cpu.worker", str(src), str(dst)],
                              cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode:
            raise HbenchError("SGLang's memory code failed:\n" + done.stderr[-3000:])
        with open(dst, "rb") as f:
            return pickle.load(f)
