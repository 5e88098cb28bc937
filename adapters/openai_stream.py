"""The one streaming client both real-engine adapters use.

It replays a `Workload` open-loop against an OpenAI-compatible
``/v1/completions`` endpoint: each request is sent at its scheduled arrival
time (relative to one start instant) whether or not earlier requests have
finished, so queueing happens in the server, where it is measured, and not in
the client. Each request records when it was really sent (``dispatch_s``; the
dispatch lag is ``dispatch_s - arrival_s``), its first streamed token, one time
per output token and the server's own token counts.

Why threads and ``http.client``: they are in the standard library, handle
chunked transfer decoding, and give per-socket timeouts for free; one thread
per in-flight request is cheap at the rates a single server sustains. Failures
are data: an HTTP error, a stream that ends without ``[DONE]``, an error event
or a timeout yields a ``failed`` record with the reason, never an exception,
so a server that dies mid-run cannot hang or crash the benchmark.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from harness.errors import HbenchError
from harness.records import FAILED, FINISHED, RequestRecord


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


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server's base address, e.g. ``http://127.0.0.1:8000``."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        text = url if "://" in url else f"http://{url}"
        parts = urlsplit(text)
        if parts.scheme != "http" or not parts.hostname:
            raise HbenchError(f"endpoint must look like http://HOST:PORT, got {url!r}")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise HbenchError(f"endpoint {url!r} has a bad port: {exc}") from None
        return cls(parts.hostname, port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def http_get(endpoint: Endpoint, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """One GET; returns (status, body). Network errors propagate as OSError."""
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def served_models(endpoint: Endpoint, timeout_s: float = 5.0) -> list[str]:
    """Model ids the server serves (GET /v1/models), or a one-line HbenchError.

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
        return [m["id"] for m in data]
    except (ValueError, KeyError, TypeError):
        raise HbenchError(f"{endpoint.url}/v1/models did not return an OpenAI model list") from None


@dataclass
class StreamOutcome:
    """What one streamed completion produced (times relative to the run's start)."""

    status: str = FINISHED
    error: str = ""
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    usage: dict = field(default_factory=dict)


def completion_body(model: str, prompt: str, output_len: int, salt: str | None,
                    extra: dict | None = None) -> dict:
    """The request body: exact output length, greedy, usage in the stream."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "min_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if salt is not None:
        body["cache_salt"] = salt
    if extra:
        body.update(extra)
    return body


def stream_completion(endpoint: Endpoint, body: dict, t0: float,
                      timeouts: Timeouts = DEFAULT_TIMEOUTS, path: str = "/v1/completions",
                      clock: Callable[[], float] = time.perf_counter) -> StreamOutcome:
    """Send one streaming completion now and time every chunk; never raises on I/O."""
    conn = _connection(endpoint, timeouts)
    out = StreamOutcome()
    payload = json.dumps(body).encode()

    def send():
        out.dispatch_s = clock() - t0
        _send(conn, path, payload)

    return _exchange(conn, out, send, t0, timeouts, clock)


def _connection(endpoint: Endpoint, timeouts: Timeouts) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeouts.connect_s)


def _send(conn: http.client.HTTPConnection, path: str, payload: bytes) -> None:
    conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})


def _exchange(conn: http.client.HTTPConnection, out: StreamOutcome, send: Callable[[], None],
              t0: float, timeouts: Timeouts, clock: Callable[[], float]) -> StreamOutcome:
    """Run ``send`` (which sets ``out.dispatch_s``), then read and time the stream.

    I/O errors from ``send`` or the stream become a failed outcome; ``conn`` is
    always closed.
    """
    chunk_times: list[float] = []
    chunk_tokens: list[int] = []     # tokens a chunk is known to carry (0 = unknown, >= 1)
    try:
        send()
        start = out.dispatch_s
        sock = conn.sock  # getresponse() detaches it from conn when the server will close
        sock.settimeout(timeouts.first_byte_s)
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(300).decode(errors="replace").strip().replace("\n", " ")
            return _fail(out, f"HTTP {resp.status}: {detail}", clock() - t0)
        sock.settimeout(timeouts.idle_s)
        done = False
        while True:
            line = resp.readline()
            now = clock() - t0
            if not line:
                break
            if now - start > timeouts.total_s:
                return _fail(out, f"total timeout {timeouts.total_s:g}s exceeded", now)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
            except ValueError:
                return _fail(out, f"malformed stream event: {data[:120]!r}", now)
            if "error" in event:
                return _fail(out, f"server error event: {event['error']}", now)
            if event.get("usage"):
                out.usage = event["usage"]
            choices = event.get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            ids = choice.get("token_ids") or []
            text = choice.get("text") or ""
            lp = choice.get("logprobs") or {}
            lps = [x for x in (lp.get("token_logprobs") or []) if x is not None]
            # A chunk carries tokens if it has text, ids or logprobs, or if it is
            # not the bare finish marker: detokenizers may hold back the text of
            # a partial UTF-8 character, so empty text alone does not mean "no token".
            n = len(ids) or len(lps) or (1 if text or choice.get("finish_reason") is None else 0)
            if n:
                chunk_times.append(now)
                chunk_tokens.append(n)
            out.text += text
            out.token_ids.extend(int(i) for i in ids)
            out.logprobs.extend(float(x) for x in lps)
        if not done:
            return _fail(out, f"stream ended before [DONE] after {len(chunk_times)} chunks",
                         clock() - t0, chunk_times, chunk_tokens)
        out.finish_s = clock() - t0
        out.token_times = _token_times(chunk_times, chunk_tokens, out.usage)
        out.first_token_s = out.token_times[0] if out.token_times else None
        return out
    except TimeoutError:
        what = "first byte" if not chunk_times else "next chunk"
        limit = timeouts.first_byte_s if not chunk_times else timeouts.idle_s
        return _fail(out, f"timed out after {limit:g}s waiting for {what}", clock() - t0,
                     chunk_times, chunk_tokens)
    except (OSError, http.client.HTTPException) as exc:
        return _fail(out, f"{type(exc).__name__}: {exc}", clock() - t0, chunk_times, chunk_tokens)
    finally:
        conn.close()


def _fail(out: StreamOutcome, error: str, now: float, chunk_times=(), chunk_tokens=()):
    out.status = FAILED
    out.error = error
    out.finish_s = now
    out.token_times = _token_times(list(chunk_times), list(chunk_tokens), {})
    out.first_token_s = out.token_times[0] if out.token_times else None
    return out


def _token_times(chunk_times: list[float], chunk_tokens: list[int], usage: dict) -> list[float]:
    """One time per output token: a chunk's time repeated for each token it carried.

    The server's ``usage.completion_tokens`` is the truth for the count. When
    chunks carried no ids, the count is reconciled at the end: surplus tokens
    take the last chunk's time, surplus chunks (a trailing chunk that carried
    no token) are dropped.
    """
    times = [t for t, n in zip(chunk_times, chunk_tokens, strict=True) for _ in range(n)]
    total = usage.get("completion_tokens")
    if total is None or not times:
        return times
    if total > len(times):
        times += [times[-1]] * (total - len(times))
    return times[:total]


ProgressFn = Callable[[int], None]
SWITCH_INTERVAL_S = 1e-4
PREPARE_LEAD_S = 0.05   # a request's thread starts and connects this long before its arrival
SPIN_S = 0.001          # the dispatcher sleeps until this close to a send time, then spins


class _Slot:
    """One request between preparation and send: a worker connects, the dispatcher sends.

    The dispatcher itself writes the request on the worker's already-open
    socket, so the send instant depends on one thread's wake-up only, not on a
    second thread being scheduled; the worker then reads the stream.
    """

    def __init__(self, conn: http.client.HTTPConnection, path: str, payload: bytes):
        self.conn = conn
        self.path = path
        self.payload = payload
        self.out = StreamOutcome()
        self.connected = threading.Event()   # set once the worker's connect ended, either way
        self.sent = threading.Event()        # set once the dispatcher tried to send
        self.send_error: Exception | None = None

    def connect_and_wait(self) -> None:
        """Worker side (the ``send`` step of `_exchange`): connect, wait for the dispatcher."""
        try:
            self.conn.connect()
        finally:
            self.connected.set()
        self.sent.wait()
        if self.send_error is not None:
            raise self.send_error

    def dispatch(self, t0: float, clock: Callable[[], float], connect_s: float) -> None:
        """Dispatcher side: send now if the worker connected; never raises."""
        if not self.connected.wait(connect_s + 1.0):
            self.send_error = OSError("not connected by the send time")
        elif self.conn.sock is not None:   # None: the connect failed, the worker reports it
            self.out.dispatch_s = clock() - t0
            try:
                _send(self.conn, self.path, self.payload)
            except (OSError, http.client.HTTPException) as exc:
                self.send_error = exc
        self.sent.set()


@dataclass
class OpenLoopResult:
    records: list[RequestRecord]
    outcomes: list[StreamOutcome]
    window_start_s: float
    window_end_s: float


def run_open_loop(endpoint: Endpoint, model: str, workload, *, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                  extra_body: dict | None = None, progress: ProgressFn | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  t0: float | None = None) -> OpenLoopResult:
    """Replay ``workload`` open-loop; one `RequestRecord` per request, in order.

    Times in the records are seconds since the start instant ``t0`` (now, if
    not given; pass it to share the origin with a metrics scraper), so
    ``window_start_s`` is 0 and ``window_end_s`` is when the last stream closed.

    One dispatcher (the calling thread) walks a merged timeline: at
    ``arrival - PREPARE_LEAD_S`` it starts the request's reader thread, which
    connects and waits; at ``arrival`` (slept to within ``SPIN_S``, then spun)
    it writes the request on that open socket itself.
    """
    requests = list(workload.requests)
    outcomes: list[StreamOutcome | None] = [None] * len(requests)
    slots: list[_Slot | None] = [None] * len(requests)
    lock = threading.Lock()
    completed = [0]

    def work(i: int, slot: _Slot, t0: float):
        try:
            outcome = _exchange(slot.conn, slot.out, slot.connect_and_wait, t0, timeouts, clock)
        except Exception as exc:  # a client bug must fail one request, not lose it silently
            outcome = _fail(slot.out, f"client error {type(exc).__name__}: {exc}", clock() - t0)
        with lock:
            outcomes[i] = outcome
            completed[0] += 1
            n = completed[0]
        if progress is not None:
            progress(n)

    # (time, 0 = prepare / 1 = send, index): a request is prepared before it is sent
    timeline = sorted([(r.arrival_s - PREPARE_LEAD_S, 0, i) for i, r in enumerate(requests)]
                      + [(r.arrival_s, 1, i) for i, r in enumerate(requests)])
    threads = []
    # Many reader threads share the GIL; a short switch interval lets the
    # dispatcher take it back within ~0.1 ms of its deadline instead of 5 ms.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        t0 = clock() if t0 is None else t0
        for at, kind, i in timeline:
            if kind == 0:
                _sleep_until(t0 + at, clock)
                r = requests[i]
                body = completion_body(model, r.prompt_text, r.output_len, r.salt, extra_body)
                slots[i] = _Slot(_connection(endpoint, timeouts), "/v1/completions",
                                 json.dumps(body).encode())
                th = threading.Thread(target=work, args=(i, slots[i], t0), daemon=True,
                                      name=f"hbench-req-{i}")
                th.start()
                threads.append(th)
            else:
                _sleep_until(t0 + at - SPIN_S, clock)
                while clock() < t0 + at:
                    pass
                slots[i].dispatch(t0, clock, timeouts.connect_s)
                slots[i] = None
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(switch)
    end = clock() - t0
    records = [_record(r, o) for r, o in zip(requests, outcomes, strict=True)]
    return OpenLoopResult(records, outcomes, 0.0, end)


def _sleep_until(deadline: float, clock: Callable[[], float]) -> None:
    """Sleep until ``deadline``; the final ``SPIN_S`` before a send is spun by the caller."""
    while (left := deadline - clock()) > 0:
        time.sleep(left)


def _record(r, o: StreamOutcome) -> RequestRecord:
    usage = o.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or r.prompt_len)
    cached = int(details.get("cached_tokens") or 0)
    return RequestRecord(
        request_id=r.request_id,
        arrival_s=float(r.arrival_s),
        prompt_tokens=prompt_tokens,
        target_output_tokens=r.output_len,
        status=o.status,
        error=o.error,
        dispatch_s=o.dispatch_s,
        first_token_s=o.first_token_s,
        finish_s=o.finish_s,
        token_times=list(o.token_times),
        output_tokens=int(usage.get("completion_tokens") or len(o.token_times)),
        reused_tokens=cached,
        initial_input_tokens=prompt_tokens - cached,
        prefix_group=r.prefix_group,
    )
