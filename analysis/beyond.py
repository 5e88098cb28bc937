"""The ``beyond`` design's own figures and findings tables (`analysis.designs._beyond`).

Organization x checkpoint policy at two budgets on two workloads: which
combination wins where, and whether the layout (the organization) or the
policy moves throughput and TTFT more. Pure functions of the run table and
the evaluated contrasts; `write_beyond` writes ``beyond.md`` and the figures.

* `combination_figure`: per workload x budget, each policy's arm mean of a
  metric for every organization (organization colours, `common.palette`),
  95% intervals over seeds (`analysis.figures.centre_ci`).
* `effects_figure`: every "which organization" and "which policy" contrast
  of throughput and TTFT p99 as effect % with its 95% CI, the two families
  side by side: the wider spread is the factor that moves the metric more.
* `best_combinations`: per workload x budget, the combination with the best
  arm mean (highest throughput, lowest TTFT p99) and the runner-up: a
  ranking of means that beyond.md says is not a test (only a significant
  contrast names a winner: `analysis.verdicts`).
* `factor_spread`: per workload x budget and metric, the largest absolute
  effect among the organization contrasts and among the policy contrasts,
  and how many of each are significant after Holm.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.designs import (
    BEYOND_BUDGETS,
    BEYOND_ORGS,
    BEYOND_POLICIES,
    BEYOND_WORKLOADS,
    THROUGHPUT,
    TOKEN_HIT_RATE,
)
from analysis.figures import _label, centre_ci, save
from analysis.report import markdown_table
from common.atomic import atomic_write_text
from common.palette import org_color

TTFT = "ttft_p99_s"
LOWER_IS_BETTER = {TTFT, "ttft_p50_s"}


def policy_of(row) -> str:
    """The `BEYOND_POLICIES` label of a run row ("" if none matches)."""
    for label, (publish, evict, alpha) in BEYOND_POLICIES.items():
        a = row["utility_alpha"]
        same_alpha = str(a) == str(alpha) if isinstance(alpha, str) else (
            not isinstance(a, str) and math.isclose(float(a), alpha))
        if row["ckpt_publish"] == publish and row["ckpt_evict"] == evict and same_alpha:
            return label
    return ""


def with_policy(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    runs["policy"] = [policy_of(r) for _, r in runs.iterrows()]
    return runs


def _values(runs, wl, b, pol, org, metric) -> np.ndarray:
    sel = runs[(runs["workload_kind"] == wl) & (runs["budget"] == b) & (runs["policy"] == pol)
               & (runs["org"] == org)]
    return pd.to_numeric(sel[metric], errors="coerce").dropna().to_numpy(dtype=float)


def arm_centre(values, metric: str) -> tuple[float, float, float]:
    """(centre, lower error, upper error) of an arm over seeds, as
    `analysis.figures.centre_ci` draws ``metric`` (a rate in [0, 1] such as
    the token hit rate: the mean with a percentile bootstrap interval within
    the seeds' values, so within [0, 1])."""
    return centre_ci(np.asarray(values, dtype=float), metric)


def combination_figure(runs: pd.DataFrame, metric: str) -> Figure | None:
    """Grouped bars: rows are workloads, columns budgets; in each panel the
    policies along x, one bar per organization (module docstring)."""
    runs = with_policy(runs)
    if metric not in runs.columns or runs.empty:
        return None
    wls, pols = list(BEYOND_WORKLOADS), list(BEYOND_POLICIES)
    fig = Figure(figsize=(13, 7.5))
    axes = fig.subplots(len(wls), len(BEYOND_BUDGETS), squeeze=False)
    width = 0.8 / len(BEYOND_ORGS)
    for i, wl in enumerate(wls):
        for j, b in enumerate(BEYOND_BUDGETS):
            ax = axes[i][j]
            for k, org in enumerate(BEYOND_ORGS):
                centres, lows, highs = [], [], []
                for pol in pols:
                    c, lo, hi = arm_centre(_values(runs, wl, b, pol, org, metric), metric)
                    centres.append(c)
                    lows.append(lo)
                    highs.append(hi)
                x = np.arange(len(pols)) + (k - (len(BEYOND_ORGS) - 1) / 2) * width
                ax.bar(x, centres, width, yerr=[lows, highs], capsize=2, color=org_color(org),
                       label=org.upper(), edgecolor="black", linewidth=0.4)
            ax.set_xticks(np.arange(len(pols)))
            ax.set_xticklabels(pols, fontsize=8)
            ax.set_title(f"{wl}, {b}", fontsize=10)
            ax.set_ylabel(_label(metric), fontsize=9)
            ax.set_xlabel("checkpoint policy (publish / evict)", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if metric in LOWER_IS_BETTER:     # latencies span orders of magnitude across cells
                ax.set_yscale("log")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="organization", loc="lower center", ncol=len(BEYOND_ORGS),
               fontsize=9, bbox_to_anchor=(0.5, -0.04))
    better = "lower is better" if metric in LOWER_IS_BETTER else "higher is better"
    how = ("mean over seeds, 95% percentile bootstrap interval within the seeds" if metric == TOKEN_HIT_RATE
           else "geometric mean over seeds, 95% CI")
    fig.suptitle(f"{_label(metric)} by organization and checkpoint policy "
                 f"({better}; bars: {how})", fontsize=11)
    fig.tight_layout()
    return fig


def effects_figure(contrasts: pd.DataFrame) -> Figure | None:
    """Effect % with 95% CI of every organization and policy contrast, per metric."""
    fams = (("which organization", "#4d4d4d"), ("which policy", "#b07aa1"))
    tags = ("throughput", "TTFT p99")
    if contrasts is None or contrasts.empty:
        return None
    fig = Figure(figsize=(12, 5))
    axes = fig.subplots(1, len(tags), squeeze=False)[0]
    for ax, tag in zip(axes, tags, strict=True):
        for y, (fam, color) in enumerate(fams):
            rows = contrasts[contrasts["family"] == f"{fam} ({tag})"].dropna(subset=["effect_pct"])
            if rows.empty:
                continue
            jitter = np.linspace(-0.3, 0.3, len(rows))
            for dy, (_, r) in zip(jitter, rows.iterrows(), strict=True):
                sig = bool(r["significant"])
                g = r["geo_mean_ratio"]
                ax.errorbar(g, y + dy, xerr=[[g - r["ci_low"]], [r["ci_high"] - g]],
                            fmt="o", ms=4, color=color,
                            mfc=color if sig else "white", elinewidth=0.8, alpha=0.9)
        ax.axvline(1, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yticks(range(len(fams)))
        ax.set_yticklabels([f"{f}\n(n={len(contrasts[contrasts['family'] == f'{f} ({tag})'])})"
                            for f, _ in fams])
        ax.set_xlabel(f"{tag} ratio to the reference arm\n(unitless, log scale; "
                      "geometric mean, 95% CI)")
        ax.set_title(f"{tag}: organization vs policy effects", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Which moves the metric more, the layout or the checkpoint policy? (filled: "
                 "significant after Holm; hollow: not, or arms not valid)", fontsize=11)
    fig.tight_layout()
    return fig


def best_combinations(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per workload x budget: the best and the runner-up (org, policy) by the
    arm mean of ``metric`` over seeds, with their 95% intervals."""
    runs = with_policy(runs)
    rows = []
    for wl in BEYOND_WORKLOADS:
        for b in BEYOND_BUDGETS:
            arms = []
            for org in BEYOND_ORGS:
                for pol in BEYOND_POLICIES:
                    v = _values(runs, wl, b, pol, org, metric)
                    if v.size:
                        c, lo, hi = arm_centre(v, metric)
                        arms.append((c, c - lo, c + hi, org, pol, v.size))
            if not arms:
                continue
            arms.sort(key=lambda a: a[0], reverse=metric not in LOWER_IS_BETTER)
            for rank, (c, lo, hi, org, pol, n) in enumerate(arms[:2], start=1):
                rows.append({"workload": wl, "budget": b, "rank": rank, "org": org, "policy": pol,
                             "value": c, "ci_low": lo, "ci_high": hi, "n": n})
    return pd.DataFrame(rows)


def factor_spread(contrasts: pd.DataFrame) -> pd.DataFrame:
    """Per workload x budget and metric: the largest |effect| among organization
    contrasts and among policy contrasts, and how many are significant."""
    rows = []
    for tag in ("throughput", "TTFT p99"):
        for wl in BEYOND_WORKLOADS:
            for b in BEYOND_BUDGETS:
                row = {"metric": tag, "workload": wl, "budget": b}
                for fam in ("which organization", "which policy"):
                    sel = contrasts[(contrasts["family"] == f"{fam} ({tag})")
                                    & contrasts["name"].str.endswith(f" {wl} {b}")]
                    eff = sel["effect_pct"].dropna()
                    key = "org" if fam == "which organization" else "policy"
                    if eff.empty:
                        row[f"{key}_max_abs_pct"], row[f"{key}_max_name"] = math.nan, ""
                    else:
                        i = eff.abs().idxmax()
                        row[f"{key}_max_abs_pct"] = float(eff.loc[i])
                        row[f"{key}_max_name"] = str(sel.loc[i, "name"])
                    row[f"{key}_significant"] = f"{int(sel['significant'].sum())}/{len(sel)}"
                rows.append(row)
    return pd.DataFrame(rows)


def _fmt(x: float, metric: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if metric == TOKEN_HIT_RATE:
        return f"{100 * x:.1f} %"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.2f}"


def _p(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _ci(r, metric) -> str:
    return f"[{_fmt(r['ci_low'], metric)}, {_fmt(r['ci_high'], metric)}]"


def write_beyond(root, runs: pd.DataFrame, contrasts: pd.DataFrame,
                 interactions: pd.DataFrame | None, figures: bool = True) -> list[Path]:
    """Write ``root/beyond.md`` (best combinations, factor spread, the
    interaction and cross-check families) and, if ``figures``, the design's
    figures under ``root/analysis/figures``; return the figure paths."""
    root = Path(root)
    figs: list[Path] = []
    out = root / "analysis" / "figures"
    drawn = (("beyond_throughput", lambda: combination_figure(runs, THROUGHPUT)),
             ("beyond_ttft_p99", lambda: combination_figure(runs, TTFT)),
             ("beyond_token_hit_rate", lambda: combination_figure(runs, TOKEN_HIT_RATE)),
             ("beyond_effects", lambda: effects_figure(contrasts)))
    for stem, draw in drawn if figures else ():
        fig = draw()
        if fig is not None:
            figs.extend(save(fig, out, stem))
    parts = ["# Beyond the study: organization x checkpoint policy", "",
             "Arm values are geometric means over seeds with 95% t intervals of the mean log "
             "(token hit rates: means with percentile bootstrap intervals within the seeds' values); effects are paired-seed "
             "geometric-mean ratios with the 95% t interval of the mean log ratio, Holm within "
             "each family (analysis/report.md has every contrast).", ""]
    for metric in (THROUGHPUT, TTFT, TOKEN_HIT_RATE):
        best = best_combinations(runs, metric)
        if best.empty:
            continue
        parts += [f"## Highest arm means by {_label(metric)}", "",
                  "A ranking of arm means, not a test: which of two arms is ahead is said only by the "
                  "contrasts below (significant after Holm, CI excluding 0).", ""]
        parts += [markdown_table(("workload", "budget", "rank by mean", "organization", "policy", "value",
                                  "95% CI", "seeds"),
                                 [[r["workload"], r["budget"], str(r["rank"]), r["org"].upper(),
                                   r["policy"], _fmt(r["value"], metric), _ci(r, metric), str(r["n"])]
                                  for _, r in best.iterrows()]), ""]
    spread = factor_spread(contrasts)
    parts += ["## Layout or policy: the largest effect in each family", ""]
    parts += [markdown_table(("metric", "workload", "budget", "largest org effect", "org contrast",
                              "org significant", "largest policy effect", "policy contrast",
                              "policy significant"),
                             [[r["metric"], r["workload"], r["budget"],
                               f"{r['org_max_abs_pct']:+.1f} %", r["org_max_name"], r["org_significant"],
                               f"{r['policy_max_abs_pct']:+.1f} %", r["policy_max_name"],
                               r["policy_significant"]] for _, r in spread.iterrows()]), ""]
    for fam, table in (("which organization (throughput)", contrasts),
                       ("which organization (TTFT p99)", contrasts),
                       ("Marconi cross-check (token hit rate)", contrasts),
                       ("policy x organization (throughput)", interactions)):
        if table is None or table.empty:
            continue
        sel = table[table["family"] == fam]
        unit = "pp" if "kind" in sel.columns else "%"
        eff = "effect" if unit == "pp" else "effect_pct"
        parts += [f"## {fam}", ""]
        parts += [markdown_table(("contrast", "effect", "95% CI", "p Holm", "verdict"),
                                 [[r["name"], f"{r[eff]:+.2f} {unit}",
                                   f"[{r['effect_ci_low']:+.2f}, {r['effect_ci_high']:+.2f}]",
                                   _p(r["p_holm"]), r["verdict"]] for _, r in sel.iterrows()]), ""]
    atomic_write_text(root / "beyond.md", "\n".join(parts) + "\n")
    return figs
