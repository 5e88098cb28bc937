"""Save and load a `Workload` as one Parquet file.

One row per request; token ids as a list<int64> column; the workload's
``meta`` as JSON in the schema metadata, next to a schema version. A
multi-turn workload's sessions (the later turns, made at run time by the
closed loop) are stored as JSON in the schema metadata too. A saved
workload is what `hbench workload describe` reads and what a run can replay
instead of re-deriving; loading it back gives the same `content_hash`.

The file also stores that content hash: `load_workload` recomputes it and
refuses a file whose requests were edited after it was written, and refuses
requests no engine can serve (NaN or negative arrival, empty prompt, output
length < 1, prompt plus output longer than the recorded max model length).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path
from common.errors import HbenchError
from workloads.multiturn.session import Session, Turn
from workloads.workload import WORKLOAD_SCHEMA_VERSION, Workload, WorkloadRequest

_META = b"hbench.workload.meta"
_VERSION = b"hbench.workload.schema"
_HASH = b"hbench.workload.content_hash"
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
        _HASH: w.content_hash.encode(),
    }
    if w.sessions:
        md[_SESSIONS] = json.dumps([_session_json(x) for x in w.sessions]).encode()
    table = table.replace_schema_metadata(md)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
        os.chmod(tmp, 0o644)
    return path


def load_workload(path: str | Path) -> Workload:
    """Read a file written by `save_workload`; a user error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise HbenchError(f"workload file not found: {path}")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise HbenchError(f"{path}: not a Parquet workload ({str(exc).splitlines()[0]})") from None
    md = table.schema.metadata or {}
    if _META not in md or _VERSION not in md or not set(_COLUMNS) <= set(table.column_names):
        raise HbenchError(f"{path}: not an hbench workload file")
    version = int(md[_VERSION])
    if version != WORKLOAD_SCHEMA_VERSION:
        raise HbenchError(
            f"{path}: workload schema {version}, this hbench reads {WORKLOAD_SCHEMA_VERSION}"
        )
    cols = {c: table.column(c).combine_chunks() for c in _COLUMNS}
    if any(cols[c].null_count for c in _COLUMNS if c != "salt"):
        raise HbenchError(f"{path}: a request has a missing value")
    ids = cols["prompt_token_ids"]
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = ids.offsets.to_numpy()
    py = {c: cols[c].to_pylist() for c in _COLUMNS if c != "prompt_token_ids"}
    try:
        meta = json.loads(md[_META])
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
        sessions = tuple(_session_of(x) for x in json.loads(md[_SESSIONS])) if _SESSIONS in md else ()
        w = Workload(requests=requests, meta=meta, sessions=sessions)
    except (KeyError, TypeError) as exc:
        raise HbenchError(f"{path}: unreadable sessions ({exc})") from None
    except HbenchError as exc:
        raise HbenchError(f"{path}: {exc}") from None
    except ValueError as exc:
        raise HbenchError(f"{path}: unreadable workload metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise HbenchError(f"{path}: unreadable workload metadata (not an object)")
    if not w.requests:
        raise HbenchError(f"{path}: the workload has no requests")
    stored = md.get(_HASH)
    if stored is not None and stored.decode() != w.content_hash:
        raise HbenchError(f"{path}: content hash mismatch (stored {stored.decode()[:16]}..., "
                          f"requests hash to {w.content_hash[:16]}...): the file was edited")
    limit = meta.get("max_model_len")
    if isinstance(limit, int):
        for r in w.requests:
            if r.prompt_len + r.output_len > limit:
                raise HbenchError(f"{path}: request {r.request_id} has {r.prompt_len} prompt + "
                                  f"{r.output_len} output tokens, more than the max model length "
                                  f"{limit}")
    return w


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
