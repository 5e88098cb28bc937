"""``hbench advise``'s search: organizations and their settings, as capacity
grids, bounded by a time budget, then the answer.

An **arm** is an organization with the settings that matter here: the
running cap and, for the organizations with two pools, D0's split of the
bytes. The search plans every arm before it runs one (`plan`), runs the
arms in order, each as one capacity grid (rates x seeds, `hbench.capacity.
search`: content-addressed sweep cells, so a repeated call reuses every
finished cell), and stops between arms once the time budget is spent, with
the best answer so far. The first arms are every organization at the first
cap and split, so an answer exists early. When the best arm is held back by
its running cap, the search then tries the two leading organizations (all
of them when they are level) at twice the cap, which says what a larger cap
would buy; when the best arm holds the SLO at the grid's top rate, the grid
is widened once (`EXTEND_RATES`).

`advise` returns an `Advice`: the arms' table, the decision and the limit
(`analysis.advise`), and what to deploy (`adapters.deploy`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.errors import HbenchError

#: Organizations with two pools, whose split of the bytes is a setting.
SPLIT_ORGS = ("d0", "e0")


@dataclass(frozen=True)
class Arm:
    """An organization with its settings."""

    org: str
    cap: int
    d0_attn_fraction: float | None = None   # None: the organization has one pool

    @property
    def label(self) -> str:
        split = "" if self.d0_attn_fraction is None else f" split {self.d0_attn_fraction:g}"
        return f"{self.org} cap {self.cap}{split}"

    def fields(self) -> dict:
        out = {"org": self.org, "cap": self.cap}
        if self.d0_attn_fraction is not None:
            out["d0_attn_fraction"] = self.d0_attn_fraction
        return out


@dataclass(frozen=True)
class Search:
    """What ``hbench advise`` was asked: the arms' axes, the grid and the SLO."""

    orgs: tuple[str, ...]
    caps: tuple[int, ...]
    fractions: tuple[float, ...]
    rates: tuple[float, ...]
    seeds: tuple[int, ...]
    limits: tuple
    base: dict                      # every run's other RunConfig fields (budget, model, gpu, ...)
    alpha: float = 0.05

    def arms(self) -> list[Arm]:
        """Every planned arm, the first cap and split of every organization first."""
        def splits(org):
            return self.fractions if org in SPLIT_ORGS else (None,)

        every = [Arm(org, cap, frac) for cap in self.caps for org in self.orgs
                 for frac in splits(org)]
        first = [a for a in every if a.cap == self.caps[0]
                 and a.d0_attn_fraction in (None, self.fractions[0])]
        return first + [a for a in every if a not in first]

    def grid(self, arm: Arm) -> tuple[list, list, list, list, dict]:
        """``arm``'s capacity grid as `hbench.capacity`'s arguments: orgs,
        budgets, rates, seeds and every run's other fields."""
        base = {**self.base, **arm.fields()}
        return [base.pop("org")], [base.pop("budget")], list(self.rates), list(self.seeds), base

    def configs(self, arm: Arm) -> list:
        from hbench.capacity import capacity_configs

        return capacity_configs(*self.grid(arm))


@dataclass
class Advice:
    """What the search found (`advise`)."""

    search: Search
    cells: object                               # pandas.DataFrame, one row per run
    table: object                               # analysis.advise.arm_table
    decision: object                            # analysis.advise.Decision
    limit: object                               # analysis.advise.LimitFound
    arms_run: list[Arm]
    arms_planned: list[Arm]
    stopped: str | None = None                  # why the search stopped early
    probe: dict = field(default_factory=dict)   # a larger cap's capacities, when tried
    deploy: list = field(default_factory=list)  # adapters.deploy.Deployment
    checks: list[str] = field(default_factory=list)
    #: (table, decision, limit) at the first cap, when the cap limited it and a
    #: larger one was tried
    first: tuple | None = None


def parse_duration(text: str | None) -> float | None:
    """``90s``, ``20m``, ``1.5h`` (or plain seconds) -> seconds; None stays None."""
    if text is None:
        return None
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    number = t[:-1] if scale else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise HbenchError(f"--time-budget {text!r}: give seconds, or a number with s, m or h "
                          "(e.g. 20m)") from None
    if not math.isfinite(value) or value <= 0:
        raise HbenchError(f"--time-budget must be > 0, got {text!r}")
    return value


def check(search: Search) -> None:
    """Every planned run passes the run's own checks before any work."""
    from hbench.runner import validate_run

    for arm in search.arms():
        for cfg in search.configs(arm):
            validate_run(cfg)


def pending_cells(search: Search, out: Path, arms: Sequence[Arm]) -> tuple[int, int]:
    """(cells to run, cells already finished under ``out``) of ``arms``."""
    from harness.results import is_done
    from hbench.sweep import plan

    cells = [c for arm in arms for c in plan(search.configs(arm))]
    done = sum(is_done(out / c.cell_id) for c in cells)
    return len(cells) - done, done


def seconds_per_cell(search: Search) -> float:
    """One cell of the plan (the first arm's lowest rate and first seed) run
    now in a scratch directory: what a cell costs on this machine."""
    import tempfile

    from hbench.runner import execute

    cfg = search.configs(search.arms()[0])[0]
    with tempfile.TemporaryDirectory(prefix="hbench-advise-") as tmp:
        start = time.perf_counter()
        execute(cfg, tmp)
        return time.perf_counter() - start


def _run_arm(search: Search, arm: Arm, out: Path, jobs: int):
    from hbench.capacity import search as capacity_search

    orgs, budgets, rates, seeds, base = search.grid(arm)
    cells = capacity_search(orgs, budgets, rates, seeds, search.limits, out, base, jobs=jobs)
    cells["arm"] = arm.label
    cells["cap"] = arm.cap
    cells["d0_attn_fraction"] = arm.d0_attn_fraction if arm.d0_attn_fraction is not None \
        else math.nan
    return cells


def _evaluate(search: Search, frames: dict):
    """(cells, arm table, decision, limit) over every arm run so far."""
    import pandas as pd

    from analysis import advise as A
    from harness.results import read_run

    cells = pd.concat(list(frames.values()), ignore_index=True)
    table = A.arm_table(cells, search.alpha)
    decision = A.decide(cells, table, search.alpha)
    limit = A.limit_found(cells, decision.best["arm"], search.limits,
                          lambda run_dir: read_run(Path(run_dir)).summary)
    return cells, table, decision, limit


def cap_probe_arms(table, done: Sequence[Arm]) -> list[Arm]:
    """The two leading organizations (every one, when all are level: none
    leads) at twice the best arm's cap, each with its best arm's split
    (those not run yet)."""
    from analysis.advise import all_level

    cap = int(table.iloc[0]["cap"]) * 2
    labels = {a.label for a in done}
    orgs = list(dict.fromkeys(table["org"]))
    arms = []
    for org in orgs if all_level(table) else orgs[:2]:
        frac = table[table["org"] == org].iloc[0].get("d0_attn_fraction")
        split = None if frac is None or math.isnan(float(frac)) else float(frac)
        arm = Arm(org, cap, split)
        if arm.label not in labels:
            arms.append(arm)
    return arms


#: When the best arm holds the SLO at the top rate, the grid is extended once
#: by these multiples of its top rate.
EXTEND_RATES = (1.5, 2.0, 3.0)


def advise(search: Search, out: Path, *, jobs: int = 1, time_budget_s: float | None = None,
           on_arm: Callable[[int, int, Arm], None] | None = None) -> Advice:
    """Run the plan (module docstring) under ``out`` and decide."""
    from adapters.deploy import check_commands, deployments

    start = time.monotonic()
    planned = search.arms()
    frames: dict = {}
    stopped = None
    steps = [0]

    def run_arms(current: Search, arms: Sequence[Arm], total: int) -> bool:
        """Run ``arms`` on ``current``'s grid; False once the time budget stops it."""
        nonlocal stopped
        for arm in arms:
            if frames and time_budget_s is not None and time.monotonic() - start >= time_budget_s:
                stopped = f"the time budget was spent after {steps[0]} arm grids of {total}"
                return False
            if on_arm:
                on_arm(steps[0], total, arm)
            frames[arm.label] = (arm, _run_arm(current, arm, out, jobs))
            steps[0] += 1
        return True

    def evaluate(current: Search):
        return _evaluate(current, {k: f for k, (_, f) in frames.items()})

    run_arms(search, planned, len(planned))
    cells, table, decision, limit = evaluate(search)
    first, probe = None, {}
    if limit.kind == "cap" and stopped is None:
        arms = cap_probe_arms(table, [a for a, _ in frames.values()])
        first = (table, decision, limit)
        if run_arms(search, arms, len(planned) + len(arms)) and arms:
            cells, table, decision, limit = evaluate(search)
            probe = {"cap": arms[0].cap, "arms": [a.label for a in arms]}
    if decision.at_top and stopped is None:
        top = max(search.rates)
        wider = replace(search, rates=tuple(search.rates) + tuple(top * m for m in EXTEND_RATES))
        arms, saved = [a for a, _ in frames.values()], dict(frames)
        if run_arms(wider, arms, steps[0] + len(arms)):
            search = wider
            cells, table, decision, limit = evaluate(search)
        else:                      # a half-widened grid would compare arms unevenly
            frames.clear()
            frames.update(saved)
    cfg = search.configs(frames[decision.best["arm"]][0])[0]   # typed as its runs were
    return Advice(search, cells, table, decision, limit, [a for a, _ in frames.values()],
                  planned, stopped, probe, deployments(cfg), check_commands(cfg), first)
