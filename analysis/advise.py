"""The answer of ``hbench advise``: which arm sustains the most load within an
SLO, by how much, and what limits it. Pure functions over a capacity grid.

An **arm** is an organization with its settings (running cap, D0's split):
one row of `arm_table`, its capacity the mean over seeds of the per-seed
capacities (`analysis.capacity.seed_capacity`) with its bootstrap interval.
The **best** arm has the highest mean capacity; the **runner-up** is the
best arm of another organization, and the margin between them is the
seed-paired capacity difference with its t interval and paired t test
(`analysis.capacity.paired_difference`); it counts only by the one rule of
every table (`analysis.stats.is_significant`).

**What limits** an arm is read where it stopped: for each seed, the run at
the first grid rate above its capacity. Which SLO term failed there, and,
for a TTFT term, which cause the run's TTFT attribution
(`harness.attribution`, ``ttft_<band>_<cause>_s``) gives most of that
percentile to: waiting for the running cap, for memory (pages, or recompute
after a preemption), for the step's token budget, or the prefill itself
(compute). The seeds vote; a latency that is not valid (the queue grew)
counts as the term failing. An arm whose SLO held at the top of the grid has
no limit inside the grid.

**At one rate** (``hbench advise --at-rate``: the user's traffic) the arms
are compared where they run, as the study compares organizations at a
working point (`decide_point`): on throughput where some run's queue grew
(then throughput is the service rate each sustains), otherwise on the SLO's
first latency term (in a steady state throughput only echoes the offered
load), by the seed-paired ratio with its log-t interval
(`analysis.stats.summarize_ratios`). Arms that hold the SLO at every seed
rank first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import stats
from analysis.capacity import (
    Limit,
    capacity_table,
    paired_difference,
    per_seed_capacity,
    seed_capacity,
)

#: Columns that name an arm in a cell table, beside ``arm`` (its label).
ARM_COLUMNS = ("arm", "org", "cap", "d0_attn_fraction", "headroom", "ckpt")
#: The throughput compared at one rate (the study's ledger timebase).
POINT_METRIC = "throughput_ledger_tok_s"
#: The checkpoint policy every run has unless one is searched.
DEFAULT_CKPT = "every/lru"
#: TTFT attribution cause -> the limit it names.
CAUSE_LIMIT = {"wait_cap": "cap", "wait_memory": "memory", "recompute": "memory",
               "wait_budget": "token budget", "prefill": "compute"}
#: What each limit is, in the answer's words.
LIMIT_WORDS = {
    "cap": "the running cap: requests waited for a running slot, not for memory",
    "memory": "state memory: requests waited for pages (or were recomputed after a preemption)",
    "token budget": "the step's token budget: admitted requests waited for prefill tokens",
    "compute": "compute: the steps themselves are too slow for the SLO",
    "grid": "nothing inside the rate grid: the SLO held at its top rate",
    "held": "nothing at this rate: the SLO held at every seed",
}


@dataclass(frozen=True)
class LimitFound:
    """What stopped an arm: ``kind`` (a key of `LIMIT_WORDS`), the SLO terms
    that failed, the seeds' votes and the TTFT parts behind the answer."""

    kind: str
    failed_terms: tuple[str, ...] = ()
    votes: Mapping[str, int] = field(default_factory=dict)
    parts_s: Mapping[str, float] = field(default_factory=dict)
    rate: float | None = None

    @property
    def words(self) -> str:
        return LIMIT_WORDS[self.kind]


@dataclass(frozen=True)
class Decision:
    """The best arm, the runner-up of another organization, and the margin."""

    best: dict
    runner_up: dict | None
    diff: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    p: float = math.nan
    significant: bool = False
    at_top: bool = False        # the best arm held the SLO at the top rate of the grid

    @property
    def level(self) -> bool:
        """Best and runner-up have the same capacity at every seed."""
        return self.runner_up is not None and self.diff == 0 and self.ci_low == self.ci_high == 0


#: Organizations a released engine serves as they are (S0: stock vLLM; D0 and
#: U0: SGLang's pools), first among arms of equal capacity.
SHIPPED = ("s0", "d0", "u0")


def arm_table(cells: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """One row per arm, best first (among equal capacities, an organization a
    released engine serves first, `SHIPPED`): its columns (`ARM_COLUMNS`),
    capacity mean, bootstrap interval and per-seed capacities."""
    keys = [c for c in ARM_COLUMNS if c in cells.columns]
    table = capacity_table(cells, alpha, keys=keys)
    table["_shipped"] = [0 if o in SHIPPED else 1 for o in table["org"]]
    table = table.sort_values(["capacity_req_s", "_shipped"], ascending=[False, True],
                              kind="stable")
    return table.drop(columns="_shipped").reset_index(drop=True)


def decide(cells: pd.DataFrame, table: pd.DataFrame, alpha: float = 0.05) -> Decision:
    """The best arm of ``table`` (`arm_table`), the best arm of another
    organization, and their seed-paired capacity difference."""
    best = table.iloc[0].to_dict()
    top_rate = float(cells["rate"].max())
    others = table[table["org"] != best["org"]]
    at_top = best["capacity_req_s"] >= top_rate
    if others.empty:
        return Decision(best, None, at_top=at_top)
    runner = others.iloc[0].to_dict()
    a = per_seed_capacity(cells[cells["arm"] == best["arm"]])
    b = per_seed_capacity(cells[cells["arm"] == runner["arm"]])
    diff, lo, hi, p = paired_difference(a, b, 1 - alpha)
    if np.allclose([a[s] - b[s] for s in sorted(set(a) & set(b))], 0.0):
        lo = hi = 0.0
    significant = bool(math.isfinite(p) and stats.is_significant(p, (lo, hi), 0.0, alpha))
    return Decision(best, runner, diff, lo, hi, p, significant, at_top)


def failing_runs(cells: pd.DataFrame, arm: str) -> list[tuple[int, float, str]]:
    """(seed, rate, run directory) of each seed's run at the first grid rate
    above the arm's capacity (none for a seed that held the top rate)."""
    g = cells[cells["arm"] == arm]
    out = []
    for seed, s in g.groupby("seed"):
        _, nxt = seed_capacity(dict(zip(s["rate"], s["meets"], strict=True)))
        if nxt is not None:
            row = s[s["rate"] == nxt].iloc[0]
            out.append((int(seed), float(nxt), str(row["run_dir"])))
    return out


def _band(limit: Limit) -> str:
    return "p50" if limit.quantile == "p50" else "p99"


def limit_of_run(summary: Mapping, limits: Sequence[Limit]) -> tuple[str, tuple[str, ...], dict]:
    """(limit kind, failed SLO terms, TTFT parts) of one run past capacity."""
    from harness.validity import metric_is_valid

    failed = tuple(str(lim) for lim in limits
                   if not metric_is_valid(summary, lim.key)
                   or not (summary.get(lim.key) is not None
                           and float(summary[lim.key]) <= lim.seconds))
    ttft = [lim for lim in limits if lim.metric == "ttft" and str(lim) in failed]
    if not ttft:
        return ("compute" if failed else "grid"), failed, {}
    band = _band(ttft[0])
    parts = {cause: float(summary.get(f"ttft_{band}_{cause}_s") or 0.0) for cause in CAUSE_LIMIT}
    parts = {k: v for k, v in parts.items() if math.isfinite(v)}
    if not parts or max(parts.values()) <= 0:
        return "compute", failed, parts
    by_kind = Counter()
    for cause, seconds in parts.items():
        by_kind[CAUSE_LIMIT[cause]] += seconds
    return by_kind.most_common(1)[0][0], failed, parts


def limit_found(cells: pd.DataFrame, arm: str, limits: Sequence[Limit],
                summary_of: Callable[[str], Mapping]) -> LimitFound:
    """What limits ``arm`` (module docstring); ``summary_of(run directory)``
    reads a run's ``summary.json``."""
    runs = failing_runs(cells, arm)
    if not runs:
        return LimitFound("grid")
    votes, terms, parts = Counter(), Counter(), Counter()
    for _, _, run_dir in runs:
        kind, failed, p = limit_of_run(summary_of(run_dir), limits)
        votes[kind] += 1
        terms.update(failed)
        parts.update(p)
    kind = votes.most_common(1)[0][0]
    n = len(runs)
    return LimitFound(kind, tuple(t for t, _ in terms.most_common()), dict(votes),
                      {k: v / n for k, v in parts.items()}, min(r for _, r, _ in runs))


def capacity_words(row: Mapping, top_rate: float, unit: str = "req/s") -> str:
    """``2.50 req/s [2.00, 3.00]``, with "at least" at the top of the grid."""
    at_least = "at least " if row["capacity_req_s"] >= top_rate else ""
    if row["ci_low"] == row["ci_high"]:
        return f"{at_least}{row['capacity_req_s']:.2f} {unit} (every seed)"
    return (f"{at_least}{row['capacity_req_s']:.2f} {unit} "
            f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]")


def margin_words(d: Decision, alpha: float, unit: str = "req/s") -> str:
    """The best arm against the runner-up, in one clause."""
    if d.runner_up is None:
        return "it is the only organization searched"
    other = d.runner_up["arm"]
    if d.level:
        return f"{other} sustains exactly the same at every seed: the organizations do not differ here"
    if not math.isfinite(d.p):
        return f"ahead of {other} by {d.diff:+.2f} {unit} (one seed: no test)"
    if d.ci_low == d.ci_high:
        return (f"ahead of {other} by {d.diff:+.2f} {unit} at every seed (no spread across the "
                "seeds, so no interval)")
    verdict = (f"significant (paired t p {d.p:.3g} < {alpha:g})" if d.significant
               else "not significant at these seeds")
    return (f"ahead of {other} by {d.diff:+.2f} {unit} [{d.ci_low:+.2f}, {d.ci_high:+.2f}], "
            f"{verdict}")


def runs_at_capacity(cells: pd.DataFrame, arm: str) -> list[str]:
    """Run directories of ``arm`` at each seed's own capacity rate."""
    g = cells[cells["arm"] == arm]
    out = []
    for seed, cap in per_seed_capacity(g).items():
        at = g[(g["seed"] == seed) & (g["rate"] == cap)]
        out.extend(str(d) for d in at["run_dir"])
    return out


def state_peak_bytes(summary: Mapping, weights_bytes: float) -> float:
    """Peak state bytes of a run: its peak total (state at its largest moment,
    plus the weights) less the weights. The per-kind peaks are reached at
    different moments, so their sum would overstate it."""
    total = summary.get("peak_mem_total_bytes")
    if total is None or not math.isfinite(float(total)):
        return math.nan
    return float(total) - float(weights_bytes)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _arm_words(row: Mapping) -> str:
    split = row.get("d0_attn_fraction")
    split = "" if _missing(split) else f", {split:g} of the bytes to attention"
    headroom = row.get("headroom")
    headroom = "" if _missing(headroom) or float(headroom) == 0 else \
        f", admission headroom {float(headroom):g}"
    ckpt = row.get("ckpt")
    ckpt = "" if _missing(ckpt) or ckpt == DEFAULT_CKPT else f", checkpoints {ckpt}"
    return f"{str(row['org']).upper()} with a running cap of {int(row['cap'])}{split}{headroom}{ckpt}"


def _limit_clause(limit: LimitFound, unit: str) -> str:
    where = f" at {limit.rate:g} {unit}" if limit.rate is not None else ""
    failed = f" ({', '.join(limit.failed_terms)} missed)" if limit.failed_terms else ""
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in
                      sorted(limit.parts_s.items(), key=lambda kv: -kv[1]) if v > 0)
    return (f"what limits it{where}{failed}: {limit.words}"
            + (f" (TTFT parts: {parts})" if parts else ""))


def _limit_and_peak(limit: LimitFound, unit: str, peak: tuple[float, float] | None, where: str,
                    held: str) -> list[str]:
    """What limits the best arm (``held`` when nothing did) and its runs'
    peak state at ``where``, as sentences."""
    if limit.kind in ("grid", "held"):
        out = [held]
    else:
        clause = _limit_clause(limit, unit)
        out = [clause[0].upper() + clause[1:] + "."]
    if peak is not None and peak[1] > 0:
        out.append(f"At {where} the runs' peak state was {peak[0] / 1e9:.1f} GB of the "
                   f"{peak[1] / 1e9:.1f} GB given ({peak[0] / peak[1]:.0%}).")
    return out


def all_level(table: pd.DataFrame) -> bool:
    """Every arm of ``table`` has the same capacity at every seed."""
    return len(table) > 1 and table["per_seed"].nunique() == 1


def smaller_words(smaller: Mapping, alpha: float, unit: str = "req/s") -> str:
    """What would change a level answer: the same arms on less memory
    (`hbench.advise._budget_probe`), in one sentence."""
    label, share = smaller["budget"], smaller["share"]
    where = f"with {label} for state ({share:g} of it)"
    if "refused" in smaller:
        return (f"Less memory would not change that: {where} the workload cannot be served "
                f"({smaller['refused']}).")
    d = smaller["decision"]
    if smaller["level"] and d.best["capacity_req_s"] >= smaller["top_rate"]:
        return (f"What would change that is beyond the rate grid: {where} every organization "
                f"still holds the SLO at its top rate ({smaller['top_rate']:g} {unit}); pass "
                "higher --rates to compare them.")
    if smaller["level"]:
        return (f"What would change that: not less memory either; {where} every organization "
                f"still sustains {capacity_words(d.best, smaller['top_rate'], unit)}, level at "
                "every seed, so for this model and traffic the layout does not decide.")
    top = smaller["top_rate"]
    table = smaller["table"]
    leaders = table[table["per_seed"] == d.best["per_seed"]]
    if leaders["org"].nunique() < 2:
        return (f"What would change that: less memory; {where} {_arm_words(d.best)} leads, "
                f"sustaining {capacity_words(d.best, top, unit)}, {margin_words(d, alpha, unit)}.")
    names = ", ".join(dict.fromkeys(str(o).upper() for o in leaders["org"]))
    behind = "; ".join(f"{str(r['org']).upper()} {capacity_words(r, top, unit)}"
                       for r in table[table["per_seed"] != d.best["per_seed"]].to_dict("records"))
    return (f"What would change that: less memory; {where} {names} still sustain "
            f"{capacity_words(d.best, top, unit)}, level at every seed, while "
            f"{behind} falls behind.")


def sentences(d: Decision, limit: LimitFound, *, slo: str, top_rate: float, alpha: float,
              setting: str, unit: str = "req/s", first: tuple | None = None,
              peak: tuple[float, float] | None = None, grid: str = "",
              level: bool = False) -> list[str]:
    """The answer, a few sentences: what to use, how much it sustains and by
    what margin, what limits it and what would change that. ``first``: the
    (table, decision, limit) at the first cap when the cap limited it and a
    larger cap was tried; ``level``: every arm at the best arm's cap has its
    capacity at every seed (then the best is the first a released engine
    serves)."""
    out = []
    if first is not None:
        t0, d0, l0 = first
        who = ("every organization searched sustains" if all_level(t0)
               else f"the best, {_arm_words(d0.best)}, sustains")
        out.append(f"{setting}: with a running cap of {int(d0.best['cap'])}, {who} "
                   f"{capacity_words(d0.best, top_rate, unit)}, and {_limit_clause(l0, unit)}."
                   + (" At this budget the organization does not matter; the cap does."
                      if all_level(t0) else ""))
        lead = f"With the cap raised to {int(d.best['cap'])}, use"
    else:
        lead = f"{setting}: use"
    best = d.best
    if level:
        shipped = ", which a released engine serves" if best["org"] in SHIPPED else ""
        out.append(f"{lead} {_arm_words(best)}{shipped}: every organization tried at this cap "
                   f"sustains {capacity_words(best, top_rate, unit)} within {slo}, level at "
                   "every seed.")
    else:
        out.append(f"{lead} {_arm_words(best)}. It sustains {capacity_words(best, top_rate, unit)}"
                   f" within {slo}; {margin_words(d, alpha, unit)}.")
    out += _limit_and_peak(limit, unit, peak, "its capacity", held=(
        f"Every capacity reached the top of the rate grid ({top_rate:g} {unit}): no limit was "
        "found inside it; pass higher --rates to find where it stops."))
    if limit.kind == "cap":
        out.append("Raise the running cap (vLLM --max-num-seqs, SGLang --max-running-requests) "
                   "to let memory decide.")
    elif limit.kind == "memory" and d.runner_up is not None:
        out.append("More state memory, or an organization that packs state tighter, moves "
                   "this limit.")
    if grid:
        out.append(grid)
    return out


# ---- at one rate -------------------------------------------------------------


@dataclass(frozen=True)
class PointDecision:
    """The best arm at one rate, the runner-up of another organization, and
    the seed-paired ratio best / runner-up of ``metric`` (percent)."""

    best: dict
    runner_up: dict | None
    metric: str
    higher_is_better: bool
    effect_pct: float = math.nan
    ci_low_pct: float = math.nan
    ci_high_pct: float = math.nan
    p: float = math.nan
    significant: bool = False
    n: int = 0

    @property
    def level(self) -> bool:
        return self.runner_up is not None and self.effect_pct == 0 \
            and self.ci_low_pct == self.ci_high_pct == 0


def point_metric(cells: pd.DataFrame, limits: Sequence[Limit]) -> tuple[str, bool]:
    """(metric, higher is better) the arms are compared on at one rate:
    throughput where some run's queue grew (its latency is not valid),
    otherwise the SLO's first latency term."""
    if "valid" in cells.columns and not cells["valid"].astype(bool).all():
        return POINT_METRIC, True
    return limits[0].key, False


def point_table(cells: pd.DataFrame, metric: str, higher_is_better: bool) -> pd.DataFrame:
    """One row per arm at one rate: its columns (`ARM_COLUMNS`), the mean of
    ``metric`` and of throughput over seeds, and the seeds holding the SLO;
    best first (every seed holding the SLO, then ``metric``, then an
    organization a released engine serves)."""
    keys = [c for c in ARM_COLUMNS if c in cells.columns]
    rows = []
    for arm, g in cells.groupby(keys, sort=False, dropna=False):
        rows.append({**dict(zip(keys, arm, strict=True)), "rate": float(g["rate"].iloc[0]),
                     "metric": metric, "value": float(g[metric].astype(float).mean()),
                     "throughput": float(g[POINT_METRIC].astype(float).mean()),
                     "seeds_held": int(g["meets"].sum()), "seeds": int(len(g))})
    table = pd.DataFrame(rows)
    table["_all"] = table["seeds_held"] < table["seeds"]
    table["_value"] = -table["value"] if higher_is_better else table["value"]
    table["_shipped"] = [0 if o in SHIPPED else 1 for o in table["org"]]
    table = table.sort_values(["_all", "_value", "_shipped"], kind="stable")
    return table.drop(columns=["_all", "_value", "_shipped"]).reset_index(drop=True)


def decide_point(cells: pd.DataFrame, table: pd.DataFrame, higher_is_better: bool,
                 alpha: float = 0.05) -> PointDecision:
    """The best arm of ``table`` (`point_table`) against the best arm of
    another organization: per seed best / runner-up of the table's metric,
    summarized as the study's contrasts are (`analysis.stats.summarize_ratios`:
    geometric mean ratio, log-t interval, t test on the log ratios)."""
    best = table.iloc[0].to_dict()
    metric = best["metric"]
    higher = higher_is_better
    others = table[table["org"] != best["org"]]
    if others.empty:
        return PointDecision(best, None, metric, higher)
    runner = others.iloc[0].to_dict()

    def per_seed(label):
        g = cells[cells["arm"] == label]
        return dict(zip(g["seed"].astype(int), g[metric].astype(float), strict=True))

    ratios = stats.paired_ratios(per_seed(best["arm"]), per_seed(runner["arm"]))
    if not ratios:
        return PointDecision(best, runner, metric, higher)
    r = np.array(list(ratios.values()), dtype=float)
    if np.allclose(r, 1.0):
        return PointDecision(best, runner, metric, higher, 0.0, 0.0, 0.0, math.nan, False, len(r))
    summary = stats.summarize_ratios(r, alpha)
    lo, hi = summary.ci
    significant = bool(math.isfinite(summary.p)
                       and stats.is_significant(summary.p, summary.ci, 1.0, alpha))
    return PointDecision(best, runner, metric, higher, summary.effect_pct,
                         stats.effect_pct(lo), stats.effect_pct(hi), summary.p, significant, len(r))


def limit_at_point(cells: pd.DataFrame, arm: str, limits: Sequence[Limit],
                   summary_of: Callable[[str], Mapping]) -> LimitFound:
    """What limits ``arm`` at its one rate: the seeds that missed the SLO
    vote as in `limit_found`; none missing it is ``held``."""
    g = cells[(cells["arm"] == arm) & ~cells["meets"].astype(bool)]
    if g.empty:
        return LimitFound("held", rate=float(cells["rate"].iloc[0]))
    votes, terms, parts = Counter(), Counter(), Counter()
    for run_dir in g["run_dir"]:
        kind, failed, p = limit_of_run(summary_of(str(run_dir)), limits)
        votes[kind] += 1
        terms.update(failed)
        parts.update(p)
    n = len(g)
    return LimitFound(votes.most_common(1)[0][0], tuple(t for t, _ in terms.most_common()),
                      dict(votes), {k: v / n for k, v in parts.items()}, float(g["rate"].iloc[0]))


METRIC_WORDS = {POINT_METRIC: "throughput (output tokens/s, ledger timebase)"}


def metric_words(metric: str) -> str:
    """A compared metric's key in words: ``ttft_p99_s`` -> ``TTFT p99``."""
    if metric in METRIC_WORDS:
        return METRIC_WORDS[metric]
    name, _, quantile = metric.removesuffix("_s").rpartition("_")
    return f"{name.upper()} {quantile}"


def metric_axis(metric: str) -> str:
    """`metric_words` with the unit an axis needs (latencies are in seconds)."""
    return metric_words(metric) + ("" if metric in METRIC_WORDS else " (s)")


def point_margin_words(d: PointDecision, alpha: float) -> str:
    """The best arm against the runner-up at one rate, in one clause."""
    if d.runner_up is None:
        return "it is the only organization searched"
    other = d.runner_up["arm"]
    what = metric_words(d.metric)
    if d.level:
        return f"{other} serves exactly the same {what} at every seed: the organizations do not differ here"
    if d.n < 2 or not math.isfinite(d.p):
        return f"{d.effect_pct:+.2f}% {what} against {other} ({d.n} seed: no test)"
    verdict = (f"significant (t test on log ratios p {d.p:.3g} < {alpha:g})" if d.significant
               else "not significant at these seeds")
    return (f"{d.effect_pct:+.2f}% {what} against {other} "
            f"[{d.ci_low_pct:+.2f}%, {d.ci_high_pct:+.2f}%] over {d.n} paired seeds, {verdict}")


def point_sentences(d: PointDecision, limit: LimitFound, *, slo: str, rate: float, alpha: float,
                    setting: str, unit: str = "req/s", peak: tuple[float, float] | None = None,
                    grid: str = "") -> list[str]:
    """The answer at one rate, a few sentences: what to use there, by what
    margin on which metric (and why that metric), whether the SLO held and
    what limits it."""
    best = d.best
    why = ("some run's queue grew at this rate, so each arm's throughput is the rate it "
           "sustains" if d.higher_is_better
           else "every run kept up with the offered load, so throughput only echoes it and "
                "latency is the difference")
    held = f"{best['seeds_held']} of {best['seeds']} seeds held {slo}"
    out = [f"{setting} at {rate:g} {unit}: use {_arm_words(best)}. "
           f"It serves {best['throughput']:.1f} output tok/s"
           + ("" if d.higher_is_better else f" with {metric_words(d.metric)} "
                                            f"{best['value']:.3g} s")
           + f" ({held}); {point_margin_words(d, alpha)}.",
           f"Compared on {metric_words(d.metric)}: {why}."]
    out += _limit_and_peak(limit, unit, peak, "this rate",
                           held=f"The SLO held at {rate:g} {unit} at every seed.")
    if grid:
        out.append(grid)
    return out
