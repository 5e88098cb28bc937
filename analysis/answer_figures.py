"""Figures of the answers: the capacity winner map and the TTFT attribution bars.

Like `analysis.figures`, each function takes tables and returns a bare
matplotlib `Figure` (Agg canvas, no global pyplot state).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from analysis.figures import budget_order
from harness.attribution import CAUSES

ORG_COLOURS = {"s0": "#8c8c8c", "s1": "#f28e2b", "s2": "#4e79a7", "d0": "#e15759",
               "u0": "#76b7b2", "e0": "#b07aa1"}
CAUSE_COLOURS = {"wait_memory": "#e15759", "wait_cap": "#f28e2b", "wait_budget": "#edc948",
                 "prefill": "#4e79a7", "recompute": "#b07aa1"}
CAUSE_LABELS = {"wait_memory": "waiting: memory short", "wait_cap": "waiting: running cap full",
                "wait_budget": "waiting: token budget", "prefill": "prefill compute",
                "recompute": "recompute after preemption"}


def winner_map_figure(wmap: pd.DataFrame, title: str) -> Figure:
    """Budget (rows) x rate (columns); colour = organization with the best mean
    goodput; hatched where its lead over the runner-up is not significant."""
    budgets = sorted(wmap["budget"].unique(), key=budget_order)
    rates = sorted(wmap["rate"].unique())
    orgs = sorted(wmap["winner"].unique())
    colours = [ORG_COLOURS.get(o, "#59a14f") for o in orgs]
    grid = np.full((len(budgets), len(rates)), np.nan)
    fig = Figure(figsize=(1.1 * len(rates) + 2.5, 0.8 * len(budgets) + 1.6), layout="constrained")
    ax = fig.subplots()
    for _, r in wmap.iterrows():
        i, j = budgets.index(r["budget"]), rates.index(r["rate"])
        grid[i, j] = orgs.index(r["winner"])
    ax.imshow(grid, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(orgs) - 0.5, aspect="auto")
    for _, r in wmap.iterrows():
        i, j = budgets.index(r["budget"]), rates.index(r["rate"])
        if not r["significant"]:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                   edgecolor="white", linewidth=0))
        ax.text(j, i, f"{r['goodput']:.2f}", ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
    ax.set_yticks(range(len(budgets)), budgets)
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("budget")
    ax.set_title(title, fontsize=9)
    handles = [Patch(facecolor=c, label=o.upper()) for o, c in zip(orgs, colours, strict=True)]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="not significant"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
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
    fig = Figure(figsize=(3 + 1.2 * len(orgs), 3.8), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for ax, band in zip(axes, ("p50", "p99"), strict=True):
        bottom = np.zeros(len(orgs))
        for c in CAUSES:
            v = data[f"ttft_{band}_{c}_s"].fillna(0).to_numpy(float)
            ax.bar([o.upper() for o in orgs], v, bottom=bottom, color=CAUSE_COLOURS[c],
                   label=CAUSE_LABELS[c])
            bottom += v
        ax.set_title(f"TTFT {band} by cause")
        ax.set_ylabel("seconds")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
