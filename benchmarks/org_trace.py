"""Record the organization calls of a simulated serving run; replay them through any organization.

Why: the simulator's wall time mixes the scheduler, the cost model and the
organization. To compare the four organizations' own speed we need one fixed
stream of logical operations fed to each of them, side by side in one process.

Recording wraps the organization the simulator builds in `RecordingOrg`, a
proxy that forwards every call and logs it in an organization-independent
form: request ids, token positions and references to prefix-key lists (no
pages, no entries). Each request's key list is stored once (its final length;
the scheduler only ever appends to it) and an operation records how many keys
the list held at the call, so a replay sees exactly the list the recording
org saw. Results that feed later calls are referred to, not stored: an
``allocate`` "with hit" gets the replaying org's own last `lookup` result for
that key list, a ``can_allocate`` gets its own last `pages_needed` for that request.

Replay follows the trace's logical operations and tracks which requests the
replaying org has admitted, because the organizations differ in what fits:

* an admission (``allocate`` with keys) that does not fit is *refused*; the
  request's later calls are skipped until the trace admits it again;
* a continuation ``allocate`` that the recording org satisfied but the
  replaying org cannot is answered as a scheduler would, with ``preempt``
  (*forced preemption*), and the request is skipped likewise;
* ``finish`` of a request the replaying org does not hold becomes
  ``abandon`` (releases any pin it left), so nothing stays held at the end;
* commit / retain / preempt of a request it does not hold are skipped.

So commit or finish is never called on a request the replaying org did not
admit, and every organization runs its invariants clean after a replay.

A trace is a compact ``.npz``: an int64 op table (one row per call), the
concatenated key lists with offsets, the distinct headroom fractions, and the
recording run's configuration as JSON.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adapters.sim.engine import SimEngine
from harness.config import RunConfig
from harness.run_setup import RunSetup

# op codes; row layout: (op, rid, kidx, x, y, nkeys, flag)
LOOKUP, DEMAND, CAN_ALLOCATE, ALLOCATE, COMMIT, RETAIN, FINISH, PREEMPT, ABANDON, USAGE = range(10)
OP_NAMES = ("lookup", "pages_needed", "can_allocate", "allocate", "commit", "retain", "finish",
            "preempt", "abandon", "usage")
HAS_HIT, RECORDED_OK = 1, 2      # flag bits: a hit was passed; the recording org said True
NO_KEYS = -1                     # kidx / nkeys when the call passed keys=None
TRACE_VERSION = 1


@dataclass(frozen=True)
class Trace:
    """A recorded operation stream (see the module docstring for its columns)."""

    ops: np.ndarray            # int64 (n, 7)
    key_data: np.ndarray       # int64, all key lists concatenated
    key_offsets: np.ndarray    # int64 (lists + 1,)
    headrooms: tuple[float, ...]
    meta: dict

    def __len__(self) -> int:
        return len(self.ops)

    def key_lists(self) -> list[list[int]]:
        flat, off = self.key_data.tolist(), self.key_offsets.tolist()
        return [flat[off[i]:off[i + 1]] for i in range(len(off) - 1)]

    def op_counts(self) -> dict[str, int]:
        counts = np.bincount(self.ops[:, 0], minlength=len(OP_NAMES))
        return {name: int(n) for name, n in zip(OP_NAMES, counts, strict=True)}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.savez_compressed(f, ops=self.ops, key_data=self.key_data,
                                key_offsets=self.key_offsets,
                                headrooms=np.array(self.headrooms, dtype=np.float64),
                                meta=np.array(json.dumps({"version": TRACE_VERSION, **self.meta})))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            if meta.pop("version", None) != TRACE_VERSION:
                raise ValueError(f"{path}: trace format is not version {TRACE_VERSION}")
            return cls(z["ops"], z["key_data"], z["key_offsets"],
                       tuple(float(h) for h in z["headrooms"]), meta)


class RecordingOrg:
    """Forwards every call to ``org`` and logs the scheduler-facing ones.

    Attributes the scheduler or engine reads (``grid``, ``capacity``,
    ``invalidations`` ...) and unlogged methods (``check_invariants``) pass
    through unchanged, so the run behaves exactly as without the proxy.
    """

    def __init__(self, org):
        self._org = org
        self.rows: list[tuple[int, ...]] = []
        self._keys: list[list[int]] = []        # the scheduler's own lists, kept alive
        self._kidx: dict[int, int] = {}          # id(list) -> index
        self._hits: dict[int, object] = {}       # kidx -> last PrefixHit returned
        self._last_demand: tuple = (None, None)  # (rid, Demand) of the last pages_needed call
        self._headrooms: dict[float, int] = {}

    def __getattr__(self, name):
        return getattr(self._org, name)

    # ---- helpers ------------------------------------------------------------
    def _key_ref(self, keys) -> tuple[int, int]:
        if keys is None:
            return NO_KEYS, NO_KEYS
        i = self._kidx.get(id(keys))
        if i is None:
            i = self._kidx[id(keys)] = len(self._keys)
            self._keys.append(keys)
        return i, len(keys)

    def _hit_flag(self, kidx: int, hit) -> int:
        if hit is None:
            return 0
        if self._hits.get(kidx) is not hit:
            raise AssertionError("a PrefixHit not returned by the last lookup of these keys")
        return HAS_HIT

    # ---- logged calls ---------------------------------------------------------
    def lookup(self, keys, max_tokens: int):
        kidx, nk = self._key_ref(keys)
        hit = self._hits[kidx] = self._org.lookup(keys, max_tokens)
        self.rows.append((LOOKUP, -1, kidx, max_tokens, 0, nk, 0))
        return hit

    def pages_needed(self, rid, end: int, prefill_until: int, keys=None, hit=None,
                     prompt_len=None):
        # prompt_len acts only in place (vLLM's blocks), which is not traced
        kidx, nk = self._key_ref(keys)
        flag = self._hit_flag(kidx, hit)
        d = self._org.pages_needed(rid, end, prefill_until, keys, hit, prompt_len)
        self._last_demand = (rid, d)
        self.rows.append((DEMAND, rid, kidx, end, prefill_until, nk, flag))
        return d

    def can_allocate(self, demand, headroom: float = 0.0) -> bool:
        rid, last = self._last_demand
        if last is not demand:
            raise AssertionError("can_allocate with a Demand other than the last pages_needed's")
        h = self._headrooms.setdefault(float(headroom), len(self._headrooms))
        ok = self._org.can_allocate(demand, headroom)
        self.rows.append((CAN_ALLOCATE, rid, NO_KEYS, h, 0, NO_KEYS, RECORDED_OK if ok else 0))
        return ok

    def allocate(self, rid, end: int, prefill_until: int, keys=None, hit=None,
                 prompt_len=None) -> bool:
        # ``prompt_len`` matters only to vLLM paging, which traces do not replay
        kidx, nk = self._key_ref(keys)
        flag = self._hit_flag(kidx, hit)
        ok = self._org.allocate(rid, end, prefill_until, keys, hit, prompt_len)
        self.rows.append((ALLOCATE, rid, kidx, end, prefill_until, nk,
                          flag | (RECORDED_OK if ok else 0)))
        return ok

    def allocate_all(self, requests) -> bool:
        # logged as the ``allocate`` of each, in order, when all fit (what they
        # take); when not, nothing changed and the scheduler allocates one by one
        ok = self._org.allocate_all(requests)
        if ok:
            for rid, end, prefill_until in requests:
                self.rows.append((ALLOCATE, rid, NO_KEYS, end, prefill_until, NO_KEYS,
                                  RECORDED_OK))
        return ok

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        kidx, nk = self._key_ref(keys)
        self.rows.append((COMMIT, rid, kidx, computed, prefill_until, nk, 0))
        return self._org.commit(rid, keys, computed, prefill_until)

    def retain(self, rid, position: int, keys) -> bool:
        kidx, nk = self._key_ref(keys)
        ok = self._org.retain(rid, position, keys)
        self.rows.append((RETAIN, rid, kidx, position, 0, nk, RECORDED_OK if ok else 0))
        return ok

    def finish(self, rid) -> None:
        self.rows.append((FINISH, rid, NO_KEYS, 0, 0, NO_KEYS, 0))
        self._org.finish(rid)

    def preempt(self, rid) -> None:
        self.rows.append((PREEMPT, rid, NO_KEYS, 0, 0, NO_KEYS, 0))
        self._org.preempt(rid)

    def abandon(self, rid) -> None:
        self.rows.append((ABANDON, rid, NO_KEYS, 0, 0, NO_KEYS, 0))
        self._org.abandon(rid)

    def usage(self):
        self.rows.append((USAGE, -1, NO_KEYS, 0, 0, NO_KEYS, 0))
        return self._org.usage()

    def trace(self, meta: dict) -> Trace:
        lengths = [len(k) for k in self._keys]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.fromiter((k for keys in self._keys for k in keys), dtype=np.int64,
                           count=int(offsets[-1]))
        ops = np.array(self.rows, dtype=np.int64).reshape(-1, 7)
        headrooms = tuple(sorted(self._headrooms, key=self._headrooms.get))
        return Trace(ops, data, offsets, headrooms, meta)


class _RecordingSimEngine(SimEngine):
    """The simulator, with its organization wrapped in a `RecordingOrg`. It runs
    without the scheduler's stretches of quiet decode steps, so the trace holds
    the organization calls of every step (the per-step stream the replay
    benchmark measures)."""

    def __init__(self):
        super().__init__(fast=False)
        self.recorder: RecordingOrg | None = None

    def build(self, config):
        self.recorder = RecordingOrg(super().build(config))
        return self.recorder


def record_trace(config: RunConfig, workload=None) -> Trace:
    """Run the simulator on ``config`` (building its workload unless given) and
    return every organization call it made."""
    from harness.run_workload import build_run_workload

    if workload is None:
        workload = build_run_workload(config)
    engine = _RecordingSimEngine()
    engine.run(workload, RunSetup.resolve(config))
    meta = {"config": config.to_dict(), "workload_hash": workload.content_hash}
    return engine.recorder.trace(meta)


def build_org(name: str, trace: Trace):
    """A fresh organization ``name`` with the budget and model of the trace's run."""
    config = RunConfig.from_dict({**trace.meta["config"], "org": name})
    return SimEngine().build(RunSetup.resolve(config))


@dataclass(frozen=True)
class ReplayStats:
    """What replaying a trace through one organization did and cost."""

    org: str
    ops: int
    seconds: float
    admitted: int              # admissions the replaying org accepted
    refused: int               # admissions that did not fit
    forced_preemptions: int    # continuations that did not fit: preempted
    skipped: int               # ops of requests the replaying org did not hold
    finish_as_abandon: int
    seconds_by_op: dict | None = None

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")


def replay(trace: Trace, org, *, by_op: bool = False, key_lists=None, rows=None) -> ReplayStats:
    """Feed ``trace`` through ``org`` (fresh, same budget label); time it.

    ``key_lists`` / ``rows`` let a caller convert the trace once and replay it
    many times; ``by_op`` also accumulates seconds per op kind (slower).
    """
    finals = key_lists if key_lists is not None else trace.key_lists()
    rows = rows if rows is not None else trace.ops.tolist()
    heads = trace.headrooms
    keys_now: list[list[int]] = [[] for _ in finals]
    hits: dict[int, object] = {}
    demands: dict[int, object] = {}
    live: set = set()
    admitted = refused = forced = skipped = as_abandon = 0
    per_op = [0.0] * len(OP_NAMES) if by_op else None
    clock = time.perf_counter
    t_start = clock()
    for op, rid, kidx, x, y, nk, flag in rows:
        keys = None
        if kidx >= 0:
            keys = keys_now[kidx]
            if nk > len(keys):
                keys.extend(finals[kidx][len(keys):nk])
        if by_op:
            t0 = clock()
        if op == COMMIT:
            if rid in live:
                org.commit(rid, keys, x, y)
            else:
                skipped += 1
        elif op == ALLOCATE:
            hit = hits[kidx] if flag & HAS_HIT else None
            if rid in live:
                if not org.allocate(rid, x, y, keys, hit) and flag & RECORDED_OK:
                    org.preempt(rid)
                    live.discard(rid)
                    forced += 1
            elif keys is not None:
                if org.allocate(rid, x, y, keys, hit):
                    live.add(rid)
                    admitted += 1
                else:
                    refused += 1
            else:
                skipped += 1
        elif op == LOOKUP:
            hits[kidx] = org.lookup(keys, x)
        elif op == DEMAND:
            demands[rid] = org.pages_needed(rid, x, y, keys, hits[kidx] if flag & HAS_HIT else None)
        elif op == CAN_ALLOCATE:
            org.can_allocate(demands[rid], heads[x])
        elif op == USAGE:
            org.usage()
        elif op == FINISH:
            if rid in live:
                org.finish(rid)
                live.discard(rid)
            else:
                org.abandon(rid)
                as_abandon += 1
        elif op == PREEMPT:
            if rid in live:
                org.preempt(rid)
                live.discard(rid)
            else:
                skipped += 1
        elif op == RETAIN:
            if rid in live:
                org.retain(rid, x, keys)
            else:
                skipped += 1
        elif op == ABANDON:
            org.abandon(rid)
            live.discard(rid)
        if by_op:
            per_op[op] += clock() - t0
    seconds = clock() - t_start
    return ReplayStats(
        org=org.name, ops=len(rows), seconds=seconds, admitted=admitted, refused=refused,
        forced_preemptions=forced, skipped=skipped, finish_as_abandon=as_abandon,
        seconds_by_op=dict(zip(OP_NAMES, per_op, strict=True)) if by_op else None)


def trace_config(requests: int, rate: float, org: str = "s2", budget: str = "b83",
                 seed: int = 0) -> RunConfig:
    """The recording run's configuration (everything else at study defaults)."""
    return RunConfig(org=org, budget=budget, requests=requests, rate=rate, seed=seed)


def describe(trace: Trace) -> str:
    c = trace.meta["config"]
    counts = Counter({k: v for k, v in trace.op_counts().items() if v})
    parts = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    return (f"{len(trace)} ops recorded on {c['org']} at {c['budget']}, {c['requests']} requests "
            f"at {c['rate']} req/s (seed {c['seed']}): {parts}")
