"""``hbench report RESULTS -o report.html``: one self-contained HTML report.

Thin: `analysis.html_report.write_report` does the work.
"""

from __future__ import annotations

import warnings

import click

from analysis.run_validity import INCLUDE_INVALID_HELP
from hbench.flag_types import PATH


@click.command("report", context_settings={"max_content_width": 100})
@click.argument("results_dir", type=PATH)
@click.option("-o", "--out", type=PATH, default=None,
              help="Output file (default: RESULTS_DIR/report.html).")
@click.option("--include-invalid", is_flag=True, help=INCLUDE_INVALID_HELP)
def report(results_dir, out, include_invalid):
    """Write one HTML file with every table and figure of RESULTS_DIR.

    It opens with the answers: what the runs asked and what the data say,
    as sentences with CIs, Holm p values and the runs that are not valid;
    then the capacity search (if RESULTS_DIR holds a capacity.json), every
    figure `analyze` draws plus the TTFT attribution, the contrast tables,
    memory given, TTFT attribution and shared-prefix diagnostics per run,
    and the runs with their validity verdicts last (folded). Figures are
    inlined, so the file opens offline.
    """
    from analysis.html_report import auto_contrasts_table, write_report
    from analysis.load import load_runs
    from hbench.paths import check_writable_file

    out = out if out is not None else results_dir / "report.html"
    check_writable_file(out, "--out")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(results_dir)
        path = write_report(results_dir, out, runs=runs,
                            contrasts=auto_contrasts_table(runs, include_invalid))
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    click.echo(f"{len(runs)} runs; wrote {path}")
