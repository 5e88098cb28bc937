"""NumPy arrays and lists of strings to and from Arrow arrays, through their buffers.

pyarrow's own conversions (`pyarrow.array`, ``Array.to_numpy``,
``ChunkedArray.to_numpy``, `pyarrow.parquet.read_table`) first ask pyarrow's
pandas shim whether the values are pandas objects, and the shim imports
pandas wherever it is installed: ~0.3 s, more than a study-sized simulated
run's engine and writing together. The functions here build and read Arrow
arrays from their buffers instead (a NumPy array's bytes are an Arrow
primitive array's data buffer), so the code that writes a run's tables and
reads back the step table's spilled chunks loads no pandas. What they build
is what `pyarrow.array` builds of the same values (`from_numbers` with
``nan_is_null`` what `pyarrow.Table.from_pandas` builds of a float column);
``to_pylist`` and ``as_py``, which need no shim, read strings back.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMBER_TYPES = {np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64(),
                 np.dtype(np.float64): pa.float64()}
_OFFSET_DTYPES = {pa.string(): np.int32, pa.large_string(): np.int64}


def _bitmap(flags: np.ndarray) -> pa.Buffer:
    """Arrow's bit-packed layout of a bool array (least significant bit first)."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def from_numbers(values: np.ndarray, *, nan_is_null: bool = False) -> pa.Array:
    """A 1-D bool, int32, int64 or float64 array as an Arrow array of that
    type (sharing its bytes where it is contiguous); with ``nan_is_null`` a
    NaN is a null, as pandas writes a float column, else a NaN value."""
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, _bitmap(values)])
    arrow_type = _NUMBER_TYPES.get(values.dtype)
    if arrow_type is None or values.ndim != 1:
        raise TypeError(f"no Arrow column for a {values.ndim}-D {values.dtype} array")
    validity, nulls = None, 0
    if nan_is_null and values.dtype.kind == "f":
        missing = np.isnan(values)
        nulls = int(missing.sum())
        if nulls:
            validity = _bitmap(~missing)
    return pa.Array.from_buffers(arrow_type, len(values), [validity, pa.py_buffer(values)],
                                 null_count=nulls)


def from_nullable_ints(values: np.ndarray) -> pa.Array:
    """Whole numbers held as float64, NaN for a missing one, as an Arrow
    int64 array with a null for each NaN (what pandas' ``Int64`` writes): a
    count an engine did not observe stays missing instead of reading as 0.
    ValueError for a value that is not a whole number."""
    values = np.asarray(values, dtype=np.float64)
    missing = np.isnan(values)
    ints = np.where(missing, 0.0, values).astype(np.int64)
    if not np.array_equal(ints[~missing], values[~missing]):
        raise ValueError("a nullable integer column holds a value that is not a whole number")
    nulls = int(missing.sum())
    return pa.Array.from_buffers(pa.int64(), len(ints),
                                 [_bitmap(~missing) if nulls else None, pa.py_buffer(ints)],
                                 null_count=nulls)


def from_strings(values: list, arrow_type: pa.DataType | None = None) -> pa.Array:
    """A list of str (None for a null) as an Arrow ``string`` (the default)
    or ``large_string`` array."""
    arrow_type = pa.string() if arrow_type is None else arrow_type
    try:
        encoded = [b"" if v is None else v.encode() for v in values]
    except AttributeError:
        bad = next(v for v in values if v is not None and not isinstance(v, str))
        raise TypeError(f"not a string for an Arrow text column: {bad!r}") from None
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(values)), out=offsets[1:])
    offset_dtype = _OFFSET_DTYPES[arrow_type]
    if offsets[-1] > np.iinfo(offset_dtype).max:
        raise OverflowError(f"{offsets[-1]} bytes of text do not fit an Arrow {arrow_type} column")
    missing = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    nulls = int(missing.sum())
    return pa.Array.from_buffers(
        arrow_type, len(values),
        [_bitmap(~missing) if nulls else None, pa.py_buffer(offsets.astype(offset_dtype)),
         pa.py_buffer(b"".join(encoded))], null_count=nulls)


def from_values(values: np.ndarray | list, *, nan_is_null: bool = False) -> pa.Array:
    """A column as Arrow infers it, as `pyarrow.Table.from_pandas` does: a
    NumPy array by its dtype (`from_numbers`), a list of str and None as
    ``string``, or as ``null`` when it holds no string (no row, or None in
    every row)."""
    if isinstance(values, np.ndarray):
        return from_numbers(values, nan_is_null=nan_is_null)
    if all(v is None for v in values):
        return pa.nulls(len(values))
    return from_strings(values)


def table(columns: dict[str, np.ndarray | list], *, nan_is_null: bool = False,
          nullable_ints=()) -> pa.Table:
    """A table of ``columns`` (name: values, in order), each by `from_values`,
    those named in ``nullable_ints`` by `from_nullable_ints`."""
    return pa.Table.from_arrays(
        [from_nullable_ints(v) if name in nullable_ints else from_values(v, nan_is_null=nan_is_null)
         for name, v in columns.items()], names=list(columns))


def numbers(arr: pa.Array) -> np.ndarray:
    """The values of an integer or floating-point array without nulls, as a
    read-only view of its data buffer."""
    if arr.null_count:
        raise ValueError("a stored number is missing")
    dtype = np.dtype(arr.type.to_pandas_dtype())
    if dtype.kind not in "iuf":
        raise TypeError(f"not a numeric Arrow array: {arr.type}")
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr),
                         offset=arr.offset * dtype.itemsize)


def values_of(column: pa.ChunkedArray | pa.Array) -> np.ndarray | list:
    """A numeric column without nulls as a new NumPy array, a text column as a
    list of str (None for a null; equal strings one object, as pandas reads
    them, so a column of a few distinct values costs a pointer a row)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        shared: dict[str, str] = {}
        return [None if s is None else shared.setdefault(s, s) for s in column.to_pylist()]
    return numbers(column).copy()
