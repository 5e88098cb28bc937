"""One self-contained HTML report of a results root: opens offline, anywhere.

Everything is inlined: figures as base64 PNG data URIs, no script, no
stylesheet or font fetched from anywhere. The report answers first: what was
asked and what the data say (`analysis.headlines`: sentences generated from
the contrasts, with CIs, Holm p values and the runs that are not valid),
then the capacity search (when a ``capacity.json`` from `hbench capacity`
lies under the root) and the study-vs-hbench table (for `hbench
reproduce`), then every figure the data support (`analysis.figure_set.figure_set`,
the figures ``analyze`` writes as files, plus the TTFT attribution), then
the contrast tables, and the per-run tables last, folded
(`analysis.html_sections`).
"""

from __future__ import annotations

import base64
import html
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis import headlines
from analysis import html_sections as S
from analysis.capacity_file import capacity_docs
from common.atomic import atomic_write_text
from common.errors import HbenchError

STYLE = """body{font-family:sans-serif;margin:24px auto;max-width:1150px;padding:0 12px;color:#222}
h1{font-size:22px;overflow-wrap:anywhere}h2{margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0 18px;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;overflow-wrap:anywhere}
th{background:#eee;overflow-wrap:normal}
td:first-child,th:first-child{text-align:left}.bad{color:#b00;font-weight:bold}
tr.group th{background:#f6f6f6;text-align:left}div.scroll{overflow-x:auto;max-width:100%}
img{max-width:100%;height:auto;display:block;margin:8px 0 4px;border:1px solid #ddd}
figure{margin:0 0 22px}figcaption{color:#555;font-size:13px}
p,li{overflow-wrap:anywhere}p.note{color:#555;font-size:13px}p.asked{font-size:16px}
ul.answers li{margin:5px 0}li.sig{font-weight:bold}li.untested{color:#b00}
summary{cursor:pointer;color:#333;margin:6px 0}"""


def png_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig: Figure | None, alt: str, caption: str = "") -> str:
    if fig is None:
        return ""
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{html.escape(alt)}" src="{png_data_uri(fig)}">{cap}</figure>'


def _answers_section(runs: pd.DataFrame, contrasts: pd.DataFrame | None, asked: str,
                     capacity_docs: Sequence[dict], study: pd.DataFrame | None, alpha: float,
                     contrast_answers: bool = True) -> str:
    """The first screen: the question, the answer (each sentence with its
    uncertainty) and what limited it; no run id (those are in the tables at
    the end)."""
    items: list[tuple[str, str]] = []
    if study is not None and not study.empty:
        items += [("study", headlines.study_sentence(r)) for _, r in study.iterrows()]
    for doc in capacity_docs:
        items += [("capacity", t) for t in headlines.capacity_headlines(doc)]
    if contrast_answers:
        items += headlines.contrast_headlines(contrasts, alpha)
    items += [("summary", t) for t in headlines.expression_sentences(runs)]
    lis = "".join(f"<li class='{c}'>{html.escape(t)}</li>" for c, t in items)
    shown = contrasts if contrast_answers else None
    valid = runs["valid"].astype(bool).all() if "valid" in runs.columns else True
    lim = "".join(f"<li class='{'summary' if valid or i else 'untested'}'>{html.escape(t)}</li>"
                  for i, t in enumerate(headlines.limits(runs, shown, headlines.CONTRASTS_LEAVE_THEM
                                                         if contrast_answers else headlines.CAPACITY_LEAVES_THEM)))
    return (f"<h2>Answers</h2><p class='asked'><b>Asked:</b> {html.escape(asked)}</p>"
            f"<p><b>What the data say:</b></p><ul class='answers'>{lis}</ul>"
            f"<p><b>What limits the answer:</b></p><ul class='answers'>{lim}</ul>")


def _capacity_section(docs: Sequence[tuple[Path, dict]]) -> str:
    from analysis.answer_figures import winner_map_figure

    if not docs:
        return ""
    parts = ["<h2>Capacity at the SLO</h2>"]
    for f, doc in docs:
        parts.append(f"<p class='note'>SLO {html.escape(', '.join(doc['slo']))}; rate grid "
                     f"{html.escape(', '.join(f'{r:g}' for r in doc['rates']))} req/s; seeds "
                     f"{html.escape(', '.join(map(str, doc['seeds'])))} ({html.escape(str(f.parent))}).</p>")
        rows = sorted(doc["capacity"], key=lambda c: (S.budget_order(c["budget"]), c["org"]))
        parts.append(S.table_html(["org", "budget", "capacity req/s", "interval low req/s",
                                   "interval high req/s", "per seed req/s"],
                                  [[c["org"], c["budget"], c["capacity_req_s"], c["ci_low"], c["ci_high"],
                                    c["per_seed"]] for c in rows]))
        parts += [f"<p>{html.escape(headlines.crossover_sentence(c))}</p>" for c in doc["crossovers"]]
        wmap = pd.DataFrame(doc["winner_map"])
        if not wmap.empty:
            parts.append(_img(winner_map_figure(wmap, f"winner by goodput ({', '.join(doc['slo'])})"),
                              "capacity winner map",
                              "Winner map: a cell names an organization only when its goodput lead over "
                              "the runner-up is significant (seed-paired difference, Holm over every "
                              "cell, the interval excluding 0: the rule of every table here); grey "
                              "cells are ties. The capacity interval is a percentile bootstrap over "
                              "seeds, within the per-seed capacities."))
    return "".join(parts)


def _figures_section(runs: pd.DataFrame, figures: Sequence[tuple[str, str, Figure | None]]) -> str:
    from analysis.answer_figures import attribution_figure

    parts = [_img(fig, stem, caption) if fig is not None or " not drawn: " not in caption
             else f"<p class='note'>{html.escape(caption)}</p>" for stem, caption, fig in figures]
    parts.append(_img(attribution_figure(runs), "ttft_attribution",
                      "TTFT by cause: mean parts of the requests around TTFT p50 and in the top 2 %, "
                      "per organization."))
    return "<h2>Figures</h2>" + "".join(parts)


def build_html(root, runs: pd.DataFrame, contrasts: pd.DataFrame | None = None, *,
               metrics: Sequence[str] | None = None, interactions: pd.DataFrame | None = None,
               study: pd.DataFrame | None = None, asked: str | None = None, title: str | None = None,
               figures: Sequence[tuple[str, str, Figure | None]] | None = None, alpha: float = 0.05,
               contrast_answers: bool = True) -> str:
    """The report as one HTML string (figures inlined). ``metrics``: those
    contrasted (default: the contrasts' own); ``study``: the study-vs-hbench
    table of `analysis.reproduce.compare`; ``asked``: the question the runs
    answer (default: built from what they vary); ``figures``: the
    `analysis.figure_set.figure_set` already drawn (default: drawn here);
    ``contrast_answers``: whether the contrasts are stated among the answers
    (a capacity search answers with capacities; its contrasts stay in their
    table)."""
    from analysis.figure_set import figure_set

    root = Path(root)
    if metrics is None:
        metrics = (sorted(set(contrasts["metric"])) if contrasts is not None and not contrasts.empty
                   else ["throughput_ledger_tok_s"])
    docs = capacity_docs(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if figures is None:
            figures = figure_set(runs, metrics, contrasts)
        asked = asked or headlines.question(runs, metrics)
        body = (_answers_section(runs, contrasts, asked, [d for _, d in docs], study, alpha,
                                 contrast_answers)
                + _capacity_section(docs) + S.study_section(study)
                + _figures_section(runs, figures)
                + S.contrasts_section(contrasts) + S.interactions_section(interactions)
                + S.memory_given_section(runs) + S.attribution_section(runs)
                + S.explain_section(runs) + S.runs_section(runs))
    title = html.escape(title or f"hbench report: {root} ({headlines.served_by(runs)})")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{title}</title>"
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
                 contrasts: pd.DataFrame | None = None, **kwargs) -> Path:
    """Write the report of ``root`` to ``out``; contrasts default to the
    automatic ones; ``kwargs`` go to `build_html`."""
    from analysis.load import load_runs

    runs = load_runs(root) if runs is None else runs
    if contrasts is None:
        contrasts = auto_contrasts_table(runs)
    return atomic_write_text(Path(out), build_html(root, runs, contrasts, **kwargs))
