"""The types a results tree's files must have when they are read back.

A results tree comes from outside as much as a flag does: copied between
machines, edited by hand, cut short by a full disk. `harness.results` reads
its JSON through `common.safe_json` (bounded size and depth) and then asks
this module whether each field the readers use has the type they assume, so
that a manifest whose ``config`` is a string is one `HbenchError` naming the
file (exit 2) instead of an AttributeError deep in analyze, or a false
"regression" (exit 1) from regress. `read_table` does the same for the
parquet tables: a corrupt or truncated file, or one whose columns are not
those of a results table, is refused naming the file, not a pyarrow traceback.
The tables are read back as pandas frames, for analysis; pandas is imported
when the first one is, so that writing a run (`harness.results` imports this
module) never loads it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import HbenchError

if TYPE_CHECKING:
    import pandas as pd

# Manifest fields the readers use, with the JSON types each may have.
_OBJECT, _TEXT, _INT = (dict,), (str,), (int,)
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "config": _OBJECT, "budget": _OBJECT,
    "run_id": _TEXT, "org": _TEXT, "engine": _TEXT, "status": _TEXT,
    "schema_version": _INT,
    "engine_version": _TEXT + (type(None),), "workload_hash": _TEXT + (type(None),),
    "git_commit": _TEXT + (type(None),),
    "workload_meta": _OBJECT + (type(None),), "engine_info": _OBJECT + (type(None),),
}
#: Fields a manifest must have for its run to be compared at all.
REQUIRED_MANIFEST = ("config", "budget")
#: Summary fields that hold an object (the rest are metrics).
SUMMARY_OBJECTS = ("validity",)
#: Columns every results table of that name has (more may follow).
TABLE_COLUMNS = {"requests": ("request_id", "arrival_s", "status"), "steps": ()}


def _type_names(types: tuple[type, ...]) -> str:
    names = {dict: "an object", str: "a string", int: "an integer", type(None): "null"}
    return " or ".join(names[t] for t in types)


def check_manifest(file: Path, manifest: dict) -> None:
    """Refuse a manifest whose fields have the wrong JSON types."""
    for key in REQUIRED_MANIFEST:
        if key not in manifest:
            raise HbenchError(f"{file}: manifest has no {key!r}")
    for key, types in MANIFEST_FIELDS.items():
        if key not in manifest:
            continue
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise HbenchError(f"{file}: manifest field {key!r} must be {_type_names(types)}, "
                              f"got {type(value).__name__}")
    label = manifest["budget"].get("label")
    if label is not None and not isinstance(label, str):
        raise HbenchError(f"{file}: manifest field 'budget.label' must be a string, "
                          f"got {type(label).__name__}")


def check_summary(file: Path, summary: dict) -> None:
    """Refuse a summary whose validity record is not an object. Its metrics
    are judged by their readers: a non-numeric metric of a candidate is a
    regression to ``regress``, not bad input."""
    for key in SUMMARY_OBJECTS:
        if key in summary and not isinstance(summary[key], dict):
            raise HbenchError(f"{file}: summary field {key!r} must be an object, "
                              f"got {type(summary[key]).__name__}")


def read_table(file: Path, name: str, data: bytes | None = None) -> pd.DataFrame:
    """The results table ``name`` (``requests`` or ``steps``) in ``file`` (or
    in ``data``, its bytes already read and checked); HbenchError naming the
    file when it is not a readable parquet table with that table's columns."""
    import pandas as pd

    try:
        source = file if data is None else pa.BufferReader(data)
        columns = pq.read_schema(source).names   # the footer only: a bad file fails fast
        if missing := [c for c in TABLE_COLUMNS.get(name, ()) if c not in columns]:
            raise HbenchError(f"{file}: not a results {name} table "
                              f"(no column {', '.join(missing)})")
        return pd.read_parquet(file if data is None else io.BytesIO(data))
    except (OSError, pa.ArrowException) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise HbenchError(f"{file}: not a readable parquet table ({reason})") from None
