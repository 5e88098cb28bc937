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
                      clock: Callable[[], float] = time.perf_counter,
                      send_at: float | None = None) -> StreamOutcome:
    """Send one streaming completion and time every chunk; never raises on I/O.

    With ``send_at`` (a ``clock()`` instant) the connection is opened first and
    the request is sent at that instant, so connecting is off the dispatch path.
    """
    out = StreamOutcome()
    payload = json.dumps(body).encode()
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeouts.connect_s)
    chunk_times: list[float] = []
    chunk_tokens: list[int] = []     # tokens a chunk is known to carry (0 = unknown, >= 1)
    try:
        if send_at is not None:
            conn.connect()
            _sleep_until(send_at, clock)
        out.dispatch_s = clock() - t0
        start = out.dispatch_s
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
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
DISPATCH_LEAD_S = 0.02     # threads start this early, connect, then send at the arrival


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
    """
    requests = list(workload.requests)
    outcomes: list[StreamOutcome | None] = [None] * len(requests)
    lock = threading.Lock()
    completed = [0]

    def work(i: int, t0: float):
        r = requests[i]
        body = completion_body(model, r.prompt_text, r.output_len, r.salt, extra_body)
        try:
            outcome = stream_completion(endpoint, body, t0, timeouts, clock=clock,
                                        send_at=t0 + r.arrival_s)
        except Exception as exc:  # a client bug must fail one request, not lose it silently
            outcome = _fail(StreamOutcome(), f"client error {type(exc).__name__}: {exc}",
                            clock() - t0)
        with lock:
            outcomes[i] = outcome
            completed[0] += 1
            n = completed[0]
        if progress is not None:
            progress(n)

    threads = []
    # Many reader threads share the GIL; a short switch interval lets the
    # dispatcher take it back within ~0.1 ms of its deadline instead of 5 ms.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        t0 = clock() if t0 is None else t0
        for i, r in enumerate(requests):
            # start each request's thread a little early: it connects, then sends on time
            _sleep_until(t0 + r.arrival_s - DISPATCH_LEAD_S, clock)
            th = threading.Thread(target=work, args=(i, t0), daemon=True, name=f"hbench-req-{i}")
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(switch)
    end = clock() - t0
    records = [_record(r, o) for r, o in zip(requests, outcomes, strict=True)]
    return OpenLoopResult(records, outcomes, 0.0, end)


def _sleep_until(deadline: float, clock: Callable[[], float]) -> None:
    """Sleep until ``deadline``; no busy-wait, which would steal the GIL from readers."""
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
