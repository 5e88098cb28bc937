"""``hbench regress``: does a candidate results root regress against a baseline?

Exit status: 0 no regression, 1 regression, 2 bad input (a missing
directory, no complete runs, no matching cells). Bad input is reported here
rather than through the CLI's usual exit 1, so CI can tell "slower" from
"could not compare".
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.errors import HbenchError


@click.command("regress")
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Baseline results root.")
@click.option("--candidate", type=click.Path(path_type=Path), required=True, help="Candidate results root.")
@click.option("--min-effect", type=float, default=0.02, show_default=True,
              help="Smallest relative change in the bad direction that counts (0.02 = 2%).")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="Significance level after Holm.")
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None,
              help="Write the Markdown report here (for a CI comment).")
def regress(baseline, candidate, min_effect, alpha, report_path):
    """Compare CANDIDATE runs with BASELINE runs cell by cell (same config,
    seed and workload) on throughput, p99 latencies and peak memory."""
    import warnings

    from analysis.load import load_runs
    from analysis.regress import compare, markdown

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = compare(load_runs(baseline), load_runs(candidate), min_effect=min_effect, alpha=alpha)
    except HbenchError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    text = markdown(result, baseline, candidate)
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(text)
    click.echo(text)
    sys.exit(1 if result.regressed else 0)
