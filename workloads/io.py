"""Save and load a `Workload` as one Parquet file.

One row per request; token ids as a list<int64> column; the workload's
``meta`` as JSON in the schema metadata, next to a schema version. A
multi-turn workload's sessions (the later turns, made at run time by the
closed loop) are stored as JSON in the schema metadata too. A saved
workload is what `hbench workload describe` reads and what a run can replay
instead of re-deriving; loading it back gives the same `content_hash`.

A file carries two hashes, and `load_workload` refuses a file that lacks
either or whose content no longer matches them, before it reads its rows:

- ``hbench.workload.content_hash``: the request stream's hash
  (`workloads.workload.stream_hash`, what a run records as its
  ``workload_hash``). It stays exactly that hash, so a run of a saved
  workload and a run that derived the same stream record the same value:
  `scripts/compare_results.py`, `hbench regress` and the committed baselines
  pair runs on it.
- ``hbench.workload.file_hash``: sha256 over the schema version, the
  canonical JSON of ``meta`` and the stream hash (`file_hash`). The stream
  hash alone does not cover ``meta``, yet a run of a saved workload records
  the meta's recipe (seed, q, rate, arrival, ...) as its configuration
  (`harness.run_workload.recorded_config`); this hash makes an edited meta
  (seed 1 -> 99 on a seed-1 stream) as detectable as an edited request.

It then refuses requests no engine can serve (NaN or negative arrival, empty
prompt, output length < 1, prompt plus output longer than the recorded max
model length). `stored_size` reads a file's request and token counts from
the Parquet footer alone, so a run's memory estimate covers a saved
workload before it is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path
from common.errors import HbenchError
from workloads import file_schema
from workloads.multiturn.session import Session, Turn
from workloads.workload import WORKLOAD_SCHEMA_VERSION, Workload, WorkloadRequest, stream_hash

_META = b"hbench.workload.meta"
_VERSION = b"hbench.workload.schema"
_HASH = b"hbench.workload.content_hash"
_FILE_HASH = b"hbench.workload.file_hash"
_SESSIONS = b"hbench.workload.sessions"
_COLUMNS = ("request_id", "arrival_s", "prompt_text", "prompt_token_ids", "output_len",
            "prefix_group", "prefix_tokens", "salt")


def save_workload(w: Workload, path: str | Path) -> Path:
    """Write ``w`` to ``path`` (atomically: a temp file renamed into place)."""
    path = Path(path)
    rs = w.requests
    lengths = np.array([r.prompt_len for r in rs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32 if lengths.sum() < 2**31 else np.int64)
    flat = (np.concatenate([np.asarray(r.prompt_token_ids, dtype=np.int64) for r in rs])
            if rs else np.zeros(0, dtype=np.int64))
    list_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    table = pa.table({
        "request_id": pa.array([r.request_id for r in rs], pa.int64()),
        "arrival_s": pa.array([float(r.arrival_s) for r in rs], pa.float64()),
        "prompt_text": pa.array([r.prompt_text for r in rs], pa.large_string()),
        "prompt_token_ids": list_type.from_arrays(pa.array(offsets), pa.array(flat, pa.int64())),
        "output_len": pa.array([r.output_len for r in rs], pa.int64()),
        "prefix_group": pa.array([r.prefix_group for r in rs], pa.int64()),
        "prefix_tokens": pa.array([r.prefix_tokens for r in rs], pa.int64()),
        "salt": pa.array([r.salt for r in rs], pa.string()),
    })
    md = {
        _META: json.dumps(w.meta, sort_keys=True).encode(),
        _VERSION: str(WORKLOAD_SCHEMA_VERSION).encode(),
        **_hashes(w.meta, w.requests, w.sessions),
    }
    if w.sessions:
        md[_SESSIONS] = json.dumps([_session_json(x) for x in w.sessions]).encode()
    table = table.replace_schema_metadata(md)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
        os.chmod(tmp, 0o644)
    return path


def file_hash(meta: dict, stream: str) -> str:
    """The ``hbench.workload.file_hash`` of a file holding ``meta`` and the
    stream whose `stream_hash` is ``stream`` (see the module docstring)."""
    blob = json.dumps({"schema": WORKLOAD_SCHEMA_VERSION, "meta": meta, "stream": stream},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _hashes(meta: dict, requests, sessions) -> dict[bytes, bytes]:
    stream = stream_hash(requests, sessions)
    return {_HASH: stream.encode(), _FILE_HASH: file_hash(meta, stream).encode()}


def stored_hashes(table: pa.Table) -> dict[bytes, bytes]:
    """The two hash entries (schema metadata key -> value) a workload file
    whose rows and metadata are ``table``'s must carry to be loaded."""
    return _hashes(*_parse(table))


def _parse(table: pa.Table) -> tuple[dict, tuple, tuple]:
    """(meta, requests, sessions) of a workload table, unchecked."""
    md = table.schema.metadata
    cols = {c: table.column(c).combine_chunks() for c in _COLUMNS}
    ids = cols["prompt_token_ids"]
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = ids.offsets.to_numpy()
    py = {c: cols[c].to_pylist() for c in _COLUMNS if c != "prompt_token_ids"}
    meta = file_schema.metadata_json(md[_META], "metadata")
    requests = tuple(
        WorkloadRequest(
            request_id=py["request_id"][i],
            arrival_s=py["arrival_s"][i],
            prompt_text=py["prompt_text"][i],
            prompt_token_ids=flat[offsets[i]:offsets[i + 1]].copy(),
            output_len=py["output_len"][i],
            prefix_group=py["prefix_group"][i],
            prefix_tokens=py["prefix_tokens"][i],
            salt=py["salt"][i],
        )
        for i in range(table.num_rows)
    )
    sessions = (tuple(_session_of(x) for x in file_schema.metadata_json(md[_SESSIONS], "sessions"))
                if _SESSIONS in md else ())
    return meta, requests, sessions


def _schema_metadata(path: Path, schema: pa.Schema) -> dict:
    md = schema.metadata or {}
    if _META not in md or _VERSION not in md or not set(_COLUMNS) <= set(schema.names):
        raise HbenchError(f"{path}: not an hbench workload file")
    version = file_schema.schema_version(path, md[_VERSION])
    file_schema.check_columns(path, schema)
    if version != WORKLOAD_SCHEMA_VERSION:
        raise HbenchError(
            f"{path}: workload schema {version}, this hbench reads {WORKLOAD_SCHEMA_VERSION}"
        )
    return md


def _read_parquet(path: Path, read):
    """``read(path)`` (the footer or the table) of a workload file; HbenchError
    for a missing file or one that is not Parquet."""
    if not path.is_file():
        raise HbenchError(f"workload file not found: {path}")
    try:
        return read(path)
    except (OSError, pa.ArrowException) as exc:
        raise HbenchError(f"{path}: not a Parquet workload ({str(exc).splitlines()[0]})") from None


def stored_size(path: str | Path) -> tuple[int, int, dict]:
    """(requests, prompt tokens, meta) of a workload file, from its Parquet
    footer alone (the row count and the token-id column's value count), so
    its size is known before any row is read."""
    path = Path(path)
    footer = _read_parquet(path, pq.read_metadata)
    md = _schema_metadata(path, footer.schema.to_arrow_schema())
    tokens = 0
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema.split(".")[0] == "prompt_token_ids":
                tokens += column.num_values
    try:
        meta = file_schema.metadata_json(md[_META], "metadata")
    except HbenchError as exc:
        raise HbenchError(f"{path}: {exc}") from None
    return footer.num_rows, tokens, meta if isinstance(meta, dict) else {}


def load_workload(path: str | Path) -> Workload:
    """Read a file written by `save_workload`; a user error for anything else."""
    path = Path(path)
    table = _read_parquet(path, pq.read_table)
    md = _schema_metadata(path, table.schema)
    if any(table.column(c).null_count for c in _COLUMNS if c != "salt"):
        raise HbenchError(f"{path}: a request has a missing value")
    try:
        meta, requests, sessions = _parse(table)
    except (KeyError, TypeError) as exc:
        raise HbenchError(f"{path}: unreadable sessions ({exc})") from None
    except HbenchError as exc:
        raise HbenchError(f"{path}: {exc}") from None
    except ValueError as exc:
        raise HbenchError(f"{path}: unreadable workload metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise HbenchError(f"{path}: unreadable workload metadata (not an object)")
    _check_hashes(path, md, _hashes(meta, requests, sessions))
    try:
        w = Workload(requests=requests, meta=meta, sessions=sessions)
    except HbenchError as exc:
        raise HbenchError(f"{path}: {exc}") from None
    if not w.requests:
        raise HbenchError(f"{path}: the workload has no requests")
    limit = meta.get("max_model_len")
    if isinstance(limit, int):
        for r in w.requests:
            if r.prompt_len + r.output_len > limit:
                raise HbenchError(f"{path}: request {r.request_id} has {r.prompt_len} prompt + "
                                  f"{r.output_len} output tokens, more than the max model length "
                                  f"{limit}")
    return w


def _check_hashes(path: Path, md: dict, expected: dict[bytes, bytes]) -> None:
    """Refuse a file without both stored hashes or whose content hashes
    otherwise: its requests (the stream hash) or its meta (the file hash)
    were edited after it was written."""
    missing = [k.decode() for k in (_HASH, _FILE_HASH) if k not in md]
    if missing:
        raise HbenchError(f"{path}: content hash missing ({', '.join(missing)}): not a file "
                          "written by `hbench workload build`, or edited since; build it again")
    stored, stream = md[_HASH].decode(errors="replace"), expected[_HASH].decode()
    if stored != stream:
        raise HbenchError(f"{path}: content hash mismatch (stored {stored[:16]}..., "
                          f"requests hash to {stream[:16]}...): the file was edited")
    if md[_FILE_HASH] != expected[_FILE_HASH]:
        raise HbenchError(f"{path}: content hash mismatch ({_FILE_HASH.decode()}): the workload's "
                          "metadata (its recipe: seed, q, rate, ...) was edited")


def _session_json(s: Session) -> dict:
    return {"session_id": s.session_id, "first_request": s.first_request, "turns": [
        {"request_id": t.request_id, "user_token_ids": t.user_token_ids.tolist(),
         "user_text": t.user_text, "answer_token_ids": t.answer_token_ids.tolist(),
         "answer_text": t.answer_text, "output_len": t.output_len, "think_s": t.think_s,
         "prompt_len": t.prompt_len} for t in s.turns]}


def _session_of(d: dict) -> Session:
    turns = tuple(Turn(request_id=int(t["request_id"]),
                       user_token_ids=np.asarray(t["user_token_ids"], dtype=np.int64),
                       user_text=t["user_text"],
                       answer_token_ids=np.asarray(t["answer_token_ids"], dtype=np.int64),
                       answer_text=t["answer_text"], output_len=int(t["output_len"]),
                       think_s=float(t["think_s"]), prompt_len=int(t["prompt_len"]))
                  for t in d["turns"])
    return Session(session_id=int(d["session_id"]), first_request=int(d["first_request"]),
                   turns=turns)
