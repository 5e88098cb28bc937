"""The Markdown report of `hbench regress` (a CI comment): the verdict,
both sides' roots, engine versions and commits, the regressions by cell,
missing cells, then every comparison (per cell for a deterministic engine,
per seed group for a noisy one)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from analysis import stats
from analysis.gated_metrics import GATES, RULES
from analysis.regress import Finding, RegressResult
from analysis.report import markdown_table


def _value(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _pct(change: float) -> str:
    if math.isnan(change):
        return "n/a"
    return "+inf" if math.isinf(change) else f"{change * 100:+.2f}%"


def _ci(ci: stats.Interval) -> str:
    return "n/a" if math.isnan(ci[0]) else f"[{_pct(ci[0] - 1)}, {_pct(ci[1] - 1)}]"


def markdown(result: RegressResult) -> str:
    """The report (a CI comment): verdict, both sides' provenance, the
    regressions by cell, missing cells, then every comparison."""
    regs = result.regressions
    head = "REGRESSION" if result.regressed else "no regression"
    counts = []
    if regs:
        counts.append(f"{len(regs)} regressed cell metrics")
    if result.missing:
        counts.append(f"{len(result.missing)} missing cells" + (" (allowed)" if result.allow_missing else ""))
    mode = (f"engine `{result.engine}` is deterministic: each of the {result.cells} matched cells is compared "
            f"on its own; a gated metric worse than its rule tolerates ({result.min_effect:.2%}) is a "
            "regression"
            if result.deterministic else
            f"engine `{result.engine}` is noisy: the {result.cells} matched cells are compared per seed group "
            f"(paired t test on log ratios, geometric-mean change with its 95% t CI, Holm across groups x "
            f"metrics); a group regresses when p Holm < {result.alpha}, its CI excludes 0 and it is worse by "
            f"more than {result.min_effect:.2%}")
    lines = [f"## hbench regress: {head}" + (f" ({'; '.join(counts)})" if counts else ""), "",
             f"Cells are matched by configuration and seed; {mode}. A candidate value that is null, "
             "not a number, negative, or zero for a relative metric is a regression, and so is a "
             "baseline cell the candidate lacks. A baseline value that cannot be measured against is "
             "bad input, listed here only under --allow-missing.", "", _gated(result), "",
             _table(["side", "root", "runs", "engine version", "commit"],
                    [[name, f"`{s['root']}`", str(s["runs"]), ", ".join(s["engine_version"]),
                      ", ".join(s["git_commit"])] for name, s in result.sides.items()]), ""]
    if regs:
        lines += ["### Regressions", "",
                  _table(["cell", "metric", "better", "baseline", "candidate", "change", "why"],
                         [[f.label, f.metric, f.better, _value(f.baseline), _value(f.candidate),
                           _pct(f.change), f.reason] for f in regs]), ""]
    if result.invalid:
        fate = ("kept in the paired tests (--include-invalid)" if result.include_invalid or result.deterministic
                else "left out of the paired tests and Holm (--include-invalid keeps them)")
        lines += [f"### Runs that are not valid: {len(result.invalid)} ({fate}; their numbers may not "
                  "mean what they claim)", ""]
        lines += [f"- {x}" for x in result.invalid] + [""]
    if result.baseline_gaps:
        lines += ["### Baseline values that cannot be gated (allowed by --allow-missing; those "
                  "metrics of those cells are not checked)", ""]
        lines += [f"- {x}" for x in result.baseline_gaps] + [""]
    if result.missing:
        title = "Missing cells (allowed by --allow-missing)" if result.allow_missing else "Missing cells (regressions)"
        lines += [f"### {title}", ""] + [f"- {', '.join(f'{k}={v}' for k, v in m.items())}"
                                          for m in result.missing] + [""]
    lines += ["<details><summary>every comparison</summary>", ""]
    if result.deterministic:
        lines += [_cell_table(result.findings)]
    else:
        lines += [_table(["group", "metric", "seeds", "baseline mean", "candidate mean", "change", "95% CI",
                          "p", "p Holm", "verdict"],
                         [[f.label, f.metric, str(f.n), _value(f.baseline), _value(f.candidate), _pct(f.change),
                           _ci(f.ci), _p(f.p), _p(f.p_holm), ("**REGRESSION** " if f.regression else "") + f.reason]
                          for f in result.findings])]
    lines += ["", "</details>", ""]
    if result.unmatched:
        lines += [f"<details><summary>{len(result.unmatched)} candidate runs without a baseline cell "
                  "(not compared)</summary>", ""] + [f"- {u}" for u in result.unmatched] + ["", "</details>", ""]
    return "\n".join(lines)


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else ("<0.0001" if p < 1e-4 else f"{p:.4f}")


def _gated(result: RegressResult) -> str:
    """Which metrics were gated (compared in at least one cell), by direction
    and rule, and the rules' words."""
    seen = {f.metric for f in result.findings}
    groups = {}
    for metric, gate in GATES.items():
        if metric in seen:
            groups.setdefault((gate.better, gate.rule), []).append(f"`{metric}`")
    lines = [f"Gated: {len(seen)} metrics (every summary metric with a direction that these runs report)."]
    lines += [f"- {better} is better, {rule} rule ({RULES[rule]}): {', '.join(names)}"
              for (better, rule), names in sorted(groups.items())]
    return "\n".join(lines)


def _worst(findings: Sequence[Finding]) -> Finding | None:
    judged = [f for f in findings if f.candidate is not None and not math.isnan(f.change)]
    invalid = [f for f in findings if f.candidate is None]
    if invalid:
        return invalid[0]
    return max(judged, key=lambda f: -f.change if f.better == "higher" else f.change, default=None)


def _cell_table(findings: Sequence[Finding]) -> str:
    """One row per cell: how many metrics it was gated on, which regressed, and
    its worst change."""
    rows: dict[str, list[Finding]] = {}
    for f in findings:
        rows.setdefault(f.label, []).append(f)
    body = []
    for label, fs in rows.items():
        worst = _worst(fs)
        regressed = [f.metric for f in fs if f.regression]
        text = ("n/a" if worst is None else
                f"{worst.metric} {'invalid' if worst.candidate is None else _pct(worst.change)}")
        body.append([label, str(len(fs)), ", ".join(f"**{m}**" for m in regressed) or "none", text])
    return _table(["cell", "metrics gated", "regressed", "worst change"], body)


_table = markdown_table
