"""The prefix-sharing structure of a workload, against the organizations' grids.

A hybrid cache can reuse a prefix only up to a checkpoint, and checkpoints
exist only on the organization's grid (every 512 tokens for S0/S1/S2, every
1792 for D0 with Falcon-H1's geometry). So what a workload offers a cache is
its *shareable prefixes*, and what an organization can take of them is each
prefix cut down to its last grid point.

For every request, the shareable prefix is the part of its prompt that an
earlier request has already sent, at best:

- the study's shape: the shared context (``prefix_tokens``) of a request whose
  context group was used by an earlier request, under SHARE; 0 otherwise;
- multi-turn: the whole previous turn (its prompt and its answer, at their
  planned lengths) for every turn after the first; 0 for first turns.

`sharing_structure` gives, per organization, the prompt share reusable at its
grid and the shareable tokens beyond its last grid point; `history_growth`
the mean planned prompt length by turn index. Both are pure functions. The
grids themselves (organization name -> grid tokens) are the caller's: they
come from the organizations' layouts (``hbench workload describe``), which
sit above the workloads.
"""

from __future__ import annotations

import numpy as np

from workloads.workload import Workload


def shareable_prefixes(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, shareable prefix tokens) per request, later turns included."""
    prompts, shared = [], []
    seen: set[int] = set()
    for r in w.requests:
        prompts.append(r.prompt_len)
        group = r.prefix_group
        shared.append(r.prefix_tokens if group >= 0 and group in seen and r.salt is None else 0)
        if group >= 0:
            seen.add(group)
    for s in w.sessions:
        first = w.requests[s.first_request]
        prev_prompt, prev_out = first.prompt_len, first.output_len
        for t in s.turns:
            prompts.append(t.prompt_len)
            shared.append(prev_prompt + prev_out)
            prev_prompt, prev_out = t.prompt_len, t.output_len
    return np.asarray(prompts, dtype=np.int64), np.asarray(shared, dtype=np.int64)


def sharing_structure(w: Workload, grids: dict[str, int]) -> dict:
    """Prompt tokens, best-case shareable share, and per organization (name ->
    grid tokens): the share reusable at its grid, the shareable tokens beyond
    its last grid point (total and per sharing request)."""
    prompts, shared = shareable_prefixes(w)
    total = int(prompts.sum())
    sharing = shared > 0
    out = {
        "requests": int(len(prompts)),
        "prompt_tokens": total,
        "sharing_requests": int(sharing.sum()),
        "shareable_tokens": int(shared.sum()),
        "shareable_fraction": float(shared.sum() / total) if total else float("nan"),
        "shareable_prefix_p50": float(np.median(shared[sharing])) if sharing.any() else 0.0,
        "orgs": {},
    }
    for org, grid in grids.items():
        at_grid = shared // grid * grid
        beyond = shared - at_grid
        out["orgs"][org] = {
            "grid_tokens": int(grid),
            "reusable_tokens": int(at_grid.sum()),
            "reusable_fraction": float(at_grid.sum() / total) if total else float("nan"),
            "beyond_grid_tokens": int(beyond.sum()),
            "beyond_grid_mean": float(beyond[sharing].mean()) if sharing.any() else 0.0,
            "below_one_grid": int((sharing & (at_grid == 0)).sum()),
        }
    return out


def history_growth(w: Workload) -> list[dict]:
    """Per turn index of a multi-turn workload: sessions reaching it and the
    mean planned prompt length (empty for a single-turn workload)."""
    if not w.sessions:
        return []
    by_turn: dict[int, list[int]] = {}
    history: dict[int, list[int]] = {}
    for s in w.sessions:
        by_turn.setdefault(0, []).append(w.requests[s.first_request].prompt_len)
        history.setdefault(0, []).append(0)
        for k, t in enumerate(s.turns, start=1):
            by_turn.setdefault(k, []).append(t.prompt_len)
            history.setdefault(k, []).append(_history_tokens(t))
    return [{"turn": k, "sessions": len(v), "prompt_mean": float(np.mean(v)),
             "prompt_max": int(max(v)), "history_mean": float(np.mean(history[k]))}
            for k, v in sorted(by_turn.items())]


def _history_tokens(t) -> int:
    """The part of a later turn's planned prompt that is the conversation so
    far (every earlier prompt and answer): reusable from the previous turn."""
    return int(t.prompt_len - len(t.user_token_ids))


def all_turns(w: Workload) -> dict | None:
    """Totals over every turn of a multi-turn workload (None for a single-turn
    one): the first turns are the open-loop requests, the later ones are made
    by the closed loop at run time, with their planned prompt lengths."""
    if not w.sessions:
        return None
    later = [t for s in w.sessions for t in s.turns]
    prompt = sum(r.prompt_len for r in w.requests) + sum(t.prompt_len for t in later)
    history = sum(_history_tokens(t) for t in later)
    return {"turns": len(w.requests) + len(later), "later_turns": len(later),
            "prompt_tokens": int(prompt),
            "output_tokens": int(sum(r.output_len for r in w.requests)
                                 + sum(t.output_len for t in later)),
            "history_tokens": int(history),
            "history_fraction": history / prompt if prompt else float("nan")}


def sharing_figure(summary: dict):
    """A matplotlib `Figure` of ``summary`` (`hbench.commands.workload.summarize`
    with grids): left, the prompt share reusable at best and at each
    organization's grid; right, the mean planned prompt length per turn
    (multi-turn) or the shareable tokens lost beyond the last grid point."""
    from matplotlib.figure import Figure

    from common.palette import org_color

    sh = summary["sharing"]
    orgs = list(sh["orgs"])
    # constrained layout keeps the long right-hand y label inside the canvas
    fig = Figure(figsize=(10, 4.0), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    labels = ["best case", *(f"{o} (grid {sh['orgs'][o]['grid_tokens']})" for o in orgs)]
    values = [sh["shareable_fraction"], *(sh["orgs"][o]["reusable_fraction"] for o in orgs)]
    ax.bar(range(len(values)), [100 * v for v in values], color=["#bab0ac"] + [org_color(o) for o in orgs])
    ax.set_xticks(range(len(values)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("prompt tokens reusable (%)")
    ax.set_title("reusable prefix, best case vs checkpoint grid", fontsize=9)
    growth = summary.get("history_growth") or []
    if growth:
        ax2.plot([g["turn"] for g in growth], [g["prompt_mean"] for g in growth], marker="o")
        ax2.set_xlabel("turn index")
        ax2.set_ylabel("mean prompt (tokens)")
        ax2.set_title("history growth per session", fontsize=9)
    else:
        ax2.bar(orgs, [sh["orgs"][o]["beyond_grid_mean"] for o in orgs], color=[org_color(o) for o in orgs])
        ax2.set_xlabel("organization")
        ax2.set_ylabel("shareable tokens beyond the last\ngrid point (tokens/request)")
        ax2.set_title("shared prefix the grid cannot reach", fontsize=9)
    return fig


def save_sharing_figure(summary: dict, path) -> None:
    """Write `sharing_figure` of ``summary`` to ``path`` (format from its suffix)."""
    from pathlib import Path

    from common.atomic import atomic_path

    with atomic_path(Path(path)) as tmp:
        sharing_figure(summary).savefig(tmp, dpi=120)
