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

A configuration key that only one tree's runs have (a knob added between the
two versions) is left out of the matching if it holds one value in every run
of that tree (the new knob at its default, which must be the old behaviour);
the keys left out are printed. A key with several values there is compared,
so those runs stay unmatched.

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


def run_key(manifest: dict, ignore: frozenset = frozenset()) -> str:
    """What a run ran: its configuration (less the ``ignore`` keys) and its
    workload's content hash."""
    config = manifest.get("config")
    if isinstance(config, dict):
        config = {k: v for k, v in config.items() if k not in ignore}
    return json.dumps({"config": config, "workload": manifest.get("workload_hash")},
                      sort_keys=True)


def manifests(root: Path) -> list[tuple[Path, dict]]:
    return [(p.parent, json.loads(p.read_text())) for p in sorted(root.rglob("manifest.json"))]


def config_keys(runs: list[tuple[Path, dict]]) -> dict[str, set]:
    """Every configuration key of ``runs`` with the values it takes (as JSON)."""
    keys: dict[str, set] = {}
    for _, m in runs:
        for k, v in (m.get("config") or {}).items():
            keys.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return keys


def one_sided_keys(a: list, b: list) -> frozenset:
    """Keys only one side's runs have, each with a single value there."""
    ka, kb = config_keys(a), config_keys(b)
    return frozenset(k for k in ka.keys() ^ kb.keys() if len(ka.get(k) or kb.get(k)) == 1)


def collect(runs: list[tuple[Path, dict]], root: Path,
            ignore: frozenset = frozenset()) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for run_dir, manifest in runs:
        key = run_key(manifest, ignore)
        if key in out:
            raise SystemExit(f"error: {root} holds two runs of the same configuration: "
                             f"{out[key]} and {run_dir}")
        out[key] = run_dir
    return out


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
    ma, mb = manifests(before), manifests(after)
    ignore = one_sided_keys(ma, mb)
    if ignore:
        print(f"config keys on one side only, one value each, not matched on: "
              f"{', '.join(sorted(ignore))}")
    runs_a, runs_b = collect(ma, before, ignore), collect(mb, after, ignore)
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
