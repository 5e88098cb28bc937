"""`common.arrow_arrays` builds what pyarrow's own conversions build, and
reads back what they read, without loading pandas (asked of a fresh
interpreter: a test process has long imported it)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from common.arrow_arrays import from_numbers, from_strings, from_values, numbers, table, values_of
from tests.support import REPO_ROOT

NUMBERS = [np.array([1.5, np.nan, -0.0, np.inf]), np.array([3, -2**40, 7], dtype=np.int64),
           np.array([1, 2], dtype=np.int32), np.array([True, False] * 5), np.empty(0),
           np.arange(12.0)[::3]]


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal types, nulls and values (NaN equal to NaN, which ``equals`` is not)."""
    return a.type == b.type and a.null_count == b.null_count and \
        str(a.to_pylist()) == str(b.to_pylist())


@pytest.mark.parametrize("values", NUMBERS, ids=lambda v: f"{v.dtype}-{v.size}")
def test_numbers_are_what_pyarrow_array_makes(values):
    made = from_numbers(values)
    made.validate(full=True)
    assert _same(made, pa.array(values))
    assert _same(from_numbers(values, nan_is_null=True), pa.array(values, from_pandas=True))


def test_text_is_what_pyarrow_array_makes_and_null_without_any():
    values = ["finished", None, "héllo", ""]
    assert from_strings(values).equals(pa.array(values))
    assert from_strings(values, pa.large_string()).equals(pa.array(values, pa.large_string()))
    assert from_values([]).type == from_values([None, None]).type == pa.null()
    with pytest.raises(TypeError, match="not a string"):
        from_strings(["a", 3])


def test_a_table_and_its_columns_read_back():
    t = table({"x": np.array([1.0, np.nan]), "s": ["a", "a"]}, nan_is_null=True)
    assert t.schema.names == ["x", "s"] and t.column("x").null_count == 1
    column = pa.chunked_array([pa.array([1, 2]), pa.array([3])])
    back = values_of(column)
    assert back.dtype == np.int64 and back.tolist() == [1, 2, 3] and back.flags.writeable
    text = values_of(pa.chunked_array([pa.array(["x", "y"]), pa.array(["x"], pa.string())]))
    assert text == ["x", "y", "x"] and text[0] is text[2]        # equal strings one object
    assert numbers(pa.array([4, 5, 6]).slice(1)).tolist() == [5, 6]


def test_building_writing_and_reading_back_loads_no_pandas(tmp_path):
    code = f"""
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from common.arrow_arrays import table, values_of

pq.write_table(table({{"x": np.arange(3.0), "s": ["a", None, "b"]}}), {str(tmp_path / "t.parquet")!r})
back = pq.ParquetFile({str(tmp_path / "t.parquet")!r}).read()
values_of(back.column("x")), values_of(back.column("s"))
print("pandas" in sys.modules)
pa.array([1.0])                     # the control: pyarrow's own conversion loads it
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=True)
    assert out.stdout.split() == ["False", "True"]
