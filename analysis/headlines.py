"""The answers a report opens with: sentences generated from the numbers.

Each sentence states one result with what makes it trustworthy or not: the
effect, its 95% CI, the Holm-adjusted p and the number of paired seeds. A
contrast is called a difference only when `analysis.contrasts` found it
significant (Holm p < alpha AND the CI excludes 0); otherwise the sentence
says it is not significant and why (the CI contains 0, or the CI excludes 0
but the Holm p does not pass). Contrasts whose arms are not valid are named
as not tested, with the runs that made them so. Nothing here reads files:
tables in, strings out (HTML escaping is the caller's).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import pandas as pd

#: Significant findings stated one by one before the rest are only counted.
MAX_FINDINGS = 8
#: Not-significant contrasts stated one by one (largest |effect| first).
MAX_NULLS = 3

METRIC_PHRASES = {
    "throughput_ledger_tok_s": ("serves", "output tok/s", "more", "fewer"),
    "throughput_span_tok_s": ("serves", "output tok/s over the request span", "more", "fewer"),
    "delivered_rate_req_s": ("delivers", "req/s", "more", "fewer"),
}
KEY_WORDS = {"budget": "budget {v}", "rate": "{v} req/s", "headroom": "headroom {v}", "q": "q = {v}",
             "engine": "engine {v}", "paging": "paging {v}", "retention": "retention {v}"}


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_p(p: float) -> str:
    if _nan(p):
        return "n/a"
    return "< 0.0001" if p < 1e-4 else f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def _org(side: str) -> str | None:
    m = re.search(r"(?:^|, )org=([^,]+)", str(side or ""))
    return m.group(1).upper() if m else None


def _where(name: str) -> str:
    """``d0/s0 @ budget=b83, rate=2.0`` -> ``at budget b83, 2 req/s``; a
    contrast named by a design keeps its own name."""
    if " @ " not in name:
        return f"in contrast \u201c{name}\u201d"
    parts = []
    for item in name.split(" @ ", 1)[1].split(", "):
        key, _, value = item.partition("=")
        v = value
        try:
            v = f"{float(value):g}"
        except ValueError:
            pass
        parts.append(KEY_WORDS.get(key, key + " {v}").format(v=v))
    return "at " + ", ".join(parts)


def _metric_label(metric: str) -> str:
    from analysis.figures import _label

    return METRIC_PHRASES[metric][1] if metric in METRIC_PHRASES else _label(metric)


def pct(x: float) -> str:
    """Signed percent with one decimal; a value that rounds to zero is +0.0, never -0.0."""
    return f"{round(float(x), 1) + 0.0:+.1f}"


def _stats(r: Mapping) -> str:
    ci = ("no CI (one seed)" if _nan(r["effect_ci_low"])
          else f"95 % CI [{pct(r['effect_ci_low'])}, {pct(r['effect_ci_high'])}] %")
    return f"{ci}, Holm p {fmt_p(r['p_holm'])}, {int(r['n'])} paired seeds"


def contrast_sentence(r: Mapping, alpha: float = 0.05) -> str:
    """One evaluated contrast (a row of `analysis.contrasts.evaluate`) as a sentence."""
    a = _org(r.get("numerator")) or str(r["name"]).split("/")[0].upper()
    b = _org(r.get("denominator")) or str(r["name"]).split("/")[-1].split(" ")[0].upper()
    where, metric = _where(str(r["name"])), str(r["metric"])
    if r["verdict"] == "arms not valid":
        return (f"{a} vs {b} {where} is not tested: its arms are not valid "
                f"({r.get('arms_invalid') or 'see the run table'}).")
    if _nan(r["effect_pct"]):
        return f"{a} vs {b} {where} has no estimate: {r.get('invalid') or r['verdict']}."
    eff = float(r["effect_pct"])
    if bool(r["significant"]):
        if metric in METRIC_PHRASES:
            verb, unit, more, fewer = METRIC_PHRASES[metric]
            return (f"{a} {verb} {abs(eff):.1f} % {more if eff > 0 else fewer} {unit} than {b} "
                    f"{where} ({_stats(r)}).")
        return (f"{a}'s {_metric_label(metric)} is {abs(eff):.1f} % {'higher' if eff > 0 else 'lower'} "
                f"than {b}'s {where} ({_stats(r)}).")
    lo, hi = r["effect_ci_low"], r["effect_ci_high"]
    why = ("the CI contains 0" if _nan(lo) or lo <= 0 <= hi
           else f"the CI excludes 0 but Holm p is not below {alpha:g}")
    return (f"{a} and {b} {where} do not differ significantly on {_metric_label(metric)}: "
            f"{pct(eff)} % ({_stats(r)}; {why}).")


def contrast_headlines(contrasts: pd.DataFrame | None, alpha: float = 0.05) -> list[tuple[str, str]]:
    """(kind, sentence) pairs: a count (``summary``), the significant contrasts
    (``sig``, largest |effect| first), the largest not-significant ones
    (``null``), those not tested (``untested``); the rest only counted."""
    if contrasts is None or contrasts.empty:
        return [("summary", "No contrast could be formed (one organization, or no arm with paired seeds).")]
    df = contrasts.assign(_abs=contrasts["effect_pct"].abs()).sort_values("_abs", ascending=False)
    sig = df[df["significant"].astype(bool)]
    untested = df[df["verdict"] == "arms not valid"]
    null = df[~df["significant"].astype(bool) & (df["verdict"] != "arms not valid")]
    out = [("summary", f"{len(sig)} of {len(df)} contrasts are significant after Holm correction "
                       f"(alpha {alpha:g}), {len(null)} are not, {len(untested)} are not tested "
                       "(arms not valid).")]
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


def invalid_runs_sentence(runs: pd.DataFrame) -> str:
    """The runs whose validity verdict failed, each named with its arm and reasons."""
    if "valid" not in runs.columns:
        return f"{len(runs)} runs; none records a validity verdict."
    bad = runs[~runs["valid"].astype(bool)].sort_values(["org", "budget", "rate", "seed"])
    if bad.empty:
        return f"All {len(runs)} runs are valid."
    named = "; ".join(f"{r['run_id']} ({str(r['org']).upper()} @ {r['budget']}, {r['rate']:g} req/s, "
                      f"seed {r['seed']}: {r.get('invalid_reasons') or 'not valid'})"
                      for _, r in bad.iterrows())
    return f"{len(bad)} of {len(runs)} runs are not valid: {named}."


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


def capacity_headlines(doc: Mapping) -> list[str]:
    """Capacity per arm with its interval, and how many winner-map cells are ties."""
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
    won = [w for w in cells if w.get("significant") and w.get("winner") != "tie"]
    if cells:
        out.append(f"{len(won)} of {len(cells)} (budget, rate) cells have a significant goodput winner; "
                   f"{len(cells) - len(won)} are ties (equal goodput, or a difference the seeds "
                   "cannot tell apart).")
    return out


def study_sentence(r: Mapping) -> str:
    """One row of `analysis.reproduce.compare`: the study's number, hbench's, and the verdict."""
    unit = str(r["unit"] or "")

    def num(x) -> str:
        return "n/a" if _nan(x) else f"{x:,.2f} {unit}".strip()

    ci = "" if _nan(r["ci_low"]) else f", 95 % CI [{num(r['ci_low'])}, {num(r['ci_high'])}]"
    note = f" ({r['study_note']})" if r.get("study_note") else ""
    agree = (f"; direction reproduced: {r['direction_reproduced']}, CI covers the study's value: "
             f"{r['ci_covers_published']}" if r["direction_reproduced"] != "n/a" or r["ci_covers_published"] != "n/a"
             else "")
    return (f"{r['figure']}: the study reported {num(r['published'])}{note}; hbench measures "
            f"{num(r['hbench'])}{ci}, {int(r['n'])} seeds, verdict {r['hbench_verdict']}{agree}.")
