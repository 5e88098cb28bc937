"""Reading a results root into tables the statistics can use.

A results root holds run directories (at any depth, so a sweep's nested
folders work too), each with ``manifest.json`` and ``summary.json`` and the
per-request / per-step parquet tables. Only runs whose manifest says
``"status": "complete"`` and that have a summary count; any other directory
with a manifest is skipped with a `RunSkipped` warning, because a crashed or
half-written run must never enter a paired comparison silently.

`load_runs` returns one row per run: the run's configuration as plain
columns (``org``, ``budget``, ``q``, ``seed``, ...; their names are listed in
``df.attrs["config_keys"]``), every summary metric as a column, and the
identity columns ``run_id``, ``workload_hash``, ``path``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import fields
from pathlib import Path

import pandas as pd

from harness.config import RunConfig
from harness.errors import HbenchError

IDENTITY_COLUMNS = ("run_id", "workload_hash", "path", "git_commit", "engine_version", "created_utc")


class RunSkipped(UserWarning):
    """A directory that looks like a run but is not a complete one."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _run_row(run_dir: Path) -> tuple[dict, list[str]] | None:
    """The row for one run directory and its config keys, or None (with a
    warning) if it does not count."""
    try:
        manifest = _read_json(run_dir / "manifest.json")
    except ValueError as exc:
        warnings.warn(f"skipping {run_dir}: unreadable manifest ({exc})", RunSkipped, stacklevel=3)
        return None
    status = manifest.get("status")
    if status != "complete":
        warnings.warn(f"skipping {run_dir}: status {status!r}, not 'complete'", RunSkipped, stacklevel=3)
        return None
    if not (run_dir / "summary.json").is_file():
        warnings.warn(f"skipping {run_dir}: no summary.json", RunSkipped, stacklevel=3)
        return None
    try:
        summary = _read_json(run_dir / "summary.json")
    except ValueError as exc:
        warnings.warn(f"skipping {run_dir}: unreadable summary ({exc})", RunSkipped, stacklevel=3)
        return None
    config = manifest.get("config") or {}
    row: dict = dict(config)
    for key, value in summary.items():
        # Configuration and summary share no keys by design; never let a metric
        # overwrite a config value if that ever changes.
        row[f"summary.{key}" if key in config else key] = value
    row["run_id"] = manifest.get("run_id", run_dir.name)
    row["workload_hash"] = manifest.get("workload_hash")
    row["git_commit"] = manifest.get("git_commit")
    row["engine_version"] = manifest.get("engine_version")
    row["created_utc"] = manifest.get("created_utc")
    row["path"] = str(run_dir)
    return row, list(config)


def load_runs(root) -> pd.DataFrame:
    """One row per complete run under ``root`` (searched recursively), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise HbenchError(f"results directory {root} does not exist")
    rows, config_keys = [], []
    for manifest in sorted(root.rglob("manifest.json")):
        found = _run_row(manifest.parent)
        if found is None:
            continue
        row, keys = found
        rows.append(row)
        config_keys.extend(k for k in keys if k not in config_keys)
    if not rows:
        raise HbenchError(f"no complete runs under {root} (a run needs manifest.json with status 'complete' and summary.json)")
    df = pd.DataFrame(rows)
    df.attrs["config_keys"] = config_keys
    return df


def config_keys(runs: pd.DataFrame) -> list[str]:
    """The configuration columns of a `load_runs` table (RunConfig's fields if
    the table lost its attrs along the way)."""
    keys = runs.attrs.get("config_keys") or [f.name for f in fields(RunConfig)]
    return [k for k in keys if k in runs.columns]


def load_requests(run_path) -> pd.DataFrame:
    """A run's per-request table (``requests.parquet``)."""
    path = Path(run_path) / "requests.parquet"
    if not path.is_file():
        raise HbenchError(f"{path} not found")
    return pd.read_parquet(path)


def load_steps(run_path) -> pd.DataFrame:
    """A run's per-step table (``steps.parquet``)."""
    path = Path(run_path) / "steps.parquet"
    if not path.is_file():
        raise HbenchError(f"{path} not found")
    return pd.read_parquet(path)
