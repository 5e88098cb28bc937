"""`provenance.git_commit` asks one ``git status --porcelain=v2 --branch`` for
what ``git rev-parse HEAD`` and ``git status --porcelain`` answered apart, and
gives their answer in every state a checkout can be in: clean, changed,
staged, untracked, ignored, detached, with packed refs, from a worktree,
before the first commit, outside any checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
       "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True,
                          text=True).stdout


def asked_apart(cwd: Path) -> str:
    """The answer of the two questions `git_commit` asked before."""
    head = provenance._git(["rev-parse", "HEAD"], str(cwd))
    if head is None:
        return "unknown"
    status = provenance._git(["status", "--porcelain"], str(cwd))
    return head.strip() + ("-dirty" if status is None or status.strip() else "")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / ".gitignore").write_text("results/\n")
    (r / "a.txt").write_text("a\n")
    git(r, "add", ".")
    git(r, "commit", "-qm", "first")
    return r


def check(cwd: Path, expect_dirty: bool | None) -> str:
    answer = provenance.git_commit(cwd)
    assert answer == asked_apart(cwd)
    if expect_dirty is None:
        assert answer == "unknown"
    else:
        assert answer.endswith("-dirty") == expect_dirty
        assert answer.removesuffix("-dirty") == git(cwd, "rev-parse", "HEAD").strip()
    return answer


def test_clean_changed_staged_untracked_and_ignored(repo):
    check(repo, False)
    (repo / "results").mkdir()
    (repo / "results" / "x.json").write_text("{}")
    check(repo, False)            # ignored files do not count
    (repo / "new.txt").write_text("n\n")
    check(repo, True)             # untracked
    (repo / "new.txt").unlink()
    (repo / "a.txt").write_text("b\n")
    check(repo, True)             # changed
    git(repo, "add", "a.txt")
    check(repo, True)             # staged
    git(repo, "commit", "-qm", "second")
    check(repo, False)
    check(repo / "results", False)   # asked from a directory below the top


def test_detached_head_and_packed_refs(repo):
    (repo / "a.txt").write_text("c\n")
    git(repo, "commit", "-qam", "second")
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    check(repo, False)
    git(repo, "checkout", "-q", "main")
    git(repo, "pack-refs", "--all", "--prune")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    check(repo, False)


def test_a_worktree(repo, tmp_path):
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "other", str(wt))
    assert (wt / ".git").is_file()
    check(wt, False)
    (wt / "a.txt").write_text("w\n")
    check(wt, True)
    check(repo, False)


def test_before_the_first_commit_and_outside_a_checkout(tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    git(fresh, "init", "-q")
    (fresh / "a.txt").write_text("a\n")
    check(fresh, None)
    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    check(outside, None)


def test_porcelain_v2_headers_are_not_changes():
    head = "0" * 40
    assert provenance._head_and_dirty(f"# branch.oid {head}\n# branch.head main\n") == (head, False)
    assert provenance._head_and_dirty(f"# branch.oid {head}\n? new.txt\n") == (head, True)
    assert provenance._head_and_dirty("# branch.oid (initial)\n# branch.head main\n") == (None, False)


def test_the_status_asked_writes_nothing_to_the_index(repo):
    """A file whose times changed but not its contents: a plain ``git status``
    would take ``.git/index.lock`` and write the index back; `git_commit`
    asks without optional locks, so a run killed while git runs can leave no
    lock behind, and the index file is left as it was."""
    index = repo / ".git" / "index"
    later = os.stat(repo / "a.txt").st_mtime + 100
    os.utime(repo / "a.txt", (later, later))
    before = os.stat(index)
    assert provenance.git_commit(repo).endswith("-dirty") is False
    after = os.stat(index)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino, before.st_mtime_ns, before.st_size)
    git(repo, "status", "--porcelain")              # what the plain status does
    assert os.stat(index).st_mtime_ns != before.st_mtime_ns
