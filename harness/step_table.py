"""A step table stored by column, in chunks of rows.

Why: a long simulated run makes ~20 step rows per request and ~40 columns,
so a dict per row (~2.5 kB) would dominate its memory. `StepTable` takes
rows as tuples under one column list and packs every `CHUNK_ROWS` rows by
column (a numeric column as one NumPy array), yet still reads as a sequence
of dict rows, so code written for lists of dicts works unchanged; `to_frame`
gives the frame `pandas.DataFrame.from_records` makes of the rows.

Told to `spill` (the simulator's table, after `SPILL_AFTER_CHUNKS`), it
writes packed chunks as row groups of a temporary Parquet file, so a long
run holds no rows beyond the chunk being filled. Whatever it spills, it
reads and writes what the same table unspilled would (ints under a float
column as floats); a chunk that cannot be written under the first chunk's
column types brings the chunks back into memory. Chunks go to Arrow through `common.arrow_arrays`, so filling,
spilling and writing a table of numbers and strings loads no pandas.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

#: Rows packed by column at a time: big enough that packing costs little per
#: row, small enough that the rows not yet packed cost little memory.
CHUNK_ROWS = 4096

#: The chunks the simulator's step table keeps in memory before it spills
#: (`StepTable.spill`): 32,768 rows, ~12 MB packed, ~1,600 requests' steps.
#: A study-sized run (240 requests, ~5,000 rows) never spills: writing its
#: chunks to a temporary file and reading its columns back from there cost
#: more than the run's own steps.
SPILL_AFTER_CHUNKS = 8


_I32 = np.iinfo(np.int32)


def _pack(values: list):
    """One column's values: a float64 or int64 array when they are Python (or
    NumPy) floats and ints, as `pandas.DataFrame.from_records` would type
    them (ints that fit stored as int32, half the bytes; read back as
    int64); otherwise the list itself."""
    first = values[0]
    if isinstance(first, (str, bool, np.bool_)) or first is None:
        return values
    try:
        arr = np.array(values)
    except (ValueError, TypeError, OverflowError):
        return values
    if arr.ndim != 1 or arr.dtype.kind not in "fi":
        return values
    if arr.dtype == np.int64 and _I32.min <= arr.min() and arr.max() <= _I32.max:
        return arr.astype(np.int32)
    return arr


def _joined(pieces: list):
    """A column's pieces (arrays and lists, in order) as one array if every
    piece is numeric (ints as int64), else as one list of the values."""
    if all(isinstance(p, np.ndarray) for p in pieces):
        out = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return out.astype(np.int64) if out.dtype == np.int32 else out
    out: list = []
    for p in pieces:
        out.extend(p.tolist() if isinstance(p, np.ndarray) else p)
    return out


def _piece_type(piece):
    """The Parquet type of one chunk's column (float64, int64 or large_string),
    or None for one of another kind (bools, None among the values)."""
    import pyarrow as pa

    if isinstance(piece, np.ndarray):
        return pa.float64() if piece.dtype.kind == "f" else pa.int64()
    if all(type(v) is str for v in piece):
        return pa.large_string()
    return None


def _arrow_piece(piece, t):
    """One chunk's column as an Arrow array of Parquet type ``t`` (`_piece_type`)."""
    from common.arrow_arrays import from_numbers, from_strings

    if isinstance(piece, list):
        return from_strings(piece, t)
    return from_numbers(piece.astype(t.to_pandas_dtype(), copy=False))


#: A spill directory's name: this prefix, the pid of the process that made it, "-".
SPILL_PREFIX = "hbench-steps-"
#: A spill directory whose process is gone is left alone while anything in it
#: changed this recently: a process in another pid namespace sharing the
#: temporary directory (a container) looks gone from here.
ORPHAN_QUIET_S = 600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process: alive
        return True
    return True


def _last_change(path: str) -> float:
    """The latest modification time of ``path`` and the files in it."""
    with os.scandir(path) as entries:
        return max([os.stat(path).st_mtime, *(e.stat().st_mtime for e in entries)])


def remove_orphaned_spills(tmp: str | None = None, quiet_s: float = ORPHAN_QUIET_S) -> list[str]:
    """Remove the spill directories that processes no longer running left in
    ``tmp`` (default: the temporary directory). A table removes its own when
    it goes, but a killed process (SIGKILL, the OOM killer) leaves its
    directory behind, and a long run's holds hundreds of MB. The pid is in
    the name, so a directory of a live process, this one's included, is never
    touched, nor one changed in the last ``quiet_s`` seconds. Returns the
    directories removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        pid = name[len(SPILL_PREFIX):].split("-", 1)[0]
        if not (name.startswith(SPILL_PREFIX) and pid.isdigit()) or _pid_alive(int(pid)):
            continue
        path = os.path.join(tmp, name)
        try:
            if time.time() - _last_change(path) < quiet_s:
                continue
        except OSError:              # gone meanwhile, or not a directory
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


class _Spill:
    """The Parquet parts a spilling table's chunks went to, in a temporary
    directory removed with it: closed parts, then the one being written."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.schema = None
        self.parts: list[str] = []            # every part, the open one last
        self.writer = None                    # the open part's ParquetWriter
        self.groups = 0                       # row groups in the open part
        self.where: list[tuple[int, int]] = []  # per chunk on disk: (part, row group)
        self._readers: dict[int, object] = {}  # closed part -> its open ParquetFile (`_reader`)

    def fits(self, types) -> bool:
        """Whether a chunk of Parquet ``types`` can be written under the schema
        (its own types if it is the first)."""
        if any(t is None for t in types):
            return False
        if self.schema is None:
            return True
        import pyarrow as pa

        return all(t == s or (s == pa.float64() and t == pa.int64())
                   for t, s in zip(types, self.schema.types, strict=True))

    def write(self, columns, chunk, types) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.schema is None:
            self.schema = pa.schema(list(zip(columns, types, strict=True)))
        if self.writer is None:
            self._close_readers()   # a part of its own: the files open for reading need not stay
            self.parts.append(os.path.join(self.dir, f"part{len(self.parts)}.parquet"))
            self.writer = pq.ParquetWriter(self.parts[-1], self.schema)
            self.groups = 0
        arrays = [_arrow_piece(p, t) for p, t in zip(chunk, self.schema.types, strict=True)]
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
        self.where.append((len(self.parts) - 1, self.groups))
        self.groups += 1

    def close_part(self) -> None:
        """Close the open part (so that it can be read); the next chunk opens a new one."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _reader(self, part: int):
        """Closed part ``part``, open for reading. Kept open until the next part
        is begun or the table goes: reading the columns of a run one by one (its
        summary reads some 30) would otherwise open the file and parse its
        footer for each, three quarters of the reading's time."""
        reader = self._readers.get(part)
        if reader is None:
            import pyarrow.parquet as pq

            reader = self._readers[part] = pq.ParquetFile(self.parts[part])
        return reader

    def _close_readers(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def read_column(self, name: str):
        """Column ``name`` of every chunk on disk, as one piece."""
        import pyarrow as pa

        from common.arrow_arrays import values_of

        self.close_part()
        chunks = []
        for part in range(len(self.parts)):
            chunks.extend(self._reader(part).read(columns=[name]).column(0).chunks)
        return values_of(pa.chunked_array(chunks, type=self.schema.field(name).type))

    def read_frame(self, names):
        """Columns ``names`` of every chunk on disk as one frame, converted by
        Arrow (the frame pandas makes of the values: float64, int64, str)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.close_part()
        tables = [pq.read_table(part, columns=list(names)) for part in self.parts]
        return pa.concat_tables(tables).to_pandas()

    def read_chunk(self, c: int):
        """Chunk ``c`` on disk as an Arrow table."""
        self.close_part()
        part, group = self.where[c]
        return self._reader(part).read_row_group(group)

    def remove(self) -> None:
        self.close_part()
        self._close_readers()
        self._cleanup()


class StepTable(Sequence):
    """Rows with fixed ``columns``: packed chunks (`_chunks`, one piece per
    column each) and the rows appended since (``rows``, tuples)."""

    def __init__(self, columns: tuple[str, ...] = (), rows: list[tuple] | None = None):
        self.columns = tuple(columns)
        self.rows: list[tuple] = [] if rows is None else rows
        self._index = {c: i for i, c in enumerate(self.columns)}
        self._chunks: list[list] = []        # per chunk: one piece per column
        self._starts: list[int] = []         # the first row index of each chunk
        self._packed = 0                     # rows in the chunks
        self._spill: _Spill | None = None    # where chunks went (`spill`), if anywhere
        self._spilled = 0                    # the first chunks, on disk (None in `_chunks`)
        self._spill_after: int | None = None  # spill once more chunks than this are packed

    def spill(self, after_chunks: int = 0) -> None:
        """Write packed chunks to a temporary Parquet file instead of keeping
        them, once more than ``after_chunks`` are packed (see the module
        docstring). What killed processes' tables left is removed now."""
        assert not self._chunks, "spill before the first chunk is packed"
        remove_orphaned_spills()
        self._spill_after = after_chunks

    def set_columns(self, columns) -> None:
        """Name the columns (once, before the first row)."""
        assert not len(self) and not self.columns, "columns are fixed by the first row"
        self.columns = tuple(columns)
        self._index = {c: i for i, c in enumerate(self.columns)}

    def append(self, row: tuple) -> None:
        """One more row (its values in column order)."""
        rows = self.rows
        rows.append(row)
        if len(rows) >= CHUNK_ROWS:
            self._pack_rows()

    def _pack_rows(self) -> None:
        """The appended rows become one chunk, packed by column."""
        if not self.rows:
            return
        self._starts.append(self._packed)
        self._chunks.append([_pack(list(col)) for col in zip(*self.rows, strict=True)])
        self._packed += len(self.rows)
        self.rows = []
        if self._spill_after is not None and len(self._chunks) > self._spill_after:
            self._spill_chunks()

    def _spill_chunks(self) -> None:
        """Every chunk still in memory to the spill file, in order (the file is
        made with the first); a chunk that does not fit its types brings the
        table back into memory for good (`_unspill`)."""
        if self._spill is None:
            self._spill = _Spill()
        spill = self._spill
        for c in range(self._spilled, len(self._chunks)):
            chunk = self._chunks[c]
            types = [_piece_type(p) for p in chunk]
            if not spill.fits(types):
                self._unspill()
                return
            spill.write(self.columns, chunk, types)
            self._chunks[c] = None
            self._spilled += 1

    def seal(self) -> None:
        """No more rows for now: a spilling table that has spilled, or would
        with the rows appended since its last chunk as one more, writes them as
        that chunk and closes its file, so that reading it and `write_parquet`
        (a link to that file) need no second part. One still under its
        ``after_chunks`` keeps its rows in memory."""
        after = self._spill_after
        if after is not None and (self._spill is not None
                                  or len(self._chunks) + bool(self.rows) > after):
            self._pack_rows()
            if self._spill is not None:
                self._spill.close_part()

    def _unspill(self) -> None:
        """The chunks on disk back into memory, a piece per column each; no more spilling."""
        from common.arrow_arrays import values_of

        spill = self._spill
        for c in range(self._spilled):
            table = spill.read_chunk(c)
            self._chunks[c] = [values_of(table.column(i)) for i in range(len(self.columns))]
        spill.remove()
        self._spill, self._spilled, self._spill_after = None, 0, None

    def __len__(self) -> int:
        return self._packed + len(self.rows)

    def _row(self, k: int) -> tuple:
        if k >= self._packed:
            return self.rows[k - self._packed]
        c = bisect_right(self._starts, k) - 1
        j = k - self._starts[c]
        if c < self._spilled:
            return tuple(self._spill.read_chunk(c).slice(j, 1).to_pylist()[0].values())
        return tuple(p[j].item() if isinstance(p, np.ndarray) else p[j] for p in self._chunks[c])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._take(range(*i.indices(len(self))))
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(i)
        return dict(zip(self.columns, self._row(k), strict=True))

    def __iter__(self):
        cols = self.columns
        for c, chunk in enumerate(self._chunks):
            if c < self._spilled:
                for row in self._spill.read_chunk(c).to_pylist():
                    yield dict(zip(cols, row.values(), strict=True))
                continue
            lists = [p.tolist() if isinstance(p, np.ndarray) else p for p in chunk]
            for row in zip(*lists, strict=True):
                yield dict(zip(cols, row, strict=True))
        for row in self.rows:
            yield dict(zip(cols, row, strict=True))

    def _pieces(self, i: int) -> list:
        """Column ``i``'s pieces: each chunk's (those on disk read back as one),
        then the appended rows' values."""
        pieces = [self._spill.read_column(self.columns[i])] if self._spilled else []
        pieces.extend(chunk[i] for chunk in self._chunks[self._spilled:])
        if self.rows:
            pieces.append(_pack([row[i] for row in self.rows]))
        return pieces

    def array(self, name: str):
        """Column ``name`` as one NumPy array when it is numeric, else as a list
        of its values; None if there is no such column or no row."""
        i = self._index.get(name)
        if i is None or not len(self):
            return None
        return _joined(self._pieces(i))

    def column(self, name: str) -> list:
        """The values of column ``name`` (a list of Nones if there is no such column)."""
        i = self._index.get(name)
        if i is None:
            return [None] * len(self)
        values = _joined(self._pieces(i)) if len(self) else []
        return values.tolist() if isinstance(values, np.ndarray) else values

    def has(self, name: str) -> bool:
        return name in self._index

    def _take(self, index, columns=None) -> StepTable:
        """A new table of the rows at ``index`` (increasing positions), in order
        (of ``columns`` only, those of them the table has, if given)."""
        index = np.asarray(index, dtype=np.int64)
        names = [c for c in self.columns if columns is None or c in columns]
        out = StepTable(names)
        if index.size:
            out._chunks = [[self._subset(self._index[c], index) for c in names]]
            out._starts, out._packed = [0], int(index.size)
        return out

    def _subset(self, i: int, index: np.ndarray):
        values = _joined(self._pieces(i))
        if isinstance(values, np.ndarray):
            return values[index]
        return [values[k] for k in index.tolist()]

    def select(self, keep, columns=None) -> StepTable:
        """The rows whose ``keep`` flag is true, in order (a new table; of
        ``columns`` only, those of them the table has, if given)."""
        keep = np.asarray(keep, dtype=bool)
        assert keep.size == len(self), "one flag per row"
        return self._take(np.flatnonzero(keep), columns)

    def to_frame(self, columns=None):
        """The same frame `pandas.DataFrame.from_records` makes of the rows
        (of ``columns`` only, those of them the table has, if given)."""
        import pandas as pd

        if not len(self):
            return pd.DataFrame()
        names = [c for c in self.columns if columns is None or c in columns]
        if self._spilled and self._spilled == len(self._chunks) and not self.rows:
            return self._spill.read_frame(names)       # every row on disk: Arrow to pandas
        return pd.DataFrame({c: _joined(self._pieces(self._index[c])) for c in names},
                            columns=names)

    def _arrow_types(self):
        """Each column's Parquet type as pandas would write the frame (int64,
        float64 and str columns), or None if some column is of another kind."""
        import pyarrow as pa

        if self._spilled:
            return self._spilled_types()
        types = []
        for i in range(len(self.columns)):
            pieces = self._pieces(i)
            if all(isinstance(p, np.ndarray) for p in pieces):
                floats = any(p.dtype.kind == "f" for p in pieces)
                types.append(pa.float64() if floats else pa.int64())
            elif all(isinstance(p, list) and all(type(v) is str for v in p) for p in pieces):
                types.append(pa.large_string())
            else:
                return None
        return types

    def _spilled_types(self):
        """`_arrow_types` of a table with chunks on disk: the file's types, as
        the chunks in memory and the appended rows leave them."""
        import pyarrow as pa

        types = []
        for i, t in enumerate(self._spill.schema.types):
            pieces = [chunk[i] for chunk in self._chunks[self._spilled:]]
            if self.rows:
                pieces.append(_pack([row[i] for row in self.rows]))
            kinds = {_piece_type(p) for p in pieces}
            if t == pa.large_string():
                if kinds - {t}:
                    return None
            elif kinds - {pa.float64(), pa.int64()}:
                return None
            elif pa.float64() in kinds:
                t = pa.float64()
            types.append(t)
        return types

    def write_parquet(self, path) -> None:
        """Write the table to ``path`` a chunk at a time (one row group each),
        never as one frame: what `pandas.read_parquet` reads back is the frame
        `to_frame` gives. A table with a column that is neither numeric nor
        strings is written through that frame."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._spill is not None:
            self._pack_rows()              # the last rows to disk too (or every chunk back)
        if self._spill is not None and self._spilled and self._spilled == len(self._chunks):
            self._write_spilled(path)
            return
        types = self._arrow_types() if len(self) else None
        if types is None:
            self.to_frame().to_parquet(path, index=False)
            return
        schema = pa.schema(list(zip(self.columns, types, strict=True)))
        chunks = list(self._chunks)
        if self.rows:
            chunks.append([_pack([row[i] for row in self.rows]) for i in range(len(self.columns))])
        with pq.ParquetWriter(path, schema) as writer:
            for chunk in chunks:
                arrays = [_arrow_piece(p, t) for p, t in zip(chunk, types, strict=True)]
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))

    def _write_spilled(self, path) -> None:
        """Every chunk is on disk: the file itself (linked, else copied), or its
        parts' row groups in order into one file if reading closed it early."""
        import pyarrow.parquet as pq

        spill = self._spill
        spill.close_part()
        if len(spill.parts) == 1:
            try:
                os.link(spill.parts[0], path)
            except OSError:
                shutil.copyfile(spill.parts[0], path)
            return
        with pq.ParquetWriter(path, spill.schema) as writer:
            for c in range(self._spilled):
                writer.write_table(spill.read_chunk(c))


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


def steps_frame(steps, columns=None):
    """The step rows as a DataFrame (`StepTable.to_frame` or ``DataFrame(rows)``),
    of ``columns`` only (those of them the rows have) if given."""
    import pandas as pd

    if isinstance(steps, StepTable):
        return steps.to_frame(columns)
    frame = pd.DataFrame(steps)
    return frame if columns is None else frame[[c for c in frame.columns if c in columns]]


def write_steps(steps, path) -> None:
    """Write step rows to the Parquet file ``path``: a `StepTable` chunk by
    chunk (`StepTable.write_parquet`), a list of row dicts as its frame."""
    if isinstance(steps, StepTable):
        steps.write_parquet(path)
    else:
        steps_frame(steps).to_parquet(path, index=False)
