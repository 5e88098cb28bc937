"""Compare two result trees run for run: are the numbers byte-identical?

    python scripts/compare_results.py BEFORE AFTER

Both trees hold run directories (a ``manifest.json`` each), e.g. two
``hbench sweep`` outputs or two ``hbench reproduce`` outputs made by two
versions of the code. Runs are matched by what they ran (the manifest's
``config`` and ``workload_hash``), not by folder name, because cell ids hash
the simulator's sources and so change with any edit to them. For every
matched pair, ``summary.json`` must be equal value for value, and
``requests.parquet`` / ``steps.parquet`` (where both sides have one) must hold
equal tables (same columns, dtypes and values, NaN equal to NaN). Version
strings (engine version, git commit, package versions, times) are not
compared.

Exit status: 0 identical, 1 some run differs or is unmatched, 2 bad input.
A refactor of the simulator, its organizations or its metrics is "pure"
when this prints ``identical`` for the CI smoke sweep and
``hbench reproduce q4 --quick`` made before and after it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

TABLES = ("requests.parquet", "steps.parquet")


def run_key(manifest: dict) -> str:
    """What a run ran: its configuration and its workload's content hash."""
    return json.dumps({"config": manifest.get("config"),
                       "workload": manifest.get("workload_hash")}, sort_keys=True)


def collect(root: Path) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for manifest_path in sorted(root.rglob("manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        key = run_key(manifest)
        if key in runs:
            raise SystemExit(f"error: {root} holds two runs of the same configuration: "
                             f"{runs[key]} and {manifest_path.parent}")
        runs[key] = manifest_path.parent
    return runs


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def diff_summary(a: Path, b: Path) -> list[str]:
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    out = [f"summary: key only on one side: {k}" for k in sorted(sa.keys() ^ sb.keys())]
    out += [f"summary.{k}: {sa[k]!r} != {sb[k]!r}"
            for k in sorted(sa.keys() & sb.keys()) if not _same(sa[k], sb[k])]
    return out


def diff_table(a: Path, b: Path, name: str) -> list[str]:
    if not (a / name).exists() or not (b / name).exists():
        return []
    ta, tb = pd.read_parquet(a / name), pd.read_parquet(b / name)
    if list(ta.columns) != list(tb.columns):
        return [f"{name}: columns differ: {sorted(set(ta.columns) ^ set(tb.columns))}"]
    if len(ta) != len(tb):
        return [f"{name}: {len(ta)} rows != {len(tb)} rows"]
    out = []
    for col in ta.columns:
        try:
            pd.testing.assert_series_equal(ta[col], tb[col], check_exact=True)
        except AssertionError:
            out.append(f"{name}.{col}: values differ")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    before, after = (Path(p) for p in argv)
    for root in (before, after):
        if not root.is_dir():
            print(f"error: {root} is not a directory", file=sys.stderr)
            return 2
    runs_a, runs_b = collect(before), collect(after)
    if not runs_a:
        print(f"error: no runs under {before}", file=sys.stderr)
        return 2
    problems = 0
    for key in sorted(runs_a.keys() ^ runs_b.keys()):
        side = runs_a.get(key) or runs_b.get(key)
        print(f"unmatched: {side}")
        problems += 1
    for key in sorted(runs_a.keys() & runs_b.keys()):
        a, b = runs_a[key], runs_b[key]
        diffs = diff_summary(a, b) + [d for t in TABLES for d in diff_table(a, b, t)]
        for d in diffs:
            print(f"{a.name} vs {b.name}: {d}")
        problems += bool(diffs)
    matched = len(runs_a.keys() & runs_b.keys())
    if problems:
        print(f"DIFFERENT: {problems} of {len(runs_a.keys() | runs_b.keys())} runs")
        return 1
    print(f"identical: {matched} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
