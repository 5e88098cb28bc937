"""Performance regression check: a candidate results root against a baseline.

Cells are matched by configuration (every `RunConfig` field both sides
record but `VOLATILE_KEYS`), and matched runs must be pairable
(`harness.results.check_pairable`; the engine version may differ, since a
candidate build is the point). A deterministic engine (the simulator) is
judged cell by cell, so a change confined to one organization is caught
however many cells agree; a noisy one (a real server) per seed group, with
Holm across groups x metrics, as `analyze` decides. Every metric with a
direction is gated by its rule (`analysis.gated_metrics`). A baseline value
that cannot be a bar (missing, null, zero for a relative metric) is bad
input, never a pass; bad input in some cells does not hide the regressions
the others show. The rules in full: docs/statistics.md, "hbench regress".
The report is rendered by `analysis.regress_report`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from analysis import stats
from analysis.gated_metrics import GATES, Gate
from analysis.run_validity import keeps
from common.errors import HbenchError
from harness.config import RunConfig
from harness.results import Run, check_pairable, iter_runs
from harness.validity import describe_validity, metric_is_valid, run_is_valid

DETERMINISTIC_ENGINES = ("sim",)
# Config fields that say how a run was connected or checked, not what was measured.
VOLATILE_KEYS = ("endpoint", "launch", "server_cmd", "debug_invariants")
# Always named in a cell's label, whether or not they vary.
LABEL_KEYS = ("org", "budget", "seed")
CONFIG_KEYS = tuple(f.name for f in fields(RunConfig) if f.name not in VOLATILE_KEYS)


def number(value) -> float | None:
    """A summary value as a finite float, or None (null, NaN, infinity, a
    string, a bool, a list ...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def bad_change(change: float, better: str) -> float:
    """A relative change (candidate / baseline - 1) turned so positive = worse."""
    return -change if better == "higher" else change


# --------------------------------------------------------------------- input

@dataclass(frozen=True)
class Side:
    """One results root, read strictly: every run directory must be readable."""

    root: Path
    runs: tuple[Run, ...]

    @classmethod
    def read(cls, root, name: str) -> Side:
        root = Path(root)
        try:
            runs = tuple(iter_runs(root, strict=True))
        except HbenchError as exc:
            raise HbenchError(f"{name}: {exc}") from None
        if not runs:
            raise HbenchError(f"{name}: no run directories under {root}")
        return cls(root, runs)

    def values(self, attr: str) -> list[str]:
        return sorted({str(getattr(r, attr)) for r in self.runs})


def match_keys(base: Side, cand: Side) -> tuple[str, ...]:
    """The configuration fields cells are matched on: `RunConfig`'s fields
    (less `VOLATILE_KEYS`) that both sides record, so a field added to the
    configuration after the baseline was written does not unmatch every cell
    (the workload hash still guards the request stream)."""
    recorded = [{k for r in side.runs for k in r.config} for side in (base, cand)]
    return tuple(k for k in CONFIG_KEYS if k in recorded[0] and k in recorded[1])


def _key(run: Run, keys: Sequence[str]) -> tuple:
    return tuple(run.config.get(k) for k in keys)


def _index(side: Side, name: str, keys: Sequence[str]) -> dict[tuple, Run]:
    out: dict[tuple, Run] = {}
    for run in side.runs:
        key = _key(run, keys)
        if key in out:
            raise HbenchError(f"{name}: runs {out[key].path} and {run.path} have the same "
                              "configuration and seed; keep one run per cell")
        out[key] = run
    return out


def _label_keys(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    varying = [k for k in keys if len({repr(r.config.get(k)) for r in runs}) > 1]
    return [k for k in keys if k in LABEL_KEYS or k in varying]


def _order(where: Mapping) -> list:
    """Sort key of a cell label: numbers numerically, budgets like b63 < b108."""
    out = []
    for v in where.values():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((0, float(v), ""))
        elif isinstance(v, str) and v[:1] == "b" and v[1:].isdigit():
            out.append((0, float(v[1:]), v))
        else:
            out.append((1, 0.0, str(v)))
    return out


# ------------------------------------------------------------------- verdicts

@dataclass(frozen=True)
class Finding:
    """One gated metric of one cell (deterministic) or one seed group (noisy).

    ``baseline`` / ``candidate`` are the cell's values (a group: arithmetic
    means over its valid seeds; the candidate is None when it is not a
    number). ``change`` is candidate / baseline - 1 (a group: the geometric
    mean of the per-seed ratios - 1) and ``ci`` its 95% CI on the ratio scale
    (groups only).
    """

    where: Mapping
    metric: str
    better: str
    baseline: float
    candidate: float | None
    change: float
    regression: bool
    reason: str
    n: int = 1
    ci: stats.Interval = stats.NAN_INTERVAL
    p: float = math.nan
    p_holm: float = math.nan

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.where.items())


@dataclass(frozen=True)
class RegressResult:
    deterministic: bool
    engine: str
    findings: tuple[Finding, ...]
    cells: int
    missing: tuple[Mapping, ...]        # baseline cells absent from the candidate
    unmatched: tuple[str, ...]          # candidate runs without a baseline cell
    allow_missing: bool
    min_effect: float
    alpha: float
    sides: Mapping = field(default_factory=dict)   # name -> {"root", "runs", "engine_version", "git_commit"}
    invalid: tuple[str, ...] = ()       # "side run: NOT VALID: ..." for compared runs whose verdict failed
    baseline_gaps: tuple[str, ...] = ()  # baseline values that cannot be gated (allowed by allow_missing)
    include_invalid: bool = False        # runs not valid kept in the paired tests

    @property
    def regressions(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.regression)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions) or (bool(self.missing) and not self.allow_missing)


def usable(value, gate: Gate) -> float | None:
    """``value`` as a number a gate can measure against or judge (above 0 for
    a ``relative`` metric, at least 0 for a ``count``), else None."""
    v = number(value)
    if v is None or v < 0 or (v == 0 and gate.rule == "relative"):
        return None
    return v


def _invalid(where, metric, gate: Gate, b, raw) -> Finding:
    what = "a positive number" if gate.rule == "relative" else "a number of at least 0"
    return Finding(where, metric, gate.better, b, None, math.nan, True,
                   f"candidate value {raw!r} is not {what} (baseline {b:.6g})")


def _cell_finding(where, metric, gate: Gate, b: float, raw, min_effect: float) -> Finding:
    """The deterministic verdict of one metric of one cell by its gate's rule
    (`analysis.gated_metrics.RULES`; ``b`` is `usable`: see `baseline_gap`)."""
    c = usable(raw, gate)
    if c is None:
        return _invalid(where, metric, gate, b, raw)
    if b > 0:
        change = c / b - 1.0
        worse = bad_change(change, gate.better)
        why = f"worse by {worse:.2%} (tolerance {min_effect:.2%})"
    else:   # a count from 0: judged in units of the metric
        worse = bad_change(c, gate.better)
        change = math.inf if c > 0 else 0.0
        why = f"worse by {worse:.6g} from 0 (tolerance {min_effect:.6g} of one unit)"
    if worse > min_effect:
        return Finding(where, metric, gate.better, b, c, change, True, why)
    return Finding(where, metric, gate.better, b, c, change, False, "within tolerance")


_ABSENT = object()


def baseline_gap(b_run: Run, c_run: Run, metric: str) -> str | None:
    """Why ``b_run``'s value of ``metric`` cannot be gated on (missing, null,
    not a number, negative, or zero for a ``relative`` metric), or None when
    it can, or when neither side reports the metric (null or absent on both)."""
    gate = GATES[metric]
    raw = b_run.summary.get(metric, _ABSENT)
    if usable(raw, gate) is not None:
        return None
    if (raw is None or raw is _ABSENT) and c_run.summary.get(metric) is None:
        return None
    b = number(raw)
    if raw is _ABSENT:
        what = "missing"
    elif raw is None:
        what = "null"
    elif b is None:
        what = f"{raw!r}, not a finite number"
    else:
        what = f"{raw!r}, impossible for a run that served requests"
    return f"baseline {b_run.run_id}: {metric} is {what}"


_PENDING = "awaiting Holm"   # the reason of a tested group until `_judge_groups` decides


def _group_findings(where, pairs: Sequence[tuple[Run, Run]], gaps: list[str],
                    include_invalid: bool = True) -> list[Finding]:
    """Per metric: invalid candidate cells (each a regression) and the paired
    test over the seeds whose runs are valid for that metric (all of them
    when ``include_invalid``; p Holm and the verdict by `_judge_groups`);
    baseline values that cannot be gated go to ``gaps``."""
    out = []
    for metric, gate in GATES.items():
        bs, cs = [], []
        for b_run, c_run in pairs:
            if not all(keeps(metric_is_valid(r.summary, metric), include_invalid) for r in (b_run, c_run)):
                continue
            b = usable(b_run.summary.get(metric), gate)
            if b is None:
                gap = baseline_gap(b_run, c_run, metric)
                if gap:
                    gaps.append(gap)
                continue
            raw = c_run.summary.get(metric)
            c = usable(raw, gate)
            if c is None:
                out.append(_invalid({**where, "seed": b_run.config.get("seed")}, metric, gate, b, raw))
                continue
            bs.append(b)
            cs.append(c)
        if bs:
            out.append(_group_test(where, metric, gate, np.asarray(bs), np.asarray(cs)))
    return out


def _group_test(where, metric, gate: Gate, bs: np.ndarray, cs: np.ndarray) -> Finding:
    """The paired test of one group's seeds, its verdict left to `_judge_groups`:
    a ``relative`` metric on log ratios (geometric-mean change, log-scale t CI);
    a ``count`` on differences (mean change over the baseline mean, or over
    one unit from a baseline of 0, with its t CI on that scale)."""
    if gate.rule == "relative":
        r = cs / bs
        change, ci, p = (stats.geometric_mean_ratio(r) - 1.0, stats.log_t_interval(r),
                         stats.ttest_log_ratios(r))
    else:
        d = cs - bs
        scale = float(bs.mean()) or 1.0
        lo, hi = stats.t_interval(d)
        change, ci, p = float(d.mean()) / scale, (1 + lo / scale, 1 + hi / scale), stats.ttest_zero(d)
    return Finding(where, metric, gate.better, float(bs.mean()), float(cs.mean()), change, False,
                   _PENDING, n=bs.size, ci=ci, p=p)


def _judge_groups(findings: list[Finding], min_effect: float, alpha: float) -> list[Finding]:
    """Holm across every tested group x metric, then the significance rule."""
    tested = [i for i, f in enumerate(findings) if f.reason == _PENDING]
    p_holm = stats.holm([findings[i].p for i in tested])
    out = list(findings)
    for i, ph in zip(tested, p_holm, strict=True):
        f = findings[i]
        worse = bad_change(f.change, f.better)
        significant = stats.is_significant(ph, f.ci, 1.0, alpha)
        if f.n < 2:
            reg, why = False, "one valid seed: not tested"
        elif significant and worse > min_effect:
            reg, why = True, f"worse by {worse:.2%} (tolerance {min_effect:.2%}), p Holm < {alpha} and CI excludes 0"
        elif significant:
            reg, why = False, "significant, within tolerance" if worse > 0 else "significant improvement"
        else:
            reg, why = False, "not significant"
        out[i] = Finding(f.where, f.metric, f.better, f.baseline, f.candidate, f.change, reg, why,
                         f.n, f.ci, f.p, float(ph))
    return out


def validate_thresholds(min_effect: float, alpha: float) -> None:
    if not (math.isfinite(min_effect) and min_effect >= 0):
        raise HbenchError(f"--min-effect must be a finite number >= 0, got {min_effect}")
    if not (math.isfinite(alpha) and 0 < alpha < 1):
        raise HbenchError(f"--alpha must be in (0, 1), got {alpha}")


def compare(baseline, candidate, *, min_effect: float = 0.02, alpha: float = 0.05,
            allow_missing: bool = False, include_invalid: bool = False) -> RegressResult:
    """Compare the runs under ``candidate`` with those under ``baseline``. A
    real server's seed whose baseline or candidate run is not valid for a
    metric is left out of that metric's paired test in its group (and so of
    the Holm family) unless
    ``include_invalid`` (`analysis.run_validity`); the simulator's cells are
    each judged on their own either way. Runs that are not valid are named."""
    validate_thresholds(min_effect, alpha)
    base, cand = Side.read(baseline, "baseline"), Side.read(candidate, "candidate")
    engines = sorted({str(r.engine) for r in base.runs + cand.runs})
    if len(engines) != 1:
        raise HbenchError(f"baseline and candidate mix engines ({', '.join(engines)}); compare one engine at a time")
    engine = engines[0]
    deterministic = engine in DETERMINISTIC_ENGINES
    keys = match_keys(base, cand)
    if "seed" not in keys:
        raise HbenchError("runs carry no seed in their configuration; cannot match cells")
    b_index, c_index = _index(base, "baseline", keys), _index(cand, "candidate", keys)
    label_keys = _label_keys(base.runs, keys)

    def where(run: Run, keys=label_keys) -> dict:
        return {k: run.config.get(k) for k in keys}

    pairs, missing, unpairable = [], [], []
    for key, b_run in sorted(b_index.items(), key=lambda kv: _order(where(kv[1]))):
        c_run = c_index.get(key)
        if c_run is None:
            missing.append(where(b_run))
            continue
        try:
            check_pairable(b_run, c_run, same_engine_version=False, what="compare")
        except HbenchError as exc:   # bad input in this cell; the others are still compared
            unpairable.append(str(exc))
            continue
        pairs.append((b_run, c_run))
    unmatched = tuple(f"{r.run_id} ({', '.join(f'{k}={v}' for k, v in where(r).items())})"
                      for key, r in c_index.items() if key not in b_index)
    if not pairs and unpairable:
        raise HbenchError(_bad_input(unpairable, ()))
    if not pairs:
        raise HbenchError("no matching cells between baseline and candidate (same configuration and seed)"
                          + (f"; candidate has {unmatched[0]}" if unmatched else ""))

    findings: list[Finding] = []
    gaps: list[str] = []
    if deterministic:
        for b_run, c_run in pairs:
            for metric, gate in GATES.items():
                b = usable(b_run.summary.get(metric), gate)
                if b is None:
                    gap = baseline_gap(b_run, c_run, metric)
                    if gap:
                        gaps.append(gap)
                    continue
                findings.append(_cell_finding(where(b_run), metric, gate, b,
                                              c_run.summary.get(metric), min_effect))
    else:
        group_keys = [k for k in label_keys if k != "seed"]
        cell_keys = [k for k in keys if k != "seed"]
        seeds: dict[tuple, list] = {}
        for b_run in base.runs:
            seeds.setdefault(_key(b_run, cell_keys), []).append(b_run.config.get("seed"))
        for group, group_seeds in seeds.items():
            if len(group_seeds) < 2:
                label = ", ".join(f"{k}={v}" for k, v in zip(cell_keys, group, strict=True) if k in group_keys)
                raise HbenchError(
                    f"engine {engine} is noisy: a paired comparison needs at least 2 seeds per cell, but the "
                    f"baseline has only seed {group_seeds[0]} for {label}; run more seeds")
        groups: dict[tuple, list] = {}
        for b_run, c_run in pairs:
            groups.setdefault(_key(b_run, cell_keys), []).append((b_run, c_run))
        for members in groups.values():
            # A group left with one matched seed (the others missing, or not
            # valid for a metric) is not tested; its missing cells are
            # reported as such.
            findings += _group_findings(where(members[0][0], group_keys), members, gaps, include_invalid)
        findings = _judge_groups(findings, min_effect, alpha)
    problems = unpairable + ([] if allow_missing else gaps)
    if problems:
        raise HbenchError(_bad_input(problems, [f for f in findings if f.regression],
                                     hint=bool(gaps)))

    sides = {name: {"root": str(s.root), "runs": len(s.runs), "engine_version": s.values("engine_version"),
                    "git_commit": s.values("git_commit")}
             for name, s in (("baseline", base), ("candidate", cand))}
    invalid = tuple(f"{side} {run.run_id}: {describe_validity(run.summary)}"
                    for pair in pairs for side, run in zip(("baseline", "candidate"), pair, strict=True)
                    if not run_is_valid(run.summary))
    return RegressResult(deterministic, engine, tuple(findings), len(pairs), tuple(missing), unmatched,
                         allow_missing, min_effect, alpha, sides, invalid, tuple(gaps), include_invalid)


def _bad_input(problems: Sequence[str], regressions: Sequence[Finding], hint: bool = False,
               shown: int = 3) -> str:
    """One line: the input's problems, then the regressions the comparable
    cells show (so bad input in one cell does not hide a regression in another)."""
    def listed(items: Sequence[str]) -> str:
        more = f"; and {len(items) - shown} more" if len(items) > shown else ""
        return "; ".join(items[:shown]) + more

    text = (f"{len(problems)} problem{'s' if len(problems) > 1 else ''} in the input "
            f"(the gate cannot vouch for these cells): {listed(problems)}")
    if hint:
        text += " (--allow-missing lists baseline values that cannot be gated instead)"
    if regressions:
        text += (". Regressions found as well, in the cells that could be compared: "
                 + listed([f"{f.label}: {f.metric} {f.reason}" for f in regressions]))
    return text
