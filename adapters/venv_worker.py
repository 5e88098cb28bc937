"""An engine's own code in its own venv, driven from hbench's process.

vLLM's scheduler and SGLang's memory code live only in the venvs their setup
scripts make (scripts/setup_vllm_cpu.sh, scripts/setup_sglang_cpu.sh), next
to torch builds hbench's own venv does not have. `run_worker` hands the
resolved ``(workload, setup)`` to a worker module under that venv's
interpreter through a pickle file and reads back the
`harness.records.EngineRun` it writes; hbench's runner then writes the
results directory as for any engine. A worker refuses a run it cannot serve
by writing one line that starts with `REFUSED` to stderr and exiting
non-zero; that line becomes the user's one `Error:` line.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from common.errors import HbenchError

REPO = Path(__file__).resolve().parents[1]
REFUSED = "hbench-refused: "


def venv_python(variable: str, needed_for: str, setup_script: str) -> str:
    """The interpreter ``variable`` names, or one line saying why it is needed."""
    python = os.environ.get(variable)
    if not python:
        raise HbenchError(f"{needed_for} and needs {variable} (the venv of {setup_script})")
    return python


def run_worker(python: str, module: str, workload, setup, *, failed: str,
               env: Mapping[str, str] | None = None):
    """The `EngineRun` the worker ``module`` returns for ``(workload, setup)``
    under ``python``; a refusal line, else ``failed`` and the worker's last
    stderr, as an `HbenchError`."""
    with tempfile.TemporaryDirectory(prefix="hbench-worker-") as tmp:
        src, dst = Path(tmp) / "in.pkl", Path(tmp) / "out.pkl"
        with open(src, "wb") as f:
            pickle.dump((workload, setup), f)
        full_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **(env or {})}
        done = subprocess.run([python, "-m", module, str(src), str(dst)], cwd=REPO,
                              env=full_env, capture_output=True, text=True)
        if done.returncode:
            refused = [line for line in done.stderr.splitlines() if line.startswith(REFUSED)]
            if refused:
                raise HbenchError(refused[-1][len(REFUSED):])
            raise HbenchError(f"{failed}:\n" + done.stderr[-3000:])
        with open(dst, "rb") as f:
            return pickle.load(f)
