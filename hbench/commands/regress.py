"""``hbench regress``: does a candidate results root regress against a baseline?

Exit status: 0 no regression, 1 regression, 2 bad input (bad thresholds, an
unwritable --report, a missing or empty directory, a malformed run, no
matching cells, runs that may not be compared, a baseline value that cannot
be gated on unless --allow-missing). Bad input is reported here rather than
through the CLI's usual exit 1, so CI can tell "slower" from "could not
compare". Bad input wins: when some cells are bad input and others regress,
the exit status is 2 and the one error line names the regressions too.
Every check of the options runs before any run is read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from analysis.run_validity import INCLUDE_INVALID_HELP
from common.errors import HbenchError
from hbench.flag_types import FLOAT, PATH


def check_writable(path: Path) -> None:
    """Refuse a report path that cannot be written (`hbench.paths.check_writable_file`:
    a directory, a link to nothing, a name too long, an unwritable location)."""
    from hbench.paths import check_writable_file

    check_writable_file(path, "--report")
    if path.exists() and not os.access(path, os.W_OK):
        raise HbenchError(f"--report {path} is not writable")


def _fail(message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(2)


@click.command("regress")
@click.option("--baseline", type=PATH, required=True, help="Baseline results root.")
@click.option("--candidate", type=PATH, required=True, help="Candidate results root.")
@click.option("--min-effect", type=FLOAT, default=0.02, show_default=True,
              help="Tolerance: the largest relative change in the bad direction that still passes (0.02 = 2%).")
@click.option("--alpha", type=FLOAT, default=0.05, show_default=True,
              help="Significance level after Holm (noisy engines only).")
@click.option("--allow-missing", is_flag=True,
              help="A baseline cell absent from the candidate is listed, not a regression; a "
                   "baseline metric that is missing, null, not a number or an impossible 0 is "
                   "listed and not gated, instead of exit 2.")
@click.option("--include-invalid", is_flag=True, help=INCLUDE_INVALID_HELP)
@click.option("--report", "report_path", type=PATH, default=None,
              help="Write the Markdown report here (for a CI comment).")
def regress(baseline, candidate, min_effect, alpha, allow_missing, include_invalid, report_path):
    """Compare CANDIDATE runs with BASELINE runs cell by cell (same
    configuration and seed) on every summary metric with a direction:
    throughput, TTFT, ITL, TPOT and end-to-end percentiles, finished, failed
    and cancelled requests, reuse, preemptions, memory peaks, the parts of
    TTFT, ... (analysis/gated_metrics.py). A relative metric regresses when
    worse than the baseline by more than --min-effect of it; a count (zero
    when nothing of its kind happened) also when worse, from 0, by more than
    --min-effect of one unit. The report names every metric it gated.

    The simulator is deterministic, so each cell is judged on its own; a
    real server's cells are judged per seed group by a paired test.

    Exit 0: no regression; 1: a regression; 2: bad input, which wins over a
    regression (the error line then names the regressions as well).
    """
    from analysis.regress import compare, validate_thresholds
    from analysis.regress_report import markdown

    try:
        validate_thresholds(min_effect, alpha)
        if report_path is not None:
            check_writable(report_path)
        result = compare(baseline, candidate, min_effect=min_effect, alpha=alpha,
                         allow_missing=allow_missing, include_invalid=include_invalid)
    except HbenchError as exc:
        _fail(str(exc))
    text = markdown(result)
    if report_path is not None:
        from common.atomic import atomic_write_text

        try:
            atomic_write_text(report_path, text)   # whole or not at all, never a 0-byte report
        except HbenchError as exc:
            _fail(f"--report: {exc}")
    click.echo(text)
    sys.exit(1 if result.regressed else 0)
