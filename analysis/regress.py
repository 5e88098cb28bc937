"""Performance regression check between two results roots (baseline vs candidate).

Cells are matched on everything that defines the measurement: the run
configuration (the config keys both roots record, minus the connection and
diagnostic fields in `VOLATILE_KEYS`), which includes the seed, plus the
``workload_hash``. A candidate cell whose config matches but whose request
stream differs is not compared (it is listed as unmatched with the reason).

Per metric, within-cell ratios ``candidate / baseline`` are tested with the
paired t test on log ratios; p values are Holm-adjusted across the metrics.
A metric regresses when it moved in its bad direction by at least
``min_effect`` (a fraction: 0.02 = 2%) AND p_holm < alpha. With a single
matched cell there is no spread to test; the engines we gate on are
deterministic (same inputs, same outputs), so the relative change itself
decides: a change of at least ``min_effect`` in the bad direction regresses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import stats
from analysis.contrasts import VOLATILE_KEYS, norm_value
from analysis.load import config_keys
from analysis.report import fmt_p, fmt_pct, markdown_table
from harness.errors import HbenchError

# metric -> the direction that is better
METRICS: dict[str, str] = {
    "throughput_ledger_tok_s": "higher",
    "ttft_p99_s": "lower",
    "itl_p99_s": "lower",
    "e2e_p99_s": "lower",
    "peak_mem_total_bytes": "lower",
}


@dataclass(frozen=True)
class MetricVerdict:
    """The outcome for one metric across all matched cells."""

    metric: str
    better: str               # "higher" or "lower"
    n: int                    # matched cells with the metric on both sides
    mean_ratio: float         # mean over cells of candidate / baseline
    ci: tuple[float, float]   # t CI of the mean ratio (NaN when n < 2)
    p: float                  # t test on log ratios (NaN when n < 2)
    p_holm: float
    regression: bool
    reason: str

    @property
    def bad_change(self) -> float:
        """Relative change in the bad direction (positive = worse)."""
        return 1.0 - self.mean_ratio if self.better == "higher" else self.mean_ratio - 1.0


@dataclass(frozen=True)
class RegressResult:
    verdicts: tuple[MetricVerdict, ...]
    cells: int
    unmatched: tuple[str, ...]
    min_effect: float
    alpha: float

    @property
    def regressed(self) -> bool:
        return any(v.regression for v in self.verdicts)


def _keys(baseline: pd.DataFrame, candidate: pd.DataFrame) -> list[str]:
    cand = set(config_keys(candidate))
    return [k for k in config_keys(baseline) if k in cand and k not in VOLATILE_KEYS]


def _index(runs: pd.DataFrame, keys: list[str], side: str) -> dict[tuple, pd.Series]:
    out = {}
    for _, row in runs.iterrows():
        key = tuple(norm_value(row[k]) for k in keys)
        if key in out:
            raise HbenchError(f"{side}: runs {out[key]['run_id']} and {row['run_id']} have the same configuration and seed")
        out[key] = row
    return out


def match_cells(baseline: pd.DataFrame, candidate: pd.DataFrame) -> tuple[list[tuple[pd.Series, pd.Series]], list[str]]:
    """(baseline row, candidate row) pairs with equal config and workload hash,
    and a note for every run left unmatched."""
    keys = _keys(baseline, candidate)
    if "seed" not in keys:
        raise HbenchError("runs carry no seed in their configuration; cannot match cells")
    base, cand = _index(baseline, keys, "baseline"), _index(candidate, keys, "candidate")
    pairs, notes = [], []
    for key, c in cand.items():
        b = base.get(key)
        if b is None:
            notes.append(f"candidate {c['run_id']}: no baseline run with the same configuration")
        elif b["workload_hash"] != c["workload_hash"]:
            notes.append(f"candidate {c['run_id']}: workload hash {c['workload_hash']} differs from "
                         f"baseline {b['run_id']} ({b['workload_hash']}); not compared")
        else:
            pairs.append((b, c))
    notes += [f"baseline {b['run_id']}: no candidate run with the same configuration"
              for key, b in base.items() if key not in cand]
    return pairs, notes


def compare(baseline: pd.DataFrame, candidate: pd.DataFrame, metrics: dict[str, str] | None = None,
            min_effect: float = 0.02, alpha: float = 0.05) -> RegressResult:
    """Test every metric over the matched cells; raise `HbenchError` if none match."""
    if min_effect < 0 or not 0 < alpha < 1:
        raise HbenchError("--min-effect must be >= 0 and --alpha in (0, 1)")
    metrics = METRICS if metrics is None else metrics
    pairs, notes = match_cells(baseline, candidate)
    if not pairs:
        detail = f" ({notes[0]})" if notes else ""
        raise HbenchError(f"no matching cells between baseline and candidate{detail}")
    partial = []
    for m, better in metrics.items():
        if better not in ("higher", "lower"):
            raise HbenchError(f"metric {m}: direction must be 'higher' or 'lower'")
        ratios = []
        for b, c in pairs:
            bv, cv = pd.to_numeric(b.get(m), errors="coerce"), pd.to_numeric(c.get(m), errors="coerce")
            if not (np.isfinite(bv) and np.isfinite(cv)):
                continue
            if bv == 0:
                # 0 -> 0 is no change; 0 -> x cannot form a ratio and is skipped.
                if cv == 0:
                    ratios.append(1.0)
                continue
            ratios.append(float(cv) / float(bv))
        partial.append((m, better, np.array(ratios)))
    p_raw = [stats.ttest_log_ratios(r) if r.size >= 2 and (r > 0).all() else math.nan for _, _, r in partial]
    p_holm = stats.holm(p_raw)
    verdicts = []
    for (m, better, r), p, ph in zip(partial, p_raw, p_holm, strict=True):
        n = int(r.size)
        mean = stats.mean_ratio(r) if n else math.nan
        bad = (1.0 - mean) if better == "higher" else (mean - 1.0)
        big = not math.isnan(bad) and bad >= min_effect
        if n == 0:
            reg, why = False, "not measured in the matched cells"
        elif n == 1:
            reg = big
            why = "single cell, deterministic change" + (f" >= {min_effect:.1%} in the bad direction" if big else f" below {min_effect:.1%}")
        else:
            reg = big and not math.isnan(ph) and ph < alpha
            if reg:
                why = f"worse by >= {min_effect:.1%} and p Holm < {alpha}"
            elif big:
                why = f"worse by >= {min_effect:.1%} but p Holm >= {alpha}"
            else:
                why = f"not worse by {min_effect:.1%} or more"
        verdicts.append(MetricVerdict(m, better, n, mean, stats.t_interval(r), p, ph, reg, why))
    return RegressResult(tuple(verdicts), len(pairs), tuple(notes), min_effect, alpha)


def markdown(result: RegressResult, baseline, candidate) -> str:
    """A report suitable for a CI comment."""
    head = "REGRESSION" if result.regressed else "no regression"
    rows = []
    for v in result.verdicts:
        ci = "n/a" if math.isnan(v.ci[0]) else f"[{fmt_pct(v.ci[0])}, {fmt_pct(v.ci[1])}]"
        rows.append([v.metric, f"{v.better} is better", str(v.n), fmt_pct(v.mean_ratio), ci, fmt_p(v.p),
                     fmt_p(v.p_holm), "**REGRESSION**" if v.regression else "ok", v.reason])
    lines = [
        f"## hbench regress: {head}", "",
        f"Baseline `{baseline}` vs candidate `{candidate}`: {result.cells} matched cells "
        f"(same configuration, seed and workload hash). Change = mean over cells of candidate/baseline - 1; "
        f"p = t test on log ratios, Holm across metrics; a regression needs a change of at least "
        f"{result.min_effect:.1%} in the bad direction and p Holm < {result.alpha} "
        "(one cell: the deterministic change alone).", "",
        markdown_table(["metric", "direction", "cells", "change", "95% CI", "p", "p Holm", "verdict", "why"], rows),
        "",
    ]
    if result.unmatched:
        lines += [f"<details><summary>{len(result.unmatched)} unmatched runs</summary>", ""]
        lines += [f"- {n}" for n in result.unmatched] + ["", "</details>", ""]
    return "\n".join(lines)
