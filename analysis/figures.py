"""Figures of a results root, written as PNG and SVG.

Each ``*_figure`` function takes tables and returns a matplotlib `Figure`
(or None when the data lack the variation the figure needs, e.g. a headroom
plot from runs at one headroom); `save` writes it. `analysis.figure_set` chooses
the figures a result set gets and renders them. Figures are
built on bare `matplotlib.figure.Figure` objects (Agg canvas), never through
pyplot's global state, so analysis can run in threads and tests.

Error bars are 95% intervals over seeds that stay inside the quantity's
bounds by construction: a positive quantity (a throughput, a latency) is
drawn as the geometric mean of its seeds with the back-transformed t
interval of the mean log, so it never reaches below zero; a bounded one (a
count, a mean token depth such as J_adopt, a fraction:
`common.metric_labels.bounded`) and any quantity with a zero among its
seeds as the mean with a percentile bootstrap interval, which lies between
its smallest and largest seed (a log-t interval on two seeds of J_adopt
reached 7,000 tokens for a 3,213-token prefix); ratios as the geometric
mean ratio with the back-transformed t interval of the mean log ratio.
Every axis carries its unit (a ratio says it is unitless, a category axis
names what it lists). Each organization has one colour in every figure
(`common.palette`). `forest_figure` draws whatever contrasts a result set
holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from analysis import stats
from analysis.contrasts import Contrast, cells, group_keys, pair, varying_keys
from common import metric_labels
from common.atomic import atomic_path
from common.palette import org_color

GIB = 1024**3
DEPTH_METRICS = (("j_adopt_mean", "J_adopt (tokens)"), ("r_max_mean", "R_max (tokens)"),
                 ("attn_depth_mean", "attention depth (tokens)"))
LINESTYLES = ("-", "--", ":", "-.")
# Colours that are no organization's (common.palette): state kinds, and the
# series of a ratio figure, which are design cells, not organizations.
MEMORY_COLORS = {"mem_attention_bytes": "#76b7b2", "mem_ssm_bytes": "#b07aa1", "mem_conv_bytes": "#9c755f"}
SERIES_COLORS = ("#222222", "#9c755f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7")
MEMORY_KINDS = (("mem_attention_bytes", "attention KV"), ("mem_ssm_bytes", "SSM state"),
                ("mem_conv_bytes", "conv state"))


def budget_order(label) -> tuple:
    """Sort key that puts b63 < b83 < b108 (numeric, not lexical)."""
    m = re.fullmatch(r"b(\d+)", str(label))
    return (0, int(m.group(1)), "") if m else (1, 0, str(label))


def _label(metric: str) -> str:
    """Axis label of a metric, with its unit (`common.metric_labels`)."""
    return metric_labels.label(metric)


def centre_ci(values, metric: str | None = None) -> tuple[float, float, float]:
    """(centre, lower error, upper error) of a non-negative quantity over seeds,
    the interval inside its bounds by construction: a bounded ``metric``
    (a count, a mean token depth, a fraction: `common.metric_labels.bounded`)
    or any zero among the values -> mean and percentile bootstrap interval,
    which lies within the seeds' own [min, max] and so within the
    quantity's bounds; otherwise (a throughput, a latency) the geometric mean
    and back-transformed t interval of the mean log. Errors are 0 for a
    single value."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna().to_numpy(dtype=float)
    if not v.size:
        return math.nan, 0.0, 0.0
    if np.all(v > 0) and not (metric is not None and metric_labels.bounded(metric)):
        centre = float(np.exp(np.log(v).mean()))
        lo, hi = stats.log_t_interval(v)
    else:
        centre = float(v.mean())
        lo, hi = stats.bootstrap_interval(v, stats.bootstrap_rng()) if v.size > 1 else (centre, centre)
    if math.isnan(lo):
        return centre, 0.0, 0.0
    return centre, max(centre - lo, 0.0), max(hi - centre, 0.0)


def _series_label(parts: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in parts.items())


def save(fig: Figure, out_dir, stem: str) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` under ``out_dir``; return both paths."""
    out = Path(out_dir)
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    for p in paths:
        with atomic_path(p) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return paths


def headroom_figure(runs: pd.DataFrame, metric: str = "throughput_ledger_tok_s") -> Figure | None:
    """Metric vs admission headroom f, one panel per budget, a line per org."""
    if runs["headroom"].nunique() < 2:
        return None
    others = [k for k in varying_keys(runs, group_keys(runs)) if k not in ("headroom", "budget")]
    budgets = sorted(runs["budget"].unique(), key=budget_order)
    fig = Figure(figsize=(4.2 * len(budgets), 3.6), layout="constrained")
    axes = fig.subplots(1, len(budgets), squeeze=False, sharey=True)[0]
    for ax, budget in zip(axes, budgets, strict=True):
        sub = runs[runs["budget"] == budget]
        styles = {}
        for where, line in sorted(cells(sub, ["org", *others]), key=lambda c: str(c[0])):
            pts = sorted((h, *centre_ci(g[metric])) for h, g in line.groupby("headroom"))
            h, m, lo, hi = (np.array(c, dtype=float) for c in zip(*pts, strict=True))
            label = _series_label(where) if others else where["org"].upper()
            rest = tuple(where[k] for k in others)
            ls = styles.setdefault(rest, LINESTYLES[len(styles) % len(LINESTYLES)])
            ax.errorbar(h, m, yerr=[lo, hi], marker="o", capsize=3, label=label,
                        color=org_color(where["org"]), ls=ls)
        ax.set_title(f"budget {budget}")
        ax.set_xlabel("admission headroom f (fraction of budget)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(_label(metric))
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"{_label(metric)} vs headroom (geometric mean, 95% log-t CI over seeds)")
    return fig


def ratio_figure(
    runs: pd.DataFrame, x: str, num_org: str = "d0", den_org: str = "s2",
    metric: str = "throughput_ledger_tok_s",
) -> Figure | None:
    """Paired ratio num_org/den_org vs ``x`` ("budget" or "rate") with t-CI
    error bars and a y = 1 line; a series per combination of the other
    varying design fields."""
    both = runs[runs["org"].isin([num_org, den_org])]
    if both.empty:
        return None
    keys = group_keys(both)
    others = [k for k in varying_keys(both, keys) if k != x]
    series: dict[tuple, list] = {}
    for where, grp in cells(both, keys):
        if set(grp["org"]) != {num_org, den_org}:
            continue
        c = Contrast(f"{num_org}/{den_org}", metric, {**where, "org": num_org}, {**where, "org": den_org})
        p = pair(grp, c)
        if stats.invalid_pairs(p["num"].to_dict(), p["den"].to_dict()):
            continue  # no ratio to draw; the contrast table names the seeds
        r = np.array(list(stats.paired_ratios(p["num"].to_dict(), p["den"].to_dict()).values()))
        lo, hi = stats.log_t_interval(r)
        m = stats.geometric_mean_ratio(r)
        err = (0.0, 0.0) if math.isnan(lo) else (m - lo, hi - m)
        series.setdefault(tuple(where[k] for k in others), []).append((where[x], m, err))
    xs = {pt[0] for pts in series.values() for pt in pts}
    if len(xs) < 2:
        return None
    categorical = x == "budget"
    order = sorted(xs, key=budget_order) if categorical else sorted(xs)
    fig = Figure(figsize=(5.6, 3.8), layout="constrained")
    ax = fig.subplots()
    # Dodge series sideways so identical ratios at one x stay visible.
    span = 1.0 if categorical else (max(order) - min(order))
    width = 0.04 * span
    for i, (key, pts) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        pts = sorted(pts, key=lambda p: order.index(p[0]))
        shift = (i - (len(series) - 1) / 2) * width
        pos = [(order.index(p[0]) if categorical else p[0]) + shift for p in pts]
        yerr = np.array([p[2] for p in pts]).T
        label = _series_label(dict(zip(others, key, strict=True))) or f"{num_org.upper()}/{den_org.upper()}"
        ax.errorbar(pos, [p[1] for p in pts], yerr=yerr, marker="o", capsize=4, label=label,
                    color=SERIES_COLORS[i % len(SERIES_COLORS)])
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    if categorical:
        ax.set_xticks(range(len(order)), [str(o) for o in order])
    ax.set_xlabel("budget (label)" if categorical else "arrival rate (req/s)")
    ax.set_ylabel(f"{num_org.upper()}/{den_org.upper()} ratio (unitless, 1 = parity)")
    ax.set_title(f"{num_org.upper()} vs {den_org.upper()}: {_label(metric)} by {x}\n"
                 "(geometric mean ratio, 95% CI)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def joint_depth_figure(runs: pd.DataFrame) -> Figure | None:
    """Per-org means over runs of J_adopt, R_max and attention depth; one bar
    per (budget, organization) where the runs have several budgets (budgets
    are never pooled: depth depends on how much a budget can keep)."""
    present = [(m, lab) for m, lab in DEPTH_METRICS if m in runs.columns and runs[m].notna().any()]
    if not present:
        return None
    budgets = (sorted(runs["budget"].dropna().unique(), key=budget_order)
               if "budget" in runs.columns else [])
    if len(budgets) > 1:
        arms = [(b, o) for b in budgets for o in sorted(runs.loc[runs["budget"] == b, "org"].unique())]
        labels = [f"{o.upper()}\n{b}" for b, o in arms]
        masks = [(runs["budget"] == b) & (runs["org"] == o) for b, o in arms]
        orgs = [o for _, o in arms]
    else:
        orgs = sorted(runs["org"].unique())
        labels = [o.upper() for o in orgs]
        masks = [runs["org"] == o for o in orgs]
    fig = Figure(figsize=(max(3.6, 0.9 * len(orgs) + 1.2) * len(present), 3.4), layout="constrained")
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    for ax, (m, lab) in zip(axes, present, strict=True):
        mc = [centre_ci(runs.loc[mask, m], m) for mask in masks]
        ax.bar(range(len(orgs)), [v[0] for v in mc], yerr=[[v[1] for v in mc], [v[2] for v in mc]],
               capsize=4, color=[org_color(o) for o in orgs])
        ax.set_xticks(range(len(orgs)), labels)
        ax.set_xlabel("organization, budget (label)" if len(budgets) > 1 else "organization")
        ax.set_title(lab)
        ax.set_ylabel("mean per request (tokens)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("joint depth by organization (mean over runs; 95% percentile bootstrap interval, "
                 "within the runs' own values)")
    return fig


def forest_figure(contrasts: pd.DataFrame | None) -> Figure | None:
    """Every contrast of a result set: geometric-mean effect (%) with its 95%
    CI and the seed count, filled red when significant and grey when not
    (`analysis.verdicts.status`, the table's own verdict). A contrast that
    is not tested (arms not valid, one seed, no ratio) is never drawn as an
    estimate: a hollow grey marker (where an effect was computed), no
    interval, and the words "not tested" with the reason. Several metrics
    get a panel each, with its own effect axis (a TTFT p99 effect of
    +2,000 % would flatten a throughput effect of -4 % to a dot)."""
    if contrasts is None or contrasts.empty or "effect_pct" not in contrasts.columns:
        return None
    rows = contrasts.to_dict("records")
    metrics = list(dict.fromkeys(str(r.get("metric") or "") for r in rows))
    groups = [[r for r in rows if str(r.get("metric") or "") == m] for m in metrics]
    fig = Figure(figsize=(8.5, 1.0 * len(groups) + 0.3 + 0.34 * len(rows)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [len(g) + 1.2 for g in groups]})[:, 0]
    for ax, metric, group in zip(axes, metrics, groups, strict=True):
        _forest_panel(ax, group)
        of = f" of {_label(metric)}" if metric else ""
        ax.set_xlabel(f"effect (%){of}: geometric mean of within-seed ratios, 95% t CI", fontsize=9)
        ax.set_ylabel("contrast (A/B, where)")
    axes[0].set_title("red *: significant (p Holm < alpha, CI excludes 0); grey: not significant; "
                      "hollow: not tested", fontsize=9)
    return fig


def _forest_panel(ax, rows: list[dict]) -> None:
    from analysis import verdicts as V

    ys = np.arange(len(rows))[::-1]
    for y, r in zip(ys, rows, strict=True):
        eff, lo, hi, state = r["effect_pct"], r["effect_ci_low"], r["effect_ci_high"], V.status(r)
        if state == V.NOT_TESTED:
            if not math.isnan(eff):
                ax.plot([eff], [y], "o", mfc="white", mec="0.6", mew=1.2)
            mark, colour = f"not tested: {V.untested_reason(r)}", "0.45"
        else:
            colour = "C3" if state == V.SIGNIFICANT else "0.45"
            if math.isnan(lo):
                ax.plot([eff], [y], "o", color=colour)
            else:
                ax.errorbar([eff], [y], xerr=[[eff - lo], [hi - eff]], fmt="o", color=colour, capsize=3)
            mark = f"n={r['n']}" + (" *" if state == V.SIGNIFICANT else "")
        ax.annotate(mark, xy=(1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8,
                    color=colour, style="italic" if state == V.NOT_TESTED else "normal")
    ax.axvline(0.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(ys, [V.title(r, with_metric=False) for r in rows], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), rows, strict=True):
        if V.status(r) == V.NOT_TESTED:
            tick.set_color("0.45")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="x", alpha=0.3)


def _cdf(ax, values: np.ndarray, label: str, color: str, style: str = "-"):
    v = np.sort(values[np.isfinite(values)])
    if v.size:
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, color=color,
                linestyle=style)


#: Line styles that tell budgets apart where one figure has several (colour is the organization's).
BUDGET_STYLES = ("-", "--", ":", "-.")


def latency_cdf_figure(requests_by_org: Mapping) -> Figure | None:
    """TTFT and ITL (per-request mean) CDFs, one line per organization; keys
    are organizations, or (organization, budget) pairs, in which case each
    budget is its own line (never pooled), in the organization's colour and
    the budget's line style."""
    if not requests_by_org:
        return None
    keyed = {(k, None) if isinstance(k, str) else tuple(k): v for k, v in requests_by_org.items()}
    budgets = sorted({b for _, b in keyed if b is not None}, key=budget_order)
    fig = Figure(figsize=(9.5, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, col, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "itl_mean_s", "ITL (per-request mean)")):
        allv = []
        for (org, budget), req in sorted(keyed.items(),
                                         key=lambda kv: (str(kv[0][0]), budget_order(kv[0][1] or ""))):
            v = pd.to_numeric(req[col], errors="coerce").to_numpy(dtype=float)
            label = org.upper() if len(budgets) < 2 else f"{org.upper()} @ {budget}"
            style = BUDGET_STYLES[budgets.index(budget) % len(BUDGET_STYLES)] if len(budgets) > 1 else "-"
            _cdf(ax, v, label, org_color(org), style)
            allv.append(v[np.isfinite(v)])
        v = np.concatenate(allv) if allv else np.array([])
        if v.size and v.min() > 0 and v.max() / v.min() > 50:
            ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel(f"{title.split()[0]} (s)")
        ax.set_ylabel("cumulative fraction of requests (0-1)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("latency CDFs by organization" + (" and budget" if len(budgets) > 1 else "")
                 + " (all requests of the runs)")
    return fig


def turn_figure(requests: Mapping[tuple[str, str], pd.DataFrame]) -> Figure | None:
    """Multi-turn runs: history reuse fraction and TTFT p50 by turn index, a
    column of panels per budget (budgets are never pooled) and one line per
    organization (`harness.per_request.turn_table` over its runs at that budget);
    TTFT on a log axis, since later turns can wait orders of magnitude longer.
    ``requests`` maps (org, budget) to the requests of those runs. None when
    no run has a turn index."""
    from harness.per_request import turn_table

    tables = {key: turn_table(req) for key, req in sorted(requests.items(), key=lambda kv: str(kv[0]))
              if "turn" in req.columns}
    tables = {key: t for key, t in tables.items() if not t.empty}
    if not tables:
        return None
    budgets = sorted({b for _, b in tables}, key=budget_order)
    fig = Figure(figsize=(4.4 * len(budgets) + 1.0, 6.2), layout="constrained")
    axes = fig.subplots(2, len(budgets), squeeze=False)
    for j, budget in enumerate(budgets):
        ax_reuse, ax_ttft = axes[0][j], axes[1][j]
        for (org, b), t in tables.items():
            if b != budget:
                continue
            later = t[t["turn"] >= 1]
            ax_reuse.plot(later["turn"], 100 * later["reuse_fraction"], marker="o", label=org.upper(),
                          color=org_color(org))
            ttft = 1e3 * t["ttft_p50_s"].where(t["ttft_p50_s"] > 0)
            ax_ttft.plot(t["turn"], ttft, marker="o", label=org.upper(), color=org_color(org))
        ax_reuse.set_title(f"budget {budget}: history served from cache", fontsize=9)
        ax_reuse.set_ylabel("reused / previous-turn tokens (%)")
        ax_reuse.set_ylim(0, 102)
        ax_ttft.set_title(f"budget {budget}: TTFT p50", fontsize=9)
        ax_ttft.set_ylabel("TTFT p50 (ms, log scale)")
        ax_ttft.set_yscale("log")
        # plain numbers (20, 50, 100 ms) on the log axis, not 2 x 10^1
        for axis_formatter in (ax_ttft.yaxis.set_major_formatter, ax_ttft.yaxis.set_minor_formatter):
            axis_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        for ax in (ax_reuse, ax_ttft):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("turn index (0 = first turn)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("multi-turn sessions by turn index (all runs per organization and budget)")
    return fig


def memory_figure(steps: pd.DataFrame, title: str) -> Figure | None:
    """Memory in use by state kind over one run (stacked area, GiB)."""
    kinds = [(c, lab) for c, lab in MEMORY_KINDS if c in steps.columns]
    if not kinds or steps.empty:
        return None
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.stackplot(steps["time_s"].to_numpy(dtype=float),
                 *[steps[c].to_numpy(dtype=float) / GIB for c, _ in kinds],
                 labels=[lab for _, lab in kinds], colors=[MEMORY_COLORS[c] for c, _ in kinds], alpha=0.85)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("memory in use (GiB)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return fig
