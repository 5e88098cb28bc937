"""Capacity at an SLO: pure functions over a rate grid of paired-seed runs.

An **SLO** is a conjunction of run-level limits such as
``ttft_p99<=2s,tpot_p99<=100ms`` (metrics ttft, tpot, itl, e2e at p50, p90
or p99; units s or ms). A run **meets** it when every limited summary metric
is at or under its limit and no request failed.

**Goodput** (DistServe): requests per second that meet the SLO: the
delivered arrival rate times the fraction of measured requests whose own
TTFT, TPOT, end-to-end time and ITL p99 are under the limit of the same
metric family (a failed request meets nothing). It equals the delivered rate
when every request meets the SLO, and does not depend on how long the last
requests take to drain.

**Capacity** of an arm (organization x budget) for one seed: the largest
grid rate r such that the SLO holds at r and at every lower grid rate; the
next grid step above it fails (or r is the top of the grid). The arm's
capacity is the mean over seeds with a percentile bootstrap interval of that
mean: it lies between the lowest and highest seed's capacity by construction,
so it never leaves the grid (a t interval on three seeds can reach below
0 req/s). Organizations are compared on goodput seed by seed
(`goodput_comparisons`: the paired difference, its t interval and t test,
Holm over every comparison of the grid) and a difference counts only by the
rule every table of a report uses (`analysis.stats.is_significant`: Holm p
< alpha and the interval excludes 0; `analysis.verdicts`). The **winner
map** names, at each (budget, rate), the organization with the best mean
goodput when its difference to the runner-up is significant, and ``tie``
otherwise: equal means (an SLO nobody meets gives every organization
goodput 0) and differences the seeds cannot tell apart are ties, never a win
decided by the organizations' names. The **crossover** rate of two
organizations at one budget is the lowest grid rate from which the first's
goodput is significantly above the second's at every higher grid rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import stats
from common.errors import HbenchError
from common.numbers import parse_float

_SLO_TERM = re.compile(r"^\s*(ttft|tpot|itl|e2e)_(p50|p90|p99)\s*<=\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(ms|s)\s*$",
                       re.ASCII)
#: Longest latency limit an SLO may name (one day): a larger one is a typo,
#: and 1e400s would read as infinity.
MAX_SLO_SECONDS = 86_400.0
#: The winner map's word for a cell no organization wins.
TIE = "tie"
# per-request column that stands for each metric family in goodput
REQUEST_COLUMN = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_p99_s", "e2e": "e2e_s"}


@dataclass(frozen=True)
class Limit:
    metric: str        # ttft, tpot, itl, e2e
    quantile: str      # p50, p90, p99
    seconds: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.quantile}_s"

    def __str__(self) -> str:
        v = self.seconds
        return f"{self.metric}_{self.quantile}<=" + (f"{v * 1e3:g}ms" if v < 1 else f"{v:g}s")


def parse_slo(text: str) -> tuple[Limit, ...]:
    """``ttft_p99<=2s,tpot_p99<=100ms`` -> limits; HbenchError on anything else."""
    limits = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        m = _SLO_TERM.match(term)
        if not m:
            raise HbenchError(f"cannot read SLO term {term!r}; expected e.g. ttft_p99<=2s or tpot_p99<=100ms")
        number = parse_float(m.group(3), f"SLO limit in {term!r}")
        value = number * (1e-3 if m.group(4) == "ms" else 1.0)
        if value <= 0:
            raise HbenchError(f"SLO limit must be a finite number > 0 in {term!r}")
        if value > MAX_SLO_SECONDS:
            raise HbenchError(f"SLO limit in {term!r} is over one day ({MAX_SLO_SECONDS:g} s); "
                              "give a latency in s or ms")
        limits.append(Limit(m.group(1), m.group(2), value))
    if not limits:
        raise HbenchError("--slo names no limit")
    if len({(x.metric, x.quantile) for x in limits}) < len(limits):
        raise HbenchError(f"--slo limits a metric twice: {text!r}")
    return tuple(limits)


def meets_slo(summary: Mapping, limits: Sequence[Limit]) -> bool:
    """Every limited metric at or under its limit, and no failed request."""
    if summary.get("failed", 0) or not summary.get("finished", 0):
        return False
    for lim in limits:
        v = summary.get(lim.key)
        if v is None or (isinstance(v, float) and math.isnan(v)) or v > lim.seconds:
            return False
    return True


def goodput(requests: pd.DataFrame, limits: Sequence[Limit]) -> float:
    """Measured requests per second whose own latencies meet the SLO (delivered
    rate x the fraction that meets it); NaN for fewer than two arrivals."""
    m = requests[~requests["warmup"].astype(bool)]
    if len(m) < 2:
        return math.nan
    ok = m["status"] == "finished"
    for lim in limits:
        col = m[REQUEST_COLUMN[lim.metric]]
        ok &= col.isna() | (col <= lim.seconds) if lim.metric in ("tpot", "itl") else col <= lim.seconds
    span = m["arrival_s"].max() - m["arrival_s"].min()
    return float(ok.sum() / len(m) * (len(m) - 1) / span) if span > 0 else math.nan


def seed_capacity(rates_ok: Mapping[float, bool]) -> tuple[float, float | None]:
    """(capacity, next rate) for one seed: the largest rate with every rate up to
    it meeting the SLO (0.0 if the lowest fails), and the grid rate above it
    (None at the top)."""
    rates = sorted(rates_ok)
    cap, nxt = 0.0, rates[0] if rates else None
    for i, r in enumerate(rates):
        if not rates_ok[r]:
            nxt = r
            break
        cap = r
        nxt = rates[i + 1] if i + 1 < len(rates) else None
    return cap, nxt


def per_seed_capacity(g: pd.DataFrame) -> dict[int, float]:
    """Seed -> its capacity (`seed_capacity`) over one arm's cells."""
    return {int(seed): seed_capacity(dict(zip(s["rate"], s["meets"], strict=True)))[0]
            for seed, s in g.groupby("seed")}


def capacity_table(cells: pd.DataFrame, alpha: float = 0.05,
                   keys: Sequence[str] = ("org", "budget")) -> pd.DataFrame:
    """One row per arm (``keys``: org and budget unless another column names
    the arm) from ``cells`` (columns ``keys``, rate, seed, meets): per-seed
    capacities, their mean and its percentile bootstrap interval (within the
    per-seed range; the mean itself for one seed or no spread)."""
    rows = []
    for arm, g in cells.groupby(list(keys), sort=False, dropna=False):
        per_seed = per_seed_capacity(g)
        caps = np.array(list(per_seed.values()), dtype=float)
        lo, hi = (stats.bootstrap_interval(caps, stats.bootstrap_rng(), level=1 - alpha)
                  if caps.size >= 2 and np.ptp(caps) > 0 else (caps.mean(),) * 2)
        rows.append({**dict(zip(keys, arm, strict=True)), "capacity_req_s": float(caps.mean()),
                     "ci_low": float(lo), "ci_high": float(hi),
                     "per_seed": ", ".join(f"{s}: {c:g}" for s, c in sorted(per_seed.items()))})
    return pd.DataFrame(rows)


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float) -> tuple:
    """(mean of a - b over the seeds both ran, interval low, high, paired t p)."""
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, math.nan, math.nan
    lo, hi = stats.t_interval(d, level)
    return float(d.mean()), lo, hi, stats.ttest_zero(d)


def goodput_comparisons(cells: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """One row per (budget, rate) and pair of organizations: ``a`` has the
    higher mean goodput (the first by name when the means are equal), ``b``
    the other; ``diff`` is the mean over seeds of the seed-paired goodput
    difference a - b (req/s) with its t interval at level 1 - alpha
    (``ci_low``, ``ci_high``) and paired t test ``p``. All comparisons of the
    grid form one Holm family (``p_holm``), and ``significant`` is the one
    rule of every table (`analysis.stats.is_significant`: p Holm < alpha
    and the interval excludes 0)."""
    rows = []
    for (budget, rate), g in cells.groupby(["budget", "rate"], sort=False):
        by_org = {org: dict(zip(s["seed"].astype(int), s["goodput"], strict=True))
                  for org, s in g.groupby("org", sort=True)}
        means = {org: float(np.mean(list(v.values()))) for org, v in by_org.items()}
        orgs = sorted(by_org, key=lambda o: -means[o])     # stable: equal means keep name order
        for i, a in enumerate(orgs):
            for b in orgs[i + 1:]:
                diff, lo, hi, p = paired_difference(by_org[a], by_org[b], 1 - alpha)
                rows.append({"budget": budget, "rate": float(rate), "a": a, "b": b,
                             "mean_a": means[a], "mean_b": means[b], "diff": diff,
                             "ci_low": lo, "ci_high": hi, "p": p})
    cols = ["budget", "rate", "a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p"]
    df = pd.DataFrame(rows, columns=cols)
    df["p_holm"] = stats.holm(df["p"].to_numpy(dtype=float)) if len(df) else []
    df["significant"] = [bool(stats.is_significant(r.p_holm, (r.ci_low, r.ci_high), 0.0, alpha))
                         for r in df.itertuples()]
    return df


def winner_map(cells: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """One row per (budget, rate): ``leader`` and ``runner_up`` (best and second
    mean goodput; ``leader`` None when the two means are equal), their
    comparison's raw ``p``, ``p_holm``, interval and ``significant``
    (`goodput_comparisons`: the one rule, Holm over the whole grid), and
    ``winner``: the leader when significant, else ``"tie"``. Organizations
    are ordered by mean goodput alone, never by name."""
    comp = goodput_comparisons(cells, alpha)
    rows = []
    for (budget, rate), g in cells.groupby(["budget", "rate"], sort=False):
        means = sorted(((float(s["goodput"].mean()), org) for org, s in g.groupby("org", sort=True)),
                       key=lambda m: m[0], reverse=True)
        best, second = means[0][1], (means[1][1] if len(means) > 1 else None)
        equal = second is not None and means[0][0] == means[1][0]
        row = {"budget": budget, "rate": float(rate), "leader": None if equal else best,
               "runner_up": second, "goodput": means[0][0], "p": math.nan, "p_holm": math.nan,
               "ci_low": math.nan, "ci_high": math.nan, "significant": False}
        if second is not None:
            c = comp[(comp["budget"] == budget) & (comp["rate"] == float(rate))
                     & (comp["a"].isin([best, second])) & (comp["b"].isin([best, second]))].iloc[0]
            row.update(p=float(c["p"]), p_holm=float(c["p_holm"]), ci_low=float(c["ci_low"]),
                       ci_high=float(c["ci_high"]), significant=bool(c["significant"]) and not equal)
        row["winner"] = best if row["significant"] else TIE
        rows.append(row)
    return pd.DataFrame(rows)


def crossovers(cells: pd.DataFrame, alpha: float = 0.05) -> list[dict]:
    """For each budget and each ordered pair of organizations (a, b): the lowest
    grid rate from which a's goodput is significantly above b's
    (`goodput_comparisons`, the one rule) at that and every higher grid rate,
    when a is not already significantly ahead at the lowest rate (otherwise
    no crossover). ``p_holm`` is the largest Holm p of those rates."""
    comp = goodput_comparisons(cells, alpha)
    out = []
    for budget in cells["budget"].unique():
        orgs = sorted(cells.loc[cells["budget"] == budget, "org"].unique())
        rates = sorted(cells.loc[cells["budget"] == budget, "rate"].unique())
        at = comp[comp["budget"] == budget]
        for a in orgs:
            for b in orgs:
                if a == b:
                    continue
                won = {float(r.rate): float(r.p_holm) for r in at.itertuples()
                       if r.a == a and r.b == b and r.significant}
                ahead = [float(r) in won for r in rates]
                if ahead[0] or not ahead[-1]:
                    continue
                k = len(ahead)
                while k > 0 and ahead[k - 1]:
                    k -= 1
                out.append({"budget": budget, "org": a, "beats": b, "from_rate": float(rates[k]),
                            "p_holm": max(won[float(r)] for r in rates[k:])})
    return out


def invalid_at_capacity(cells: pd.DataFrame) -> list[str]:
    """``org@budget seed s rate r`` for each seed's run at its found capacity
    whose validity verdict failed (``cells``: one row per run with org,
    budget, seed, rate, meets and valid)."""
    out = []
    for (org, budget, seed), g in cells.groupby(["org", "budget", "seed"], sort=False):
        cap, _ = seed_capacity(dict(zip(g["rate"], g["meets"], strict=True)))
        at = g[g["rate"] == cap]
        if not at.empty and not bool(at["valid"].iloc[0]):
            out.append(f"{org}@{budget} seed {seed} rate {cap:g}")
    return out
