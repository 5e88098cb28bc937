"""The answers a report opens with: sentences generated from the numbers.

Each sentence states one result with what makes it trustworthy or not: the
effect, its 95% CI, the Holm-adjusted p and the number of paired seeds.
Whether a sentence may name a winner is read from the row it words
(`analysis.verdicts.status`: the table's ``significant`` column, computed
by the one rule `analysis.stats.is_significant`, Holm p < alpha AND the CI
excludes the null), never decided here: a contrast that is not significant
is worded as such with why (the CI contains 0, or the CI excludes 0 but the
Holm p does not pass); one that is not tested (``excluded``: arms not
valid; one seed; no ratio) is named as not tested with the table's reason.
What limited the answer (runs not valid, seeds, the smallest change the
seeds can detect) is said apart (`limits`), without run ids: those are in
the tables at the end. Nothing here reads files: tables in, strings out
(HTML escaping is the caller's).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import pandas as pd

from analysis import verdicts as V
from common import metric_labels

#: Significant findings stated one by one before the rest are only counted.
MAX_FINDINGS = 8
#: Not-significant contrasts stated one by one (largest |effect| first).
MAX_NULLS = 3

#: Sentence words of the throughputs: verb, what is served, more, fewer.
METRIC_PHRASES = {
    "throughput_ledger_tok_s": ("serves", "output tok/s", "more", "fewer"),
    "throughput_span_tok_s": ("serves", "output tok/s over the request span", "more", "fewer"),
    "delivered_rate_req_s": ("delivers", "req/s", "more", "fewer"),
}


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_p(p: float) -> str:
    if _nan(p):
        return "n/a"
    return "< 0.0001" if p < 1e-4 else f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def _metric_label(metric: str) -> str:
    return METRIC_PHRASES[metric][1] if metric in METRIC_PHRASES else metric_labels.name(metric)


def pct(x: float) -> str:
    """Signed percent with one decimal; a value that rounds to zero is +0.0, never -0.0."""
    return f"{round(float(x), 1) + 0.0:+.1f}"


def _stats(r: Mapping) -> str:
    ci = ("no CI (one seed)" if _nan(r["effect_ci_low"])
          else f"95 % CI [{pct(r['effect_ci_low'])}, {pct(r['effect_ci_high'])}] %")
    return f"{ci}, Holm p {fmt_p(r['p_holm'])}, {int(r['n'])} paired seeds"


def _better(metric: str, eff: float) -> str:
    up = metric_labels.higher_is_better(metric)
    return "" if up is None else ", better" if (eff > 0) == up else ", worse"


def served_by(runs: pd.DataFrame) -> str:
    """Which engine, model and GPU the runs are, for a report's title:
    "engine vllm, falcon-h1-7b on a100-pcie-40gb" (several values joined)."""
    def values(column: str) -> str:
        if column not in runs.columns:
            return "unknown"
        return "/".join(sorted(str(v) for v in runs[column].dropna().unique())) or "unknown"

    return f"engine {values('engine')}, {values('model')} on {values('gpu')}"


def contrast_sentence(r: Mapping, alpha: float = 0.05) -> str:
    """One evaluated contrast (a row of `analysis.contrasts.evaluate`) as a sentence."""
    a, b = V.sides(r)
    where, metric = V.where(str(r["name"])), str(r["metric"])
    where = f" {where}" if where else ""
    state = V.status(r)
    if state == V.NOT_TESTED:
        subject = f"\u201c{r['name']}\u201d" if where.startswith(" in \u201c") else f"{a} vs {b}{where}"
        return f"{subject} on {_metric_label(metric)} is not tested: {V.untested_reason(r)}."
    kept = (f"; its arms are not valid ({V.short_reason(r['arms_invalid'])}), kept by --include-invalid"
            if str(r.get("arms_invalid") or "") else "")
    eff = float(r["effect_pct"])
    if state == V.SIGNIFICANT:
        if metric in METRIC_PHRASES:
            verb, unit, more, fewer = METRIC_PHRASES[metric]
            return (f"{a} {verb} {abs(eff):.1f} % {more if eff > 0 else fewer} {unit} than {b}"
                    f"{where} ({_stats(r)}{kept}).")
        return (f"{a}'s {_metric_label(metric)} is {abs(eff):.1f} % {'higher' if eff > 0 else 'lower'} "
                f"than {b}'s{where} ({_stats(r)}{_better(metric, eff)}{kept}).")
    lo, hi = r["effect_ci_low"], r["effect_ci_high"]
    why = ("the CI contains 0" if _nan(lo) or lo <= 0 <= hi
           else f"the CI excludes 0 but Holm p is not below {alpha:g}")
    return (f"{a} and {b}{where} do not differ significantly on {_metric_label(metric)}: "
            f"{pct(eff)} % ({_stats(r)}; {why}{kept}).")


def contrast_headlines(contrasts: pd.DataFrame | None, alpha: float = 0.05) -> list[tuple[str, str]]:
    """(kind, sentence) pairs: a count (``summary``), the significant contrasts
    (``sig``, largest |effect| first), the largest not-significant ones
    (``null``), those not tested (``untested``); the rest only counted."""
    if contrasts is None or contrasts.empty:
        return [("summary", "No contrast could be formed (one organization, or no arm with paired seeds).")]
    df = contrasts.assign(_abs=contrasts["effect_pct"].abs(),
                          _state=[V.status(r) for _, r in contrasts.iterrows()])
    df = df.sort_values("_abs", ascending=False)
    sig, null, untested = (df[df["_state"] == s] for s in (V.SIGNIFICANT, V.NOT_SIGNIFICANT, V.NOT_TESTED))
    metrics = ", ".join(_metric_label(m) for m in dict.fromkeys(df["metric"]))
    out = [("summary", f"{len(sig)} of {len(df)} contrasts ({metrics}) are significant after Holm "
                       f"correction (alpha {alpha:g}), {len(null)} are not, {len(untested)} are not tested.")]
    out += [("sig", contrast_sentence(r, alpha)) for _, r in sig.head(MAX_FINDINGS).iterrows()]
    if len(sig) > MAX_FINDINGS:
        out.append(("summary", f"{len(sig) - MAX_FINDINGS} more significant contrasts are in the "
                               "contrast table."))
    out += [("null", contrast_sentence(r, alpha)) for _, r in null.head(MAX_NULLS).iterrows()]
    if len(null) > MAX_NULLS:
        out.append(("summary", f"{len(null) - MAX_NULLS} more contrasts are not significant."))
    out += [("untested", contrast_sentence(r, alpha)) for _, r in untested.head(MAX_NULLS).iterrows()]
    if len(untested) > MAX_NULLS:
        out.append(("summary", f"{len(untested) - MAX_NULLS} more contrasts are not tested."))
    return out


def _range(values, fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"


def seeds_sentence(contrasts: pd.DataFrame | None) -> str:
    """How many paired seeds the tested contrasts rest on, and the smallest
    change those seeds can detect (MDE at 80 % power) ("" without contrasts)."""
    if contrasts is None or contrasts.empty:
        return ""
    tested = contrasts[[V.status(r) != V.NOT_TESTED for _, r in contrasts.iterrows()]]
    if tested.empty:
        return "No contrast could be tested."
    n = [int(x) for x in tested["n"]]
    text = f"Each tested contrast rests on {_range(n, str)} paired seeds"
    mde = [float(x) for x in tested.get("mde_pct", pd.Series(dtype=float)) if not _nan(x)]
    if mde:
        text += ("; at their spread, the smallest change a test detects with 80 % power is "
                 + _range(mde, lambda x: f"\u00b1{x:.1f} %"))
    unpaired = sum(1 for x in tested.get("unpaired", []) if str(x or ""))
    if unpaired:
        text += f"; {unpaired} contrasts have seeds that only one arm ran (left out, named in the table)"
    return text + "."


#: What happens to the runs that are not valid, by default.
CONTRASTS_LEAVE_THEM = ("contrasts of the metrics they spoil are not tested unless "
                        "--include-invalid")
CAPACITY_LEAVES_THEM = "each counts as missing the SLO unless --include-invalid"


def limits(runs: pd.DataFrame, contrasts: pd.DataFrame | None, fate: str = CONTRASTS_LEAVE_THEM) -> list[str]:
    """What limited the answer: runs that are not valid (counted by reason,
    with ``fate``: what the command did with them), and the seeds behind the
    contrasts."""
    return [s for s in (invalid_runs_sentence(runs, fate), seeds_sentence(contrasts)) if s]


def reasons_count(reasons) -> str:
    """``overload: 8, failures: 2`` from each run's comma-separated reasons."""
    counts = Counter(x.strip() for text in reasons for x in str(text or "not valid").split(",") if x.strip())
    return ", ".join(f"{k}: {n}" for k, n in counts.most_common())


def invalid_runs_sentence(runs: pd.DataFrame, fate: str = CONTRASTS_LEAVE_THEM) -> str:
    """How many runs are not valid and why (counted by reason); the runs
    themselves are named in the table at the end of the report."""
    if "valid" not in runs.columns:
        return f"{len(runs)} runs; none records a validity verdict."
    bad = runs[~runs["valid"].astype(bool)]
    if bad.empty:
        return f"All {len(runs)} runs are valid."
    arms = bad.groupby(["org", "budget"], sort=False).ngroups
    return (f"{len(bad)} of {len(runs)} runs are not valid ({reasons_count(bad.get('invalid_reasons', []))}; "
            f"{arms} organization x budget arms): {fate}; each run is named under "
            "\u201cRuns not valid\u201d at the end.")


def validity_sentence(validity, fate: str = CONTRASTS_LEAVE_THEM) -> str:
    """`invalid_runs_sentence` from an `analysis.run_validity.RunValidity`
    (``run_id (reasons)`` per run) where no run table is at hand."""
    if not validity.invalid:
        return f"All {validity.total} runs are valid."
    why = reasons_count(m.group(1) if (m := re.search(r"\((.*)\)$", x)) else "" for x in validity.invalid)
    fate = "they are kept in the tests (--include-invalid)" if validity.include_invalid else fate
    return (f"{len(validity.invalid)} of {validity.total} runs are not valid ({why}): {fate}; each run "
            "is named under \u201cRuns not valid\u201d at the end.")


def expression_sentences(runs: pd.DataFrame) -> list[str]:
    """One sentence per (engine, organization) whose runs say they are not the
    study's organization (`analysis.load.org_expression`), e.g. vLLM's S1:
    what the name means in these runs."""
    if "org_expression" not in runs.columns:
        return []
    named = runs.dropna(subset=["org_expression"])
    pairs = sorted({(str(r["engine"]), str(r["org"]), str(r["org_expression"]))
                    for _, r in named.iterrows() if str(r["org"]) != "s0"})
    return [f"{org.upper()} on {engine} is {text}." for engine, org, text in pairs]


def question(runs: pd.DataFrame, metrics: Sequence[str]) -> str:
    """What the runs asked, from what they vary."""
    from analysis.figures import budget_order

    def values(key: str, fmt=str) -> str:
        vals = runs[key].dropna().unique() if key in runs.columns else []
        order = budget_order if key == "budget" else (lambda v: (isinstance(v, str), v))
        return ", ".join(fmt(v) for v in sorted(vals, key=order)) or "-"
    labels = ", ".join(_metric_label(m) for m in metrics)
    return (f"How do organizations {values('org', lambda v: str(v).upper())} compare on {labels}, "
            f"paired by seed, at budgets {values('budget')} and arrival rates "
            f"{values('rate', lambda v: f'{v:g}')} req/s (seeds {values('seed')})?")


def crossover_sentence(c: Mapping) -> str:
    """One entry of `analysis.capacity.crossovers` (significant by construction)."""
    return (f"At {c['budget']}, {str(c['org']).upper()} serves significantly more goodput than "
            f"{str(c['beats']).upper()} from {c['from_rate']:g} req/s up (Holm p \u2264 {fmt_p(c['p_holm'])} "
            "at each rate), not below.")


def capacity_headlines(doc: Mapping) -> list[str]:
    """Capacity per arm with its interval, how many winner-map cells are ties,
    and the crossovers (each significant by the one rule)."""
    out = []
    slo = ", ".join(doc["slo"])
    top = max(doc.get("rates") or [math.inf])
    for c in doc["capacity"]:
        n = len(str(c["per_seed"]).split(", "))
        at_top = c["ci_low"] >= top    # every seed held the SLO at the grid's highest rate
        out.append(f"{str(c['org']).upper()} at {c['budget']} sustains "
                   + ("at least the grid's top rate, " if at_top else "") + f"{c['capacity_req_s']:.2f} req/s "
                   f"within {slo} (interval [{c['ci_low']:.2f}, {c['ci_high']:.2f}] req/s over {n} seeds; "
                   f"per seed {c['per_seed']}).")
    cells = doc.get("winner_map") or []
    won = [w for w in cells if V.claims_winner(w) and w.get("winner") != "tie"]
    if cells:
        ties = len(cells) - len(won)
        out.append(f"{len(won)} of {len(cells)} (budget, rate) cells have a significant goodput winner; "
                   f"{ties} {'is a tie' if ties == 1 else 'are ties'} (equal goodput, or a difference "
                   "the seeds cannot tell apart).")
        out += [crossover_sentence(c) for c in doc.get("crossovers") or []]
    return out


def direction_words(r: Mapping) -> str:
    """A `analysis.reproduce.compare` row's ``direction_reproduced`` as a
    report may say it: a sign that matches the study's is a reproduced
    direction only when hbench's own verdict is significant."""
    d, verdict = str(r["direction_reproduced"]), str(r["hbench_verdict"])
    if d == "n/a" or _nan(r.get("published")) or r.get("published") == 0 or verdict == V.SIGNIFICANT:
        return d
    if verdict == V.NOT_SIGNIFICANT:
        return "same sign, not significant" if d == "yes" else "opposite sign, not significant"
    return f"not tested ({verdict})"


def study_sentence(r: Mapping) -> str:
    """One row of `analysis.reproduce.compare`: the study's number, hbench's, and the verdict."""
    unit = str(r["unit"] or "")

    def num(x) -> str:
        return "n/a" if _nan(x) else f"{x:,.2f} {unit}".strip()

    ci = "" if _nan(r["ci_low"]) else f", 95 % CI [{num(r['ci_low'])}, {num(r['ci_high'])}]"
    note = f" ({r['study_note']})" if r.get("study_note") else ""
    verdict = str(r["hbench_verdict"])
    untested = verdict not in V.TESTED_VERDICTS and verdict != "arm mean"
    agree = (f"; direction reproduced: {direction_words(r)}, CI covers the study's value: "
             f"{r['ci_covers_published']}" if not untested and (r["direction_reproduced"] != "n/a"
                                                                 or r["ci_covers_published"] != "n/a")
             else "")
    what = f"not tested ({verdict}): no verdict on the study's number" if untested else f"verdict {verdict}"
    return (f"{r['figure']}: the study reported {num(r['published'])}{note}; hbench measures "
            f"{num(r['hbench'])}{ci}, {int(r['n'])} seeds, {what}{agree}.")
