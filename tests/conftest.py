"""Suite-wide settings: hypothesis profiles, every cache the code writes kept
inside pytest's temp area, the tiers (integration tests are slow by where they
live), and fixtures more than one package's tests use. Helpers live in
`tests.support`."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

INTEGRATION = Path(__file__).parent / "integration"

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


def pytest_collection_modifyitems(items):
    """Tests under tests/integration start real engines: they are slow by where they live."""
    for item in items:
        if INTEGRATION in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)


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
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    ``HBENCH_TEST_TORCH_THREADS`` sets another count (scripts/kernel_paths.sh
    runs the float comparisons on more threads, a different summation order)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("HBENCH_TEST_TORCH_THREADS", "1")))
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
