"""The detail sections of the HTML report: tables under the answers.

Each function takes tables and returns an HTML fragment ("" when it has
nothing to show). Tables of runs are sorted by organization, budget, rate and
seed (never by run id, a hash) and folded in a ``<details>`` element: they
back the answers above them, they are not the answers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.figures import budget_order
from common.errors import HbenchError
from harness.attribution import CAUSES

RUN_ORDER = ("org", "budget", "rate", "headroom", "q", "seed")


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3g}" if abs(v) < 1 else f"{v:,.2f}"
    return str(v)


def table_html(header: Sequence[str], rows: Sequence[Sequence], groups: Sequence[str] | None = None) -> str:
    """A table; ``groups`` (one label per row) starts a labelled row group
    wherever the label changes."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body, last = [], object()
    for i, row in enumerate(rows):
        if groups is not None and groups[i] != last:
            last = groups[i]
            body.append(f"<tr class='group'><th colspan='{len(header)}'>{html.escape(str(last))}</th></tr>")
        cells = []
        for c in row:
            text = html.escape(fmt(c))
            cls = ' class="bad"' if text.startswith("NOT VALID") or text == "arms not valid" else ""
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def folded(summary: str, inner: str, open_: bool = False) -> str:
    return (f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>"
            f"{inner}</details>")


def sort_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs ordered by organization, budget (numerically), rate, headroom, q and seed."""
    keys = [k for k in RUN_ORDER if k in runs.columns]
    return runs.sort_values(keys, key=lambda s: s.map(budget_order) if s.name == "budget" else s,
                            kind="stable")


def _group_label(r) -> str:
    return f"{str(r['org']).upper()} @ {r['budget']}"


def runs_section(runs: pd.DataFrame) -> str:
    cols = [("org", "org"), ("budget", "budget"), ("rate", "rate req/s"), ("headroom", "headroom"),
            ("q", "q"), ("seed", "seed"), ("throughput_ledger_tok_s", "output tok/s"),
            ("ttft_p99_s", "TTFT p99 s"), ("tpot_p99_s", "TPOT p99 s"),
            ("delivered_rate_req_s", "delivered req/s"), ("validity", "validity"), ("run_id", "run")]
    cols = [(k, h) for k, h in cols if k in runs.columns]
    ordered = sort_runs(runs)
    rows = [[r[k] for k, _ in cols] for _, r in ordered.iterrows()]
    groups = [_group_label(r) for _, r in ordered.iterrows()]
    n_bad = int((~runs["valid"].astype(bool)).sum()) if "valid" in runs.columns else 0
    return ("<h2>Runs and validity</h2>" + invalid_runs_table(ordered)
            + folded(f"{len(runs)} runs, {n_bad} not valid, grouped by organization and budget, "
                     "sorted by rate and seed (click to open)",
                     "<p class='note'>Validity checks: delivered load, arrival process, failures, "
                     "dispatch lag, cache state, overload.</p>" + table_html([h for _, h in cols], rows, groups)))


def invalid_runs_table(runs: pd.DataFrame) -> str:
    """The runs that are not valid, with their arm and reasons ("" when none):
    the run ids the answers do not name."""
    if "valid" not in runs.columns or runs["valid"].astype(bool).all():
        return ""
    bad = runs[~runs["valid"].astype(bool)]
    cols = [k for k in ("org", "budget", "rate", "seed", "invalid_reasons", "run_id") if k in bad.columns]
    heads = {"rate": "rate req/s", "invalid_reasons": "why not valid", "run_id": "run"}
    return ("<h3>Runs not valid</h3>"
            + folded(f"{len(bad)} runs not valid, by organization, budget, rate and seed (click to open)",
                     table_html([heads.get(k, k) for k in cols], [[r[k] for k in cols] for _, r in bad.iterrows()])))


def memory_given_section(runs: pd.DataFrame) -> str:
    """The memory each organization was given at each budget: organizations
    are compared at equal bytes (harness/budget.py), and this shows it."""
    if "allocated_bytes" not in runs.columns or runs["allocated_bytes"].isna().all():
        return ""
    keys = [k for k in ("engine", "paging", "budget", "org") if k in runs.columns]
    # dropna=False: a run without a paging mode (None) still has its row
    given = (runs.dropna(subset=["allocated_bytes"]).groupby(keys, sort=True, dropna=False)["allocated_bytes"]
             .agg(["min", "max"]).reset_index())
    given = given.sort_values(["budget", "org"], key=lambda s: s.map(budget_order) if s.name == "budget" else s)
    rows = [[*(r[k] for k in keys), f"{r['min'] / 2**20:,.2f}"
             + ("" if r["min"] == r["max"] else f" - {r['max'] / 2**20:,.2f}")]
            for _, r in given.iterrows()]
    return ("<h2>Memory given</h2><p class='note'>State memory each organization's engine was "
            "given (whole model, MiB): one budget label is the same bytes for every "
            "organization, less each one's rounding to whole pages.</p>"
            + table_html([*keys, "allocated MiB"], rows))


def contrasts_section(contrasts: pd.DataFrame | None) -> str:
    if contrasts is None or contrasts.empty:
        return "<h2>Contrasts</h2><p class='note'>No contrasts (a single organization or arm).</p>"
    from analysis.report import CONTRAST_HEADER, contrast_notes, contrast_rows

    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in contrast_notes(contrasts))
    ordered = contrasts.sort_values(["significant", "family", "name"], ascending=[False, True, True],
                                    kind="stable")
    return ("<h2>Contrasts (paired by seed, Holm within family)</h2><p class='note'>Significant "
            "contrasts first.</p>" + table_html(CONTRAST_HEADER, contrast_rows(ordered)) + notes)


def interactions_section(interactions: pd.DataFrame | None) -> str:
    if interactions is None or interactions.empty:
        return ""
    from analysis.report import INTERACTION_HEADER, interaction_rows

    return "<h2>Interactions</h2>" + table_html(INTERACTION_HEADER, interaction_rows(interactions))


def attribution_section(runs: pd.DataFrame) -> str:
    from analysis.answer_figures import CAUSE_LABELS

    keys = [f"ttft_p99_{c}_s" for c in CAUSES]
    if not set(keys) <= set(runs.columns) or runs[keys].isna().all().all():
        return ("<h2>TTFT attribution</h2><p class='note'>No run records the scheduler's reasons "
                "(real engines expose no per-step reasons).</p>")
    header = ["org", "budget", "rate", "seed", "TTFT p50 s", "TTFT p99 s",
              *(f"p99: {CAUSE_LABELS[c]}" for c in CAUSES), "run"]
    ordered = sort_runs(runs)
    rows = [[r["org"], r["budget"], r["rate"], r["seed"], r["ttft_p50_s"], r["ttft_p99_s"],
             *(r[k] for k in keys), r["run_id"]] for _, r in ordered.iterrows()]
    return ("<h2>TTFT attribution</h2>"
            + folded(f"per run ({len(rows)} runs): mean parts of the requests around TTFT p50 "
                     "(45th-55th percentile) and in the top 2 % (p99), in seconds",
                     table_html(header, rows, [_group_label(r) for _, r in ordered.iterrows()])))


def explain_section(runs: pd.DataFrame, limit: int = 12) -> str:
    from analysis.explain import explain_run

    rows = []
    for _, r in sort_runs(runs).head(limit).iterrows():
        try:
            d = explain_run(Path(r["path"]))
        except HbenchError:
            continue
        counts = ", ".join(f"{k}: {n}" for k, n in d["counts"].items()) or "-"
        rows.append([d["org"], r["budget"], r["rate"], r["seed"], d["shared_requests"], d["reused_all"],
                     counts, d["answer"], r["run_id"]])
    if not rows:
        return ""
    more = f"first {limit} of {len(runs)} runs" if len(runs) > limit else f"{len(rows)} runs"
    return ("<h2>Shared-prefix diagnostics</h2>"
            + folded(f"per run ({more}, by organization, budget, rate, seed)",
                     table_html(["org", "budget", "rate", "seed", "sharing", "reused all",
                                 "misses by reason", "answer", "run"], rows)))


STUDY_HEADER = ("design", "published figure", "study's value", "study note", "hbench's value",
                "hbench 95% CI", "n", "hbench's verdict", "hbench p Holm", "direction reproduced",
                "CI covers study", "magnitude ratio")


def study_section(table: pd.DataFrame | None) -> str:
    """The study-vs-hbench table of `analysis.reproduce.compare`: the study's
    value, hbench's value and hbench's verdict in separate columns,
    interactions included."""
    if table is None:
        return ""
    if table.empty:
        return ("<h2>Study vs hbench</h2><p class='note'>The study published no number for this "
                "design; the contrasts below are what hbench measured.</p>")

    from analysis.headlines import direction_words

    def num(x, unit):
        return "n/a" if pd.isna(x) else f"{x:,.3f} {unit}".strip() if abs(x) < 1000 else f"{x:,.1f} {unit}".strip()

    rows = [[r["design"], r["figure"], num(r["published"], r["unit"]), r["study_note"] or "",
             num(r["hbench"], r["unit"]),
             "n/a" if pd.isna(r["ci_low"]) else f"[{num(r['ci_low'], '')}, {num(r['ci_high'], '')}]",
             str(r["n"]), r["hbench_verdict"], "n/a" if pd.isna(r["hbench_p_holm"]) else f"{r['hbench_p_holm']:.4g}",
             direction_words(r), r["ci_covers_published"], num(r["magnitude_ratio"], "")]
            for _, r in table.iterrows()]
    return ("<h2>Study vs hbench</h2><p class='note'>One row per number the study published: its "
            "value and note, then hbench's value, interval and verdict from the runs of this "
            "directory (relative effects: geometric mean of within-seed ratios with the log-scale "
            "t interval; interactions in their own unit).</p>" + table_html(STUDY_HEADER, rows))
