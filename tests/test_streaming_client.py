"""The streaming client (adapters/client/) against a local scripted server with known delays.

`ScriptedServer` is a real HTTP/1.1 server on 127.0.0.1 that streams
server-sent events with chunked transfer encoding, like uvicorn does for
vLLM and SGLang, so timing and failure handling are tested end to end over a
socket. test_sglang_adapter.py and benchmarks/bench_client.py reuse it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from adapters.client.dispatch import run_open_loop
from adapters.client.http import Endpoint, Timeouts, served_models
from adapters.client.stream import CompletionStream, StreamOutcome, stream_completion
from adapters.server_process import free_port
from common.errors import HbenchError
from workloads.workload import Workload, WorkloadRequest


@dataclass
class Script:
    """How the server answers one completion request."""

    first_delay_s: float = 0.1
    interval_s: float = 0.02
    texts: tuple[str, ...] = ("a", "b", "", "d")  # one token per chunk, one with empty text
    status: int = 200
    drop_after: int | None = None   # close the connection after this many chunks
    hang_after: int | None = None   # stop sending (but keep the socket) after this many chunks
    raw_events: tuple[tuple[float, str], ...] | None = None  # replay recorded SSE lines
    diverge_salted_at: int | None = None   # salted requests get another token id here


def sse_events(script: Script, body: dict) -> list[tuple[float, bytes]]:
    """(delay before, bytes) for each event of a vLLM-style completion stream."""
    if script.raw_events is not None:
        return [(d, (line + "\n\n").encode()) for d, line in script.raw_events]
    events = []
    n = len(script.texts)
    for i, text in enumerate(script.texts):
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": "length" if i == n - 1 else None}
        if body.get("return_token_ids"):
            diverge = "cache_salt" in body and i == script.diverge_salted_at
            choice["token_ids"] = [999 if diverge else 100 + i]
        if body.get("logprobs"):
            choice["logprobs"] = {"tokens": [text], "token_logprobs": [-0.5 - i]}
        delay = script.first_delay_s if i == 0 else script.interval_s
        events.append((delay, {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}))
    cached = 0 if "cache_salt" in body else 4   # a salted request never hits the cache
    usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n,
             "prompt_tokens_details": {"cached_tokens": cached}}
    events.append((0.0, {"id": "cmpl-1", "object": "text_completion", "choices": [],
                         "usage": usage}))
    out = [(d, f"data: {json.dumps(e)}\n\n".encode()) for d, e in events]
    out.append((0.0, b"data: [DONE]\n\n"))
    return out


class ScriptedServer:
    """OpenAI-compatible streaming server for tests; ``script`` may be swapped between runs.

    ``metrics_text`` is the ``/metrics`` body, or a callable returning it per scrape.
    """

    def __init__(self, script: Script | None = None, metrics_text="",
                 models: tuple[str, ...] = ("tiny",)):
        self.script = script or Script()
        self.metrics_text = metrics_text
        self.models = models
        self.bodies: list[dict] = []
        self.received_at: list[float] = []   # perf_counter() at each completion POST
        # perf_counter() after each event of a completion stream was flushed, by prompt:
        # what the server really did (its sleeps overrun on a loaded machine)
        self.sent_at: dict[str, list[float]] = {}
        self.received_by_prompt: dict[str, float] = {}
        self.port = free_port()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle(self):
                try:
                    super().handle()
                except ConnectionError:
                    pass   # the client hung up (timeouts, closed streams): expected here

            def do_GET(self):
                if self.path == "/v1/models":
                    data = {"object": "list", "data": [{"id": m} for m in outer.models]}
                    self._send(200, json.dumps(data).encode(), "application/json")
                elif self.path == "/metrics":
                    text = outer.metrics_text
                    text = text() if callable(text) else text
                    self._send(200, text.encode(), "text/plain")
                elif self.path == "/health":
                    self._send(200, b"", "text/plain")
                else:
                    self._send(404, b"not found", "text/plain")

            def do_POST(self):
                if self.path == "/v1/completions":   # not vLLM's client's /tokenize probe
                    outer.received_at.append(time.perf_counter())
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                script = outer.script
                if script.status != 200:
                    self._send(script.status, b'{"error": "boom"}', "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                sent = outer.sent_at.setdefault(str(body.get("prompt")), [])
                if self.path == "/v1/completions":
                    outer.received_by_prompt[str(body.get("prompt"))] = outer.received_at[-1]
                for i, (delay, data) in enumerate(sse_events(script, body)):
                    if script.drop_after is not None and i >= script.drop_after:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if script.hang_after is not None and i >= script.hang_after:
                        time.sleep(2.0)
                        return
                    time.sleep(delay)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    sent.append(time.perf_counter())
                self.wfile.write(b"0\r\n\r\n")

            def _send(self, status, payload, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def make_workload(arrivals, output_len=4, salts=None) -> Workload:
    reqs = tuple(
        WorkloadRequest(request_id=i, arrival_s=a, prompt_text=f"prompt {i}",
                        prompt_token_ids=np.arange(5, dtype=np.int64), output_len=output_len,
                        salt=None if salts is None else salts[i])
        for i, a in enumerate(arrivals))
    return Workload(reqs)


TOL = 0.04  # seconds; machines are noisy


def test_ttft_itl_and_dispatch_lag_match_the_servers_delays():
    with ScriptedServer(Script(first_delay_s=0.1, interval_s=0.02)) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.05, 0.1]))
    assert [r.status for r in res.records] == ["finished"] * 3
    for r in res.records:
        assert abs(r.dispatch_s - r.arrival_s) < TOL
        ttft = r.first_token_s - r.dispatch_s
        prompt = f"prompt {r.request_id}"
        assert ttft >= 0.1 - 0.005   # never before the server's first pause
        # and the first token's wait is the one the server really took
        server_ttft = srv.sent_at[prompt][0] - srv.received_by_prompt[prompt]
        assert abs(ttft - server_ttft) < TOL, (ttft, server_ttft)
        # four chunks, one with empty text, are four tokens
        assert r.output_tokens == 4 and len(r.token_times) == 4
        itls = np.diff(r.token_times)
        assert all(x >= 0.02 - 0.005 for x in itls)   # never faster than the server's pauses
        # and each gap is the one the server really left (its sleeps overrun under load)
        server_gaps = np.diff(srv.sent_at[prompt][:4])
        assert np.all(np.abs(itls - server_gaps) < TOL), (itls, server_gaps)
        assert r.prompt_tokens == 7 and r.reused_tokens == 4 and r.initial_input_tokens == 3
        assert r.j_adopt == 4          # a hybrid server's cached tokens are its joint hit
    assert res.window_end_s >= res.records[-1].finish_s


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


def test_open_loop_does_not_wait_for_earlier_requests():
    # each stream takes ~0.3 s; arrivals 0.05 s apart must still be sent on time
    script = Script(first_delay_s=0.3, interval_s=0.0, texts=("x",))
    with ScriptedServer(script) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.05, 0.1, 0.15]))
    lags = [r.dispatch_s - r.arrival_s for r in res.records]
    assert max(lags) < TOL
    assert res.window_end_s < 0.15 + 0.3 + 0.2


def test_http_500_gives_failed_records_with_the_status():
    with ScriptedServer(Script(status=500)) as srv:
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0, 0.01]))
    assert [r.status for r in res.records] == ["failed", "failed"]
    assert all(r.error.startswith("HTTP 500") for r in res.records)
    assert all(r.output_tokens == 0 and r.first_token_s is None for r in res.records)


def test_connection_closed_mid_stream_is_a_failure_not_a_hang():
    with ScriptedServer(Script(drop_after=2, interval_s=0.01, first_delay_s=0.01)) as srv:
        t = time.perf_counter()
        res = run_open_loop(srv.endpoint, "tiny", make_workload([0.0]))
        assert time.perf_counter() - t < 2.0
    r = res.records[0]
    assert r.status == "failed"
    assert "before [DONE]" in r.error or "Incomplete" in r.error
    assert len(r.token_times) == 2   # the tokens that did arrive are kept


def test_refused_connection_fails_the_request_without_sending_it():
    res = run_open_loop(Endpoint("127.0.0.1", free_port()), "tiny", make_workload([0.0, 0.01]))
    assert [r.status for r in res.records] == ["failed", "failed"]
    assert all(r.error.startswith("ConnectionRefusedError") for r in res.records)
    assert all(r.dispatch_s is None for r in res.records)


def test_idle_timeout_bounds_a_stalled_stream():
    with ScriptedServer(Script(hang_after=1, first_delay_s=0.01)) as srv:
        out = stream_completion(srv.endpoint, {"prompt": "x"}, time.perf_counter(),
                                Timeouts(connect_s=1, first_byte_s=1, idle_s=0.3, total_s=5))
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
