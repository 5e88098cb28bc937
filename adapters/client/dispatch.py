"""Open-loop replay of a `Workload` against a streaming server, with
closed-loop turns for multi-turn sessions.

Each request is sent at its scheduled arrival time (relative to one start
instant) whether or not earlier requests have finished, so queueing happens
in the server, where it is measured, and not in the client. A multi-turn
workload's later turns are the exception by design: turn k is made by
`workloads.multiturn.session.SessionLoop` from what turn k-1 generated (its
text and, where the server streams them, its token ids) when turn k-1 ends,
and sent a think time later. Each request
records when it was really sent (``dispatch_s``; the dispatch lag is
``dispatch_s - arrival_s``), and `adapters.client.stream` times the rest.

Why threads: one reader thread per in-flight request is cheap at the rates a
single server sustains, and blocking reads with socket timeouts bound every
wait. Why the dispatcher sends itself: a request's thread starts and connects
`PREPARE_LEAD_S` before its arrival and then waits on its `ConnectionSlot`;
at the arrival the dispatcher (the calling thread) writes the request on that
open socket, so the send instant depends on one thread's wake-up only, not on
a second thread being created or scheduled.
"""

from __future__ import annotations

import heapq
import http.client
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass

from adapters.base import ProgressFn
from adapters.client.http import (
    COMPLETIONS_PATH,
    DEFAULT_TIMEOUTS,
    IO_ERRORS,
    Endpoint,
    Timeouts,
    open_connection,
    post_json,
)
from adapters.client.stream import (
    Clock,
    StreamOutcome,
    completion_body,
    failed,
    stream_exchange,
)
from harness.records import RequestRecord
from workloads.multiturn.session import SessionLoop

SWITCH_INTERVAL_S = 1e-4
PREPARE_LEAD_S = 0.05   # a request's thread starts and connects this long before its arrival
SPIN_S = 0.001          # the dispatcher sleeps until this close to a send time, then spins
SLEEP_SLICE_S = 0.25    # a long sleep wakes this often to see whether the run was stopped


class Abort:
    """A run stopped from outside: a watcher (the metrics scraper, when the
    server admits nothing for a long time) calls `trip` with the reason; the
    client then fails every request still in flight or not yet sent with that
    reason instead of waiting out each one's timeout."""

    def __init__(self):
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._hooks: list = []

    def is_set(self) -> bool:
        return self.reason is not None

    def on_trip(self, hook) -> None:
        with self._lock:
            self._hooks.append(hook)

    def trip(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            hooks = list(self._hooks)
        for hook in hooks:
            hook()


class ConnectionSlot:
    """One HTTP connection between preparation and send: its reader thread
    connects, the dispatcher sends, the reader thread reads the stream.

    The two threads meet on two events: ``connected`` (set by the reader once
    its connect ended, either way) and ``sent`` (set by the dispatcher once it
    tried to send). Only the dispatcher sets ``out.dispatch_s`` and
    ``send_error``; only the reader reads the response.
    """

    def __init__(self, conn: http.client.HTTPConnection, path: str, payload: bytes):
        self.conn = conn
        self.path = path
        self.payload = payload
        self.out = StreamOutcome()
        self.connected = threading.Event()
        self.sent = threading.Event()
        self.send_error: Exception | None = None
        self.sock = None   # the socket the request went out on (shut down by an abort)

    def connect_and_wait(self) -> None:
        """Reader side (the ``send`` step of `stream_exchange`): connect, wait for
        the dispatcher, and re-raise its send error so the outcome records it."""
        try:
            self.conn.connect()
        finally:
            self.connected.set()
        self.sent.wait()
        if self.send_error is not None:
            raise self.send_error

    def dispatch(self, t0: float, clock: Clock, connect_s: float) -> None:
        """Dispatcher side: send now if the reader connected; never raises."""
        if not self.connected.wait(connect_s + 1.0):
            self.send_error = OSError("not connected by the send time")
        elif self.conn.sock is not None:   # None: the connect failed, the reader reports it
            self.out.dispatch_s = clock() - t0
            self.sock = self.conn.sock
            try:
                post_json(self.conn, self.path, self.payload)
            except IO_ERRORS as exc:
                self.send_error = exc
        self.sent.set()

    def cancel(self, reason: str) -> None:
        """Abort side: an unsent request is not sent; a sent one's stream ends."""
        if not self.sent.is_set():
            self.send_error = OSError(reason)
            self.sent.set()
        elif self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # already closed


@dataclass
class OpenLoopResult:
    records: list[RequestRecord]
    outcomes: list[StreamOutcome]
    window_start_s: float
    window_end_s: float


def run_open_loop(endpoint: Endpoint, model: str, workload, *, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                  extra_body: dict | None = None, progress: ProgressFn | None = None,
                  clock: Clock = time.perf_counter,
                  t0: float | None = None, abort: Abort | None = None) -> OpenLoopResult:
    """Replay ``workload`` open-loop (later turns of its sessions closed-loop);
    one `RequestRecord` per request served, in request-id order.

    Times in the records are seconds since the start instant ``t0`` (now, if
    not given; pass it to share the origin with a metrics scraper), so
    ``window_start_s`` is 0 and ``window_end_s`` is when the last stream closed.

    One dispatcher (the calling thread) walks a merged timeline: at
    ``arrival - PREPARE_LEAD_S`` it starts the request's reader thread, which
    connects and waits; at ``arrival`` (slept to within ``SPIN_S``, then spun)
    it writes the request on that open socket itself.

    ``abort``, once tripped, fails every request not yet finished with its
    reason: unsent ones are not sent, open streams are shut down.
    """
    loop = SessionLoop(workload) if workload.sessions else None
    requests = list(workload.requests)   # grows: a session's next turn is appended when made
    outcomes: dict[int, StreamOutcome] = {}
    slots: dict[int, ConnectionSlot] = {}
    cond = threading.Condition()
    completed = [0]
    # (time, 0 = prepare / 1 = send, index): a request is prepared before it is sent
    timeline: list[tuple[float, int, int]] = []
    unfinished = [len(requests)]   # requests whose end may still add a turn

    def plan(i: int, r) -> None:
        heapq.heappush(timeline, (r.arrival_s - PREPARE_LEAD_S, 0, i))
        heapq.heappush(timeline, (r.arrival_s, 1, i))

    def read(i: int, slot: ConnectionSlot, t0: float):
        try:
            outcome = stream_exchange(slot.conn, slot.out, slot.connect_and_wait, t0, timeouts,
                                      clock)
        except Exception as exc:  # a client bug must fail one request, not lose it silently
            outcome = failed(slot.out, f"client error {type(exc).__name__}: {exc}", clock() - t0)
        if abort is not None and abort.is_set() and not outcome.success:
            outcome.error = f"stopped: {abort.reason} ({outcome.error})"
        nxt = None
        if loop is not None and outcome.success:
            nxt = loop.next_turn(requests[i], outcome.token_ids, outcome.finish_s, outcome.text)
        with cond:
            outcomes[i] = outcome
            completed[0] += 1
            n = completed[0]
            if nxt is not None:
                requests.append(nxt)
                unfinished[0] += 1
                plan(len(requests) - 1, nxt)
            unfinished[0] -= 1
            cond.notify()
        if progress is not None:
            progress(n)

    for i, r in enumerate(requests):
        plan(i, r)
    threads = []
    made: list[ConnectionSlot] = []
    if abort is not None:
        abort.on_trip(lambda: [slot.cancel(abort.reason) for slot in list(made)])
    # Many reader threads share the GIL; a short switch interval lets the
    # dispatcher take it back within ~0.1 ms of its deadline instead of 5 ms.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        t0 = clock() if t0 is None else t0
        while True:
            with cond:
                if not timeline and loop is not None and unfinished[0] > 0:
                    cond.wait()    # a turn in flight may still make the next one
                    continue
                if not timeline:
                    break
                at, kind, i = timeline[0]
                if loop is not None and (left := t0 + at - SPIN_S * kind - clock()) > 0:
                    cond.wait(left)   # woken early when a finished turn plans an earlier one
                    continue
                heapq.heappop(timeline)
            if kind == 0 and abort is not None and abort.is_set():
                with cond:   # never prepared: failed here, not sent
                    outcomes[i] = failed(StreamOutcome(), f"stopped: {abort.reason} (not sent)",
                                         clock() - t0)
                    completed[0] += 1
                    unfinished[0] -= 1
                continue
            if kind == 0:
                _sleep_until(t0 + at, clock, abort)
                r = requests[i]
                # a request without text (a calibration cell) goes as its token ids
                prompt = r.prompt_text or [int(t) for t in r.prompt_token_ids]
                body = completion_body(model, prompt, r.output_len, r.salt, extra_body)
                slots[i] = ConnectionSlot(open_connection(endpoint, timeouts), COMPLETIONS_PATH,
                                          json.dumps(body).encode())
                th = threading.Thread(target=read, args=(i, slots[i], t0), daemon=True,
                                      name=f"hbench-req-{i}")
                th.start()
                threads.append(th)
                made.append(slots[i])
                if abort is not None and abort.is_set():
                    slots[i].cancel(abort.reason)   # tripped while it was being made
            else:
                _sleep_until(t0 + at - SPIN_S, clock, abort)   # at once once stopped
                slot = slots.pop(i)
                if abort is not None and abort.is_set():
                    slot.cancel(abort.reason)
                    continue
                while clock() < t0 + at:
                    pass
                slot.dispatch(t0, clock, timeouts.connect_s)
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(switch)
    end = clock() - t0
    order = sorted(range(len(requests)), key=lambda i: requests[i].request_id)
    records = [request_record(requests[i], outcomes[i]) for i in order]
    if loop is not None:
        for rec in records:
            rec.session, rec.turn = loop.turn_of[rec.request_id]
    return OpenLoopResult(records, [outcomes[i] for i in order], 0.0, end)


def _sleep_until(deadline: float, clock: Clock, abort: Abort | None = None) -> None:
    """Sleep until ``deadline`` (or an abort); the final ``SPIN_S`` before a
    send is spun by the caller."""
    while (left := deadline - clock()) > 0:
        if abort is not None and abort.is_set():
            return
        time.sleep(min(left, SLEEP_SLICE_S))


def request_record(r, o: StreamOutcome) -> RequestRecord:
    """The harness's record of workload request ``r`` served as outcome ``o``
    (token counts and cached prompt tokens from the server's usage; the
    cached tokens are also its J_adopt). What the client cannot see is None,
    not 0 (`harness.records.NULLABLE_FIELDS`): a request's preemptions,
    recomputed tokens, deepest checkpoint and attention depth always, and its
    reuse where the server reported no cached-token count."""
    usage = o.usage or {}
    prompt_tokens = int(usage.get("prompt_tokens") or r.prompt_len)
    cached = reported_cached_tokens(usage)
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
        initial_input_tokens=None if cached is None else prompt_tokens - cached,
        recomputed_tokens=None,
        preemptions=None,
        # a hybrid model's prefix hit needs the attention blocks and a recurrent
        # state at the same position (the joint hit): what a server reports as
        # cached is the J it adopted
        j_adopt=cached,
        r_max=None,
        attn_depth=None,
        prefix_group=r.prefix_group,
    )


def reported_cached_tokens(usage: dict) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (vLLM with
    ``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``),
    or None where the server sent no count: unknown, not "nothing reused"."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict) or details.get("cached_tokens") is None:
        return None
    return int(details["cached_tokens"])
