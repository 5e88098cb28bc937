"""Rendering evaluated contrasts: a rich terminal table, CSV, versioned JSON
and a Markdown report with the figure list.

Ratios are shown as signed percent effects, ``(ratio - 1) x 100``: the
geometric mean ratio with its log-scale t CI first (the estimate the p value
tests), the arithmetic mean ratio after it (the study's estimate, for
comparison). Interactions are in their own unit (pp for differences, % for
ratios of ratios). A row whose CI contains the null value says "not
significant" -- the report never presents it as a finding. Seeds only one arm
ran and values that form no ratio are listed under the tables, on the
terminal and in report.md alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from common import metric_labels
from common.atomic import atomic_path, atomic_write_text

JSON_SCHEMA_VERSION = 1


def fmt_pct(ratio: float) -> str:
    return "n/a" if _nan(ratio) else f"{(ratio - 1) * 100:+.2f}%"


def fmt_num(x: float, unit: str = "") -> str:
    return "n/a" if _nan(x) else f"{x:+.2f}{unit}"


def fmt_p(p: float) -> str:
    if _nan(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def fmt_value(x: float) -> str:
    if _nan(x):
        return "n/a"
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.1f}"


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _ci_pct(lo: float, hi: float) -> str:
    return "n/a" if _nan(lo) else f"[{fmt_pct(lo)}, {fmt_pct(hi)}]"


def _n(r) -> str:
    unpaired = [x for x in str(r.get("unpaired") or "").split(",") if x]
    return f"{r['n']}" + (f" (+{len(unpaired)} unpaired)" if unpaired else "")


def _mde(x) -> str:
    return "n/a" if _nan(x) else f"±{x:.2f}%"


def contrast_rows(df: pd.DataFrame) -> list[list[str]]:
    """Display cells of each contrast, shared by the terminal and Markdown tables."""
    return [
        [metric_labels.METRICS[r["family"]].label if r["family"] in metric_labels.METRICS else r["family"],
         r["name"], _n(r), fmt_value(r["mean_numerator"]), fmt_value(r["mean_denominator"]),
         fmt_pct(r["geo_mean_ratio"]), _ci_pct(r["ci_low"], r["ci_high"]), fmt_pct(r["mean_ratio"]),
         fmt_p(r["p"]), fmt_p(r["p_signflip"]), fmt_p(r["p_holm"]), _mde(r["mde_pct"]), r["verdict"]]
        for _, r in df.iterrows()
    ]


CONTRAST_HEADER = ["family", "contrast", "n", "mean num", "mean den", "effect (geo. mean)", "95% CI (log t)",
                   "arith. mean effect", "p (t, log)", "p sign-flip", "p Holm", "MDE (80% power)", "verdict"]
INTERACTION_HEADER = ["family", "interaction", "kind", "n", "effect", "95% CI (t)",
                      "95% CI (bootstrap, approx.)", "p", "p Holm", "verdict"]


def contrast_notes(df: pd.DataFrame) -> list[str]:
    """One line per contrast with unpaired seeds or values that form no ratio."""
    notes = []
    for _, r in df.iterrows():
        if str(r.get("unpaired") or ""):
            notes.append(f"{r['name']}: seeds {r['unpaired']} ran in one arm only and are not in the estimate")
        if str(r.get("invalid") or ""):
            notes.append(f"{r['name']}: no estimate, values form no ratio ({r['invalid']}); "
                         "it still counts in its Holm family")
        if str(r.get("arms_invalid") or ""):
            where = ("left out of its Holm family" if bool(r.get("excluded", False))
                     else "kept in its Holm family")
            notes.append(f"{r['name']}: arms not valid ({r['arms_invalid']}); {where}")
    return notes


def interaction_rows(df: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, r in df.iterrows():
        u = r["unit"]
        ci = "n/a" if _nan(r["effect_ci_low"]) else f"[{fmt_num(r['effect_ci_low'], u)}, {fmt_num(r['effect_ci_high'], u)}]"
        boot = "n/a" if _nan(r["boot_effect_low"]) else f"[{fmt_num(r['boot_effect_low'], u)}, {fmt_num(r['boot_effect_high'], u)}]"
        n = f"{r['n_a']}" if r["paired"] else f"{r['n_a']}+{r['n_b']}"
        rows.append([r["family"], r["name"], r["kind"] + ("" if r["paired"] else " (unpaired)"), n,
                     fmt_num(r["effect"], u), ci, boot, fmt_p(r["p"]), fmt_p(r["p_holm"]), r["verdict"]])
    return rows


def print_tables(console: Console, contrasts: pd.DataFrame, interactions: pd.DataFrame | None = None,
                 alpha: float = 0.05) -> None:
    """The contrast (and interaction) tables on the terminal, then the
    answers in words (`analysis.headlines`, as the reports say them)."""
    for title, header, rows in (
        ("contrasts (paired by seed, Holm within family)", CONTRAST_HEADER, contrast_rows(contrasts)),
        ("interactions", INTERACTION_HEADER,
         interaction_rows(interactions) if interactions is not None else []),
    ):
        if not rows:
            continue
        table = Table(title=title)
        for h in header:
            table.add_column(h, overflow="fold")
        for row in rows:
            style = "bold green" if row[-1] == "significant" else None
            # Text, not markup: names such as "s1/s0 [ttft_p99_s]" contain brackets.
            table.add_row(*(Text(c) for c in row), style=style)
        console.print(table)
    for note in contrast_notes(contrasts):
        console.print(Text(f"note: {note}"))
    if not contrasts.empty:       # the answers, worded as report.md and report.html word them
        from analysis.headlines import contrast_headlines, seeds_sentence

        for kind, sentence in contrast_headlines(contrasts, alpha):
            console.print(Text(sentence, style="bold" if kind == "sig" else ""))
        console.print(Text(seeds_sentence(contrasts)))


def _records(df: pd.DataFrame | None) -> list[dict]:
    """Rows as JSON values: NaN and infinities (an interval's bound past a
    float's range) become null."""
    if df is None:
        return []
    out = []
    for rec in df.to_dict(orient="records"):
        row = {}
        for k, v in rec.items():
            v = v.item() if hasattr(v, "item") else v
            row[k] = None if _nan(v) or (isinstance(v, float) and math.isinf(v)) else v
        out.append(row)
    return out


def to_json(contrasts: pd.DataFrame, interactions: pd.DataFrame | None = None,
            arms: pd.DataFrame | None = None, validity=None) -> str:
    """Versioned JSON document; NaN and infinities become null. ``validity`` (an
    `analysis.run_validity.RunValidity`) adds the runs that are not valid."""
    doc = {"schema_version": JSON_SCHEMA_VERSION, "contrasts": _records(contrasts),
           "interactions": _records(interactions), "arms": _records(arms)}
    if validity is not None:
        doc["validity"] = validity.as_dict()
    return json.dumps(doc, indent=2, allow_nan=False, default=str)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(s):
        return str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(root, contrasts: pd.DataFrame, interactions: pd.DataFrame | None,
                    arms: pd.DataFrame | None, figures: Sequence[Path], out_dir, validity=None,
                    alpha: float = 0.05, served: str | None = None) -> str:
    """The report.md text: the answers in words and what limits them (as
    report.html says them), arm means, contrasts, interactions, the runs
    that are not valid (from ``validity``), figures; ``served``: which
    engine, model and GPU the runs are (`headlines.served_by`)."""
    from analysis import headlines

    parts = [f"# hbench analysis of `{root}`", ""]
    if served:
        parts += [f"Runs: {served}.", ""]
    if not contrasts.empty:
        parts += ["## Answers", ""]
        parts += [f"- **{t}**" if kind == "sig" else f"- {t}"
                  for kind, t in headlines.contrast_headlines(contrasts, alpha)] + [""]
        limits = [headlines.validity_sentence(validity)] if validity is not None else []
        limits += [t for t in (headlines.seeds_sentence(contrasts),) if t]
        parts += ["What limits the answer:", ""] + [f"- {t}" for t in limits] + [""]
    elif validity is not None:
        parts += [headlines.validity_sentence(validity), ""]
    parts += ["Relative effects are geometric means of within-seed ratios with the back-transformed t CI of "
              "the mean log ratio (the arithmetic mean ratio is shown beside it for comparison with the "
              "study); p is a t test on the log ratios, Holm-adjusted within each family, with the exact "
              "sign-flip permutation p beside it; MDE is the smallest change the t test detects with 80% "
              "power at this spread and seed count. A result is significant only when p Holm < alpha and "
              "its 95% CI excludes the null (ratio 1, difference 0 pp). Definitions: docs/statistics.md.", ""]
    if arms is not None and not arms.empty:
        parts += ["## Arms (mean over seeds)", ""]
        cols = [c for c in arms.columns if not c.endswith(("_ci_low", "_ci_high"))]
        parts += [markdown_table([metric_labels.label(c) if c in metric_labels.METRICS else c for c in cols],
                                 [[fmt_value(v) if isinstance(v, float) else str(v) for v in r]
                                        for r in arms[cols].itertuples(index=False)]), ""]
    parts += ["## Contrasts", ""]
    if contrasts.empty:
        parts += ["No contrasts: every design cell holds a single organization.", ""]
    else:
        parts += [markdown_table(CONTRAST_HEADER, contrast_rows(contrasts)), ""]
        sig = contrasts[contrasts["significant"]]
        parts += [f"{len(sig)} of {len(contrasts)} contrasts significant.", ""]
        notes = contrast_notes(contrasts)
        if notes:
            parts += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    if interactions is not None and not interactions.empty:
        parts += ["## Interactions", "", markdown_table(INTERACTION_HEADER, interaction_rows(interactions)), ""]
    if validity is not None and validity.invalid:
        fate = "kept in" if validity.include_invalid else "left out of"
        parts += ["## Runs not valid", "", f"{len(validity.invalid)} runs, {fate} the Holm families:", ""]
        parts += [f"- {x}" for x in validity.invalid] + [""]
    if figures:
        parts += ["## Figures", ""]
        out_dir = Path(out_dir)
        for p in figures:
            if p.suffix == ".png":
                rel = p.relative_to(out_dir) if p.is_relative_to(out_dir) else p
                parts.append(f"- [{p.stem}]({rel}) ![{p.stem}]({rel})")
        parts.append("")
    return "\n".join(parts)


def write_outputs(out_dir, root, contrasts: pd.DataFrame, interactions: pd.DataFrame | None,
                  arms: pd.DataFrame | None, figures: Sequence[Path], validity=None,
                  served: str | None = None) -> list[Path]:
    """contrasts.csv (+ interactions.csv), contrasts.json and report.md under
    ``out_dir`` (``validity``: `analysis.run_validity.RunValidity` of the runs)."""
    out = Path(out_dir)
    written = [out / "contrasts.csv", out / "contrasts.json", out / "report.md"]
    with atomic_path(written[0]) as tmp:
        contrasts.to_csv(tmp, index=False)
    atomic_write_text(written[1], to_json(contrasts, interactions, arms, validity))
    atomic_write_text(written[2], markdown_report(root, contrasts, interactions, arms, figures, out, validity,
                                                      served=served))
    if interactions is not None and not interactions.empty:
        with atomic_path(out / "interactions.csv") as tmp:
            interactions.to_csv(tmp, index=False)
        written.append(out / "interactions.csv")
    return written
