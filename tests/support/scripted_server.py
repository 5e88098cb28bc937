"""`ScriptedServer`: a real HTTP/1.1 server on 127.0.0.1 that streams
server-sent events with chunked transfer encoding, like uvicorn does for vLLM
and SGLang, from a `Script` of known delays, so the streaming client, the
served-engine adapters and benchmarks/bench_client.py are tested end to end
over a socket. Events are ordered by holding streams until a condition holds
(`Script.hold_until`, `Script.hang_after`), never by sleeps."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from adapters.client.http import Endpoint
from adapters.server_process import free_port


@dataclass
class Script:
    """How the server answers one completion request."""

    first_delay_s: float = 0.1
    interval_s: float = 0.02
    texts: tuple[str, ...] = ("a", "b", "", "d")  # one token per chunk, one with empty text
    status: int = 200
    drop_after: int | None = None   # close the connection after this many chunks
    # stop sending (but keep the socket) after this many chunks, until the server exits
    hang_after: int | None = None
    # hold every stream before its first event until this many completion
    # requests arrived (a client that waits for earlier requests never sends them)
    hold_until: int | None = None
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


#: how long a held or hanging stream waits at most (a bound for a hang, not a delay)
HOLD_LIMIT_S = 60.0


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
        # perf_counter() just before each event of a completion stream was
        # written, by prompt: no client can have read the event earlier
        self.written_at: dict[str, list[float]] = {}
        self.received_by_prompt: dict[str, float] = {}
        self.arrived = threading.Condition()   # notified at each completion POST
        self.closing = threading.Event()       # set when the server exits: hung streams end
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
                    with outer.arrived:
                        outer.received_at.append(time.perf_counter())
                        outer.arrived.notify_all()
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
                written = outer.written_at.setdefault(str(body.get("prompt")), [])
                if self.path == "/v1/completions":
                    outer.received_by_prompt[str(body.get("prompt"))] = outer.received_at[-1]
                events = sse_events(script, body)
                if script.hold_until is not None:
                    with outer.arrived:
                        if not outer.arrived.wait_for(
                                lambda: len(outer.received_at) >= script.hold_until,
                                HOLD_LIMIT_S):
                            error = {"error": f"held {HOLD_LIMIT_S:g} s: {len(outer.received_at)}"
                                              f" of {script.hold_until} requests arrived"}
                            events = [(0.0, f"data: {json.dumps(error)}\n\n".encode())]
                for i, (delay, data) in enumerate(events):
                    if script.drop_after is not None and i >= script.drop_after:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if script.hang_after is not None and i >= script.hang_after:
                        outer.closing.wait(HOLD_LIMIT_S)
                        return
                    time.sleep(delay)
                    written.append(time.perf_counter())
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
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
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
