"""The schema a saved workload file must have before its rows are read.

`workloads.io.load_workload` reads a Parquet file someone may have edited: a
schema-version field that is not a number, a column of strings where token
counts belong, metadata JSON nested thousands deep. `check_table` judges the
file's schema and metadata first, so each of those is one `HbenchError`
naming the file and the field, never a ValueError or an ArrowTypeError from
deep inside the conversion.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from common.errors import HbenchError
from common.safe_json import loads_json


def _integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _real(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_integer(t)


def _text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _text_or_null(t: pa.DataType) -> bool:
    return _text(t) or pa.types.is_null(t)


def _token_ids(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)


#: Each column's allowed Arrow types, as the loader converts them.
COLUMN_TYPES = {
    "request_id": (_integer, "integers"),
    "arrival_s": (_real, "numbers"),
    "prompt_text": (_text, "strings"),
    "prompt_token_ids": (_token_ids, "lists of integer token ids"),
    "output_len": (_integer, "integers"),
    "prefix_group": (_integer, "integers"),
    "prefix_tokens": (_integer, "integers"),
    "salt": (_text_or_null, "strings or null"),
}


def check_columns(path: Path, schema: pa.Schema) -> None:
    """Refuse a file whose workload columns have the wrong Arrow types."""
    for name, (ok, wanted) in COLUMN_TYPES.items():
        if name in schema.names and not ok(schema.field(name).type):
            raise HbenchError(f"{path}: column {name!r} holds {schema.field(name).type}, "
                              f"a workload stores {wanted} there")


def schema_version(path: Path, raw: bytes) -> int:
    """The file's schema-version field, an ASCII integer."""
    text = raw.decode("ascii", errors="replace").strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise HbenchError(f"{path}: workload schema field {text[:20]!r} is not a version number")
    return int(text)


def metadata_json(raw: bytes, what: str):
    """A JSON metadata field of the file (meta, sessions), read by the bounded
    loader; the caller adds the file's name to the error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HbenchError(f"workload {what} is not UTF-8 text") from None
    return loads_json(text, f"workload {what}")
