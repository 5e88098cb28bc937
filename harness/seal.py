"""A JSON document's seal: the sha256 of every other field it holds.

A run's manifest is sealed (``manifest_sha256``). The run id binds the
configuration (`harness.run_address`) and the files' record binds the other
files, but a manifest carries more that readers use: the budget's allocated
bytes (analysis's memory table), the engine's info (explain's attention
block and checkpoint grid), the workload's meta (its shared context), the
creation time (which of two equal runs is the newer), the versions a report
prints. So the writer seals the manifest last: the sha256 of the canonical
JSON of all its other fields. An edit to any field, or a field added or
removed, no longer matches the seal, and every reader refuses the run (a
sweep reruns it). ``capacity.json`` is sealed the same way
(``capacity_sha256``): the report reads its numbers.

Like the cache's digests the seal is unkeyed: it catches a hand edit, rot
and a field copied from another document, not a forger who recomputes it
with this code.
"""

from __future__ import annotations

import hashlib
import json

#: The manifest field holding its seal.
SEAL = "manifest_sha256"


def sealed(doc: dict, field: str = SEAL) -> dict:
    """``doc`` with its seal, as ``field``, over every other field (any old seal replaced)."""
    fields = {k: v for k, v in doc.items() if k != field}
    return {**fields, field: _sha256(fields)}


def seal_problem(doc: dict, field: str = SEAL) -> str | None:
    """What is wrong with ``doc``'s seal in ``field``; None when it matches its fields."""
    seal = doc.get(field)
    if seal is None:
        return f"it records no {field}, so its fields cannot be verified"
    fields = {k: v for k, v in doc.items() if k != field}
    if seal != _sha256(fields):
        return f"its fields do not match its {field} (edited since it was written)"
    return None


def _sha256(fields: dict) -> str:
    """Over the canonical JSON text (`harness.run_address.canonical`'s form; a
    NaN, which only capacity.json holds, as ``NaN``)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
