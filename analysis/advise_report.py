"""``hbench advise``'s report: the answer first, then each arm's capacity (or,
at one rate, what each arm serves there) as a figure and a table, what to
deploy and how to check it. One self-contained
HTML file (figures inlined, as every hbench report) and a Markdown twin."""

from __future__ import annotations

import html
import math

import pandas as pd
from matplotlib.figure import Figure

from analysis.advise import POINT_METRIC, metric_axis
from analysis.html_report import STYLE, png_data_uri
from common.palette import org_color


def capacity_figure(table: pd.DataFrame, top_rate: float, unit: str = "req/s") -> Figure:
    """Each arm's capacity (mean over seeds) with its interval, best first."""
    fig = Figure(figsize=(7.5, 0.45 * len(table) + 1.4))
    ax = fig.add_subplot()
    rows = table.iloc[::-1]
    y = range(len(rows))
    ax.barh(list(y), rows["capacity_req_s"], color=[org_color(o) for o in rows["org"]])
    ax.errorbar(rows["capacity_req_s"], list(y),
                xerr=[rows["capacity_req_s"] - rows["ci_low"], rows["ci_high"] - rows["capacity_req_s"]],
                fmt="none", ecolor="#333", capsize=3)
    ax.set_yticks(list(y), list(rows["arm"]))
    ax.axvline(top_rate, color="#999", linestyle="--", linewidth=1)
    ax.set_xlabel(f"capacity within the SLO, {unit} (dashed: top of the rate grid)")
    ax.set_xlim(0, top_rate * 1.08)
    fig.tight_layout()
    return fig


def point_figure(table: pd.DataFrame, unit: str = "req/s") -> Figure:
    """Each arm's compared metric at one rate (mean over seeds), best on top."""
    fig = Figure(figsize=(7.5, 0.45 * len(table) + 1.4))
    ax = fig.add_subplot()
    rows = table.iloc[::-1]
    y = range(len(rows))
    ax.barh(list(y), rows["value"], color=[org_color(o) for o in rows["org"]])
    ax.set_yticks(list(y), [f"{a} ({h}/{n} seeds held the SLO)" for a, h, n in
                            zip(rows["arm"], rows["seeds_held"], rows["seeds"], strict=True)])
    ax.set_xlabel(f"{metric_axis(table['metric'].iloc[0])} at {table['rate'].iloc[0]:g} {unit}, "
                  "mean over seeds")
    fig.tight_layout()
    return fig


#: (column, heading) of the arms' table, by mode.
CAPACITY_COLUMNS = (("arm", "arm"), ("capacity_req_s", "capacity (mean over seeds)"),
                    ("ci_low", "interval low"), ("ci_high", "interval high"),
                    ("per_seed", "capacity per seed"))
POINT_COLUMNS = (("arm", "arm"), ("value", "compared metric (mean over seeds)"),
                 ("throughput", "output tok/s"), ("seeds_held", "seeds holding the SLO"),
                 ("seeds", "seeds"))


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.2f}" if isinstance(v, float) else html.escape(str(v))


def advice_html(doc: dict, table: pd.DataFrame) -> str:
    asked = doc["asked"]
    answer = "".join(f"<p>{html.escape(s)}</p>" for s in doc["answer"])
    point = asked.get("at_rate") is not None
    unit = asked.get("rate_unit", "req/s")
    fig = point_figure(table, unit) if point else capacity_figure(table, max(asked["rates"]), unit)
    columns = POINT_COLUMNS if point else CAPACITY_COLUMNS
    if point and table["metric"].iloc[0] == POINT_METRIC:    # compared on throughput itself
        columns = tuple(c for c in columns if c[0] != "throughput")
    cols = [c for c, _ in columns]
    names = [n for _, n in columns]
    if point:       # the compared metric's own name, unit and rate
        names[cols.index("value")] = f"{metric_axis(table['metric'].iloc[0])} (mean over seeds)"
    else:
        names[cols.index("capacity_req_s")] = f"capacity, {unit} (mean over seeds)"
    section = f"Each arm at {asked['at_rate']:g} {unit}" if point else "Capacity of each arm"
    head = "".join(f"<th>{c}</th>" for c in names)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in doc["arms"])
    deploy = "".join(f"<li>{html.escape(x)}</li>" for x in doc["deploy"])
    checks = "".join(f"<li><code>{html.escape(x)}</code></li>" for x in doc["checks"])
    title = f"hbench advise: {html.escape(str(asked.get('config_path') or asked['model']))}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
            f"<h2>Answer</h2>{answer}"
            f"<h2>{section}</h2><figure><img alt='each arm' "
            f"src='{png_data_uri(fig)}'></figure>"
            f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"
            f"<h2>What to deploy</h2><ul>{deploy}</ul>"
            f"<h2>Check it on your server</h2><ul>{checks}</ul>"
            f"<p class='note'>{len(doc['cells'])} runs; seeds {asked['seeds']}, rates "
            f"{asked['rates']} {unit}; SLO {html.escape(asked['slo'])}.</p></body></html>\n")


def advice_markdown(doc: dict) -> str:
    asked = doc["asked"]
    unit = asked.get("rate_unit", "req/s")
    lines = ["# hbench advise", "", *doc["answer"], ""]
    if asked.get("at_rate") is not None:
        metric = doc["arms"][0]["metric"]
        tok_s = metric != POINT_METRIC       # a latency: throughput beside it
        lines += [f"At {asked['at_rate']:g} {unit}:", "",
                  f"| arm | {metric_axis(metric)} |{' output tok/s |' if tok_s else ''} "
                  "seeds holding the SLO |", "|---|---|---|" + ("---|" if tok_s else "")]
        lines += [f"| {r['arm']} | {r['value']:.4g} |"
                  + (f" {r['throughput']:.1f} |" if tok_s else "")
                  + f" {r['seeds_held']} of {r['seeds']} |" for r in doc["arms"]]
    else:
        lines += [f"| arm | capacity {unit} | interval | per seed |", "|---|---|---|---|"]
        lines += [f"| {r['arm']} | {r['capacity_req_s']:.2f} | [{r['ci_low']:.2f}, "
                  f"{r['ci_high']:.2f}] | {r['per_seed']} |" for r in doc["arms"]]
    lines += ["", "What to deploy:", "", *(f"- {x}" for x in doc["deploy"]), "",
              "Check it on your server:", "", *(f"- `{x}`" for x in doc["checks"]), "",
              f"{len(doc['cells'])} runs; seeds {asked['seeds']}, rates {asked['rates']} {unit}; "
              f"SLO {asked['slo']}.", ""]
    return "\n".join(lines)
