"""Any chat corpus as (user turn, assistant reply) pairs: the packaged
ShareGPT, a local file or folder, a saved `datasets` dataset, or a hub id.

``--dataset`` resolves, in this order:

1. nothing: the packaged ShareGPT V3 (offline, `workloads.sharegpt.loader`);
2. a ShareGPT JSON / JSONL file: the tolerant ShareGPT parser (a file cut
   off mid-record still gives its complete records);
3. a local file (``.json``, ``.jsonl``, ``.parquet``) or a folder of them,
   or a folder written by ``Dataset.save_to_disk``: read with Hugging Face
   `datasets`;
4. anything else that is not a local path: a hub dataset id, read with
   `datasets` (needs network access; hbench's tests never use one).

Column mapping: the chat column is the given ``chat_column`` or the first of
`CHAT_COLUMNS` the corpus has; its messages are ShareGPT-style
``{"from", "value"}`` or OpenAI-style ``{"role", "content"}`` (detected from
the first message). A pair is a user message (`USER_ROLES`) immediately
followed by an assistant message (`ASSISTANT_ROLES`), both with non-blank
text, as in the ShareGPT loader. Records without a chat list, with a malformed
message, or without any pair are skipped and counted by reason.

The identity of what was read (source, sha256 of the local files or the hub
revision, records read and skipped) is the pairs' ``identity``; a workload
built from them records it in its meta, hence in every run's manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.errors import HbenchError
from common.input_files import check_input_file
from workloads import hub
from workloads.sharegpt.loader import PACKAGE_NAME, ShareGPTPairs, cache_dir, load_pairs

CHAT_COLUMNS = ("conversations", "messages", "conversation")
MESSAGE_KEYS = (("from", "value"), ("role", "content"))
USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant"})
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}

_LOADED: dict[tuple, ShareGPTPairs] = {}


def load_corpus(dataset: str | Path | None = None, *, chat_column: str | None = None,
                revision: str | None = None) -> ShareGPTPairs:
    """The pairs of ``dataset`` (see module docstring) with their ``identity``."""
    if dataset is None:
        pairs = load_pairs(None)
        return _with_identity(pairs, {"source": f"{PACKAGE_NAME} package", "path": pairs.source,
                                      "file_key": pairs.key})
    text = str(dataset)
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        check_input_file(path, "--dataset")   # a FIFO would block the reader forever
    if path.is_file() and path.suffix in (".json", ".jsonl") and chat_column in (
            None, "conversations"):
        try:
            pairs = load_pairs(path)
        except HbenchError as exc:
            if "not ShareGPT format" not in str(exc):
                raise
        else:
            return _with_identity(pairs, {"source": "file", "path": pairs.source,
                                          "sha256": _sha256([path])})
    key = (str(path.resolve()) if path.exists() else text, chat_column, revision,
           _stamp(path) if path.exists() else None)
    if key not in _LOADED:
        if path.exists():
            ds, identity = _read_local(path)
        elif _looks_like_path(text):
            raise HbenchError(f"dataset file not found: {text}")
        else:
            ds, identity = _read_hub(text, revision)
        _LOADED[key] = pairs_from_dataset(ds, name=path.name if path.exists() else text,
                                          identity=identity, chat_column=chat_column)
    return _LOADED[key]


_IDENTIFIED: dict[str, tuple[ShareGPTPairs, ShareGPTPairs]] = {}


def _with_identity(pairs: ShareGPTPairs, identity: dict) -> ShareGPTPairs:
    """``pairs`` with ``identity`` added; the same object for the same loaded
    pairs, so the per-pairs token memo of a sweep stays warm."""
    hit = _IDENTIFIED.get(pairs.key)
    if hit is not None and hit[0] is pairs:
        return hit[1]
    no_pair = pairs.records_read - pairs.conversations
    out = dataclasses.replace(pairs, identity={
        **identity, "format": "sharegpt", "records_read": pairs.records_read,
        "records_skipped": {"no user/assistant pair": no_pair} if no_pair else {},
        "truncated": pairs.truncated})
    _IDENTIFIED[pairs.key] = (pairs, out)
    return out


def _looks_like_path(text: str) -> bool:
    return (text.startswith((".", "/", "~")) or Path(text).suffix in FILE_BUILDERS
            or text.count("/") != 1)


def _stamp(path: Path) -> tuple:
    files = _files(path) if path.is_dir() else [path]
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file())


def _sha256(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _datasets():
    try:
        import datasets
    except ImportError:
        raise HbenchError("reading this corpus needs the 'datasets' package "
                          "(pip install datasets)") from None
    datasets.disable_progress_bars()
    return datasets


def _read_local(path: Path):
    ds_mod = _datasets()
    if path.is_dir() and ((path / "dataset_info.json").is_file()
                          or (path / "dataset_dict.json").is_file()):
        try:
            with hub.quiet():
                ds = ds_mod.load_from_disk(str(path))
        except Exception as exc:  # datasets raises many types for a bad folder
            raise HbenchError(f"{path}: cannot load the saved dataset ({_first_line(exc)})") from None
        if isinstance(ds, ds_mod.DatasetDict):
            split = "train" if "train" in ds else next(iter(ds))
            ds = ds[split]
        return ds, {"source": "saved dataset", "path": str(path.resolve()),
                    "sha256": _sha256([f for f in _files(path) if f.suffix == ".arrow"]),
                    "fingerprint": getattr(ds, "_fingerprint", None)}
    files = _files(path) if path.is_dir() else [path]
    builders = {FILE_BUILDERS.get(f.suffix) for f in files}
    builders.discard(None)
    data = [f for f in files if f.suffix in FILE_BUILDERS]
    if len(builders) != 1:
        found = "no JSON, JSONL or Parquet file" if not builders else "JSON and Parquet mixed"
        raise HbenchError(f"{path}: not a chat corpus ({found})")
    try:
        with hub.quiet():   # its own "Failed to read ..." lines would precede ours
            ds = ds_mod.load_dataset(builders.pop(), data_files=[str(f) for f in data],
                                     split="train", cache_dir=str(cache_dir() / "datasets"))
    except Exception as exc:  # parse errors come from pyarrow or datasets, many types
        raise HbenchError(f"{path}: cannot read it as a chat corpus ({_first_line(exc)})") from None
    return ds, {"source": "file" if path.is_file() else "folder", "path": str(path.resolve()),
                "sha256": _sha256(data), "files": len(data)}


def _read_hub(name: str, revision: str | None):
    ds_mod = _datasets()
    hub.check_reachable(name)   # one short attempt, not the library's five retries
    try:
        with hub.quiet():
            ds = ds_mod.load_dataset(name, split="train", revision=revision,
                                     cache_dir=str(cache_dir() / "datasets"))
    except Exception as exc:  # network, auth, missing dataset: all one line for the user
        raise HbenchError(f"cannot load hub dataset {name!r} ({_first_line(exc)})") from None
    return ds, {"source": "hub", "id": name, "revision": revision or "default branch",
                "fingerprint": getattr(ds, "_fingerprint", None)}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def pairs_from_dataset(ds, *, name: str, identity: dict,
                       chat_column: str | None = None) -> ShareGPTPairs:
    """(user, assistant) pairs of a `datasets.Dataset` (or any object with
    ``column_names`` and column access) whose chat column holds messages."""
    columns = list(ds.column_names)
    if chat_column is None:
        chat_column = next((c for c in CHAT_COLUMNS if c in columns), None)
        if chat_column is None:
            raise HbenchError(f"{name}: not a recognized chat corpus: no column "
                              f"{' / '.join(CHAT_COLUMNS)} (columns: {', '.join(columns)}); "
                              "name it with --chat-column")
    elif chat_column not in columns:
        raise HbenchError(f"{name}: no column {chat_column!r} (columns: {', '.join(columns)})")
    keys = None
    skipped = {"no message list": 0, "malformed message": 0, "no user/assistant pair": 0}
    conv, human, gpt = [], [], []
    n = 0
    for n, messages in enumerate(ds[chat_column], start=1):
        if not isinstance(messages, list) or not messages:
            skipped["no message list"] += 1
            continue
        if keys is None:
            keys = _message_keys(messages[0], name, chat_column)
        role, text = keys
        if not all(isinstance(m, dict) and isinstance(m.get(role), str)
                   and isinstance(m.get(text), str) for m in messages):
            skipped["malformed message"] += 1
            continue
        found = False
        for a, b in zip(messages, messages[1:], strict=False):
            if (a[role] in USER_ROLES and b[role] in ASSISTANT_ROLES
                    and a[text].strip() and b[text].strip()):
                conv.append(n - 1)
                human.append(a[text])
                gpt.append(b[text])
                found = True
        if not found:
            skipped["no user/assistant pair"] += 1
    if not conv:
        raise HbenchError(f"{name}: no user/assistant pair in {n} records "
                          f"(skipped: {_skips(skipped) or 'none'})")
    skipped = {k: v for k, v in skipped.items() if v}
    identity = {**identity, "format": f"{chat_column} ({'/'.join(keys)})", "records_read": n,
                "records_skipped": skipped}
    digest = hashlib.sha256(repr(sorted(identity.items())).encode()).hexdigest()[:20]
    return ShareGPTPairs(source=str(identity.get("path") or identity.get("id")), name=name,
                         key=digest, records_read=n, truncated=False,
                         conv=np.asarray(conv, dtype=np.int64), human=pa.array(human, pa.string()),
                         gpt=pa.array(gpt, pa.string()), identity=identity)


def _message_keys(message, name: str, column: str) -> tuple[str, str]:
    if isinstance(message, dict):
        for keys in MESSAGE_KEYS:
            if all(k in message for k in keys):
                return keys
    shown = sorted(message) if isinstance(message, dict) else type(message).__name__
    raise HbenchError(f"{name}: messages in column {column!r} have neither from/value nor "
                      f"role/content keys (found {shown})")


def _skips(skipped: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in skipped.items() if v)
