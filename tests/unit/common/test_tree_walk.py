"""`common.tree_walk.walk` answers as ``os.walk`` does, at any depth."""

from __future__ import annotations

import os
import sys

import pytest

from common.tree_walk import walk


def _tree(root):
    for d in ("a/b/c", "a/.hidden", "d", "e/f"):
        (root / d).mkdir(parents=True)
    for f in ("x", "a/y", "a/b/c/z", "e/f/w"):
        (root / f).write_text(f)
    (root / "link").symlink_to(root / "a", target_is_directory=True)
    (root / "dangling").symlink_to(root / "nowhere")


def test_it_answers_as_os_walk_does(tmp_path):
    _tree(tmp_path)
    ours = [(p, sorted(d), sorted(f)) for p, d, f in walk(tmp_path)]
    theirs = [(p, sorted(d), sorted(f)) for p, d, f in os.walk(tmp_path)]
    assert sorted(ours) == sorted(theirs)
    assert [p for p, _, _ in walk(tmp_path)][0] == str(tmp_path)


def test_pruning_in_place_is_obeyed(tmp_path):
    _tree(tmp_path)
    seen = []
    for path, dirnames, _ in walk(tmp_path):
        seen.append(os.path.relpath(path, tmp_path))
        dirnames[:] = [d for d in dirnames if d != "a"]
    assert sorted(seen) == [".", "d", "e", "e/f"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="path length limits")
def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path):
    chain = [tmp_path]
    for _ in range(sys.getrecursionlimit() + 200):   # a level at a time: makedirs recurses
        chain.append(chain[-1] / "d")
        chain[-1].mkdir()
    (chain[-1] / "leaf").write_text("")
    try:
        list(os.walk(tmp_path))
        os_walk_fails = False
    except RecursionError:
        os_walk_fails = True
    found = [p for p, _, files in walk(tmp_path) if "leaf" in files]
    assert found == [str(chain[-1])]
    assert os_walk_fails or sys.version_info >= (3, 12)   # 3.12 made os.walk iterative
    (chain[-1] / "leaf").unlink()
    for d in reversed(chain[1:]):                      # and rmtree recurses too
        d.rmdir()


def test_a_directory_that_cannot_be_listed_goes_to_onerror(tmp_path):
    errors = []
    assert list(walk(tmp_path / "missing", errors.append)) == []
    assert len(errors) == 1 and isinstance(errors[0], FileNotFoundError)
