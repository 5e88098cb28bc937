"""What every hostile-input case asserts, and the hostile files they hand in.

A case passes when the command exits with the documented code (2 for bad
input), prints exactly one line and that line starts with ``Error:``, raised
no exception other than the CLI's SystemExit (no traceback), and left the
directory it was given exactly as it was (nothing written, no empty folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbench.cli import cli

#: Seconds a refused input may take: a refusal happens before any work.
REFUSAL_SECONDS = 20.0
DEEP = 200_000


def snapshot(root: Path) -> list[tuple[str, int]]:
    """Every path under ``root`` with its size (0 for directories and links)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            size = p.lstat().st_size if p.is_file() and not p.is_symlink() else 0
            out.append((str(p.relative_to(root)), size))
    return sorted(out)


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise TimeoutError in the block after ``seconds`` (the command hung)."""
    def ring(signum, frame):
        raise TimeoutError(f"no answer within {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def refused(args: list, needle: str = "", *, watch: Path | None = None, code: int = 2,
            env: dict | None = None):
    """Invoke ``hbench ARGS``; assert one ``Error:`` line (holding ``needle``),
    exit ``code``, no traceback, nothing written under ``watch``, within
    `REFUSAL_SECONDS`. Returns the error line."""
    before = snapshot(watch) if watch is not None else None
    t0 = time.monotonic()
    with _alarm(REFUSAL_SECONDS):   # a FIFO opened for reading would block forever
        res = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    elapsed = time.monotonic() - t0
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"traceback: {res.exception!r}\n{res.output}")
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert "Traceback" not in res.output
    assert needle.lower() in lines[0].lower(), lines[0]
    if watch is not None:
        assert snapshot(watch) == before, "the command wrote something"
    assert elapsed < REFUSAL_SECONDS, f"took {elapsed:.1f} s"
    return lines[0]


@contextlib.contextmanager
def deep_chain(root: Path, depth: int) -> Iterator[Path]:
    """``root/d/d/.../d``, ``depth`` directories deep, made and removed a level
    at a time (``os.makedirs`` and ``shutil.rmtree`` recurse once per level,
    and would fail on it as the code under test once did); yields the deepest."""
    chain = [root]
    for _ in range(depth):
        chain.append(chain[-1] / "d")
        chain[-1].mkdir()
    try:
        yield chain[-1]
    finally:
        for d in reversed(chain[1:]):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()


def deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int = DEEP) -> str:
    return '{"a":' * depth + "1" + "}" * depth


#: A valid measured cost profile (the fitted rates of a CPU).
PROFILE = {"kind": "hbench-cost-profile", "schema": 1, "name": "cpu", "engine": "torch",
           "device": "cpu", "model": "m", "mem_bytes": None,
           "rates": {"mem_bytes_s": 2e9, "state_bytes_s": 5e8, "gemm_flops_s": 3e10,
                     "attn_flops_s": 1e10, "scan_flops_s": 4e9, "step_overhead_s": 0.002,
                     "request_overhead_s": 0.0005, "combine": "sum"}}


def profile_text(**changes) -> str:
    """The profile as JSON text with ``rates`` fields (or ``mem_bytes``) replaced
    by raw JSON text (so NaN, Infinity and 1e400 can be written)."""
    doc = json.loads(json.dumps(PROFILE))
    raw = {}
    for key, value in changes.items():
        marker = f"@@{key}@@"
        raw[marker] = value
        if key == "mem_bytes":
            doc["mem_bytes"] = marker
        else:
            doc["rates"][key] = marker
    text = json.dumps(doc)
    for marker, value in raw.items():
        text = text.replace(json.dumps(marker), value)
    return text


def make_results_tree(root: Path) -> Path:
    """A results tree holding one small complete run (8 requests), under ``root``."""
    res = CliRunner().invoke(cli, ["run", "--requests", "8", "--rate", "4", "--seed", "3",
                                   "--out", str(root), "--json"])
    assert res.exit_code == 0, res.output
    return root


@pytest.fixture(autouse=True)
def in_a_scratch_directory(tmp_path, monkeypatch):
    """Each case runs in its own empty working directory, so an output that
    silently falls back to ``.`` is caught by the nothing-written check."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
