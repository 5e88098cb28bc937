"""Derived workloads kept on disk, so a run reads its workload back instead
of deriving it again.

Deriving a study-sized workload (240 requests) tokenizes the calibration
sample that fixes the context length, the candidate turns and the contexts:
about 0.2 s, more than the simulation of those requests. Its result depends
only on

- the recipe (`workloads.spec.WorkloadSpec`, every field);
- the corpus: the packaged ShareGPT V3 file, by its `file_key` (path, size,
  mtime and the loader's version);
- the code that derives it: the bytes of every source file of the
  ``workloads`` package (`source_digest`), and the Python, NumPy and PyArrow
  versions (the tokenizer's regular expressions, the random streams' draws,
  the corpus reader);

so a workload is stored under a hash of all of them (`derived_key`) and read
back only for the same hash. Kept: workloads of the packaged corpus with the
default tokenizer, made at once (at most
`workloads.request_seq.MADE_AT_ONCE` requests) and without multi-turn
sessions; anything else (a ``--dataset`` file, whose reader and identity
live in `workloads.corpus`; an HF tokenizer file) is derived every time, as
before.

A file is one Arrow IPC file, zstd-compressed (a 240-request workload of
~5.6 MB keeps in 0.2 - 1.1 MB), written atomically, with the workload's
``meta`` as JSON and its `content_hash` in the schema metadata. Reading it
back checks the file's size and sha256, recorded beside it when it was
written (`common.cache.keep_file`; they cover the meta, which the stream hash
does not), and recomputes the stream hash; a file that fails either is
derived again, never served, with one line saying so. The directory is kept under
`LIMIT_BYTES` by removing the least recently used files. Everything here is
a cache (`common.cache`): deleting it costs time, never a result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.arrow_arrays import numbers
from common.atomic import atomic_path
from common.cache import cache_dir, keep_file, recomputed, record_file, verified_bytes
from common.errors import HbenchError
from workloads.request_seq import MADE_AT_ONCE
from workloads.spec import WorkloadSpec
from workloads.workload import Workload, WorkloadRequest, stream_hash, token_ids

#: Bumped when the file layout or what the key covers changes.
FORMAT = 2
#: The cache directory's size bound: least recently used files go first.
LIMIT_BYTES = 256 * 2**20
_META = b"hbench.derived.meta"
_HASH = b"hbench.derived.content_hash"
_KEY = b"hbench.derived.key"
_PACKAGE = Path(__file__).resolve().parent


def directory() -> Path:
    return cache_dir() / "derived-workloads"


@functools.cache
def source_digest() -> str:
    """sha256 over the relative path and bytes of every ``.py`` file of the
    ``workloads`` package: changes whenever the derivation's code does."""
    h = hashlib.sha256()
    for f in sorted(_PACKAGE.rglob("*.py")):
        h.update(f.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def derived_key(spec: WorkloadSpec, *, tokenizer=None, revision=None) -> str | None:
    """The cache key of the workload `workloads.build.workload_for` derives
    for ``spec``, or None for a workload this cache does not keep."""
    if (spec.dataset is not None or spec.chat_column is not None or tokenizer is not None
            or revision is not None or spec.workload_kind != "sharegpt"):
        return None
    from workloads.sharegpt.loader import package_file_key

    try:
        corpus = package_file_key()
    except (HbenchError, OSError):   # no package: the derivation says so
        return None
    blob = json.dumps({
        "format": FORMAT, "spec": dataclasses.asdict(spec), "corpus": corpus,
        "code": source_digest(), "python": sys.version, "numpy": np.__version__,
        "pyarrow": pa.__version__,
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _file(key: str) -> Path:
    return directory() / f"{key}.arrow"


def read(key: str) -> Workload | None:
    """The workload stored under ``key``, or None: absent, or not verified
    (`common.cache.verified_bytes`: its file's size and sha256, meta included;
    then its key, and its requests against the stored content hash)."""
    path = _file(key)
    data = verified_bytes(path, LIMIT_BYTES)
    if data is None:
        return None
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        md = table.schema.metadata or {}
        if md.get(_KEY) != key.encode():
            raise ValueError("kept under another key")
        meta = json.loads(md[_META])
        if not isinstance(meta, dict):
            raise ValueError("its meta is not an object")
        stored = md[_HASH].decode()
        requests = _requests(table)
        if stream_hash(requests) != stored:
            raise ValueError("its requests do not hash to its content hash")
        w = Workload(requests=requests, meta=meta)
    except (KeyError, ValueError, TypeError, IndexError, HbenchError, pa.ArrowException) as exc:
        recomputed(path, f"it does not read as the workload it names ({exc})")
        return None
    w.__dict__["content_hash"] = stored   # the cached_property, verified just above
    try:
        os.utime(path)   # recently used: the last to be removed
    except OSError:
        pass
    return w


def _requests(table: pa.Table) -> tuple[WorkloadRequest, ...]:
    # Read through buffers and scalars (`common.arrow_arrays`): pyarrow's
    # to_numpy imports pandas (half a second) to check for pandas types.
    ids = table.column("prompt_token_ids").combine_chunks()
    flat, offsets = numbers(ids.values), numbers(ids.offsets)
    cols = {c: [x.as_py() for x in table.column(c).combine_chunks()]
            for c in ("arrival_s", "prompt_text", "output_len", "prefix_group", "prefix_tokens",
                      "salt")}
    return tuple(
        WorkloadRequest(
            request_id=i, arrival_s=cols["arrival_s"][i], prompt_text=cols["prompt_text"][i],
            # token_ids picks the dtype derivation picked (int32 when every id fits)
            prompt_token_ids=token_ids(flat[offsets[i]:offsets[i + 1]]),
            output_len=cols["output_len"][i], prefix_group=cols["prefix_group"][i],
            prefix_tokens=cols["prefix_tokens"][i], salt=cols["salt"][i])
        for i in range(table.num_rows))


def write(key: str, w: Workload) -> None:
    """Store ``w`` under ``key`` if this cache keeps its kind (requests made at
    once, no sessions, a meta that JSON gives back equal); a cache directory
    that cannot be written only costs speed."""
    rs = w.requests
    if not isinstance(rs, tuple) or w.sessions or not rs or len(rs) > MADE_AT_ONCE:
        return
    try:
        meta_text = json.dumps(w.meta)
    except (TypeError, ValueError):
        return
    if json.loads(meta_text) != w.meta:
        return
    flat = np.concatenate([np.asarray(r.prompt_token_ids) for r in rs])
    offsets = np.concatenate([[0], np.cumsum([len(r.prompt_token_ids) for r in rs])])
    table = pa.table({
        "arrival_s": pa.array([float(r.arrival_s) for r in rs], pa.float64()),
        "prompt_text": pa.array([r.prompt_text for r in rs], pa.large_string()),
        "prompt_token_ids": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                          pa.array(flat)),
        "output_len": pa.array([r.output_len for r in rs], pa.int64()),
        "prefix_group": pa.array([r.prefix_group for r in rs], pa.int64()),
        "prefix_tokens": pa.array([r.prefix_tokens for r in rs], pa.int64()),
        "salt": pa.array([r.salt for r in rs], pa.string()),
    }).replace_schema_metadata({_KEY: key.encode(), _META: meta_text.encode(),
                                _HASH: w.content_hash.encode()})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    try:
        with atomic_path(_file(key)) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema,
                                                                    options=options) as writer:
                writer.write_table(table)
            os.chmod(tmp, 0o644)
        keep_file(_file(key))
        _prune(directory(), LIMIT_BYTES)
    except (OSError, HbenchError, pa.ArrowException):
        pass


def _prune(folder: Path, limit: int) -> None:
    """Remove the least recently used ``.arrow`` files of ``folder`` (with
    their records) until the rest take at most ``limit`` bytes."""
    entries = []
    for f in folder.glob("*.arrow"):
        try:
            st = f.stat()
        except FileNotFoundError:   # another process pruned it
            continue
        entries.append((st.st_mtime_ns, st.st_size, f))
    total = sum(size for _, size, _ in entries)
    for _, size, f in sorted(entries):
        if total <= limit:
            break
        f.unlink(missing_ok=True)
        record_file(f).unlink(missing_ok=True)
        total -= size
