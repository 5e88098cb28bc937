"""Suite-wide fixtures: keep every cache the code writes inside pytest's temp area."""

import os

import pytest


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
