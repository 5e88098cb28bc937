"""Which figures a result set gets, in the order a report shows them, and
writing them as files.

`figure_set` draws every figure the data support (`analysis.figures`) with
its file stem and caption; ``analyze`` and ``reproduce`` save them
(`render_figures`) and the HTML report inlines the same list, so a report
shows every figure its command wrote. The memory timeline is per run: it
shows the run with the highest peak of memory in use, and says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis.figures import (
    GIB,
    MEMORY_KINDS,
    _label,
    forest_figure,
    headroom_figure,
    joint_depth_figure,
    latency_cdf_figure,
    memory_figure,
    ratio_figure,
    save,
    turn_figure,
)
from common.errors import HbenchError
from harness.results import read_run


def _requests_by(runs: pd.DataFrame, keys: Sequence[str]) -> dict:
    """The requests of every run that has them, concatenated per value of ``keys``."""
    out: dict = {}
    for _, r in runs.iterrows():
        run = read_run(r["path"])
        if run.has_table("requests"):
            key = tuple(r[k] for k in keys)
            out.setdefault(key[0] if len(keys) == 1 else key, []).append(run.table("requests"))
    return {k: pd.concat(frames, ignore_index=True) for k, frames in out.items()}


def peak_memory_run(runs: pd.DataFrame):
    """(row, steps table) of the run with the highest peak of memory in use
    (attention + SSM + conv over its steps; ties broken by run id), or None
    when no run has a step table: the memory timeline shows the run that
    came closest to its budget."""
    best = None
    for _, r in runs.sort_values("run_id").iterrows():
        run = read_run(r["path"])
        if not run.has_table("steps"):
            continue
        steps = run.table("steps")
        cols = [c for c, _ in MEMORY_KINDS if c in steps.columns]
        peak = float(steps[cols].sum(axis=1).max()) if cols and not steps.empty else -1.0
        if best is None or peak > best[0]:
            best = (peak, r, steps)
    return None if best is None else (best[1], best[2])


def memory_title(row, peak_gib: float) -> str:
    return (f"memory by state kind: {str(row['org']).upper()} @ {row['budget']}, rate {row['rate']:g} "
            f"req/s, seed {row['seed']}\n(the run with the highest peak in use, {peak_gib:.2f} GiB)")


def figure_set(runs: pd.DataFrame, metrics: Sequence[str] = ("throughput_ledger_tok_s",),
               contrasts: pd.DataFrame | None = None) -> list[tuple[str, str, Figure | None]]:
    """Every figure the data support as (file stem, caption, figure or None),
    in the order a report shows them: the answers first (contrasts, ratios,
    headroom), then the mechanisms (memory, depth, latency, turns). A ratio
    figure whose runs cannot be paired (several runs for one seed) is None
    with a caption that says why."""
    figs: list[tuple[str, str, Figure | None]] = [
        ("contrasts_forest", "Every contrast: effect with its 95% CI; red: significant (Holm p < alpha, CI excluding 0); "
                             "grey: not significant; hollow, no interval: not tested, with why.",
         forest_figure(contrasts))]
    for m in metrics:
        for x in ("budget", "rate"):
            caption = f"D0/S2 ratio of {_label(m)} by {x}."
            try:
                fig = ratio_figure(runs, x, metric=m)
            except HbenchError as e:   # runs that cannot be paired: the report says why
                fig, caption = None, f"The D0/S2 ratio by {x} is not drawn: {e}"
            figs.append((f"d0_s2_ratio_vs_{x}_{m}", caption, fig))
        figs.append((f"headroom_{m}", f"{_label(m)} against admission headroom, per budget.",
                     headroom_figure(runs, m)))
    chosen = peak_memory_run(runs)
    if chosen is not None:
        row, steps = chosen
        cols = [c for c, _ in MEMORY_KINDS if c in steps.columns]
        peak = float(steps[cols].sum(axis=1).max()) / GIB if cols and not steps.empty else 0.0
        figs.append(("memory_" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(row["run_id"])),
                     f"Memory in use over time of run {row['run_id']}, chosen as the run with the "
                     f"highest peak in use ({peak:.2f} GiB).",
                     memory_figure(steps, memory_title(row, peak))))
    figs.append(("joint_depth", "Joint depth per organization (and budget).",
                 joint_depth_figure(runs)))
    figs.append(("latency_cdf", "TTFT and ITL distributions per organization (and budget).",
                 latency_cdf_figure(_requests_by(runs, ["org", "budget"]))))
    figs.append(("multiturn_by_turn", "Multi-turn sessions by turn index, per budget.",
                 turn_figure(_requests_by(runs, ["org", "budget"]))))
    return figs


def render_figures(
    runs: pd.DataFrame, out_dir, metrics: Sequence[str] = ("throughput_ledger_tok_s",),
    contrasts: pd.DataFrame | None = None,
) -> list[Path]:
    """Draw every figure the data support under ``out_dir`` (the forest plot
    of ``contrasts`` when given); return the paths."""
    paths: list[Path] = []
    for stem, _, fig in figure_set(runs, metrics, contrasts):
        if fig is not None:
            paths.extend(save(fig, out_dir, stem))
    return paths
