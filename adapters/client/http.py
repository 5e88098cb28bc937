"""Where an OpenAI-compatible server is and how one request reaches it.

Why ``http.client`` and not a client library: it is in the standard library,
decodes chunked transfer encoding, and gives per-socket timeouts, which is all
a streaming benchmark client needs. This room owns the endpoint address, the
timeouts every wait is bounded by, opening a connection, writing a POST, the
one-shot GETs (``/v1/models``, ``/version``, ``/health``, ``/metrics``) and
which exceptions count as I/O failures. Every read is bounded in size and in
time as a whole (`read_pieces`, and `get_response` for the status line and
headers: a socket timeout alone bounds each wait, so a server dripping a byte
a second would never be stopped). It knows nothing about streams or
schedules; `adapters.client.stream` and `adapters.client.dispatch` build on it.
"""

from __future__ import annotations

import http.client
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from common.errors import HbenchError

#: What a request's I/O may raise; the stream room turns these into failed outcomes.
IO_ERRORS = (OSError, http.client.HTTPException)

COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class Timeouts:
    """Every wait the client does is bounded by one of these (seconds).

    ``first_byte_s`` covers queueing plus prefill in the server, so it is
    generous; ``idle_s`` bounds the gap between two streamed chunks;
    ``total_s`` bounds one request end to end.
    """

    connect_s: float = 5.0
    first_byte_s: float = 600.0
    idle_s: float = 120.0
    total_s: float = 3600.0


DEFAULT_TIMEOUTS = Timeouts()
#: Longest endpoint URL read (a host and a port need far fewer).
MAX_URL_CHARS = 2048
#: Largest body a one-shot GET reads: a big server's /metrics page is about 1 MB.
MAX_GET_BYTES = 32 * 2**20
#: Longest line of a stream (a chunk of a few tokens is under 1 KB), and the
#: most bytes one stream may send (a 100,000-token answer is ~30 MB of chunks).
MAX_LINE_BYTES = 1 * 2**20
MAX_STREAM_BYTES = 256 * 2**20
_READ_BYTES = 64 * 1024


class BoundExceeded(OSError):
    """A server's answer broke a bound: too large, too slow in all, or cut
    off mid-body. An OSError, so every caller that handles a failed read
    handles it."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server's base address, e.g. ``http://127.0.0.1:8000``."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        shape = f"endpoint must look like http://HOST:PORT, got {url[:200]!r}"
        if len(url) > MAX_URL_CHARS or not url.isascii() or not url.isprintable() or " " in url:
            raise HbenchError(shape)
        text = url if "://" in url else f"http://{url}"
        try:   # urlsplit raises ValueError on an unclosed [IPv6 bracket, .hostname on others
            parts = urlsplit(text)
            host = parts.hostname
        except ValueError as exc:
            raise HbenchError(f"{shape} ({exc})") from None
        if parts.scheme != "http" or not host:
            raise HbenchError(shape)
        try:
            port = parts.port
        except ValueError as exc:
            raise HbenchError(f"endpoint {url!r} has a bad port: {exc}") from None
        if port == 0:
            raise HbenchError(f"endpoint {url!r} has a bad port: 0 is not a server's port")
        return cls(host, 80 if port is None else port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def open_connection(endpoint: Endpoint, timeouts: Timeouts) -> http.client.HTTPConnection:
    """An unconnected connection to ``endpoint``; it connects on first use (or
    on ``connect()``) within ``timeouts.connect_s``."""
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeouts.connect_s)


def post_json(conn: http.client.HTTPConnection, path: str, payload: bytes) -> None:
    """Write one POST of an already-encoded JSON body; the response is read by the caller."""
    conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})


def describe_error(exc: BaseException) -> str:
    """The one-line reason an I/O error gives a failed request."""
    return f"{type(exc).__name__}: {exc}"


def read_pieces(resp: http.client.HTTPResponse, sock, deadline: float, idle_s: float,
                *, cut_ends: bool = False) -> Iterator[bytes]:
    """The body of ``resp`` as it arrives (``read1``: chunked encoding decoded),
    every wait at most ``idle_s`` and none past ``deadline`` (a
    `time.monotonic` time): a server that drips a byte at a time is stopped
    at the deadline, not once per byte. TimeoutError past either. A body cut
    off before its end is `BoundExceeded`, or, with ``cut_ends`` (a stream,
    whose parser says what is missing), its end."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than its deadline")
        sock.settimeout(min(idle_s, left))
        try:
            piece = resp.read1(_READ_BYTES)
        except http.client.IncompleteRead as exc:
            if cut_ends:
                if exc.partial:
                    yield exc.partial
                return
            raise BoundExceeded(f"the answer stopped mid-body after {len(exc.partial):,} bytes") from None
        if not piece:
            if resp.length and not cut_ends:   # read1 of a stated length says nothing of a cut
                raise BoundExceeded(f"the answer stopped mid-body, {resp.length:,} bytes short")
            return
        yield piece


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes as `http.client` reads them, no wait past ``deadline``
    (a `time.monotonic` time): each wait is capped at the time left, and none
    starts after it (TimeoutError)."""

    def __init__(self, sock, deadline: float):
        super().__init__()
        self._sock, self._deadline = sock, deadline
        self._raw = sock.makefile("rb", buffering=0)   # holds the socket open, as http.client's own

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than its deadline")
        wait = self._sock.gettimeout()
        self._sock.settimeout(left if wait is None else min(wait, left))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """``sock`` as `http.client` sees it, but the file it reads the answer from
    is a `_DeadlineReader`; everything else is the socket's."""

    def __init__(self, sock, deadline: float):
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name):
        return getattr(self._sock, name)


def get_response(conn: http.client.HTTPConnection, deadline: float) -> http.client.HTTPResponse:
    """``conn.getresponse()`` with every byte of the answer read by ``deadline``:
    the status line and the headers (which `http.client` reads a line at a
    time, each wait bounded only by the socket's timeout: a server dripping
    them would hold the reader for hours) as well as the body."""
    conn.sock = _DeadlineSocket(conn.sock, deadline)
    return conn.getresponse()


def http_get(endpoint: Endpoint, path: str, timeout_s: float = 5.0,
             max_bytes: int = MAX_GET_BYTES) -> tuple[int, bytes]:
    """One GET, all of it (connecting, sending, every byte of the answer)
    within ``timeout_s`` and at most ``max_bytes`` of body; returns (status,
    body). A failure, a broken bound included, is an OSError."""
    deadline = time.monotonic() + timeout_s
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        sock = conn.sock   # getresponse() detaches it from conn when the server will close
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        resp = get_response(conn, deadline)
        if resp.length is not None and resp.length > max_bytes:
            raise BoundExceeded(f"{path} answered {resp.length:,} bytes; at most {max_bytes:,} are read")
        body = bytearray()
        for piece in read_pieces(resp, sock, deadline, timeout_s):
            body += piece
            if len(body) > max_bytes:
                raise BoundExceeded(f"{path} answered over {max_bytes:,} bytes; at most that many are read")
        return resp.status, bytes(body)
    except http.client.HTTPException as exc:   # a malformed answer: an I/O failure like the rest
        raise BoundExceeded(describe_error(exc)) from None
    finally:
        conn.close()


def model_entries(endpoint: Endpoint, timeout_s: float = 5.0) -> list[dict]:
    """The model entries the server lists (GET /v1/models; each has an ``id``,
    vLLM's also ``max_model_len``), or a one-line HbenchError.

    Called before any request is sent so a wrong or dead endpoint fails fast.
    """
    try:
        status, body = http_get(endpoint, "/v1/models", timeout_s)
    except OSError as exc:
        raise HbenchError(f"cannot reach {endpoint.url}: {exc}") from None
    if status != 200:
        raise HbenchError(f"{endpoint.url}/v1/models answered HTTP {status}")
    try:
        data = json.loads(body)["data"]
        if not all(isinstance(m, dict) and "id" in m for m in data):
            raise TypeError("an entry without an id")
        return list(data)
    except (ValueError, KeyError, TypeError):
        raise HbenchError(f"{endpoint.url}/v1/models did not return an OpenAI model list") from None


def served_models(endpoint: Endpoint, timeout_s: float = 5.0) -> list[str]:
    """Model ids the server serves (`model_entries`)."""
    return [m["id"] for m in model_entries(endpoint, timeout_s)]


def server_version(endpoint: Endpoint) -> str | None:
    """The server's own ``GET /version`` answer (vLLM, SGLang), or None."""
    try:
        status, body = http_get(endpoint, "/version", timeout_s=5.0)
        return body.decode(errors="replace").strip()[:200] if status == 200 else None
    except OSError:
        return None
