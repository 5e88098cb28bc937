"""Why did a shared prefix not get reused? Hybrid prefix-cache diagnostics of one run.

A request that shares a context (``prefix_group`` >= 0) can reuse it up to
the **target**: the deepest checkpoint grid position J within the shared part
(J <= shared tokens, J < prompt tokens, J a multiple of the organization's
grid). Reuse needs attention for [0, J) *and* a checkpoint at exactly J
(DESIGN.md section 1). A request whose reuse (J_adopt at first admission) is
short of its target, or whose target is 0, gets one reason, checked in
this order:

``isolate``           the run gives every request its own cache salt (ISOLATE);
``shorter_than_block``  the shared part is shorter than one attention block;
``no_grid_position``  no checkpoint grid position lies within the shared part
                      (the grid is coarser than the prefix, e.g. D0's 1792);
``first_of_group``    no earlier request of its group existed to compute it;
``producer_computing``  every earlier request of its group was still before its
                      first token when this one was admitted: nothing published yet;
``checkpoint_evicted``  attention up to the target survived, the checkpoint did
                      not (R_max < J <= attention depth);
``attention_evicted`` the checkpoint survived, attention did not
                      (J <= R_max, attention depth < J);
``evicted_before_reuse``  both halves gone, and no earlier request of the group
                      had reused the prefix;
``evicted_after_reuse``   both halves gone after someone had reused it;
``other``             anything else (J_adopt short with both halves reported).

`diagnose` works on the tables; `explain_run` reads a run directory (the
grid and block from its engine info, the shared length from its workload).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from common.errors import HbenchError
from harness.results import read_run

REASONS = {
    "isolate": "ISOLATE: every request has its own cache salt",
    "shorter_than_block": "the shared prefix is shorter than one attention block",
    "no_grid_position": "no checkpoint at any grid position within the shared prefix",
    "first_of_group": "first request of its prefix group (nothing to reuse yet)",
    "producer_computing": "the earlier requests of its group were still computing the prefix",
    "checkpoint_evicted": "checkpoint evicted while attention survived (R_max < target <= attention)",
    "attention_evicted": "attention evicted while the checkpoint survived (target <= R_max)",
    "evicted_before_reuse": "both halves evicted before anyone reused the prefix",
    "evicted_after_reuse": "both halves evicted after earlier reuse",
    "other": "other",
}


def _first_admission(steps: pd.DataFrame) -> dict[int, float]:
    out: dict[int, float] = {}
    if "admitted_ids" not in steps.columns:
        return out
    for t, ids in zip(steps["start_s"].tolist(), steps["admitted_ids"].tolist(), strict=True):
        if ids:
            for rid in str(ids).split(","):
                out.setdefault(int(rid), float(t))
    return out


def diagnose(requests: pd.DataFrame, steps: pd.DataFrame, *, shared_tokens: int, grid: int,
             block: int, isolate: bool) -> pd.DataFrame:
    """One row per measured request that shares a prefix: ``target``,
    ``j_adopt``, ``reused_all`` and ``reason`` ("" when it reused all of its
    target)."""
    admitted = _first_admission(steps)
    reqs = requests.sort_values(["arrival_s", "request_id"])
    shared = reqs[reqs["prefix_group"] >= 0]
    rows = []
    for group, g in shared.groupby("prefix_group", sort=False):
        earlier: list = []            # (first token time, reused its target)
        for r in g.itertuples(index=False):
            target = min(shared_tokens, int(r.prompt_tokens) - 1) // grid * grid
            reached = int(r.j_adopt) >= target > 0
            if not r.warmup:
                reason = "" if reached else _reason(r, target, shared_tokens, block, isolate, earlier,
                                                    admitted.get(int(r.request_id), float(r.arrival_s)))
                rows.append({"request_id": int(r.request_id), "prefix_group": int(group),
                             "target": target, "j_adopt": int(r.j_adopt), "r_max": int(r.r_max),
                             "attn_depth": int(r.attn_depth), "reused_all": reached, "reason": reason})
            first = float(r.first_token_s) if not np.isnan(r.first_token_s) else np.inf
            earlier.append((first, reached))
    cols = ["request_id", "prefix_group", "target", "j_adopt", "r_max", "attn_depth", "reused_all", "reason"]
    return pd.DataFrame(rows, columns=cols).sort_values("request_id").reset_index(drop=True)


def _reason(r, target: int, shared_tokens: int, block: int, isolate: bool, earlier, admitted_s) -> str:
    if isolate:
        return "isolate"
    if shared_tokens < block:
        return "shorter_than_block"
    if target <= 0:
        return "no_grid_position"
    if not earlier:
        return "first_of_group"
    if all(first > admitted_s for first, _ in earlier):
        return "producer_computing"
    attn, rmax = int(r.attn_depth), int(r.r_max)
    if attn >= target > rmax:
        return "checkpoint_evicted"
    if rmax >= target > attn:
        return "attention_evicted"
    if attn < target and rmax < target:
        return "evicted_after_reuse" if any(reused for _, reused in earlier) else "evicted_before_reuse"
    return "other"


def answer(diag: pd.DataFrame, *, org: str, shared_tokens: int, grid: int, block: int) -> str:
    """A short text answer: how many shared requests missed, and the main reason in words."""
    n = len(diag)
    if n == 0:
        return "No measured request shares a prefix (q = 0 or no shared contexts): nothing to explain."
    missed = diag[diag["reason"] != ""]
    if missed.empty:
        return f"All {n} requests that share a prefix reused it up to their deepest grid position."
    counts = Counter(missed["reason"])
    top, k = counts.most_common(1)[0]
    text = (f"{len(missed)} of {n} requests that share a prefix did not reuse all of it; "
            f"most often ({k}): {REASONS[top]}.")
    if top == "no_grid_position":
        text += (f" The shared prefix is {shared_tokens} tokens and {org.upper()} keeps checkpoints "
                 f"every {grid} tokens, so no checkpoint can lie inside it: a finer grid or a longer "
                 "shared prefix would let it be reused.")
    elif top == "shorter_than_block":
        text += f" The shared prefix is {shared_tokens} tokens, an attention block {block}."
    elif top == "checkpoint_evicted":
        more = "a smaller --d0-attn-fraction" if org.lower() == "d0" else "a larger budget"
        text += (" Attention up to the target survived but the deepest checkpoint left (R_max) "
                 "lies below it, so reuse stopped at R_max: checkpoints were evicted first. "
                 f"Retention (keeping published checkpoints) or more checkpoint memory ({more}) "
                 "would raise R_max to the target.")
    elif top == "attention_evicted":
        more = "a larger --d0-attn-fraction" if org.lower() == "d0" else "a larger budget"
        text += (" A checkpoint at the target survived but the attention before it did not "
                 f"(attention depth below the target): more attention memory ({more}) would "
                 "let the checkpoint be used.")
    elif top == "first_of_group":
        text += " These are cold misses: the first request of each group computes what the others reuse."
    elif top == "producer_computing":
        text += (" The prefix was requested again before its first request had finished computing it "
                 "(arrivals close together).")
    return text


def explain_run(run_dir: Path) -> dict:
    """The diagnosis of one run directory as a JSON-ready dict (``hbench explain``
    and the HTML report); HbenchError when its manifest lacks the grid, the
    attention block or the shared-context length."""
    run = read_run(run_dir)
    info = run.manifest.get("engine_info") or {}
    grid, block = info.get("grid_tokens"), info.get("attn_block_tokens")
    shared = (run.manifest.get("workload_meta") or {}).get("context_tokens")
    if grid is None or block is None or shared is None:
        raise HbenchError(f"{run_dir}: the manifest records no checkpoint grid, attention block or "
                          "shared-context length; hbench explain needs a run written by hbench's "
                          "simulator on a derived workload")
    diag = diagnose(run.table("requests"), run.table("steps"), shared_tokens=int(shared),
                    grid=int(grid), block=int(block), isolate=bool(run.config.get("isolate")))
    counts = Counter(r for r in diag["reason"] if r)
    return {
        "run": str(run.path), "org": run.config.get("org"), "grid_tokens": grid,
        "attn_block_tokens": block, "shared_prefix_tokens": shared,
        "shared_requests": len(diag), "reused_all": int(diag["reused_all"].sum()),
        "counts": {k: counts[k] for k in REASONS if counts[k]},
        "answer": answer(diag, org=str(run.config.get("org")), shared_tokens=int(shared),
                         grid=int(grid), block=int(block)),
    }
