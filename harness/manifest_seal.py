"""A manifest's seal: the sha256 of every other field it holds.

The run id binds the configuration (`harness.run_address`) and the files'
record binds the other files, but a manifest carries more that readers use:
the budget's allocated bytes (analysis's memory table), the engine's info
(explain's attention block and checkpoint grid), the workload's meta (its
shared context), the creation time (which of two equal runs is the newer),
the versions a report prints. So the writer seals the manifest last: its
``manifest_sha256`` is the sha256 of the canonical JSON of all its other
fields. An edit to any field, or a field added or removed, no longer
matches the seal, and every reader refuses the run (a sweep reruns it).

Like the cache's digests the seal is unkeyed: it catches a hand edit, rot
and a field copied from another run, not a forger who recomputes it with
this code.
"""

from __future__ import annotations

import hashlib

from harness.run_address import canonical

#: The manifest field holding the seal.
SEAL = "manifest_sha256"


def sealed(manifest: dict) -> dict:
    """``manifest`` with its seal over every other field (any old seal replaced)."""
    fields = {k: v for k, v in manifest.items() if k != SEAL}
    return {**fields, SEAL: _sha256(fields)}


def seal_problem(manifest: dict) -> str | None:
    """What is wrong with ``manifest``'s seal; None when it matches its fields."""
    seal = manifest.get(SEAL)
    if seal is None:
        return f"it records no {SEAL}, so its fields cannot be verified"
    fields = {k: v for k, v in manifest.items() if k != SEAL}
    try:
        ok = seal == _sha256(fields)
    except ValueError:   # NaN or Infinity in a field: never written by hbench
        ok = False
    return None if ok else f"its fields do not match its {SEAL} (edited since the run was written)"


def _sha256(fields: dict) -> str:
    return hashlib.sha256(canonical(fields).encode()).hexdigest()
