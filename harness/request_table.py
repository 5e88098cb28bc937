"""The one table of a run's requests: fixed-width columns, a row per request.

Every engine hands its requests back as a `RequestTable`, so the summary and
the per-request table (`harness.metrics`) are computed once, from columns,
whichever engine ran. A served engine's client and the in-process engines'
loop append a row per ended request (`RequestTable.append`); a table can
also be built from whole columns (`RequestTable.from_columns`). A row keeps
~200 bytes and no Python object: a request's token times are summed up as
its row goes in (token count and the mean, p50, p99 and max of its gaps,
`harness.token_times.token_time_stats`) and, for a finished measured
request, its gaps go into the table's `GapPool`, the sample of the
summary's ITL percentiles. Rows read back as `RequestRecord`s (made on
read, without token times) in request-id order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from harness.records import FINISHED, NULLABLE_FIELDS, STATUSES, RequestRecord
from harness.token_times import GapPool, inter_token_gaps_of, token_time_stats

#: The columns: integers (int64), whole counts that may be missing
#: (`NULLABLE_FIELDS`, float64 with NaN for None: exact below 2^53), then
#: times and ITL figures (float64, NaN for a time that is None); besides
#: them ``status`` (its index in `STATUSES`), ``warmup`` and the error texts.
INT_FIELDS = ("request_id", "prompt_tokens", "target_output_tokens", "output_tokens",
              "prefix_group", "session", "turn", "n_token_times")
FLOAT_FIELDS = (*NULLABLE_FIELDS, "arrival_s", "dispatch_s", "first_token_s", "finish_s",
                "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
#: What `token_time_stats` says of a request's token times, in its order.
ITL_FIELDS = ("n_token_times", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
_OPTIONAL = ("dispatch_s", "first_token_s", "finish_s")


class RequestTable(Sequence):
    """Rows of ended requests as columns, in request-id order once `seal`ed
    (rows may come in any order: requests end out of order). Appending
    stops at `seal`; reading seals."""

    def __init__(self):
        self._ints = {f: array("q") for f in INT_FIELDS}
        self._floats = {f: array("d") for f in FLOAT_FIELDS}
        self._status = array("b")                # index in STATUSES
        self._warmup = array("b")
        self._errors: dict[int, str] = {}        # request id -> its error, where there is one
        self._gaps = GapPool()
        self._sealed: dict[str, np.ndarray] | None = None

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> RequestTable:
        """The sealed table of ``records``, a row appended for each."""
        table = cls()
        for r in records:
            table.append(r)
        return table.seal()

    @classmethod
    def from_columns(cls, columns: Mapping[str, np.ndarray], *, statuses: Sequence[str],
                     errors: Mapping[int, str], gaps: tuple[np.ndarray, np.ndarray]
                     ) -> RequestTable:
        """A sealed table from whole columns: every field of `INT_FIELDS` and
        `FLOAT_FIELDS` and ``warmup`` (one value a request), each request's
        status, the errors by request id and the ITL sample as (values,
        counts) of the gaps of the finished measured requests."""
        table = cls()
        n = len(statuses)
        for f in (*INT_FIELDS, *FLOAT_FIELDS, "warmup"):
            assert len(columns[f]) == n, f"column {f} has {len(columns[f])} values, not {n}"
        table._ints = {f: array("q", np.asarray(columns[f], dtype=np.int64).tobytes())
                       for f in INT_FIELDS}
        table._floats = {f: array("d", np.asarray(columns[f], dtype=np.float64).tobytes())
                         for f in FLOAT_FIELDS}
        table._status = array("b", bytes(STATUSES.index(s) for s in statuses))
        table._warmup = array("b", np.asarray(columns["warmup"], dtype=np.int8).tobytes())
        table._errors = {int(k): v for k, v in errors.items() if v}
        table._gaps.add_counted(*gaps)
        return table.seal()

    def append(self, r: RequestRecord) -> None:
        """One ended request's row; its token times are summed up, and its
        gaps kept for the summary's ITL if it finished and is measured.
        ``r`` is read, never changed, and not held."""
        assert self._sealed is None, "no row after seal"
        gaps = inter_token_gaps_of(r.token_times)
        if r.status == FINISHED and not r.warmup:
            self._gaps.add(gaps)
        values = {**vars(r), **dict(zip(ITL_FIELDS, token_time_stats(r.token_times, gaps),
                                        strict=True))}
        for f, col in self._ints.items():
            col.append(values[f])
        for f, col in self._floats.items():
            v = values[f]
            col.append(np.nan if v is None else v)
        self._status.append(STATUSES.index(r.status))
        self._warmup.append(r.warmup)
        if r.error:
            self._errors[r.request_id] = r.error

    def seal(self) -> RequestTable:
        """Every row is in: the columns become arrays in request-id order."""
        if self._sealed is None:
            cols = {f: np.frombuffer(c, dtype=np.int64) for f, c in self._ints.items()}
            cols.update({f: np.frombuffer(c, dtype=np.float64) for f, c in self._floats.items()})
            cols["status"] = np.frombuffer(self._status, dtype=np.int8)
            cols["warmup"] = np.frombuffer(self._warmup, dtype=np.int8).astype(bool)
            order = np.argsort(cols["request_id"], kind="stable")
            self._sealed = {f: c[order] for f, c in cols.items()}
            self._ints = self._floats = {}
            self._status = self._warmup = array("b")
        return self

    def array(self, name: str) -> np.ndarray:
        """Column ``name`` (a field of `INT_FIELDS` or `FLOAT_FIELDS`, ``status``
        as its index in `STATUSES`, or ``warmup``), in request-id order; a
        field of `NULLABLE_FIELDS` as float64, NaN where it is None."""
        return self.seal()._sealed[name]

    def statuses(self) -> list[str]:
        return [STATUSES[k] for k in self.array("status").tolist()]

    def errors(self) -> list[str]:
        return [self._errors.get(rid, "") for rid in self.array("request_id").tolist()]

    def itl_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """The inter-token gaps of the finished measured requests, as (values,
        counts) arrays (`GapPool.counted`): the summary's ITL sample."""
        return self._gaps.counted()

    def has_turns(self) -> bool:
        """Whether a request has a turn index (a multi-turn workload)."""
        return bool((self.array("turn") >= 0).any())

    def last_finish(self) -> float:
        """The latest finish time of any request; 0.0 if none has one."""
        finishes = self.array("finish_s")
        finishes = finishes[~np.isnan(finishes)]
        return float(finishes.max()) if finishes.size else 0.0

    def __len__(self) -> int:
        if self._sealed is not None:
            return len(self._sealed["request_id"])
        return len(self._status)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        cols = self.seal()._sealed
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(i)
        v = {f: cols[f][k].item() for f in (*INT_FIELDS, *FLOAT_FIELDS) if f not in ITL_FIELDS}
        for f in _OPTIONAL:
            if v[f] != v[f]:          # NaN: None
                v[f] = None
        for f in NULLABLE_FIELDS:
            v[f] = None if v[f] != v[f] else int(v[f])
        return RequestRecord(**v, status=STATUSES[int(cols["status"][k])],
                             error=self._errors.get(v["request_id"], ""),
                             warmup=bool(cols["warmup"][k]))
