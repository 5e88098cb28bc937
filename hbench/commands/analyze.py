"""``hbench analyze DIR``: paired-seed contrasts, Holm per family, report and figures.

Thin: loads the runs, builds the contrasts (automatic, or from a design
file), evaluates them and hands the tables to `analysis.report` and
`analysis.figures`.
"""

from __future__ import annotations

import warnings

import click

from analysis.default_metrics import DEFAULT_METRICS
from analysis.run_validity import INCLUDE_INVALID_HELP
from common.errors import HbenchError
from harness.config import ORG_NAMES
from hbench.flag_types import FLOAT, PATH


@click.command("analyze")
@click.argument("results_dir", type=PATH)
@click.option("--out", "out_dir", type=PATH, default=None,
              help="Where to write the analysis (default: RESULTS_DIR/analysis).")
@click.option("--metric", "metrics", multiple=True, default=None,
              help="Summary metric to contrast (repeatable); each metric is one Holm family. "
                   f"Default: {', '.join(DEFAULT_METRICS)} (those the runs have).")
@click.option("--reference", type=click.Choice(ORG_NAMES, case_sensitive=False), default=None,
              help="Compare every other organization with this one (default: every pair).")
@click.option("--design", "--family-file", "design", type=PATH, default=None,
              help="TOML file of [[contrast]] and [[interaction]] tables instead of the automatic contrasts.")
@click.option("--alpha", type=FLOAT, default=0.05, show_default=True, help="Significance level after Holm.")
@click.option("--include-invalid", is_flag=True, help=INCLUDE_INVALID_HELP)
@click.option("--no-figures", is_flag=True, help="Skip the figures.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables.")
def analyze(results_dir, out_dir, metrics, reference, design, alpha, include_invalid, no_figures,
            as_json):
    """Compare organizations across seeds in RESULTS_DIR.

    \b
    Example:
      hbench analyze results/ --reference s2

    Without --design, runs are grouped by every configuration field except
    org and seed, and within each group every pair of organizations is
    contrasted (or every one with --reference) on throughput and latency
    (TTFT p50/p99, TPOT p99), or on each --metric. Validity is per metric: a
    queue that kept growing leaves throughput valid (the service rate an
    organization sustains) but not latency, so a contrast whose arms are not
    valid for its metric (or lack parity) is marked with why and left out of
    its Holm family unless --include-invalid. A configuration and seed run
    twice counts once: the newest run, the others named. Writes
    contrasts.csv, contrasts.json, report.md, report.html and figures/
    under --out.
    """
    from rich.console import Console

    from analysis import contrasts as C
    from analysis.figure_set import figure_set
    from analysis.figures import save
    from analysis.headlines import served_by
    from analysis.html_report import build_html
    from analysis.load import load_runs
    from analysis.report import print_tables, to_json, write_outputs
    from analysis.run_validity import of_runs
    from common.atomic import atomic_write_text, new_dirs_removed_on_error
    from hbench.paths import check_writable_dir

    if not 0 < alpha < 1:
        raise HbenchError(f"--alpha must be in (0, 1), got {alpha}")
    check_writable_dir(out_dir if out_dir is not None else results_dir / "analysis")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(results_dir)
        if design is not None:
            d = C.load_design(design)
            contrasts, interactions = list(d.contrasts), list(d.interactions)
        else:
            contrasts, interactions = C.auto_contrasts(runs, list(metrics) or None,
                                                       reference and reference.lower()), []
        table = C.evaluate(runs, contrasts, alpha=alpha, include_invalid=include_invalid)
        inter = (C.evaluate_interactions(runs, contrasts, interactions, alpha=alpha,
                                         include_invalid=include_invalid) if interactions else None)
        used = sorted({c.metric for c in contrasts}) or list(metrics) or [C.DEFAULT_METRIC]
        arms = C.arm_means(runs, used)
        validity = of_runs(runs, include_invalid, used)
        out = out_dir if out_dir is not None else results_dir / "analysis"
        # The HTML reads every run's tables: built first, a corrupt one fails
        # before any output is written.
        drawn = figure_set(runs, used, table)
        html = build_html(results_dir, runs, table, metrics=used, interactions=inter, figures=drawn,
                          alpha=alpha)
        with new_dirs_removed_on_error(out):   # a failed write leaves no empty folder
            figures = [] if no_figures else [p for stem, _, fig in drawn if fig is not None
                                             for p in save(fig, out / "figures", stem)]
            write_outputs(out, results_dir, table, inter, arms, figures, validity,
                          served=served_by(runs))
            atomic_write_text(out / "report.html", html)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    if as_json:
        click.echo(to_json(table, inter, arms, validity))
    else:
        print_tables(Console(width=max(Console().width, 160)), table, inter)
        click.echo(validity.sentence("Holm families"))
        click.echo(f"{len(runs)} runs, {len(table)} contrasts; wrote {out}/report.md, report.html"
                   + (f" and {len(figures)} figure files" if figures else ""))
