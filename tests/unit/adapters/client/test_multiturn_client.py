"""The streaming client serves multi-turn sessions closed-loop against a local
scripted server: it waits for a turn to finish, then sends the next one a
think time later, built from what the server streamed back."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.client.dispatch import run_open_loop
from tests.support.scripted_server import Script, ScriptedServer
from workloads.multiturn.session import Session, Turn
from workloads.workload import Workload, WorkloadRequest

THINK_S = 0.2


def ids(*xs):
    return np.asarray(xs, dtype=np.int64)


def two_sessions() -> Workload:
    """Sessions 0 and 1 (first turns at 0.0 and 0.05 s), three turns each."""
    firsts = tuple(WorkloadRequest(request_id=s, arrival_s=0.05 * s, prompt_text=f"hello {s}",
                                   prompt_token_ids=ids(1, 2, s), output_len=4)
                   for s in range(2))
    next_id = 2
    sessions = []
    for s in range(2):
        turns = []
        for k in (1, 2):
            turns.append(Turn(request_id=next_id, user_token_ids=ids(50 + k), user_text=f" q{k}",
                              answer_token_ids=ids(0, 0, 0, 0), answer_text="", output_len=4,
                              think_s=THINK_S, prompt_len=3 + 5 * k))
            next_id += 1
        sessions.append(Session(session_id=s, first_request=s, turns=tuple(turns)))
    return Workload(requests=firsts, meta={"max_model_len": 100}, sessions=tuple(sessions))


@pytest.mark.slow
def test_each_turn_waits_for_the_previous_answer_and_its_think_time():
    w = two_sessions()
    script = Script(first_delay_s=0.1, interval_s=0.02)
    with ScriptedServer(script) as srv:
        res = run_open_loop(srv.endpoint, "tiny", w,
                            extra_body={"return_token_ids": True})
        prompts = [b["prompt"] for b in srv.bodies]
    recs = res.records
    assert [r.request_id for r in recs] == list(range(6))
    assert all(r.status == "finished" for r in recs)
    by = {(r.session, r.turn): r for r in recs}
    assert set(by) == {(s, k) for s in range(2) for k in range(3)}
    for s in range(2):
        for k in (1, 2):
            prev, cur = by[(s, k - 1)], by[(s, k)]
            # sent only after the previous turn ended, a think time later
            assert cur.arrival_s == prev.finish_s + THINK_S
            assert cur.dispatch_s >= prev.finish_s + THINK_S - 1e-9
            assert cur.first_token_s - cur.dispatch_s >= 0.1 - 0.005   # the server's first pause
    # the next prompt is the previous prompt + the streamed answer + the new message
    assert "hello 0abd q1" in prompts and "hello 0abd q1abd q2" in prompts
    assert "hello 1abd q1abd q2" in prompts
    # sessions are open-loop to each other: session 1 started before session 0's turn 1
    assert by[(1, 0)].dispatch_s < by[(0, 1)].dispatch_s


def test_generated_token_ids_extend_the_next_prompt_ids():
    from workloads.multiturn.session import SessionLoop

    w = two_sessions()
    loop = SessionLoop(w)
    nxt = loop.next_turn(w.requests[0], [100, 101, 102, 103], 1.0, "abd")
    assert nxt.prompt_token_ids.tolist() == [1, 2, 0, 100, 101, 102, 103, 51]
    assert nxt.prompt_text == "hello 0abd q1"


@pytest.mark.slow
def test_a_failed_turn_ends_its_session_and_the_run_still_ends():
    w = two_sessions()
    with ScriptedServer(Script(status=500)) as srv:
        res = run_open_loop(srv.endpoint, "tiny", w)
    assert [r.request_id for r in res.records] == [0, 1]
    assert all(r.status == "failed" for r in res.records)
