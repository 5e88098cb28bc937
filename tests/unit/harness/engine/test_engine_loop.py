"""The engine core's event loop and clocks (harness/engine/loop.py, clock.py).

A scripted scheduler and executor record what the loop asks of them and
when, so each test states the exact order of events: a step completing at t
before an arrival at t, arrivals at one time in the order they were pushed,
the next step planned before an arrival at its start, a stretch's steps
interleaved with arrivals, and on a wall clock the events that fell due
while a step ran handed over before the next step is planned.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from harness.engine.clock import VirtualClock, WallClock
from harness.engine.loop import ARRIVAL, STEP_DONE, EngineLoop
from harness.records import RequestRecord
from harness.request_table import RequestTable
from harness.scheduler.stretch import Stretch as HandedOut
from tests.support import REPO_ROOT


def workload(*arrivals):
    """Requests (request id, arrival time); one prompt token each."""
    reqs = [SimpleNamespace(request_id=rid, arrival_s=t, prompt_token_ids=np.array([rid]),
                            output_len=1, salt=None, prefix_group=-1, prefix_tokens=0)
            for rid, t in arrivals]
    return SimpleNamespace(requests=reqs, sessions=(), warmup_ids=lambda n: set())


class Scheduler:
    """Every waiting request runs in the next step and finishes with it."""

    def __init__(self, log, clock, stretch=None):
        self.log, self.clock, self.stretch = log, clock, stretch
        self.waiting, self.running, self.requests = [], [], {}

    def add(self, rid, arrival_s, ids, output_len, salt, group, warmup=False, keys=None):
        self.log.append(("add", rid, self.clock.now))
        record = RequestRecord(request_id=rid, arrival_s=arrival_s, prompt_tokens=1,
                               target_output_tokens=output_len)
        r = SimpleNamespace(rid=rid, record=record, tokens=None, keys=None, token_times=None)
        self.requests[rid] = r
        self.waiting.append(r)
        return r

    @property
    def has_work(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        if self.stretch is not None:       # handed out once, first
            stretch, self.stretch = self.stretch, None
            return stretch
        self.running, self.waiting = self.running + self.waiting, []
        self.log.append(("plan", [r.rid for r in self.running], self.clock.now))
        return SimpleNamespace(items=list(self.running), failed=[])

    def complete(self, batch, now):
        self.running = []
        return batch.items

    def check_drained(self):
        assert not self.has_work


class Executor:
    """Each step takes ``duration``; ``work`` advances a fake wall clock by
    that much while it runs (and ``commit`` while it is completed)."""

    def __init__(self, sched, log, duration=1.0, work=None, commit=None):
        self.sched, self.log, self.duration = sched, log, duration
        self.work, self.commit = work, commit
        self.start = None

    def begin_step(self, now):
        self.start = now

    def execute(self, batch):
        if self.work:
            self.work(self.duration)
            return self.sched.clock.now
        return self.start + self.duration

    def complete(self, batch, now):
        self.log.append(("done", now))
        if self.commit:
            self.commit()
        return self.sched.complete(batch, now)

    def generated_ids(self, r):
        return []

    def run_stretch(self, stretch, loop):
        return stretch.run(loop)


def run(arrivals, clock=None, **executor):
    log = []
    clock = clock or VirtualClock()
    sched = Scheduler(log, clock)
    ended = []
    loop = EngineLoop(workload(*arrivals), sched, Executor(sched, log, **executor), clock,
                      progress=ended.append)
    records = loop.run()
    return log, records, ended


def test_a_step_done_at_t_comes_before_an_arrival_at_t():
    log, records, ended = run([(0, 0.0), (1, 0.0), (2, 1.0)])
    assert log == [("add", 0, 0.0), ("plan", [0], 0.0),   # planned at once
                   ("add", 1, 0.0),                        # same time, pushed later
                   ("done", 1.0), ("plan", [1], 1.0),      # before the arrival at 1.0
                   ("add", 2, 1.0),
                   ("done", 2.0), ("plan", [2], 2.0),
                   ("done", 3.0)]
    assert ended == [1, 2, 3]


def test_the_request_table_is_in_request_id_order():
    _, table, _ = run([(5, 0.0), (2, 0.5), (9, 0.7)])
    assert isinstance(table, RequestTable)
    assert table.array("request_id").tolist() == [2, 5, 9]
    assert table.array("arrival_s").tolist() == [0.5, 0.0, 0.7]


def test_requests_are_read_one_at_a_time_as_they_arrive():
    """A workload made on read is read in order, each request once, and none
    before the arrival ahead of it was handed to the scheduler: the loop
    holds one arrival ahead, not the whole stream."""
    log = []
    reqs = workload((0, 0.0), (1, 0.5), (2, 0.5), (3, 2.5)).requests

    class Logged(list):
        def __iter__(self):
            for r in reqs:
                log.append(("read", r.request_id))
                yield r

    clock = VirtualClock()
    sched = Scheduler(log, clock)
    wl = SimpleNamespace(requests=Logged(reqs), sessions=(), warmup_ids=lambda n: set())
    EngineLoop(wl, sched, Executor(sched, log), clock).run()
    assert [e for e in log if e[0] in ("read", "add")] == [
        ("read", 0), ("read", 1), ("add", 0, 0.0), ("read", 2), ("add", 1, 0.5),
        ("read", 3), ("add", 2, 0.5), ("add", 3, 2.5)]


def test_the_event_order_is_time_then_kind():
    assert STEP_DONE < ARRIVAL
    assert (1.0, STEP_DONE, 7) < (1.0, ARRIVAL, 0) < (1.0, ARRIVAL, 1) < (1.5, STEP_DONE, 0)


class Stretch(HandedOut):
    """Handed out by the scheduler (a `harness.scheduler.stretch.Stretch`):
    runs the waiting head for three steps of 0.5 s through
    `EngineLoop.step_ends`, then finishes it."""

    def __init__(self, seen):
        self.seen = seen

    def run(self, loop):
        r = loop.sched.waiting.pop(0)
        for _ in range(3):
            self.seen.append((loop.step_ends(0.5), loop.now))
        loop.finished([r], loop.now)
        return "idle"


def test_a_stretch_gets_the_arrivals_before_each_step_end_in_event_order():
    seen, log = [], []
    clock = VirtualClock()
    sched = Scheduler(log, clock, stretch=Stretch(seen))
    ex = Executor(sched, log)
    loop = EngineLoop(workload((0, 0.0), (1, 0.2), (2, 1.0), (3, 1.2)), sched, ex, clock)
    loop.run()
    # (step end, arrivals while it ran), clock: the arrival at 1.0, the second
    # step's very end, comes after that step, with the third step's
    assert seen == [((0.5, 1), 0.5), ((1.0, 0), 1.0), ((1.5, 2), 1.5)]
    assert [e for e in log if e[0] == "add"] == [("add", 0, 0.0), ("add", 1, 0.2),
                                                 ("add", 2, 1.0), ("add", 3, 1.2)]
    # after the stretch the scheduler plans the others at the stretch's end
    assert log[4:] == [("plan", [1, 2, 3], 1.5), ("done", 2.5)]


class FakeTime:
    def __init__(self, start=100.0):
        self.t, self.slept = start, []

    def timer(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s

    def pass_(self, s):
        self.t += s


def test_virtual_clock_moves_only_when_advanced():
    clock = VirtualClock()
    assert clock.now == 0.0
    assert clock.advance_to(2.5) == 2.5
    assert clock.now == 2.5


def test_wall_clock_sleeps_until_a_time_ahead_and_never_goes_back():
    ft = FakeTime()
    clock = WallClock(timer=ft.timer, sleep=ft.sleep)
    assert clock.now == 0.0
    assert clock.advance_to(2.5) == pytest.approx(2.5)
    assert ft.slept == [pytest.approx(2.5)]
    ft.pass_(1.0)                                   # work took a second
    assert clock.advance_to(3.0) == pytest.approx(3.5)
    assert len(ft.slept) == 1                       # already past: no sleep


def test_on_a_wall_clock_events_due_while_a_step_ran_come_before_planning():
    ft = FakeTime()
    clock = WallClock(timer=ft.timer, sleep=ft.sleep)
    # the step takes 1.0 s of wall time, its completion 0.5 s more
    log, _, _ = run([(0, 0.0), (1, 0.5), (2, 1.2), (3, 4.0)], clock=clock,
                    work=ft.pass_, commit=lambda: ft.pass_(0.5))
    adds = [(rid, round(t, 6)) for kind, rid, *t_ in log if kind == "add" for t in t_]
    plans = [(rids, round(t, 6)) for kind, rids, *t_ in log if kind == "plan" for t in t_]
    # request 1 arrived while step one ran; request 2 while it was completed:
    # both are handed over before the second step is planned, at 1.5
    assert adds[:3] == [(0, 0.0), (1, 1.0), (2, 1.5)]
    assert plans[:2] == [([0], 0.0), ([1, 2], 1.5)]
    # idle until request 3: the loop slept until its arrival
    assert adds[3] == (3, 4.0)
    assert ft.slept and sum(ft.slept) == pytest.approx(4.0 - 3.0)


@pytest.mark.parametrize("package", ["harness/engine", "harness/scheduler"])
def test_the_engine_core_imports_no_engine_adapter(package):
    """The core is below the engines: neither it nor the scheduler imports
    from adapters/, analysis/ or the application shell."""
    import ast

    root = REPO_ROOT
    for path in sorted((root / package).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in ("adapters", "analysis", "hbench")]
            assert not bad, f"{path.relative_to(root)} imports {bad}"


def test_the_torch_engine_imports_nothing_of_the_simulator():
    import ast

    path = REPO_ROOT / "adapters" / "torch" / "engine.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("adapters.sim"), node.module
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("adapters.sim") for a in node.names)
