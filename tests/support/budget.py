"""The suite's wall-time budget, per tier, as a pytest plugin.

``pytest --time-budget 300 ...`` fails the session (exit 1, after every test
has run and reported) when its wall time passes 300 s, and prints the
slowest tests, so the submission that makes the suite slower is the one that
hears of it. The budgets live in the Makefile beside the tiers they bound;
each is the tier's measured time on the 2-core CI machine with headroom for
a shared, noisy host (docs/testing.md has the measurements). A budget is a
line to hold, not a speed target: nothing here times a single test.
"""

from __future__ import annotations

import time

import pytest

#: How many of the slowest tests the report names when a budget is passed.
SLOWEST = 15


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--time-budget", type=float, default=None, metavar="SECONDS",
                     help="fail the session when its wall time passes SECONDS, naming the "
                          "slowest tests (the tier budgets are in the Makefile)")


#: (seconds, phase, test id) of every phase reported to this process: the
#: controller's, which receives the xdist workers' reports too.
_durations: list[tuple[float, str, str]] = []
_session: list[pytest.Session] = []
_started = time.monotonic()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.monotonic()
    _session[:] = [session]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations.append((report.duration, report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Judge the session by its wall time, where the other summaries are printed
    (the session's exit status is read after this)."""
    budget = config.getoption("--time-budget")
    if budget is None or hasattr(config, "workerinput"):     # xdist workers do not judge
        return
    elapsed = time.monotonic() - _started
    terminalreporter.write_sep("-", "time budget")
    if elapsed <= budget:
        terminalreporter.write_line(f"wall time {elapsed:.0f} s of a {budget:.0f} s budget")
        return
    terminalreporter.write_line(f"OVER BUDGET: wall time {elapsed:.0f} s of a {budget:.0f} s "
                                f"budget; the slowest tests (seconds, phase, test):", red=True)
    for d, when, nodeid in sorted(_durations, reverse=True)[:SLOWEST]:
        terminalreporter.write_line(f"  {d:7.1f}  {when:8s} {nodeid}")
    session = _session[0]
    if session.exitstatus == 0:
        session.exitstatus = 1
