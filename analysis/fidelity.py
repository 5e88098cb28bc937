"""The fidelity ledger: a real engine's runs next to the simulator's, cell by cell.

``hbench fidelity`` serves the same workloads on a real engine and on the
simulator (with a measured cost profile) and leaves both runs in one results
tree. This module pairs them by (organization, budget, seed) and, per cell
and per metric, puts real, simulated and their agreement side by side:

* rate-like metrics (throughput, latency percentiles, reused tokens, mean
  J_adopt, peak memory by kind): the ratio simulated / real; the error is
  ``|ratio - 1|``;
* small counters (preemptions, median waiting and running requests): the
  difference simulated - real; the error is its absolute value.

Each metric has a stated band (`METRICS`): a cell is *within* when its error
is at most the band. The summary gives, per metric, the median error over
cells and the cells outside the band.

Peak memory of an engine that keeps state in a wider dtype than the one the
organization accounts (the torch engine on CPU computes in float32, twice the
bf16 bytes: ``engine_info.byte_scale``) is divided by that scale before the
comparison: the simulator and the organization count accounted bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from common.errors import HbenchError
from harness.results import Run, iter_runs


@dataclass(frozen=True)
class Metric:
    name: str          # a summary.json key
    compare: str       # "ratio" | "diff"
    band: float        # |ratio - 1| or |diff| a cell may be off and still be within
    family: str        # throughput | latency | scheduling | served state | memory


#: Every metric the ledger holds, with its band. Time-based bands are wider
#: for the tails (p99 of a few dozen requests is one or two requests).
METRICS = (
    Metric("throughput_ledger_tok_s", "ratio", 0.25, "throughput"),
    Metric("throughput_span_tok_s", "ratio", 0.25, "throughput"),
    Metric("ttft_p50_s", "ratio", 0.25, "latency"),
    Metric("ttft_p99_s", "ratio", 0.5, "latency"),
    Metric("itl_p50_s", "ratio", 0.25, "latency"),
    Metric("itl_p99_s", "ratio", 0.5, "latency"),
    # per-request mean time per output token: a client sees tokens in bursts when a
    # server's API process falls behind (single gaps ~0); a request's mean is immune
    Metric("tpot_p50_s", "ratio", 0.25, "latency"),
    Metric("waiting_median", "diff", 2.0, "scheduling"),
    Metric("running_median", "diff", 2.0, "scheduling"),
    Metric("preemptions", "diff", 2.0, "scheduling"),
    Metric("reused_tokens", "ratio", 0.1, "served state"),
    Metric("j_adopt_mean", "ratio", 0.1, "served state"),
    Metric("peak_mem_attention_bytes", "ratio", 0.1, "memory"),
    Metric("peak_mem_ssm_bytes", "ratio", 0.1, "memory"),
    Metric("peak_mem_conv_bytes", "ratio", 0.1, "memory"),
)
CELL_KEYS = ("org", "budget", "seed")
LEDGER_COLUMNS = (*CELL_KEYS, "metric", "family", "compare", "real", "sim", "ratio", "diff",
                  "error", "band", "within")


#: Engines whose memory hbench sees by state kind (it places the pages, or
#: reads vLLM's block tables in process); a served engine reports one pool
#: (`adapters.served_engine`), so its per-kind peaks are not observed and its
#: memory cells stay empty.
KIND_MEMORY_ENGINES = ("sim", "torch")


def observes_memory_by_kind(run: Run) -> bool:
    return (run.engine in KIND_MEMORY_ENGINES
            or run.manifest.get("engine_info", {}).get("mode") == "in-process")


def _value(run: Run, metric: str) -> float:
    """The run's value of ``metric``; NaN where the engine does not observe it."""
    v = run.summary.get(metric)
    if v is None or not isinstance(v, (int, float)) or isinstance(v, bool):
        return math.nan
    if metric.startswith("peak_mem_"):
        if not observes_memory_by_kind(run):
            return math.nan
        v = v / float(run.manifest.get("engine_info", {}).get("byte_scale") or 1.0)
    return float(v)


def _agreement(m: Metric, real: float, sim: float) -> tuple[float, float, float]:
    """(ratio, diff, error) of one metric in one cell; NaN where undefined."""
    diff = sim - real
    if real == 0 and sim == 0:
        ratio = 1.0
    elif real == 0:
        ratio = math.inf
    else:
        ratio = sim / real
    error = abs(diff) if m.compare == "diff" else abs(ratio - 1.0)
    if math.isnan(real) or math.isnan(sim):
        return math.nan, math.nan, math.nan
    return ratio, diff, error


def cell_of(run: Run) -> tuple:
    c = run.config
    return (c.get("org"), run.manifest.get("budget", {}).get("label") or c.get("budget"),
            c.get("seed"))


def pair_runs(runs: Iterable[Run], real_engine: str) -> list[tuple[tuple, Run, Run]]:
    """(cell, real run, simulated run) for every cell that has both. A cell
    run twice by one engine is an error: which one would the ledger mean?"""
    real, sim = {}, {}
    for run in runs:
        side = sim if run.engine == "sim" else real if run.engine == real_engine else None
        if side is None:
            continue
        key = cell_of(run)
        if key in side:
            raise HbenchError(f"two {run.engine} runs for cell {key}: {side[key].path} and "
                              f"{run.path}; keep one")
        side[key] = run
    for key, run in real.items():
        other = sim.get(key)
        if other is not None and other.workload_hash != run.workload_hash:
            raise HbenchError(f"cell {key}: the real and simulated runs served different "
                              f"workloads ({run.path}, {other.path})")
    return [(k, real[k], sim[k]) for k in sorted(real, key=str) if k in sim]


def ledger(pairs: list[tuple[tuple, Run, Run]]) -> pd.DataFrame:
    """One row per cell and metric (`LEDGER_COLUMNS`)."""
    rows = []
    for key, real, sim in pairs:
        for m in METRICS:
            r, s = _value(real, m.name), _value(sim, m.name)
            ratio, diff, error = _agreement(m, r, s)
            rows.append({**dict(zip(CELL_KEYS, key, strict=True)), "metric": m.name,
                         "family": m.family, "compare": m.compare, "real": r, "sim": s,
                         "ratio": ratio, "diff": diff, "error": error, "band": m.band,
                         # None: not observed on this engine (no verdict either way)
                         "within": None if math.isnan(error) else bool(error <= m.band)})
    return pd.DataFrame(rows, columns=list(LEDGER_COLUMNS))


def summarize(table: pd.DataFrame) -> list[dict]:
    """Per metric, over the cells where both engines observe it: median error,
    cells within the band and the cells outside it."""
    out = []
    for m in METRICS:
        rows = table[(table["metric"] == m.name) & table["within"].notna()]
        finite = rows["error"].replace([math.inf], math.nan).dropna()
        outside = rows[rows["within"] == False]  # noqa: E712 (a column of True/False/None)
        out.append({
            "metric": m.name, "family": m.family, "compare": m.compare, "band": m.band,
            "cells": int(len(rows)),          # cells where both engines observe the metric
            "median_abs_error": float(finite.median()) if len(finite) else None,
            "within": int((rows["within"] == True).sum()),  # noqa: E712
            "outside": [dict(zip(CELL_KEYS, (r.org, r.budget, int(r.seed)), strict=True))
                        for r in outside.itertuples()],
        })
    return out


def read_ledger(root: Path, real_engine: str) -> pd.DataFrame:
    pairs = pair_runs(iter_runs(root), real_engine)
    if not pairs:
        raise HbenchError(f"no cell under {root} has both a {real_engine} run and a simulated run")
    return ledger(pairs)


def fidelity_figure(table: pd.DataFrame):
    """Simulated against real, one panel per metric, one point per cell, the identity line."""
    from matplotlib.figure import Figure

    from common.palette import org_color

    metrics = [m for m in METRICS if m.name in set(table["metric"])]
    cols = 4
    rows = -(-len(metrics) // cols)
    fig = Figure(figsize=(3.2 * cols, 3.0 * rows), layout="constrained")
    orgs = sorted(table["org"].unique())
    markers = dict(zip(orgs, "osD^v<>", strict=False))
    for i, m in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        sub = table[table["metric"] == m.name]
        if sub["real"].isna().all():     # the real engine does not observe it
            ax.set_title(m.name, fontsize=9)
            ax.text(0.5, 0.5, "not observed\nby the real engine", ha="center", va="center",
                    fontsize=9, color="0.4", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        for org in orgs:
            pts = sub[sub["org"] == org]
            ax.scatter(pts["real"], pts["sim"], marker=markers[org], label=org, s=22, alpha=0.8,
                       color=org_color(org))
        vals = pd.concat([sub["real"], sub["sim"]]).replace([math.inf], math.nan).dropna()
        lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (0.0, 1.0)
        if hi == lo:
            lo, hi = lo - 1, hi + 1
        pad = 0.05 * (hi - lo)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.5", lw=0.8, ls="--")
        if m.compare == "ratio":
            ax.fill_between([lo - pad, hi + pad], [(1 - m.band) * (lo - pad), (1 - m.band) * (hi + pad)],
                            [(1 + m.band) * (lo - pad), (1 + m.band) * (hi + pad)],
                            color="0.85", alpha=0.5, lw=0)
        else:
            ax.fill_between([lo - pad, hi + pad], [lo - pad - m.band, hi + pad - m.band],
                            [lo - pad + m.band, hi + pad + m.band], color="0.85", alpha=0.5, lw=0)
        ax.set_title(m.name, fontsize=9)
        ax.set_xlabel("real", fontsize=8)
        ax.set_ylabel("simulated", fontsize=8)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.legend(fontsize=7)
    return fig
