"""One streamed completion: its request body, its events, its token times.

A request's whole life after the send is here: read the response line by line,
parse the server-sent events (`CompletionStream`, no I/O of its own), give one
time per output token, and end in one typed `StreamOutcome`. Failures are
data, as in vLLM's ``benchmarks/lib/endpoint_request_func.py``: an HTTP error,
a stream that ends without ``[DONE]``, an error event or a timeout yields an
outcome with ``success=False`` and the reason in ``error``, never an
exception, so a server that dies mid-run cannot hang or crash the benchmark.
When the request is sent is not decided here: `stream_exchange` runs a
``send`` step it is given (`stream_completion` sends at once; the open-loop
dispatcher sends at the arrival instant).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from adapters.client.http import (
    COMPLETIONS_PATH,
    DEFAULT_TIMEOUTS,
    IO_ERRORS,
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    BoundExceeded,
    Endpoint,
    Timeouts,
    describe_error,
    get_response,
    open_connection,
    post_json,
    read_pieces,
)
from harness.records import FAILED, FINISHED

Clock = Callable[[], float]


@dataclass
class StreamOutcome:
    """What one streamed completion produced (times relative to the run's start).

    ``success`` is False exactly when ``error`` says why; the tokens timed
    before a failure are kept where the stream broke off (I/O error, timeout,
    early end) and dropped where the server's answer was refused (an error or
    malformed event, the total timeout).
    """

    success: bool = True
    error: str = ""
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    usage: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        """The request record's status (``finished`` / ``failed``)."""
        return FINISHED if self.success else FAILED


def completion_body(model: str, prompt: str | list[int], output_len: int, salt: str | None,
                    extra: dict | None = None) -> dict:
    """The request body: exact output length, greedy, usage in the stream. The
    prompt is text, or token ids (the OpenAI completions API takes either)."""
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


class CompletionStream:
    """Parses one completion's event lines into ``out`` and times the chunks.

    Pure bookkeeping: lines and their arrival times come in through `feed`;
    `finish` or `fail` seals ``out``. Only this class appends to
    ``chunk_times``/``chunk_tokens`` (one entry per chunk that carried tokens).
    """

    def __init__(self, out: StreamOutcome):
        self.out = out
        self.done = False                 # [DONE] seen
        self.chunk_times: list[float] = []
        self.chunk_tokens: list[int] = []  # tokens a chunk is known to carry (0 = unknown, >= 1)

    def feed(self, line: bytes, now: float) -> str | None:
        """Take one line of the body, received at ``now``; returns why the
        stream is refused (then it must be failed), else None."""
        line = line.strip()
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return None
        try:
            event = json.loads(data)
        except ValueError:
            return f"malformed stream event: {data[:120]!r}"
        if "error" in event:
            return f"server error event: {event['error']}"
        out = self.out
        if event.get("usage"):
            out.usage = event["usage"]
        choices = event.get("choices") or []
        if not choices:
            return None
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
            self.chunk_times.append(now)
            self.chunk_tokens.append(n)
        out.text += text
        out.token_ids.extend(int(i) for i in ids)
        out.logprobs.extend(float(x) for x in lps)
        return None

    def finish(self, now: float) -> StreamOutcome:
        """Seal a complete stream: token times reconciled with the server's usage."""
        out = self.out
        out.finish_s = now
        out.token_times = token_times(self.chunk_times, self.chunk_tokens, out.usage)
        out.first_token_s = out.token_times[0] if out.token_times else None
        return out

    def fail(self, error: str, now: float, keep_tokens: bool = True) -> StreamOutcome:
        """Seal a failed stream; see `StreamOutcome` for which tokens are kept."""
        times, tokens = (self.chunk_times, self.chunk_tokens) if keep_tokens else ([], [])
        return failed(self.out, error, now, times, tokens)


def failed(out: StreamOutcome, error: str, now: float, chunk_times=(), chunk_tokens=()
           ) -> StreamOutcome:
    """Mark ``out`` failed at ``now`` with ``error``, timing the chunks given
    (the server's usage is not trusted for a failed stream)."""
    out.success = False
    out.error = error
    out.finish_s = now
    out.token_times = token_times(list(chunk_times), list(chunk_tokens), {})
    out.first_token_s = out.token_times[0] if out.token_times else None
    return out


def token_times(chunk_times: list[float], chunk_tokens: list[int], usage: dict) -> list[float]:
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


def stream_lines(resp: http.client.HTTPResponse, sock, deadline: float,
                 idle_s: float) -> Iterator[bytes]:
    """The lines of a streamed answer (each with its newline; a last one
    without), read by `adapters.client.http.read_pieces` (every wait at most
    ``idle_s``, none past ``deadline``); `BoundExceeded` for a line over
    `MAX_LINE_BYTES` or a stream over `MAX_STREAM_BYTES`."""
    buf, total = bytearray(), 0
    for piece in read_pieces(resp, sock, deadline, idle_s, cut_ends=True):
        total += len(piece)
        if total > MAX_STREAM_BYTES:
            raise BoundExceeded(f"the stream sent over {MAX_STREAM_BYTES:,} bytes")
        buf += piece
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            yield bytes(buf[start:end + 1])
            start = end + 1
        del buf[:start]
        if len(buf) > MAX_LINE_BYTES:
            raise BoundExceeded(f"the stream sent a line over {MAX_LINE_BYTES:,} bytes")
    if buf:
        yield bytes(buf)


def stream_exchange(conn: http.client.HTTPConnection, out: StreamOutcome,
                    send: Callable[[], None], t0: float, timeouts: Timeouts,
                    clock: Clock) -> StreamOutcome:
    """Run ``send`` (which writes the request and sets ``out.dispatch_s``),
    then read and time the stream.

    I/O errors from ``send`` or the stream become a failed outcome; ``conn`` is
    always closed.
    """
    stream = CompletionStream(out)
    try:
        send()
        start = out.dispatch_s
        sock = conn.sock  # getresponse() detaches it from conn when the server will close
        sock.settimeout(timeouts.first_byte_s)
        deadline = time.monotonic() + timeouts.total_s - (clock() - t0 - start)
        resp = get_response(conn, deadline)   # its headers too: none read past the deadline
        if resp.status != 200:
            head = bytearray()
            for piece in read_pieces(resp, sock, time.monotonic() + timeouts.idle_s, timeouts.idle_s):
                head += piece
                if len(head) >= 300:
                    break
            detail = bytes(head[:300]).decode(errors="replace").strip().replace("\n", " ")
            return stream.fail(f"HTTP {resp.status}: {detail}", clock() - t0, keep_tokens=False)
        for line in stream_lines(resp, sock, deadline, timeouts.idle_s):
            now = clock() - t0
            if now - start > timeouts.total_s:
                return stream.fail(f"total timeout {timeouts.total_s:g}s exceeded", now,
                                   keep_tokens=False)
            refused = stream.feed(line, now)
            if refused is not None:
                return stream.fail(refused, now, keep_tokens=False)
            if stream.done:
                break
        if not stream.done:
            return stream.fail(f"stream ended before [DONE] after {len(stream.chunk_times)} "
                               "chunks", clock() - t0)
        return stream.finish(clock() - t0)
    except TimeoutError:
        now = clock() - t0
        if out.dispatch_s is not None and now - out.dispatch_s >= timeouts.total_s:
            return stream.fail(f"total timeout {timeouts.total_s:g}s exceeded", now, keep_tokens=False)
        first = not stream.chunk_times
        what = "first byte" if first else "next chunk"
        limit = timeouts.first_byte_s if first else timeouts.idle_s
        return stream.fail(f"timed out after {limit:g}s waiting for {what}", now)
    except IO_ERRORS as exc:
        return stream.fail(describe_error(exc), clock() - t0)
    finally:
        conn.close()


def stream_completion(endpoint: Endpoint, body: dict, t0: float,
                      timeouts: Timeouts = DEFAULT_TIMEOUTS, path: str = COMPLETIONS_PATH,
                      clock: Clock = time.perf_counter) -> StreamOutcome:
    """Send one streaming completion now and time every chunk; never raises on I/O."""
    conn = open_connection(endpoint, timeouts)
    out = StreamOutcome()
    payload = json.dumps(body).encode()

    def send():
        out.dispatch_s = clock() - t0
        post_json(conn, path, payload)

    return stream_exchange(conn, out, send, t0, timeouts, clock)
