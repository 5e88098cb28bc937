"""The streaming client (adapters/client/) against a local scripted server with known delays.

`ScriptedServer` is a real HTTP/1.1 server on 127.0.0.1 that streams
server-sent events with chunked transfer encoding, like uvicorn does for
vLLM and SGLang, so timing and failure handling are tested end to end over a
socket (`tests.support.scripted_server`).

Nothing here asserts how fast the client is (the machine may be loaded; the
client's dispatch lag and timing error are measured by bench_client.py).
Over the socket the tests assert what causality guarantees: a request is
never sent before its arrival, nor a token seen before the server wrote it.
Exact token times are checked on a scripted connection and clock
(`ScriptedConnection`), and events are ordered by holding streams until a
condition holds (`Script.hold_until`, `Script.hang_after`), never by sleeps.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from adapters.client.dispatch import run_open_loop
from adapters.client.http import DEFAULT_TIMEOUTS, Endpoint, Timeouts, served_models
from adapters.client.stream import (
    CompletionStream,
    StreamOutcome,
    stream_completion,
    stream_exchange,
)
from adapters.server_process import free_port
from common.errors import HbenchError
from tests.support.scripted_server import Script, ScriptedServer, sse_events
from workloads.workload import Workload, WorkloadRequest


def make_workload(arrivals, output_len=4, salts=None) -> Workload:
    reqs = tuple(
        WorkloadRequest(request_id=i, arrival_s=a, prompt_text=f"prompt {i}",
                        prompt_token_ids=np.arange(5, dtype=np.int64), output_len=output_len,
                        salt=None if salts is None else salts[i])
        for i, a in enumerate(arrivals))
    return Workload(reqs)


class ScriptedClock:
    """A clock that reads what it was last set to."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScriptedConnection:
    """What `stream_exchange` uses of an ``http.client.HTTPConnection``, without
    a socket: a 200 response whose lines arrive at scripted times, each read
    setting ``clock`` to its time, so every token's exact time is known."""

    status = 200

    def __init__(self, clock: ScriptedClock, lines: list[tuple[float, bytes]]):
        self.clock = clock
        self.lines = list(lines)
        self.sock = self            # `stream_exchange` sets its timeouts
        self.closed = False

    def settimeout(self, timeout_s: float) -> None:
        pass

    def getresponse(self) -> ScriptedConnection:
        return self

    def read1(self, n: int) -> bytes:
        """One scripted line a read (each shorter than ``n``)."""
        if not self.lines:
            return b""
        self.clock.now, line = self.lines.pop(0)
        return line

    def close(self) -> None:
        self.closed = True


def scripted_exchange(arrivals: list[float], timeouts: Timeouts = DEFAULT_TIMEOUTS) -> StreamOutcome:
    """`stream_exchange` of `Script()`'s stream (four chunks, one with empty
    text, then usage and [DONE]), sent at 0.05 s after a start at clock 1.0,
    its events arriving at ``arrivals`` (seconds since the start)."""
    clock = ScriptedClock()
    events = sse_events(Script(), {"prompt": "x"})
    lines = [(1.0 + t, line) for t, (_, data) in zip(arrivals, events, strict=True)
             for line in data.splitlines(keepends=True)]
    conn = ScriptedConnection(clock, lines)
    out = StreamOutcome()

    def send():
        clock.now = 1.05
        out.dispatch_s = clock() - 1.0

    got = stream_exchange(conn, out, send, 1.0, timeouts, clock)
    assert conn.closed
    return got


def test_each_token_is_timed_when_its_chunk_arrives():
    out = scripted_exchange([0.15, 0.17, 0.19, 0.21, 0.22, 0.23])
    assert out.success and out.status == "finished"
    assert out.dispatch_s == pytest.approx(0.05)
    assert out.token_times == pytest.approx([0.15, 0.17, 0.19, 0.21])   # the empty text too
    assert out.first_token_s == pytest.approx(0.15) and out.finish_s == pytest.approx(0.23)
    assert out.usage["completion_tokens"] == 4


def test_total_timeout_counts_on_the_clock_from_the_send():
    out = scripted_exchange([0.15, 0.17, 0.5, 0.6, 0.7, 0.8],
                            Timeouts(connect_s=1, first_byte_s=1, idle_s=1, total_s=0.3))
    assert out.status == "failed" and out.error == "total timeout 0.3s exceeded"
    assert out.token_times == [] and out.finish_s == pytest.approx(0.5)


@pytest.mark.slow
def test_token_times_and_dispatch_are_causal_over_a_socket():
    """Over a real socket only causality is certain: each request is sent at or
    after its arrival and before the server has it, and each token is seen
    after the server wrote it and after the server's first pause."""
    eps = 1e-6     # the same perf_counter on both sides; rounding of t0 + (t - t0)
    with ScriptedServer(Script(first_delay_s=0.1, interval_s=0.02)) as srv:
        t0 = time.perf_counter()
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.05, 0.1]), t0=t0)
    assert [r.status for r in res.records] == ["finished"] * 3, [r.error for r in res.records]
    for r in res.records:
        prompt = f"prompt {r.request_id}"
        assert r.dispatch_s >= r.arrival_s
        assert t0 + r.dispatch_s <= srv.received_by_prompt[prompt] + eps
        assert r.first_token_s - r.dispatch_s >= 0.1 - 0.005
        # four chunks, one with empty text, are four tokens
        assert r.output_tokens == 4 and len(r.token_times) == 4
        written = np.asarray(srv.written_at[prompt][:4]) - t0
        assert np.all(np.asarray(r.token_times) >= written - eps), (r.token_times, written)
        assert np.all(np.diff(r.token_times) >= 0)
        assert r.prompt_tokens == 7 and r.reused_tokens == 4 and r.initial_input_tokens == 3
        assert r.j_adopt == 4          # a hybrid server's cached tokens are its joint hit
    assert res.window_end_s >= res.records[-1].finish_s


@pytest.mark.slow
def test_request_body_asks_for_exact_greedy_output_and_passes_the_salt():
    with ScriptedServer() as srv:
        run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.0], output_len=9,
                                                          salts=[None, "req-1"]))
        bodies = sorted(srv.bodies, key=lambda b: b["prompt"])
    assert bodies[0]["max_tokens"] == 9 and bodies[0]["min_tokens"] == 9
    assert bodies[0]["ignore_eos"] is True and bodies[0]["temperature"] == 0.0
    assert bodies[0]["stream"] is True and bodies[0]["stream_options"] == {"include_usage": True}
    assert "cache_salt" not in bodies[0]
    assert bodies[1]["cache_salt"] == "req-1"


@pytest.mark.slow
def test_open_loop_does_not_wait_for_earlier_requests():
    # every stream is held until all four requests arrived: a client that
    # waited for an earlier request to end would never send the later ones
    script = Script(first_delay_s=0.0, interval_s=0.0, texts=("x",), hold_until=4)
    with ScriptedServer(script) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.05, 0.1, 0.15]))
    assert [r.status for r in res.records] == ["finished"] * 4, [r.error for r in res.records]
    assert all(r.dispatch_s >= r.arrival_s for r in res.records)


@pytest.mark.slow
def test_http_500_gives_failed_records_with_the_status():
    with ScriptedServer(Script(status=500)) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.01]))
    assert [r.status for r in res.records] == ["failed", "failed"]
    assert all(r.error.startswith("HTTP 500") for r in res.records)
    assert all(r.output_tokens == 0 and r.first_token_s is None for r in res.records)


@pytest.mark.slow
def test_connection_closed_mid_stream_is_a_failure_not_a_hang():
    # a client that missed the close would end only by its idle timeout, with another error
    bounded = Timeouts(connect_s=5, first_byte_s=60, idle_s=60, total_s=120)
    with ScriptedServer(Script(drop_after=2, interval_s=0.01, first_delay_s=0.01)) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0]), timeouts=bounded)
    r = res.records[0]
    assert r.status == "failed"
    assert "before [DONE]" in r.error or "Incomplete" in r.error
    assert len(r.token_times) == 2   # the tokens that did arrive are kept


def test_refused_connection_fails_the_request_without_sending_it():
    res = run_open_loop(Endpoint("127.0.0.1", free_port()), "tiny", make_workload([0.0, 0.01]))
    assert [r.status for r in res.records] == ["failed", "failed"]
    assert all(r.error.startswith("ConnectionRefusedError") for r in res.records)
    assert all(r.dispatch_s is None for r in res.records)


@pytest.mark.slow
def test_idle_timeout_bounds_a_stalled_stream():
    # the server sends one chunk, then nothing until it exits: only the idle timeout ends it
    with ScriptedServer(Script(hang_after=1, first_delay_s=0.01)) as srv:
        out = stream_completion(srv.endpoint, {"prompt": "x"}, time.perf_counter(),
                                Timeouts(connect_s=30, first_byte_s=30, idle_s=0.3, total_s=60))
    assert out.status == "failed" and not out.success
    assert out.error == "timed out after 0.3s waiting for next chunk"


def test_unreachable_endpoint_is_a_one_line_error():
    port = free_port()
    with pytest.raises(HbenchError, match=rf"^cannot reach http://127.0.0.1:{port}: .*") as exc:
        served_models(Endpoint("127.0.0.1", port), timeout_s=1.0)
    assert "\n" not in str(exc.value)


def test_endpoint_parse_accepts_bare_host_port_and_rejects_https():
    assert Endpoint.parse("127.0.0.1:8000") == Endpoint("127.0.0.1", 8000)
    assert Endpoint.parse("http://localhost:9/v1").url == "http://localhost:9"
    with pytest.raises(HbenchError, match="http://HOST:PORT"):
        Endpoint.parse("https://x:1")


def test_stream_parser_times_tokens_without_a_socket():
    """CompletionStream alone: a two-id chunk is two tokens at its time, a
    bare finish marker carries none, usage is the count, [DONE] ends it."""
    stream = CompletionStream(StreamOutcome())
    lines = [
        (0.10, {"choices": [{"text": "ab", "token_ids": [5, 6], "finish_reason": None}]}),
        (0.15, {"choices": [{"text": "", "finish_reason": None}]}),      # held-back text
        (0.20, {"choices": [{"text": "", "finish_reason": "length"}]}),  # bare finish marker
        (0.21, {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 2}}),
    ]
    for now, event in lines:
        assert stream.feed(f"data: {json.dumps(event)}\n".encode(), now) is None
        assert stream.feed(b"\n", now) is None
    assert not stream.done
    assert stream.feed(b"data: [DONE]\n", 0.22) is None and stream.done
    out = stream.finish(0.25)
    assert out.success and out.status == "finished" and out.error == ""
    assert out.token_times == [0.10, 0.10, 0.15] and out.first_token_s == 0.10
    assert out.token_ids == [5, 6] and out.text == "ab" and out.finish_s == 0.25


def test_stream_parser_refuses_error_and_malformed_events():
    stream = CompletionStream(StreamOutcome())
    assert stream.feed(b'data: {"error": "overloaded"}', 0.1) == "server error event: overloaded"
    assert stream.feed(b"data: {oops", 0.1) == "malformed stream event: b'{oops'"
    out = stream.fail("server error event: overloaded", 0.1, keep_tokens=False)
    assert not out.success and out.status == "failed" and out.token_times == []
