"""Replay a saved workload against a live server: what each request could share, and what it reused.

The replay itself is `adapters.client.dispatch.run_open_loop` (arrivals as
the workload says, later turns of a multi-turn workload closed-loop), the
same client `hbench run --engine vllm` uses. What this room adds is the
other column of the comparison, per request:

- ``shareable``: the tokens the workload lets it share with a request sent
  before it. A first turn: the longest common prefix of its token ids with
  any earlier-arriving request's (the workload's own tokens); that earlier
  request is its ``sharer``. A later turn: its session's previous turn,
  whole (prompt plus generated tokens, as the server counted them).
- ``reused``: ``usage.prompt_tokens_details.cached_tokens``, else an estimate
  from its time to first token against the probe's prefill fit (``estimated``).

and the facts a reason needs (salts, whether the sharer had produced its
first token when this request was sent, the sharer's prompt length).
"""

from __future__ import annotations

import numpy as np

from adapters.client.dispatch import run_open_loop
from adapters.client.http import Endpoint, Timeouts
from adapters.client.probe_ttft import PrefillFit


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token-id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


def first_turn_sharers(workload) -> dict[int, tuple[int, int]]:
    """request id -> (shareable tokens, sharer id) for the workload's open-loop
    requests that share a prefix with an earlier-arriving one (ties by id)."""
    order = sorted(workload.requests, key=lambda r: (r.arrival_s, r.request_id))
    out: dict[int, tuple[int, int]] = {}
    by_first: dict[int, list] = {}     # first token -> earlier requests starting with it
    for r in order:
        ids = r.prompt_token_ids
        best, who = 0, -1
        for e in by_first.get(int(ids[0]), ()):
            n = common_prefix(ids, e.prompt_token_ids)
            if n > best:
                best, who = n, e.request_id
        if best > 0:
            out[r.request_id] = (best, who)
        by_first.setdefault(int(ids[0]), []).append(r)
    return out


def replay_rows(endpoint: Endpoint, model: str, workload, *, timeouts: Timeouts,
                fit: PrefillFit | None = None) -> list[dict]:
    """Serve ``workload`` and return one row per request (see the module docstring)."""
    result = run_open_loop(endpoint, model, workload, timeouts=timeouts)
    by_id = {rec.request_id: (rec, o) for rec, o in zip(result.records, result.outcomes,
                                                        strict=True)}
    # a record outside any session has session and turn -1 (harness.records)
    turn_of = {(rec.session, rec.turn): rec for rec in result.records
               if rec.session is not None and rec.session >= 0}
    wl = {r.request_id: r for r in workload.requests}
    firsts = first_turn_sharers(workload)
    rows = []
    for rec in result.records:
        o = by_id[rec.request_id][1]
        details = (o.usage or {}).get("prompt_tokens_details")
        reported = isinstance(details, dict) and details.get("cached_tokens") is not None
        ttft = (rec.first_token_s - rec.dispatch_s
                if rec.first_token_s is not None and rec.dispatch_s is not None else None)
        if reported:
            reused, estimated = rec.reused_tokens, False
        elif fit is not None and ttft is not None:
            reused, estimated = fit.reused(rec.prompt_tokens, ttft), True
        else:
            reused, estimated = None, True
        shareable, sharer = 0, None
        in_session = rec.session is not None and rec.session >= 0
        if in_session and rec.turn > 0:
            prev = turn_of.get((rec.session, rec.turn - 1))
            if prev is not None:
                shareable, sharer = prev.prompt_tokens + prev.output_tokens, prev
        elif rec.request_id in firsts:
            shareable, sid = firsts[rec.request_id]
            sharer = by_id[sid][0]
        salt = wl[rec.request_id].salt if rec.request_id in wl else None
        sharer_salt = (wl[sharer.request_id].salt if sharer is not None and sharer.request_id in wl
                       else salt)
        rows.append({
            "request_id": rec.request_id, "session": rec.session if in_session else None,
            "turn": rec.turn if in_session else None,
            "status": rec.status, "prompt_tokens": rec.prompt_tokens,
            "shareable": min(shareable, max(rec.prompt_tokens - 1, 0)) if shareable else 0,
            "reused": reused, "estimated": estimated,
            "sharer": None if sharer is None else sharer.request_id,
            "sharer_prompt": None if sharer is None else sharer.prompt_tokens,
            "salt_differs": sharer is not None and salt != sharer_salt,
            "sharer_started": sharer is not None and sharer.first_token_s is not None
            and rec.dispatch_s is not None and sharer.first_token_s <= rec.dispatch_s,
            "ttft_ms": None if ttft is None else round(ttft * 1e3, 2),
        })
    return rows
