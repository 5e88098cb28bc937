"""A results root as one table the statistics can use.

Reading is `harness.results`'s job (`iter_runs`: schema version checked,
incomplete runs skipped with a `RunSkipped` warning or refused when
``strict``); this module only flattens the runs it returns. `load_runs`
gives one row per run: the run's configuration as plain columns (``org``,
``budget``, ``q``, ``seed``, ...; their names are listed in
``df.attrs["config_keys"]``), every summary metric as a column, and the
identity and checked-metadata columns in `IDENTITY_COLUMNS` (with
``allocated_bytes``, the state memory the engine was given). The summary's
nested ``validity`` object becomes plain columns: ``valid`` (bool: valid for
every metric), ``validity`` (``valid`` or what is not valid and why),
``invalid_reasons`` and one bool per metric kind, ``valid_for_<kind>``
(`harness.validity.metric_verdicts`; `valid_column` names the one a metric
is judged by).

A configuration run again with the same seed (``hbench run`` twice) is one
observation, not two: `load_runs` keeps the newest run of each
(configuration, seed) and sets the older ones aside with a `RepeatedRun`
warning that names them, so pairing by seed sees one run per arm and seed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import fields

import pandas as pd

from analysis.run_validity import reasons
from common.errors import HbenchError
from harness.config import RunConfig
from harness.results import Run, RunSkipped, iter_runs, org_expression
from harness.validity import describe_validity, metric_kind, metric_verdicts, run_is_valid

__all__ = ["IDENTITY_COLUMNS", "RepeatedRun", "RunSkipped", "config_keys", "load_runs", "run_row",
           "valid_column"]

IDENTITY_COLUMNS = ("run_id", "workload_hash", "path", "git_commit", "engine", "engine_version",
                    "schema_version", "created_utc", "allocated_bytes", "org_expression")


class RepeatedRun(UserWarning):
    """Runs of a configuration and seed that a newer run of the same replaces."""


def run_row(run: Run) -> dict:
    """One run as a flat row: configuration, summary metrics, identity."""
    config = run.config
    row: dict = dict(config)
    for key, value in run.summary.items():
        if key == "validity":   # the one nested object: its verdict as plain columns
            continue
        # Configuration and summary share no keys by design; never let a metric
        # overwrite a config value if that ever changes.
        row[f"summary.{key}" if key in config else key] = value
    row["valid"] = run_is_valid(run.summary)
    row["validity"] = describe_validity(run.summary)
    row["invalid_reasons"] = reasons(run.summary)
    for kind, v in metric_verdicts(run.summary.get("validity")).items():
        row[f"valid_for_{kind}"] = v["valid"]
    row.update(run_id=run.run_id, workload_hash=run.workload_hash, path=str(run.path),
               git_commit=run.git_commit, engine=run.engine, engine_version=run.engine_version,
               schema_version=run.schema_version, created_utc=run.manifest.get("created_utc"),
               allocated_bytes=_allocated_bytes(run.manifest),
               org_expression=org_expression(run.manifest))
    return row



def valid_column(metric: str) -> str:
    """The column of a `load_runs` table that says whether a run's ``metric``
    is valid (``valid_for_<kind>``, `harness.validity.metric_kind`)."""
    return f"valid_for_{metric_kind(metric)}"


def _allocated_bytes(manifest: dict) -> int | None:
    """The state bytes (whole model) the engine was given for the run's budget
    (`harness.budget.OrgBudget.allocated_bytes`); None for runs written before
    manifests recorded it."""
    budget = manifest.get("budget")
    value = budget.get("allocated_whole_model_bytes") if isinstance(budget, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_runs(root, *, strict: bool = False) -> pd.DataFrame:
    """One row per complete run under ``root`` (searched recursively), sorted by path."""
    rows, keys = [], []
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", RunSkipped)
        for run in iter_runs(root, strict=strict):
            rows.append(run_row(run))
            keys.extend(k for k in run.config if k not in keys)
    if not rows:
        # The reason the last candidate was skipped is the one worth a line.
        why = f"; {skipped[-1].message}" if skipped else ""
        raise HbenchError(f"no complete runs under {root} (a run needs manifest.json with status "
                          f"'complete' and summary.json){why}")
    for w in skipped:   # the caller decides how to show them (analyze prints "warning:")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    df = pd.DataFrame(rows)
    df.attrs["config_keys"] = keys
    return newest_of_each_configuration(df)


def newest_of_each_configuration(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with one run per (configuration, seed): the newest (manifest's
    ``created_utc``, then the manifest file's modification time), the others
    set aside with one `RepeatedRun` warning naming them."""
    keys = config_keys(runs)
    if runs.empty or not keys:
        return runs
    config = pd.Series([repr(row) for row in runs[keys].itertuples(index=False, name=None)],
                       index=runs.index)
    if not config.duplicated().any():          # the usual tree: no file is asked about
        return runs
    written = runs["path"].map(_manifest_mtime_ns)
    order = runs.assign(_config=config, _written=written).sort_values(
        ["created_utc", "_written", "run_id"], na_position="first", kind="stable")
    newest = order.drop_duplicates("_config", keep="last")
    older = order[~order.index.isin(newest.index)]
    kept_for = newest.set_index("_config")["path"]
    aside = ", ".join(sorted(older["path"]))
    kept = ", ".join(sorted({kept_for[c] for c in older["_config"]}))
    warnings.warn(RepeatedRun(
        f"{len(older)} run(s) repeat a configuration and seed that a newer run also ran; "
        f"kept the newest ({kept}), set aside {aside}"), stacklevel=2)
    out = runs.loc[sorted(newest.index)]
    out.attrs = dict(runs.attrs)
    return out


def _manifest_mtime_ns(path: str) -> int:
    try:
        return os.stat(os.path.join(path, "manifest.json")).st_mtime_ns
    except OSError:
        return 0


def config_keys(runs: pd.DataFrame) -> list[str]:
    """The configuration columns of a `load_runs` table (RunConfig's fields if
    the table lost its attrs along the way)."""
    keys = runs.attrs.get("config_keys") or [f.name for f in fields(RunConfig)]
    return [k for k in keys if k in runs.columns and k not in IDENTITY_COLUMNS]
