"""``capacity.json``, the capacity search's answer, written sealed and read back checked.

`hbench capacity` writes it beside its cells; `hbench report` reads every
one under a results root into its capacity section. Its numbers are derived
from the cells but not recomputed by the report, so the file is sealed like
a manifest (`harness.seal`, ``capacity_sha256``): an edit to any number is
refused in one line rather than printed. Reading opens only a regular file,
at most `MAX_CAPACITY_BYTES`, and the search for the files is a walk that any
depth of nesting cannot break (`common.tree_walk`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.errors import HbenchError
from common.input_files import read_input_bytes
from common.tree_walk import walk
from harness.seal import seal_problem, sealed

NAME = "capacity.json"
#: The field holding the file's seal.
SEAL = "capacity_sha256"
#: Largest file read: a grid of a thousand cells writes under a megabyte.
MAX_CAPACITY_BYTES = 32 * 2**20


def capacity_text(doc: dict) -> str:
    """``doc`` (numpy numbers allowed) as the sealed JSON text to write."""
    plain = json.loads(json.dumps(doc, default=float))
    return json.dumps(sealed(plain, SEAL), indent=1) + "\n"


def read_capacity(path: Path) -> dict:
    """The checked document in the ``capacity.json`` at ``path``; one-line
    HbenchError for one that is not a regular file, too large, not a JSON
    object, or does not match its seal."""
    data = read_input_bytes(path, "capacity file", MAX_CAPACITY_BYTES)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise HbenchError(f"capacity file {path} is not JSON ({type(exc).__name__}); "
                          "run hbench capacity again to rewrite it") from None
    if not isinstance(doc, dict):
        raise HbenchError(f"capacity file {path} holds a JSON {type(doc).__name__}, not an object")
    if problem := seal_problem(doc, SEAL):
        raise HbenchError(f"capacity file {path}: {problem}; run hbench capacity again to "
                          "rewrite it (its cells are reused)")
    return doc


def capacity_docs(root: Path) -> list[tuple[Path, dict]]:
    """Every ``capacity.json`` at or below ``root`` (hidden directories
    skipped), in path order, each read by `read_capacity`."""
    found = []
    for dirpath, dirnames, filenames in walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if NAME in filenames or NAME in dirnames:
            found.append(Path(dirpath) / NAME)
    return [(f, read_capacity(f)) for f in sorted(found, key=os.fspath)]
