"""``hbench reuse DIR``: token hit rate, request hit rate and FLOPs saved per arm.

Thin: reads the runs under DIR (`harness.results.iter_runs`) and prints
`analysis.reuse`'s table, the numbers Marconi reports, beside J_adopt and
checkpoint invalidations, TTFT p99 and throughput, averaged over seeds within each arm (every run with --per-run).
"""

from __future__ import annotations

import json
import math
import warnings

import click

from common.errors import HbenchError
from hbench.flag_types import PATH


@click.command("reuse")
@click.argument("results_dir", type=PATH)
@click.option("--per-run", is_flag=True, help="One row per run instead of the mean over seeds.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def reuse(results_dir, per_run, as_json):
    """Prefix reuse of the runs in RESULTS_DIR, read from their request tables.

    \b
    Example:
      hbench reuse results/policies
    """
    from rich.console import Console
    from rich.table import Table

    from analysis.reuse import arm_means, reuse_table
    from harness.results import iter_runs

    if not results_dir.is_dir():
        raise HbenchError(f"{results_dir} is not a directory")
    with warnings.catch_warnings(record=True) as caught:   # runs skipped as incomplete
        warnings.simplefilter("always")
        table = reuse_table(iter_runs(results_dir))
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    if table.empty:
        raise HbenchError(f"no complete runs under {results_dir}")
    rows = table if per_run else arm_means(table)
    if as_json:
        click.echo(json.dumps(rows.to_dict(orient="records"), indent=1, default=float))
        return
    t = Table(title=f"prefix reuse under {results_dir}" + ("" if per_run else " (mean over seeds)"))
    for c in rows.columns:
        t.add_column(c, justify="right")
    for rec in rows.to_dict(orient="records"):
        t.add_row(*(_cell(k, v) for k, v in rec.items()))
    Console(width=max(Console().width, 140)).print(t)


def _cell(key: str, v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if key.endswith("_rate"):
            return f"{100 * v:.1f} %"
        if key == "flops_saved":
            return f"{v:.3e}"
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:g}"
    return str(v)
