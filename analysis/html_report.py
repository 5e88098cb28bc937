"""One self-contained HTML report of a results root: opens offline, anywhere.

Everything is inlined: figures as base64 PNG data URIs, no script, no
stylesheet or font fetched from anywhere. Sections: the runs with their
validity verdicts, the paired-seed contrasts (invalid arms marked), the TTFT
attribution per run and per organization, the capacity search (when a
``capacity.json`` from `hbench capacity` lies under the root) with its
winner map, the shared-prefix diagnostics per run, and the figures.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from common.atomic import atomic_write_text
from common.errors import HbenchError
from harness.attribution import CAUSES

STYLE = """body{font-family:sans-serif;margin:24px;max-width:1150px;color:#222}
table{border-collapse:collapse;margin:8px 0 18px;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#eee}
td:first-child,th:first-child{text-align:left}.bad{color:#b00;font-weight:bold}
img{max-width:100%;display:block;margin:8px 0 20px;border:1px solid #ddd}
p.note{color:#555;font-size:13px}"""


def png_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3g}" if abs(v) < 1 else f"{v:,.2f}"
    return str(v)


def table_html(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for c in row:
            text = html.escape(_fmt(c))
            cls = ' class="bad"' if text.startswith("NOT VALID") or text == "arms not valid" else ""
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _img(fig: Figure | None, alt: str) -> str:
    if fig is None:
        return ""
    return f'<img alt="{html.escape(alt)}" src="{png_data_uri(fig)}">'


def _runs_section(runs: pd.DataFrame) -> str:
    cols = [("run_id", "run"), ("org", "org"), ("budget", "budget"), ("rate", "rate"), ("q", "q"),
            ("seed", "seed"), ("throughput_ledger_tok_s", "output tok/s"), ("ttft_p99_s", "TTFT p99 s"),
            ("tpot_p99_s", "TPOT p99 s"), ("delivered_rate_req_s", "delivered req/s"),
            ("validity", "validity")]
    cols = [(k, h) for k, h in cols if k in runs.columns]
    rows = [[r[k] for k, _ in cols] for _, r in runs.sort_values("run_id").iterrows()]
    n_bad = int((~runs["valid"].astype(bool)).sum()) if "valid" in runs.columns else 0
    return (f"<h2>Runs and validity</h2><p class='note'>{len(runs)} runs, {n_bad} not valid "
            "(delivered load, arrival process, failures, dispatch lag, cache state, overload)."
            f"</p>{table_html([h for _, h in cols], rows)}")


def _memory_section(runs: pd.DataFrame) -> str:
    """The memory each organization was given at each budget: organizations
    are compared at equal bytes (harness/budget.py), and this shows it."""
    if "allocated_bytes" not in runs.columns or runs["allocated_bytes"].isna().all():
        return ""
    keys = [k for k in ("engine", "paging", "budget", "org") if k in runs.columns]
    given = (runs.dropna(subset=["allocated_bytes"]).groupby(keys, sort=True)["allocated_bytes"]
             .agg(["min", "max"]).reset_index())
    rows = [[*(r[k] for k in keys), f"{r['min'] / 2**20:,.2f}"
             + ("" if r["min"] == r["max"] else f" - {r['max'] / 2**20:,.2f}")]
            for _, r in given.iterrows()]
    return ("<h2>Memory given</h2><p class='note'>State memory each organization's engine was "
            "given (whole model, MiB): one budget label is the same bytes for every "
            "organization, less each one's rounding to whole pages.</p>"
            + table_html([*keys, "allocated MiB"], rows))


def _contrasts_section(contrasts: pd.DataFrame | None) -> str:
    if contrasts is None or contrasts.empty:
        return "<h2>Contrasts</h2><p class='note'>No contrasts (a single organization or arm).</p>"
    from analysis.figures import forest_figure
    from analysis.report import CONTRAST_HEADER, contrast_notes, contrast_rows

    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in contrast_notes(contrasts))
    return ("<h2>Contrasts (paired by seed, Holm within family)</h2>"
            + table_html(CONTRAST_HEADER, contrast_rows(contrasts)) + notes
            + _img(forest_figure(contrasts), "contrasts forest plot"))


def _attribution_section(runs: pd.DataFrame) -> str:
    from analysis.answer_figures import CAUSE_LABELS, attribution_figure

    keys = [f"ttft_p99_{c}_s" for c in CAUSES]
    if not set(keys) <= set(runs.columns) or runs[keys].isna().all().all():
        return ("<h2>TTFT attribution</h2><p class='note'>No run records the scheduler's reasons "
                "(real engines expose no per-step reasons).</p>")
    header = ["run", "org", "TTFT p50 s", "TTFT p99 s"] + [f"p99: {CAUSE_LABELS[c]}" for c in CAUSES]
    rows = [[r["run_id"], r["org"], r["ttft_p50_s"], r["ttft_p99_s"], *(r[k] for k in keys)]
            for _, r in runs.sort_values("run_id").iterrows()]
    return ("<h2>TTFT attribution</h2><p class='note'>Mean parts of the requests around TTFT p50 "
            "(45th-55th percentile) and in the top 2 % (p99), in seconds.</p>"
            + table_html(header, rows) + _img(attribution_figure(runs), "TTFT attribution by cause"))


def _capacity_section(root: Path) -> str:
    from analysis.answer_figures import winner_map_figure

    files = sorted(root.rglob("capacity.json"))
    if not files:
        return ""
    parts = ["<h2>Capacity at the SLO</h2>"]
    for f in files:
        doc = json.loads(f.read_text())
        parts.append(f"<p class='note'>SLO {html.escape(', '.join(doc['slo']))}; rate grid "
                     f"{html.escape(', '.join(f'{r:g}' for r in doc['rates']))} req/s; seeds "
                     f"{html.escape(', '.join(map(str, doc['seeds'])))} ({html.escape(str(f.parent))}).</p>")
        parts.append(table_html(["org", "budget", "capacity req/s", "CI low", "CI high", "per seed"],
                                [[c["org"], c["budget"], c["capacity_req_s"], c["ci_low"], c["ci_high"],
                                  c["per_seed"]] for c in doc["capacity"]]))
        for c in doc["crossovers"]:
            parts.append(f"<p>At {html.escape(c['budget'])}, {html.escape(c['org'].upper())} beats "
                         f"{html.escape(c['beats'].upper())} on goodput from {c['from_rate']:g} req/s.</p>")
        wmap = pd.DataFrame(doc["winner_map"])
        if not wmap.empty:
            parts.append(_img(winner_map_figure(wmap, "winner by goodput (hatched: not significant)"),
                              "capacity winner map"))
    return "".join(parts)


def _explain_section(runs: pd.DataFrame, limit: int = 12) -> str:
    from analysis.explain import explain_run

    rows = []
    for _, r in runs.sort_values("run_id").head(limit).iterrows():
        try:
            d = explain_run(Path(r["path"]))
        except HbenchError:
            continue
        counts = ", ".join(f"{k}: {n}" for k, n in d["counts"].items()) or "-"
        rows.append([r["run_id"], d["org"], d["shared_requests"], d["reused_all"], counts, d["answer"]])
    if not rows:
        return ""
    more = f" (first {limit} runs)" if len(runs) > limit else ""
    return ("<h2>Shared-prefix diagnostics" + more + "</h2>"
            + table_html(["run", "org", "sharing", "reused all", "misses by reason", "answer"], rows))


def _latency_section(runs: pd.DataFrame) -> str:
    from analysis.figures import _requests_by_org, joint_depth_figure, latency_cdf_figure

    return ("<h2>Figures</h2>" + _img(latency_cdf_figure(_requests_by_org(runs)), "latency CDF")
            + _img(joint_depth_figure(runs), "joint depth"))


def build_html(root, runs: pd.DataFrame, contrasts: pd.DataFrame | None = None) -> str:
    """The report as one HTML string (figures inlined)."""
    root = Path(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        body = (_runs_section(runs) + _memory_section(runs) + _contrasts_section(contrasts)
                + _attribution_section(runs)
                + _capacity_section(root) + _explain_section(runs) + _latency_section(runs))
    title = f"hbench report: {html.escape(str(root))}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style></head><body><h1>{title}</h1>{body}</body></html>\n")


def auto_contrasts_table(runs: pd.DataFrame, include_invalid: bool = False) -> pd.DataFrame | None:
    """The automatic contrasts of ``runs`` (None when there are none or they cannot be formed)."""
    from analysis import contrasts as C

    try:
        cs = C.auto_contrasts(runs)
        return C.evaluate(runs, cs, include_invalid=include_invalid) if cs else None
    except HbenchError:
        return None


def write_report(root, out, *, runs: pd.DataFrame | None = None,
                 contrasts: pd.DataFrame | None = None) -> Path:
    """Write the report of ``root`` to ``out``; contrasts default to the automatic ones."""
    from analysis.load import load_runs

    runs = load_runs(root) if runs is None else runs
    if contrasts is None:
        contrasts = auto_contrasts_table(runs)
    return atomic_write_text(Path(out), build_html(root, runs, contrasts))
