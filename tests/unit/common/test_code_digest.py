"""The simulator's source digest is cached by file identity: the cached value
is the computed one, a current cache skips the parse, any source change or a
new module file recomputes it, and a cache that cannot be used only costs time."""

import json
import shutil
from pathlib import Path

import pytest

from adapters.sim import version as V
from tests.support import REPO_ROOT


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the sources and an empty cache dir of its own."""
    src = tmp_path / "src"
    for pkg in ("adapters", "common", "harness", "hbench", "workloads"):
        shutil.copytree(REPO_ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.json*"))
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return src


def digest(root: Path) -> str:
    return V.source_digest.__wrapped__(root)


def test_the_cached_digest_is_the_computed_one_and_a_current_cache_skips_the_parse(tree, monkeypatch):
    computed, _ = V.compute_digest(tree)
    assert digest(tree) == computed
    assert V._cache_file(tree.resolve()).is_file()

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
    assert after == V.compute_digest(tree)[0]


@pytest.mark.slow
def test_a_new_file_where_an_imported_name_had_none_recomputes_the_digest(tree):
    before = digest(tree)
    _, identity = V.compute_digest(tree)
    name = next(n for n, rel, _, _ in identity if rel is None and n.startswith("harness."))
    new = tree.joinpath(*name.split(".")).with_suffix(".py")
    new.write_text("X = 1\n")
    assert digest(tree) == V.compute_digest(tree)[0] != before


def test_a_torn_cache_file_is_recomputed_and_replaced(tree):
    expected = digest(tree)
    file = V._cache_file(tree.resolve())
    file.write_text('{"format": 1, "root"')
    assert digest(tree) == expected
    assert json.loads(file.read_text())["value"]["digest"] == expected


@pytest.mark.slow
def test_an_unwritable_cache_dir_still_gives_the_digest(tree, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(blocker))   # a file: nothing can be made under it
    assert digest(tree) == V.compute_digest(tree)[0]
    assert blocker.read_text() == ""


def test_the_cache_dir_follows_xdg_when_hbench_cache_dir_is_unset(tmp_path, monkeypatch):
    from common.cache import cache_dir

    monkeypatch.delenv("HBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "hbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "hbench"
