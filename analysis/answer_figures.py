"""Figures of the answers: the capacity winner map and the TTFT attribution bars.

Like `analysis.figures`, each function takes tables and returns a bare
matplotlib `Figure` (Agg canvas, no global pyplot state).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from analysis.figures import budget_order
from analysis.verdicts import claims_winner
from common.palette import TIE_COLOR, org_color, text_color_on
from harness.attribution import CAUSES

# No organization's colour (common.palette): the bars' x axis lists organizations.
CAUSE_COLOURS = {"wait_memory": "#b07aa1", "wait_cap": "#edc948", "wait_budget": "#ff9da7",
                 "prefill": "#76b7b2", "recompute": "#9c755f"}
CAUSE_LABELS = {"wait_memory": "waiting: memory short", "wait_cap": "waiting: running cap full",
                "wait_budget": "waiting: token budget", "prefill": "prefill compute",
                "recompute": "recompute after preemption"}


def _lead(r) -> str:
    """A second line ``S2 ahead, p Holm 0.31`` for a tie whose means differ ("" for equal means)."""
    leader = r.get("leader", None if r["winner"] == "tie" else r["winner"])
    if leader is None or (isinstance(leader, float) and math.isnan(leader)):
        return ""
    p = r.get("p_holm", math.nan)
    return f"\n{str(leader).upper()} ahead, p Holm " + ("n/a" if p is None or math.isnan(p) else f"{p:.2f}")


def winner_map_figure(wmap: pd.DataFrame, title: str) -> Figure:
    """Budget (rows) x rate (columns); a cell takes the colour of the
    organization that wins it (best mean goodput, significantly ahead of the
    runner-up) or the tie colour, and is labelled with the winner (or "tie",
    naming the organization ahead and the p value when the means differ) and
    the best mean goodput in req/s. Whether a cell is won is the map's
    ``significant`` column (`analysis.verdicts.claims_winner`), never decided here. Text is black or white by the cell's
    luminance, so it reads on every colour."""
    budgets = sorted(wmap["budget"].unique(), key=budget_order)
    rates = sorted(wmap["rate"].unique())
    fig = Figure(figsize=(1.6 * len(rates) + 3.2, 0.85 * len(budgets) + 1.7), layout="constrained")
    ax = fig.subplots()
    winners = set()
    for _, r in wmap.iterrows():
        i, j = budgets.index(r["budget"]), rates.index(r["rate"])
        won = claims_winner(r) and r["winner"] != "tie"
        colour = org_color(r["winner"]) if won else TIE_COLOR
        winners.add(r["winner"] if won else None)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=1.5))
        word = str(r["winner"]).upper() if won else "tie" + _lead(r)
        ax.text(j, i, f"{word}\n{r['goodput']:.2f} req/s", ha="center", va="center",
                color=text_color_on(colour), fontsize=8)
    ax.set_xlim(-0.5, len(rates) - 0.5)
    ax.set_ylim(len(budgets) - 0.5, -0.5)
    ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
    ax.set_yticks(range(len(budgets)), budgets)
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("budget (label)")
    ax.set_title(title, fontsize=9)
    handles = [Patch(facecolor=org_color(o), label=o.upper()) for o in sorted(w for w in winners if w)]
    handles.append(Patch(facecolor=TIE_COLOR, label="tie: equal, or not significant"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
              title="cell: winner, best goodput", title_fontsize=8)
    return fig


def attribution_figure(breakdowns: pd.DataFrame) -> Figure | None:
    """Stacked bars of the TTFT p50 and p99 breakdown per organization (mean
    over the runs of each organization); ``breakdowns`` has an ``org`` column
    and the ``ttft_<band>_<cause>_s`` summary keys. None without data."""
    keys = [f"ttft_p99_{c}_s" for c in CAUSES]
    if breakdowns.empty or not set(keys) <= set(breakdowns.columns):
        return None
    # A key whose every value is null is an object column that the numeric
    # mean drops; reindex brings it back as NaN (drawn as 0) for both bands.
    bands = [f"ttft_{band}_{c}_s" for band in ("p50", "p99") for c in CAUSES]
    data = breakdowns.groupby("org", sort=True).mean(numeric_only=True).reindex(columns=bands)
    if data[keys].isna().all().all():
        return None
    orgs = list(data.index)
    fig = Figure(figsize=(max(6.4, 2.5 + 1.6 * len(orgs)), 4.2), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False, sharey=True)[0]
    tallest = max(float(data[[f"ttft_{b}_{c}_s" for c in CAUSES]].fillna(0).sum(axis=1).max())
                  for b in ("p50", "p99"))
    for ax, band in zip(axes, ("p50", "p99"), strict=True):
        bottom = np.zeros(len(orgs))
        for c in CAUSES:
            v = data[f"ttft_{band}_{c}_s"].fillna(0).to_numpy(float)
            ax.bar([o.upper() for o in orgs], v, bottom=bottom, color=CAUSE_COLOURS[c],
                   label=CAUSE_LABELS[c])
            bottom += v
        ax.set_title(f"TTFT {band}", fontsize=10)
        ax.set_xlabel("organization")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("mean part of TTFT (s)")
    axes[0].set_ylim(0, 1.08 * tallest if tallest > 0 else 1.0)   # room above the tallest bar
    fig.suptitle("TTFT by cause (mean over each organization's runs)", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=7)
    return fig
