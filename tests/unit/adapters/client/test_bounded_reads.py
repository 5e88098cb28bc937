"""Every HTTP read is bounded in size and in time, against a local server that
misbehaves on purpose: a body far over the bound (stated, or streamed without
a length), a body or the headers dripped a byte at a time (each wait short, the
whole endless), a line that never ends, and a connection closed mid-body. The
one-shot GETs (``/v1/models``, ``/metrics``: what the probe and the served
engines read) fail with an OSError the callers already handle; a stream
fails its request with a reason; neither takes much longer than its bound
nor holds more than its bytes."""

from __future__ import annotations

import socketserver
import threading
import time

import pytest

from adapters.client import stream as S
from adapters.client.http import Endpoint, Timeouts, http_get, model_entries
from adapters.client.stream import stream_completion
from adapters.metrics_scrape import read_metrics
from common.errors import HbenchError

MiB = 2**20


def _drip(wfile, data: bytes, every_s: float) -> None:
    for i in range(len(data)):
        wfile.write(data[i:i + 1])
        wfile.flush()
        time.sleep(every_s)


BEHAVIOURS = {
    # a stated length far over any bound: refused before reading it
    "huge-stated": lambda w: (w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n"),
                              [w.write(b"0" * 65536) for _ in range(64)]),
    # no length, closed when done: read until the bound, then refused
    "huge-unstated": lambda w: (w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"),
                                [w.write(b"0" * 65536) for _ in range(1024)]),
    "drip": lambda w: (w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"),
                       _drip(w, b"x" * 100000, 0.05)),
    "cut": lambda w: w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10),
    # the status line and headers dripped: http.client reads them a line at a
    # time, each wait bounded only by the socket's timeout
    "drip-headers": lambda w: _drip(w, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 400 + b"\r\n\r\n", 0.05),
    # a stream: one line that never ends, or an endless drip of events
    "endless-line": lambda w: (w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                       b"Connection: close\r\n\r\ndata: "),
                               [w.write(b"x" * 65536) for _ in range(64)]),
    "drip-events": lambda w: (w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                      b"Connection: close\r\n\r\n"),
                              _drip(w, b": keep-alive\n" * 1000, 0.05)),
}


class Misbehaving(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behaviour: str):
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                self.rfile.readline()           # the request line
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                try:
                    BEHAVIOURS[outer.behaviour](self.wfile)
                except OSError:                 # the client gave up: as it should
                    pass

        self.behaviour = behaviour
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.server_address[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


@pytest.mark.parametrize("behaviour, needle", [
    ("huge-stated", "at most"), ("huge-unstated", "at most"), ("drip", "timed out|deadline"),
    ("drip-headers", "timed out|deadline"), ("cut", "mid-body")])
def test_a_get_is_bounded_in_size_and_time(behaviour, needle):
    with Misbehaving(behaviour) as srv:
        t0 = time.monotonic()
        with pytest.raises(OSError, match=needle):
            http_get(srv.endpoint, "/metrics", timeout_s=1.0, max_bytes=4 * MiB)
        assert time.monotonic() - t0 < 10      # a generous bound: the deadline is 1 s
        # (dripped headers took 21 s before `get_response` bounded them)
        assert read_metrics(srv.endpoint, timeout_s=1.0) is None   # the scraper: no answer
        with pytest.raises(HbenchError, match="cannot reach"):      # the probe's first question
            model_entries(srv.endpoint, timeout_s=1.0)


@pytest.mark.parametrize("behaviour, needle", [
    ("endless-line", "line over"), ("drip-events", "total timeout"), ("huge-unstated", "line over"),
    ("drip-headers", "total timeout"), ("cut", "before [DONE]")])
def test_a_stream_is_bounded_in_size_and_time(behaviour, needle, monkeypatch):
    monkeypatch.setattr(S, "MAX_LINE_BYTES", 256 * 1024)
    with Misbehaving(behaviour) as srv:
        t0 = time.monotonic()
        out = stream_completion(srv.endpoint, {"prompt": "x", "stream": True}, time.perf_counter(),
                                Timeouts(connect_s=2, first_byte_s=2, idle_s=1, total_s=1.5))
        assert time.monotonic() - t0 < 10
    assert out.status == "failed" and needle in out.error, out.error


def test_a_stream_over_its_byte_bound_fails(monkeypatch):
    monkeypatch.setattr(S, "MAX_STREAM_BYTES", 1 * MiB)
    monkeypatch.setattr(S, "MAX_LINE_BYTES", 4 * MiB)
    with Misbehaving("huge-unstated") as srv:
        out = stream_completion(srv.endpoint, {"prompt": "x"}, time.perf_counter(),
                                Timeouts(connect_s=2, first_byte_s=2, idle_s=2, total_s=20))
    assert out.status == "failed" and "over 1,048,576 bytes" in out.error, out.error


def test_a_well_behaved_get_still_reads_whole():
    body = b'{"data": [{"id": "m"}]}'

    def answer(w):
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    BEHAVIOURS["ok"] = answer
    try:
        with Misbehaving("ok") as srv:
            assert http_get(srv.endpoint, "/v1/models") == (200, body)
            assert model_entries(srv.endpoint) == [{"id": "m"}]
    finally:
        del BEHAVIOURS["ok"]
