"""Study vs hbench: the published numbers (DESIGN.md section 8) as data, and
the comparison table `hbench reproduce` prints.

A `Published` figure points at what hbench computes for it: a declared
contrast (effect in %), an interaction (pp for a difference, % for a ratio
of ratios) or an arm mean (absolute value). `compare` looks each one up in
the evaluated tables and reports the hbench value with its 95% CI, whether
the direction matches, whether the CI covers the published value, and the
magnitude ratio hbench / published. A relative effect (a contrast, a ratio
of ratios) is hbench's geometric-mean effect with its log-scale t CI; the
arithmetic mean of the within-seed ratios -- the study's estimator -- is
shown beside it (``hbench_arith``) for comparison. Every hbench number comes from the runs;
nothing measured is stored here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from analysis.contrasts import select
from analysis.designs import THROUGHPUT
from analysis.report import markdown_table
from common.atomic import atomic_path, atomic_write_text


@dataclass(frozen=True)
class Published:
    """One number the study reported, and where hbench's counterpart lives."""

    design: str
    figure: str
    kind: str                 # "contrast", "interaction" or "arm"
    value: float              # % effect, pp, or the absolute value
    unit: str                 # "%", "pp", "tok/s", ...
    target: str = ""          # contrast / interaction name (kind contrast / interaction)
    where: Mapping = field(default_factory=dict)   # arm filter (kind arm)
    metric: str = THROUGHPUT  # arm metric (kind arm)
    note: str = ""


def _pct(a: float, b: float) -> float:
    return (a / b - 1.0) * 100.0


_Q3_ARMS = {"s0": 293.836, "s1": 405.376, "s2": 415.862}
_Q4 = (("b63", 4.978, "significant"), ("b83", -1.728, "not significant in the study"),
       ("b108", -12.556, "significant"))
_Q9_ARMS = ((True, False, 371.42), (True, True, 374.52), (False, False, 513.70), (False, True, 592.07))

PUBLISHED: tuple[Published, ...] = (
    Published("q1", "S1/S0 stronger at q=1 than q=0", "interaction", 9.623, "pp",
              "S1/S0 q=1 minus q=0", note="Holm p 0.01074"),
    Published("q1", "S2/S1 stronger at q=1 than q=0", "interaction", 10.043, "pp",
              "S2/S1 q=1 minus q=0", note="Holm p 0.0391"),
    *(Published("q3", f"no-share control: {org.upper()} throughput", "arm", v, "tok/s",
                where={"org": org}) for org, v in _Q3_ARMS.items()),
    Published("q3", "no-share control: S1/S0", "contrast", _pct(_Q3_ARMS["s1"], _Q3_ARMS["s0"]), "%",
              "S1/S0 q=0", note="ratio of the published arm means"),
    Published("q3", "no-share control: S2/S1", "contrast", _pct(_Q3_ARMS["s2"], _Q3_ARMS["s1"]), "%",
              "S2/S1 q=0", note="ratio of the published arm means"),
    Published("q3", "identical initial input work: S1/S0", "contrast", 0.0, "%", "S1/S0 initial input q=0"),
    Published("q3", "identical initial input work: S2/S1", "contrast", 0.0, "%", "S2/S1 initial input q=0"),
    *(Published("q3", f"zero preemptions: {org.upper()}", "arm", 0.0, "", where={"org": org},
                metric="preemptions") for org in _Q3_ARMS),
    *(Published("q4", f"D0 vs S2 at {b}", "contrast", v, "%", f"D0/S2 {b}", note=n) for b, v, n in _Q4),
    Published("q5", "D0 vs S2 at b63, 3 req/s, cap 63", "contrast", _Q4[0][1], "%",
              "D0/S2 b63 cap63 rate=3", note="the Q4 b63 working point"),
    *(Published("q6", f"D0 vs S2 at {b}, f=0", "contrast", v, "%", f"D0/S2 {b} f=0",
                note=f"Q4 working point, study seeds differ; {n}") for b, v, n in _Q4),
    Published("q8", "retention, ledger timebase", "contrast", 17.8, "%", "retention/none ledger"),
    Published("q8", "retention, request-span timebase", "contrast", 23.5, "%", "retention/none span"),
    *(Published("q9", f"{'ISOLATE' if iso else 'SHARE'} {'S2+retention' if ret else 'S2'} throughput",
                "arm", v, "tok/s", where={"isolate": iso, "retention": ret}) for iso, ret, v in _Q9_ARMS),
    Published("q9", "retention under ISOLATE", "contrast", 0.8, "%", "retention/none ISOLATE",
              note="study CI includes 0"),
    Published("q9", "retention under SHARE", "contrast", 15.3, "%", "retention/none SHARE",
              note="study CI [+0.8, +31.8]"),
    Published("q9", "K_ret (SHARE effect over ISOLATE effect)", "interaction", 14.3, "%", "K_ret",
              note="study CI [-0.1, +30.8]"),
)

#: The study's side (``published``, ``study_note``: what the study said about
#: its number, e.g. its own Holm p) and hbench's (``hbench`` .. ``hbench_verdict``,
#: ``hbench_p_holm``: hbench's Holm p) are separate columns, never one text.
COLUMNS = ("design", "figure", "published", "unit", "study_note", "hbench", "ci_low", "ci_high", "n",
           "direction_reproduced", "ci_covers_published", "magnitude_ratio", "hbench_p_holm",
           "hbench_verdict", "hbench_arith")


def published_for(design: str) -> list[Published]:
    return [p for p in PUBLISHED if p.design == design]


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _arith(p: Published, contrasts: pd.DataFrame) -> float:
    """The arithmetic-mean effect (%) of a contrast (the study's estimator); NaN otherwise."""
    if p.kind != "contrast" or "mean_effect_pct" not in contrasts.columns:
        return math.nan
    row = contrasts[contrasts["name"] == p.target]
    return math.nan if row.empty else float(row.iloc[0]["mean_effect_pct"])


def _lookup(p: Published, contrasts: pd.DataFrame, interactions: pd.DataFrame | None,
            runs: pd.DataFrame) -> tuple[float, float, float, int, float, str]:
    """(value, ci_low, ci_high, n, p Holm, verdict) of hbench's counterpart, in ``p.unit``."""
    nan = math.nan
    if p.kind == "contrast":
        row = contrasts[contrasts["name"] == p.target]
        if row.empty:
            return nan, nan, nan, 0, nan, "not evaluated"
        r = row.iloc[0]
        return (float(r["effect_pct"]), (float(r["ci_low"]) - 1) * 100, (float(r["ci_high"]) - 1) * 100,
                int(r["n"]), float(r.get("p_holm", nan)), str(r["verdict"]))
    if p.kind == "interaction":
        row = interactions[interactions["name"] == p.target] if interactions is not None else pd.DataFrame()
        if row.empty:
            return nan, nan, nan, 0, nan, "not evaluated"
        r = row.iloc[0]
        return (float(r["effect"]), float(r["effect_ci_low"]), float(r["effect_ci_high"]),
                int(min(r["n_a"], r["n_b"])), float(r.get("p_holm", nan)), str(r["verdict"]))
    from analysis import stats
    from common.metric_labels import bounded

    vals = pd.to_numeric(select(runs, p.where)[p.metric], errors="coerce").dropna().to_numpy()
    if vals.size == 0:
        return nan, nan, nan, 0, nan, "no runs"
    # every arm-mean quantity of the designs is non-negative: its interval stays >= 0; a count, a
    # token depth or a fraction stays within its seeds' values (percentile bootstrap), hence its bounds
    lo, hi = (stats.bootstrap_interval(vals, stats.bootstrap_rng()) if bounded(p.metric)
              else stats.bounded_t_interval(vals) if (vals >= 0).all() else stats.t_interval(vals))
    return stats.mean_over_seeds(vals), lo, hi, int(vals.size), nan, "arm mean"


def compare(design: str, contrasts: pd.DataFrame, interactions: pd.DataFrame | None,
            runs: pd.DataFrame) -> pd.DataFrame:
    """One row per published figure of ``design``: published vs hbench."""
    rows = []
    for p in published_for(design):
        v, lo, hi, n, p_holm, verdict = _lookup(p, contrasts, interactions, runs)
        has_ci = not (math.isnan(lo) or math.isnan(hi))
        if math.isnan(v):
            direction = covers = "n/a"
        elif p.kind == "arm" and p.value != 0:
            direction = "n/a"       # an absolute value has no direction
            covers = ("yes" if lo <= p.value <= hi else "no") if has_ci else ("yes" if v == p.value else "no")
        else:
            covers = ("yes" if lo <= p.value <= hi else "no") if has_ci else ("yes" if v == p.value else "no")
            if p.value == 0:        # "no effect" is reproduced by an estimate consistent with 0
                direction = "yes" if v == 0 or (has_ci and lo <= 0 <= hi) else "no"
            else:
                direction = "yes" if _sign(v) == _sign(p.value) else "no"
        ratio = v / p.value if p.value != 0 and not math.isnan(v) else math.nan
        rows.append({"design": design, "figure": p.figure, "published": p.value, "unit": p.unit,
                     "study_note": p.note, "hbench": v, "ci_low": lo, "ci_high": hi, "n": n,
                     "direction_reproduced": direction, "ci_covers_published": covers,
                     "magnitude_ratio": ratio, "hbench_p_holm": p_holm, "hbench_verdict": verdict,
                     "hbench_arith": _arith(p, contrasts)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _num(x: float) -> str:
    if _nan(x):
        return "n/a"
    return f"{x:,.3f}" if abs(x) < 1000 else f"{x:,.1f}"


def _p(x: float) -> str:
    return "n/a" if _nan(x) else f"{x:.4g}"


def display_rows(table: pd.DataFrame) -> list[list[str]]:
    from analysis.headlines import direction_words  # a sign is "reproduced" only when significant

    out = []
    for _, r in table.iterrows():
        ci = "n/a" if math.isnan(r["ci_low"]) else f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]"
        out.append([r["design"], r["figure"], f"{_num(r['published'])} {r['unit']}".strip(),
                    r["study_note"] or "", f"{_num(r['hbench'])} {r['unit']}".strip(), ci, str(r["n"]),
                    direction_words(r), r["ci_covers_published"], _num(r["magnitude_ratio"]),
                    _p(r["hbench_p_holm"]), r["hbench_verdict"],
                    _num(r["hbench_arith"]) + (f" {r['unit']}" if not _nan(r["hbench_arith"]) else "")])
    return out


HEADER = ("design", "published figure", "study", "study note", "hbench", "hbench 95% CI", "n",
          "direction reproduced", "CI covers study", "magnitude ratio", "hbench p Holm", "hbench verdict",
          "hbench arith. mean")


def markdown(table: pd.DataFrame, title: str, notes: Sequence[str] = ()) -> str:
    """The reproduce.md text: the comparison table and how to read it."""
    parts = [f"# {title}", ""]
    parts += ["Study values are the published numbers (DESIGN.md section 8); hbench values come from the "
              "runs of this directory. Relative effects are geometric means of the within-seed ratios as % "
              "with the 95% t interval of the mean log ratio (interactions: differences in pp with a t "
              "interval; K_ret as a geometric mean in %); arm means are arithmetic means over seeds with "
              "t intervals cut at 0 (counts, token depths and fractions: a percentile bootstrap interval, "
              "within the seeds' own values). The last column is the "
              "arithmetic mean of the within-seed ratios, the study's "
              "estimator, for comparison. magnitude ratio = hbench / study. \"study note\" is what the "
              "study reported beside its number (its own p values); \"hbench p Holm\" and \"hbench "
              "verdict\" are hbench's.", ""]
    if table.empty:
        parts += ["The study published no number for this design; see analysis/report.md for the "
                  "contrasts and arm means hbench measured.", ""]
    else:
        parts += [markdown_table(HEADER, display_rows(table)), ""]
    parts += [f"- {n}" for n in notes if n]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- pipeline

@dataclass(frozen=True)
class Reproduction:
    """Everything one design's reproduction produced."""

    design: str
    out: object               # Path of the design's directory
    runs: pd.DataFrame
    contrasts: pd.DataFrame
    interactions: pd.DataFrame | None
    arms: pd.DataFrame
    table: pd.DataFrame
    figures: tuple = ()
    validity: object = None   # analysis.run_validity.RunValidity of the runs


def add_derived_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-run quantities the designs report that the summary does not hold:
    ``gap_r_mean`` = R_max - J_adopt (Q7's Gap_R); ``token_hit_rate`` =
    reused / (reused + initial input) tokens of the measured requests, which
    is `analysis.reuse`'s token hit rate (reused / prompt tokens)."""
    runs = runs.copy()
    if {"r_max_mean", "j_adopt_mean"} <= set(runs.columns):
        runs["gap_r_mean"] = pd.to_numeric(runs["r_max_mean"]) - pd.to_numeric(runs["j_adopt_mean"])
    if {"reused_tokens", "initial_input_tokens"} <= set(runs.columns):
        reused = pd.to_numeric(runs["reused_tokens"])
        runs["token_hit_rate"] = reused / (reused + pd.to_numeric(runs["initial_input_tokens"]))
    return runs


def evaluate_design(name: str, root, cell_ids: Sequence[str] | None = None,
                    figures: bool = True, include_invalid: bool = False) -> Reproduction:
    """Evaluate design ``name`` on the runs under ``root`` (only ``cell_ids``
    if given, so leftovers of another grid never enter a contrast), render
    its figures and write analysis/ (with the one-file analysis/report.html)
    plus reproduce.md and reproduce.csv. Contrasts and interactions whose
    arms are not valid leave their Holm families unless ``include_invalid``
    (`analysis.run_validity`, the rule ``analyze`` applies)."""
    import warnings
    from pathlib import Path

    from analysis import contrasts as C
    from analysis.designs import design, selected_headroom_contrasts
    from analysis.figure_set import render_figures
    from analysis.headlines import served_by
    from analysis.html_report import write_report
    from analysis.load import load_runs
    from analysis.report import write_outputs
    from analysis.run_validity import of_runs
    from common.errors import HbenchError

    d = design(name)
    root = Path(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(root)
    if cell_ids is not None:
        runs = runs[runs["run_id"].isin(set(cell_ids))]
        if runs.empty:
            raise HbenchError(f"none of the {len(cell_ids)} cells of design {name} is complete under {root}")
    runs = add_derived_columns(runs.reset_index(drop=True))
    contrasts = list(d.contrasts)
    if name == "q6":
        contrasts += selected_headroom_contrasts(runs)
    table = C.evaluate(runs, contrasts, include_invalid=include_invalid)
    inter = (C.evaluate_interactions(runs, contrasts, d.interactions, include_invalid=include_invalid)
             if d.interactions else None)
    validity = of_runs(runs, include_invalid, [c.metric for c in contrasts])
    arms = C.arm_means(runs, list(d.metrics))
    metrics = sorted({c.metric for c in contrasts})
    out = root / "analysis"
    figs = render_figures(runs, out / "figures", metrics, table) if figures else []
    if name == "beyond":       # its own figures and findings tables (beyond.md)
        from analysis.beyond import write_beyond

        figs += write_beyond(root, runs, table, inter, figures=figures)
    write_outputs(out, root, table, inter, arms, figs, validity, served=served_by(runs))
    comparison = compare(name, table, inter, runs)
    write_report(root, out / "report.html", runs=runs, contrasts=table, metrics=metrics,
                 interactions=inter, study=comparison,
                 title=f"hbench reproduction: {d.title} ({served_by(runs)})",
                 asked=f"Does hbench reproduce the study's {d.title}? ({len(comparison)} published "
                       "numbers, compared with hbench's paired-seed estimates from these runs.)")
    with atomic_path(root / "reproduce.csv") as tmp:
        comparison.to_csv(tmp, index=False)
    notes = [d.notes, validity.sentence("Holm families"),
             "contrasts, arm means and figures: analysis/report.md."]
    atomic_write_text(root / "reproduce.md",
                      markdown(comparison, f"Reproduction of {d.title} ({served_by(runs)})", notes))
    return Reproduction(name, root, runs, table, inter, arms, comparison, tuple(figs), validity)
