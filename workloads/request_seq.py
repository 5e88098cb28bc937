"""A large workload's requests, made one at a time when read.

A derived request holds its prompt's token ids and text (~30 kB at the
study's 3,332-token mean input), so a workload of a million requests made
at once would need ~30 GB. `MadeOnRead` keeps only what every check and
every engine's planning reads of a request (its arrival, prompt and output
lengths: 16 bytes a request, in NumPy arrays) and makes the whole
`workloads.workload.WorkloadRequest` from its recipe each time it is read
(``seq[i]``, iteration, slices). A run reads each request once, when it
arrives (`harness.engine.loop.EngineLoop` pulls arrivals in order), and
keeps it only while it is served; `Workload.content_hash` reads each once
more. Made twice, a request is the same value: the maker is a pure function
of the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

#: A derived workload of more requests is made request by request when read
#: (a million made at once would need ~30 GB); smaller ones are made at once,
#: so a sweep that serves one workload to many cells makes its requests once.
MADE_AT_ONCE = 4096


class MadeOnRead(Sequence):
    """Requests ``0..n-1``; ``make(i)`` returns request i. ``arrival_s``,
    ``prompt_len`` and ``output_len`` are request i's values at index i (the
    values ``make(i)`` gives its request)."""

    def __init__(self, make: Callable[[int], object], *, arrival_s: np.ndarray,
                 prompt_len: np.ndarray, output_len: np.ndarray):
        self._make = make
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.output_len = np.asarray(output_len, dtype=np.int64)
        n = len(self.arrival_s)
        assert len(self.prompt_len) == n and len(self.output_len) == n, "columns differ in length"

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._make(k) for k in range(*i.indices(len(self))))
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(i)
        return self._make(k)

    def __iter__(self) -> Iterator:
        make = self._make
        for k in range(len(self)):
            yield make(k)

    def __repr__(self) -> str:
        return f"MadeOnRead({len(self)} requests)"
