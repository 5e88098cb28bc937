"""What a probe's findings mean, and why each replayed request reused less than it could share.

Pure functions over the probe's findings (a dict, `Findings.as_dict`) and the
replay's rows (`adapters.client.probe_replay.replay_rows`). A request's
**shortfall** is ``shareable - reused`` tokens. The server's grid is the
probe's reuse unit: reusable positions ``smallest + j x step``; ``g(n)`` is
the deepest of them at or below n. A shortfall gets one reason, checked in
this order, in `hbench explain`'s words where it has them
(`analysis.explain.REASONS`):

``cache_off``           the probe found no prefix caching at all;
``isolate``             the request's cache salt differs from its sharer's;
``shorter_than_block``  the shared prefix is shorter than the smallest reusable prefix;
``rounded_to_unit``     it reused g(shareable): only the tail past the last
                        reusable position is lost;
``no_grid_position``    the server kept no state inside the sharer's prompt (the
                        probe's shared-prefix-other-continuation pair reused
                        nothing), and it reused all the sharer's prompt end
                        allowed: no checkpoint lies inside the shared part;
``producer_computing``  its sharer had not produced its first token when it was sent;
``evicted_after_reuse`` / ``evicted_before_reuse``  otherwise: the prefix was
                        gone, after or before an earlier request reused it.
"""

from __future__ import annotations

import html
from collections import Counter

from analysis.explain import REASONS

PROBE_REASONS = {
    "cache_off": "prefix caching is off on the server",
    "isolate": "a cache salt: the request's salt differs from its sharer's",
    "shorter_than_block": REASONS["shorter_than_block"] + " (the reuse unit)",
    "rounded_to_unit": "the shared prefix ends inside a block: reuse stops at the block boundary below it",
    "no_grid_position": REASONS["no_grid_position"]
    + " (the server kept no state inside the sharer's prompt)",
    "producer_computing": REASONS["producer_computing"],
    "evicted_before_reuse": "evicted before reuse",
    "evicted_after_reuse": "evicted after earlier reuse",
}


def grid_floor(n: int, findings: dict) -> int:
    """The deepest reusable position at or below ``n`` (0 when none)."""
    m, step = findings.get("smallest"), findings.get("step")
    if not m or n < m:
        return 0
    if not step:
        return m
    return m + ((n - m) // step) * step


def ends_only(findings: dict) -> bool:
    """The server kept no state inside an earlier prompt (its branch pair reused nothing)."""
    return findings.get("branch_reused") == 0


def reason(row: dict, findings: dict, reused_before: bool) -> str:
    """The reason for ``row``'s shortfall ("" when it has none or reuse is unknown)."""
    s, r = row["shareable"], row["reused"]
    if r is None or s <= 0 or r >= s:
        return ""
    if findings.get("cache_on") is False:
        return "cache_off"
    if row["salt_differs"]:
        return "isolate"
    if findings.get("smallest") and s < findings["smallest"]:
        return "shorter_than_block"
    target = grid_floor(s, findings)
    if r >= target:
        return "rounded_to_unit"
    if ends_only(findings) and row.get("sharer_prompt"):
        end = grid_floor(row["sharer_prompt"] - 1, findings)
        reachable = end if end <= s else 0
        if r >= reachable:
            return "no_grid_position"
    if not row["sharer_started"]:
        return "producer_computing"
    return "evicted_after_reuse" if reused_before else "evicted_before_reuse"


def verdict(rows: list[dict], findings: dict, metrics_reused: int | None = None) -> dict:
    """Per-request reasons, totals by reason (requests and tokens lost) and one sentence.

    ``metrics_reused`` is how far the server's hit counter rose during the
    replay (None without one): the total when no request's own count is known.
    """
    out, reused_groups = [], set()
    for row in sorted(rows, key=lambda r: r["request_id"]):
        root = row["sharer"]
        why = reason(row, findings, root in reused_groups)
        if row["reused"] and row["reused"] > 0 and root is not None:
            reused_groups.add(root)
            reused_groups.add(row["request_id"])
        out.append({**row, "shortfall": max(0, row["shareable"] - (row["reused"] or 0))
                    if row["reused"] is not None else None, "reason": why})
    lost = Counter()
    n = Counter()
    for row in out:
        if row["reason"]:
            lost[row["reason"]] += row["shortfall"]
            n[row["reason"]] += 1
    known = [r for r in out if r["reused"] is not None]
    totals = {"requests": len(out), "shareable": sum(r["shareable"] for r in out),
              "reused": sum(r["reused"] for r in known),
              "estimated": any(r["estimated"] for r in known) or len(known) < len(out),
              "unknown": len(out) - len(known), "metrics_reused": metrics_reused,
              "failed": sum(1 for r in out if r["status"] != "finished")}
    by_reason = {k: {"requests": n[k], "tokens": lost[k], "words": PROBE_REASONS[k]}
                 for k in PROBE_REASONS if n[k]}
    return {"requests": out, "totals": totals, "by_reason": by_reason,
            "advice": advice(by_reason, totals, findings)}


def advice(by_reason: dict, totals: dict, findings: dict) -> str:
    """One sentence: what to change, for the reason that lost the most tokens."""
    if totals["shareable"] == 0:
        return "No request of the workload shares a prefix with an earlier one: nothing to reuse."
    if totals["unknown"] == totals["requests"]:
        counted = totals["metrics_reused"]
        return ("The server reports no request's own reuse and the probe has no prefill fit, so "
                "no shortfall can be attributed"
                + ("." if counted is None else f"; its hit counter rose by {counted} tokens "
                   f"against {totals['shareable']} shareable."))
    if not by_reason:
        return (f"The server reused all {totals['reused']} of the {totals['shareable']} "
                "shareable tokens: nothing to change.")
    top = max(by_reason, key=lambda k: by_reason[k]["tokens"])
    m, step = findings.get("smallest"), findings.get("step") or findings.get("smallest")
    text = {
        "cache_off": "Start the server with prefix caching on (vLLM: --enable-prefix-caching).",
        "isolate": "Give requests that may share a prefix the same cache salt (or none).",
        "shorter_than_block": f"Make the shared prefix longer than the server's reuse unit "
                              f"({m} tokens), or serve with a smaller block.",
        "rounded_to_unit": f"Align shared prefixes to multiples of the {step}-token reuse unit; "
                           "only the tail past the last boundary is recomputed.",
        "no_grid_position": "Send the shared prefix once as a prompt of its own before the "
                            "requests that continue it (the server keeps a state where a "
                            "prompt ends), or serve with an engine that checkpoints inside prompts.",
        "producer_computing": "Let the first request of a shared prefix finish its prefill before "
                              "the others arrive (warm the prefix first).",
        "evicted_before_reuse": "Give the server more cache memory or reuse prefixes sooner: "
                                "they were evicted before reuse.",
        "evicted_after_reuse": "Give the server more cache memory or reuse prefixes sooner: "
                               "they were evicted between reuses.",
    }[top]
    return (f"Most of the {sum(v['tokens'] for v in by_reason.values())} tokens not reused "
            f"({by_reason[top]['tokens']}) were lost to: {by_reason[top]['words']}. {text}")


def summary_lines(f: dict) -> list[tuple[str, str]]:
    """(question, answer) pairs for the findings table."""
    lines = [("evidence", f"{f['evidence'] or '-'} ({f['confidence'] or '-'}: "
                          f"{f['confidence_why'] or '-'})")]
    if f["cache_on"] is None:
        lines.append(("prefix caching", "not determined"))
    elif not f["cache_on"]:
        lines.append(("prefix caching", f"OFF: {f['cache_off_reason']}"))
    else:
        lines.append(("prefix caching", f"on: a {f['probe_len']}-token prefix reused "
                                        f"{f['reused_at_top']} tokens"))
    if f["smallest"] is not None:
        lines.append(("smallest reusable prefix", f"{f['smallest']} tokens (the shortest prompt "
                                                  f"that left it: {f['shortest_hit_len']})"))
    if f["step"] is not None:
        lines.append(("step between reusable lengths", f"{f['step']} tokens"))
    if f["stops_inside_block"] is not None:
        lines.append(("a hit can stop inside a block", "yes" if f["stops_inside_block"] else "no"))
    if f["branch_reused"] is not None:
        lines.append(("prefix inside an earlier prompt",
                      f"{f['branch_reused']} of {f['branch_prefix']} shared tokens reused by "
                      "the second prompt to share them"
                      + (": no state inside the first prompt" if f["branch_reused"] == 0
                         else "")))
    if f.get("branch_reused_third") is not None:
        lines.append(("the same prefix, a third prompt",
                      f"{f['branch_reused_third']} of {f['branch_prefix']} shared tokens reused: "
                      f"{f['branch_meaning']}"))
    if f["history_reused"] is not None:
        lines.append(("own history between turns",
                      f"{f['history_reused']} of {f['history_prompt'] + f['history_generated']} "
                      f"tokens reused (prompt {f['history_prompt']} + "
                      f"{f['history_generated']} generated)"))
    if f["survived_fillers"] is not None or f["evicted_by_fillers"] is not None:
        load = f"filler requests of {f['filler_tokens']} fresh tokens, one after another"
        if f["evicted_by_fillers"] is not None:
            if f["evicted_by_fillers"] == 0:
                text = "not reusable even with no filler in between"
            else:
                text = (f"survived {f['survived_fillers']}, evicted by {f['evicted_by_fillers']} "
                        f"{load}")
        else:
            text = f"survived at least {f['survived_fillers']} {load}"
        lines.append(("cached prefix survival", text))
    if f["server_block_size"] is not None:
        lines.append(("server's resolved block (cache_config_info)", f"{f['server_block_size']} tokens"))
    lines.append(("probe cost", f"{f['requests']} requests, {f['seconds']} s, seed {f['seed']}"
                                + (f" ({f['budget_spent']})" if f["budget_spent"] else "")))
    for note in f["notes"]:
        lines.append(("note", note))
    return lines


def html_section(report: dict) -> str:
    """The probe as one self-contained HTML section (tables only, no scripts)."""
    from analysis.html_sections import table_html

    f = report["findings"]
    parts = [f"<h2>Probe of {html.escape(str(report['endpoint']))} "
             f"({html.escape(str(f['model']))})</h2>",
             table_html(["question", "answer"], summary_lines(f))]
    pairs = [[p["what"], p["prefix"], p["warm_tail"], p["fillers"], p["prompt"], p["reused"],
              p["ttft_ms"]] for p in f["pairs"]]
    parts.append(table_html(["pair", "prefix", "warm tail", "fillers", "probe prompt", "reused",
                             "TTFT ms"], pairs))
    rep = report.get("replay")
    if rep:
        t = rep["totals"]
        parts.append(f"<h3>Workload replay: {html.escape(str(report.get('workload')))}</h3>")
        parts.append(f"<p>{t['requests']} requests; shareable {t['shareable']} tokens, reused "
                     f"{t['reused']}{' (estimated)' if t['estimated'] else ''}"
                     + ("" if t["metrics_reused"] is None
                        else f"; the server's hit counter rose by {t['metrics_reused']}")
                     + ".</p>")
        parts.append(table_html(["reason", "requests", "tokens not reused"],
                                [[v["words"], v["requests"], v["tokens"]]
                                 for v in rep["by_reason"].values()]))
        parts.append(f"<p>{html.escape(rep['advice'])}</p>")
        parts.append(table_html(
            ["request", "session", "turn", "prompt", "shareable", "reused", "reason"],
            [[r["request_id"], r["session"], r["turn"], r["prompt_tokens"], r["shareable"],
              r["reused"], PROBE_REASONS.get(r["reason"], "")] for r in rep["requests"]]))
    return "".join(parts)


def html_page(report: dict) -> str:
    from analysis.html_report import STYLE

    title = f"hbench probe: {html.escape(str(report['endpoint']))}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style></head><body>{html_section(report)}</body></html>\n")
