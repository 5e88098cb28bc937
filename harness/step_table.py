"""A step table stored as one tuple per row under one column list.

An engine's step rows (`harness.records.EngineRun.steps`) are dicts of
scalars. A long simulated run makes ~20 rows per request and a dict per row
costs ~2.5 kB, most of it the dict itself; `StepTable` keeps the column names
once and each row as a tuple of its values (~0.5 kB), and still reads as a
sequence of dict rows (``table[i]``, iteration), so code written for lists of
dicts works unchanged. `step_values` and `steps_frame` read either form by
column without building row dicts.

Every row has the same columns, in the order of the first row's keys: the
same order `pandas.DataFrame` gives a list of those dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


class StepTable(Sequence):
    """Rows with fixed ``columns``; ``rows[i]`` is a tuple of row i's values."""

    def __init__(self, columns: tuple[str, ...] = (), rows: list[tuple] | None = None):
        self.columns = tuple(columns)
        self.rows: list[tuple] = [] if rows is None else rows
        self._index = {c: i for i, c in enumerate(self.columns)}

    def set_columns(self, columns) -> None:
        """Name the columns (once, before the first row)."""
        assert not self.rows and not self.columns, "columns are fixed by the first row"
        self.columns = tuple(columns)
        self._index = {c: i for i, c in enumerate(self.columns)}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return StepTable(self.columns, self.rows[i])
        return dict(zip(self.columns, self.rows[i], strict=True))

    def __iter__(self):
        cols = self.columns
        for row in self.rows:
            yield dict(zip(cols, row, strict=True))

    def column(self, name: str) -> list:
        """The values of column ``name`` (a list of Nones if there is no such column)."""
        i = self._index.get(name)
        if i is None:
            return [None] * len(self.rows)
        return [row[i] for row in self.rows]

    def has(self, name: str) -> bool:
        return name in self._index

    def select(self, keep: list[bool]) -> StepTable:
        """The rows whose ``keep`` flag is true, in order (a new table sharing the tuples)."""
        return StepTable(self.columns, [row for row, k in zip(self.rows, keep, strict=True) if k])

    def to_frame(self) -> pd.DataFrame:
        """The same frame `pandas.DataFrame` makes of the rows as dicts."""
        if not self.rows:
            return pd.DataFrame()
        return pd.DataFrame.from_records(self.rows, columns=list(self.columns))


def step_values(steps, name: str) -> list:
    """Column ``name`` of a step table or a list of row dicts (None where a row lacks it)."""
    if isinstance(steps, StepTable):
        return steps.column(name)
    return [row.get(name) for row in steps]


def has_step_key(steps, name: str) -> bool:
    """Whether any row has a ``name`` entry (None values included)."""
    if isinstance(steps, StepTable):
        return steps.has(name) and len(steps) > 0
    return any(name in row for row in steps)


def steps_frame(steps) -> pd.DataFrame:
    """The step rows as a DataFrame (`StepTable.to_frame` or ``DataFrame(rows)``)."""
    if isinstance(steps, StepTable):
        return steps.to_frame()
    return pd.DataFrame(steps)
