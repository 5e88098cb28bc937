"""A run's content address, and the check that its manifest still matches it.

Two names address a run directory, and both hash what the run was:

- a run of ``hbench run``: ``<utc>-<engine>-<org>-<budget>-s<seed>-<hash8>``
  (`new_run_id`, with ``-2``, ``-3``, ... when the same id was taken), the
  hash over the recorded configuration and the workload hash;
- a sweep cell: 16 hex digits (`cell_id`) over the configuration, the
  workload hash, the engine version and the sha256 of the files the
  configuration names (``--config``, ``--workload``, a cost profile).

The manifest records the run id and every input of its hash (the files' sha256
as ``input_files``), so a reader recomputes the address from the manifest
alone (`check_address`): a configuration edited after the run (an ``org``
swapped between two cells, a budget relabelled) no longer hashes to its
name, and the run is refused rather than read as something it was not. The
fields a manifest repeats outside ``config`` (``org``, ``engine``, the
budget's organization) must agree with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path

from common.errors import HbenchError

#: A sweep cell's id.
CELL_ID = re.compile(r"[0-9a-f]{16}")
#: `new_run_id`'s shape: its readable parts, its hash and the suffix `free_run_id` adds.
RUN_ID = re.compile(r"(?P<utc>\d{8}T\d{6}Z)-(?P<engine>[^-]+)-(?P<org>[^-]+)-(?P<budget>[^-]+)"
                    r"-s(?P<seed>[^-]+)-(?P<hash>[0-9a-f]{8})(?P<repeat>-[0-9]+)?")


def canonical(obj) -> str:
    """The one JSON text of a plain value that every address hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_") or "x"


def _run_hash(config: dict, workload_hash) -> str:
    blob = canonical({"config": config, "workload_hash": workload_hash})
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _readable(config: dict) -> list[str]:
    return [slug(str(config.get(k))) for k in ("engine", "org", "budget")] + [
        slug(str(config.get("seed")))]


def new_run_id(config, workload_hash: str, *, now: datetime | None = None) -> str:
    """A readable, sortable run id: ``<utc>-<engine>-<org>-<budget>-s<seed>-<hash8>``.

    The trailing hash covers the whole config and the workload, so two cells of
    a sweep started in the same second (differing only in, say, headroom) get
    different ids, and a reader can tell a configuration edited since
    (`check_address`). The identical run repeated within one second gets the
    same id: `harness.results.free_run_id` gives it the next free one.
    """
    utc = (now or datetime.now(UTC)).astimezone(UTC)
    engine, org, budget, seed = _readable(config.to_dict())
    return f"{utc:%Y%m%dT%H%M%SZ}-{engine}-{org}-{budget}-s{seed}-" + _run_hash(
        config.to_dict(), workload_hash)


def _file_sha256(path: str, flag: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise HbenchError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def input_files(config) -> dict[str, str]:
    """The sha256 of the bytes of each file ``config`` names, by flag: what a
    cell's id covers besides the config, recorded in its manifest."""
    named = [("--config", config.config_path), ("--workload", config.workload_path)]
    if config.engine == "sim":
        named.append(("--gpu", config.cost_profile_path))
    return {flag: _file_sha256(path, flag) for flag, path in named if path}


def _cell_hash(config: dict, workload_hash, engine_version, files: dict) -> str:
    doc = {"config": config, "workload_hash": workload_hash, "engine_version": engine_version}
    if files:
        doc["input_files"] = files
    return hashlib.sha256(canonical(doc).encode()).hexdigest()[:16]


def cell_id(config, workload_hash: str, engine_version: str) -> str:
    """Content address of a sweep cell: first 16 hex of sha256 over the
    canonical JSON of the config, the workload hash, the engine version and
    the sha256 of the bytes of the files the config names (`input_files`), so
    editing such a file gives a new cell.

    Equal ids mean the same engine saw the same request stream under the same
    knobs, so a sweep can skip a cell whose id already has a complete run.
    """
    return _cell_hash(config.to_dict(), workload_hash, engine_version, input_files(config))


def address_of(manifest: dict) -> str | None:
    """The run id ``manifest``'s configuration hashes to, in the form of the id
    it records (a cell id; or a run id, keeping its time and repeat suffix);
    None when the id it records has neither form."""
    run_id, config = manifest.get("run_id"), manifest.get("config")
    if CELL_ID.fullmatch(run_id):
        return _cell_hash(config, manifest.get("workload_hash"), manifest.get("engine_version"),
                          manifest.get("input_files", {}))
    if m := RUN_ID.fullmatch(run_id):
        engine, org, budget, seed = _readable(config)
        return (f"{m['utc']}-{engine}-{org}-{budget}-s{seed}-"
                f"{_run_hash(config, manifest.get('workload_hash'))}{m['repeat'] or ''}")
    return None


def address_problem(manifest: dict) -> str | None:
    """What in ``manifest`` (its types already checked) does not match its run
    id, the content address of its configuration; None when all of it does."""
    run_id, config = manifest.get("run_id"), manifest.get("config")
    if not isinstance(run_id, str) or not isinstance(config, dict):
        return "it records no run id"
    for key in ("org", "engine"):
        if key in manifest and manifest[key] != config.get(key):
            return f"its {key} {manifest[key]!r} is not its configuration's {config.get(key)!r}"
    budget = manifest.get("budget")
    budget_org = budget.get("org") if isinstance(budget, dict) else None
    if budget_org is not None and budget_org != config.get("org"):
        return f"its budget is {budget_org!r}'s, its configuration's organization {config.get('org')!r}"
    files = manifest.get("input_files", {})
    if not isinstance(files, dict):
        return "its input_files record is not an object"
    if CELL_ID.fullmatch(run_id) and not files and any(
            config.get(k) for k in ("config_path", "workload_path", "cost_profile_path")):
        return "it records no sha256 of the files its configuration names"
    try:
        expected = address_of(manifest)
    except ValueError:   # NaN or Infinity in the configuration
        expected = None
    if expected is None and not (CELL_ID.fullmatch(run_id) or RUN_ID.fullmatch(run_id)):
        return f"its run id {run_id!r} is not a content address"
    ok = expected == run_id
    if not ok:
        return f"its configuration does not hash to its run id {run_id}"
    return None
