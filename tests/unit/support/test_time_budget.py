"""The tiers' time budget (`tests.support.budget`): a session past its budget
fails after every test has reported, and names its slowest tests."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO_ROOT

SUITE = '''
def test_quick():
    assert True

def test_another():
    assert 1 + 1 == 2
'''


def run_suite(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.budget",
                           "-p", "no:cacheprovider", "-o", "addopts=", str(tmp_path), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_session_within_its_budget_passes_and_says_its_time(tmp_path):
    out = run_suite(tmp_path, "--time-budget", "600")
    assert out.returncode == 0, out.stdout
    assert "wall time" in out.stdout and "of a 600 s budget" in out.stdout
    assert "OVER BUDGET" not in out.stdout and "2 passed" in out.stdout


def test_a_session_past_its_budget_fails_naming_its_slowest_tests(tmp_path):
    out = run_suite(tmp_path, "--time-budget", "0")
    assert out.returncode == 1, out.stdout
    assert "OVER BUDGET" in out.stdout and "of a 0 s budget" in out.stdout
    assert "test_tiny.py::test_quick" in out.stdout and "test_tiny.py::test_another" in out.stdout
    assert "2 passed" in out.stdout            # every test ran and reported first


def test_without_a_budget_nothing_is_judged(tmp_path):
    out = run_suite(tmp_path)
    assert out.returncode == 0 and "time budget" not in out.stdout
