"""The code digest every engine's version and the runner's are made of
(common/code_digest.py): it covers the modules that decide each engine's
numbers, so an edit there changes the version (the torch engine's with a
change in the scheduler); it is cached by file identity: the cached value is
the computed one, a current cache skips the parse, any source change or a new
module file recomputes it, and a cache that cannot be used only costs time."""

import json
import shutil
from pathlib import Path

import pytest

from common import code_digest as V
from tests.support import REPO_ROOT


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the sources and an empty cache dir of its own."""
    src = tmp_path / "src"
    for pkg in ("adapters", "common", "harness", "hbench", "workloads"):
        shutil.copytree(REPO_ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.json*"))
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return src


ROOTS = ("adapters.sim.engine", "harness.metrics")


def digest(root: Path, roots=ROOTS) -> str:
    return V.code_digest.__wrapped__(roots, root)


def test_the_cached_digest_is_the_computed_one_and_a_current_cache_skips_the_parse(tree, monkeypatch):
    computed, _ = V.compute_digest(ROOTS, tree)
    assert digest(tree) == computed
    assert V.cache_file(ROOTS, tree.resolve()).is_file()

    def no_parse(*args):
        raise AssertionError("the sources were parsed again")

    monkeypatch.setattr(V, "_imports", no_parse)
    assert digest(tree) == computed


@pytest.mark.slow
def test_editing_a_source_recomputes_the_digest(tree):
    before = digest(tree)
    with open(tree / "harness" / "metrics.py", "a") as f:
        f.write("# edited\n")
    after = digest(tree)
    assert after != before
    assert after == V.compute_digest(ROOTS, tree)[0]


@pytest.mark.slow
def test_a_new_file_where_an_imported_name_had_none_recomputes_the_digest(tree):
    before = digest(tree)
    _, identity = V.compute_digest(ROOTS, tree)
    name = next(n for n, rel, _, _ in identity if rel is None and n.startswith("harness."))
    new = tree.joinpath(*name.split(".")).with_suffix(".py")
    new.write_text("X = 1\n")
    assert digest(tree) == V.compute_digest(ROOTS, tree)[0] != before


def test_a_torn_cache_file_is_recomputed_and_replaced(tree):
    expected = digest(tree)
    file = V.cache_file(ROOTS, tree.resolve())
    file.write_text('{"format": 1, "root"')
    assert digest(tree) == expected
    assert json.loads(file.read_text())["value"]["digest"] == expected


@pytest.mark.slow
def test_an_unwritable_cache_dir_still_gives_the_digest(tree, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(blocker))   # a file: nothing can be made under it
    assert digest(tree) == V.compute_digest(ROOTS, tree)[0]
    assert blocker.read_text() == ""


def test_the_cache_dir_follows_xdg_when_hbench_cache_dir_is_unset(tmp_path, monkeypatch):
    from common.cache import cache_dir

    monkeypatch.delenv("HBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "hbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "hbench"


def test_each_set_of_roots_has_its_own_digest_and_cache_entry(tree):
    sim, metrics = ("adapters.sim.engine",), ("harness.metrics",)
    assert digest(tree, sim) != digest(tree, metrics)
    assert V.cache_file(sim, tree.resolve()) != V.cache_file(metrics, tree.resolve())


def test_a_root_that_is_no_module_is_refused(tree):
    with pytest.raises(ValueError, match="no module adapters.nowhere under"):
        digest(tree, ("adapters.nowhere",))


def files_of(roots) -> set[str]:
    return {f.relative_to(REPO_ROOT).as_posix() for f in V.source_files(roots, REPO_ROOT)}


def test_each_engines_digest_covers_the_code_that_decides_its_numbers():
    from adapters.sglang import DIGEST_ROOTS as SGLANG
    from adapters.sim.engine import DIGEST_ROOTS as SIM
    from adapters.torch.engine import DIGEST_ROOTS as TORCH
    from adapters.vllm import DIGEST_ROOTS as VLLM
    from hbench.runner import RECORDING_ROOTS

    decides = {"harness/scheduler/__init__.py", "harness/orgs/s2.py", "harness/orgs/pool.py",
               "harness/engine/loop.py", "harness/layout.py"}
    assert decides | {"adapters/sim/cost.py"} <= files_of(SIM)
    assert decides | {"adapters/torch/executor.py", "adapters/torch/model.py"} <= files_of(TORCH)
    assert {"adapters/vllm_inprocess/scheduler.py", "adapters/vllm_plugin/retention.py",
            "adapters/vllm_plugin/pages.py", "adapters/sim/cost.py",
            "harness/engine/loop.py"} <= files_of(VLLM)
    assert {"adapters/sglang_cpu/scheduler.py", "adapters/sglang_cpu/tree.py"} <= files_of(SGLANG)
    # the budget is resolved before the engine runs (harness.run_setup): recorded
    assert {"hbench/runner.py", "harness/metrics.py", "workloads/build.py",
            "harness/run_setup.py", "harness/budget.py",
            "workloads/sharegpt/derive.py", "workloads/sharegpt/arrivals.py"} \
        <= files_of(RECORDING_ROOTS)
    for roots in (SIM, TORCH, VLLM, SGLANG):
        assert not any(f.startswith(("hbench/", "analysis/")) for f in files_of(roots))


@pytest.mark.slow
@pytest.mark.parametrize("engine, edited", [
    ("torch", "harness/scheduler/__init__.py"),
    ("torch", "harness/orgs/s1.py"),
    ("sim", "harness/orgs/s1.py"),
    ("vllm", "adapters/vllm_plugin/retention.py"),
    ("vllm", "adapters/vllm_inprocess/scheduler.py"),
])
def test_editing_a_source_changes_the_engines_version(tree, engine, edited):
    """The digest part of each engine's version (its package's version aside)."""
    import importlib

    module = {"torch": "adapters.torch.engine", "sim": "adapters.sim.engine",
              "vllm": "adapters.vllm"}[engine]
    roots = importlib.import_module(module).DIGEST_ROOTS
    before = digest(tree, roots)
    with open(tree / edited, "a") as f:
        f.write("# edited\n")
    assert digest(tree, roots) != before


def test_an_engines_version_carries_its_digest():
    from adapters.sim.engine import DIGEST_ROOTS, SimEngine
    from adapters.torch.engine import DIGEST_ROOTS as TORCH
    from adapters.torch.engine import TorchEngine

    assert SimEngine().version().endswith(V.code_digest(DIGEST_ROOTS))
    assert TorchEngine().version().endswith(V.code_digest(TORCH))


def test_a_recorded_version_is_the_engines_and_the_recording_codes():
    from adapters.sim.engine import SimEngine
    from hbench.runner import RECORDING_ROOTS, recorded_version

    engine = SimEngine()
    assert recorded_version(engine) == f"{engine.version()}+{V.code_digest(RECORDING_ROOTS)}"
