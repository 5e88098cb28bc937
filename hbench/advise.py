"""``hbench advise``'s search: organizations and their settings, as capacity
grids, bounded by a time budget, then the answer.

An **arm** is an organization with the settings that matter here: the
running cap, the admission headroom, the checkpoint policy and, for the
organizations with two pools, D0's split of the bytes. The search plans every arm before it runs one (`plan`), runs the
arms in order, each as one capacity grid (rates x seeds, `hbench.capacity.
search`: content-addressed sweep cells, so a repeated call reuses every
finished cell), and stops between arms once the time budget is spent, with
the best answer so far. The first arms are every organization at the first
cap and split, so an answer exists early. When the best arm is held back by
its running cap, the search then tries the two leading organizations (all
of them when they are level) at twice the cap, which says what a larger cap
would buy; when the best arm holds the SLO at the grid's top rate, the grid
is widened once (`EXTEND_RATES`). When every organization is level at the
best arm's cap, they run again on a half, then a quarter of the memory
(`SMALLER_BUDGETS`) until they differ: what would make the layout matter.
Given one rate (``Search.at_rate``: the
user's traffic), each arm runs at that rate only and the answer compares
what the arms serve there (`analysis.advise.decide_point`), as the study's
designs compare organizations at a working point.

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
    """An organization with its settings; a setting left None is every run's
    own (``Search.base``)."""

    org: str
    cap: int
    d0_attn_fraction: float | None = None   # None: the organization has one pool
    headroom: float | None = None
    ckpt: str | None = None                 # "PUBLISH/EVICT", `parse_ckpt_policy`

    @property
    def label(self) -> str:
        split = "" if self.d0_attn_fraction is None else f" split {self.d0_attn_fraction:g}"
        headroom = "" if self.headroom is None else f" f {self.headroom:g}"
        ckpt = "" if self.ckpt is None else f" ckpt {self.ckpt}"
        return f"{self.org} cap {self.cap}{split}{headroom}{ckpt}"

    def fields(self) -> dict:
        out = {"org": self.org, "cap": self.cap}
        if self.d0_attn_fraction is not None:
            out["d0_attn_fraction"] = self.d0_attn_fraction
        if self.headroom is not None:
            out["headroom"] = self.headroom
        if self.ckpt is not None:
            out["ckpt_publish"], out["ckpt_evict"] = self.ckpt.split("/")
        return out


def parse_ckpt_policy(text: str) -> str:
    """``PUBLISH[/EVICT]`` (``marconi``, ``every/utility``) -> ``PUBLISH/EVICT``
    with the default eviction (lru) filled in; unknown names are refused."""
    from harness.orgs.evict_policy import EVICT_POLICIES
    from harness.orgs.publish_policy import PUBLISH_POLICIES

    publish, _, evict = text.strip().partition("/")
    evict = evict or "lru"
    if publish not in PUBLISH_POLICIES or evict not in EVICT_POLICIES:
        raise HbenchError(f"--ckpt-policies {text!r}: give PUBLISH[/EVICT], PUBLISH one of "
                          f"{', '.join(PUBLISH_POLICIES)}, EVICT one of {', '.join(EVICT_POLICIES)}")
    return f"{publish}/{evict}"


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
    headrooms: tuple[float | None, ...] = (None,)   # None: every run's own (base)
    ckpts: tuple[str | None, ...] = (None,)
    at_rate: float | None = None    # one rate: compare the arms there (module docstring)
    #: each planned run's checked setup by config digest (`setup`)
    _setups: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def setup(self, cfg):
        """``cfg``'s `harness.run_setup.RunSetup`, checked by the run's own checks
        (`hbench.runner.validate_run`) once per search: the up-front check, the
        smaller-budget probe and the sweep all use it."""
        key = cfg.digest()
        if key not in self._setups:
            from hbench.runner import validate_run

            self._setups[key] = validate_run(cfg)
        return self._setups[key]

    def arms(self) -> list[Arm]:
        """Every planned arm, the first setting of each axis for every
        organization first (so an answer exists early)."""
        def splits(org):
            return self.fractions if org in SPLIT_ORGS else (None,)

        every = [Arm(org, cap, frac, headroom, ckpt) for cap in self.caps
                 for headroom in self.headrooms for ckpt in self.ckpts for org in self.orgs
                 for frac in splits(org)]
        first = [a for a in every if a.cap == self.caps[0] and a.headroom == self.headrooms[0]
                 and a.ckpt == self.ckpts[0] and a.d0_attn_fraction in (None, self.fractions[0])]
        return first + [a for a in every if a not in first]

    @property
    def grid_rates(self) -> tuple[float, ...]:
        return (self.at_rate,) if self.at_rate is not None else tuple(self.rates)

    def grid(self, arm: Arm) -> tuple[list, list, list, list, dict]:
        """``arm``'s capacity grid as `hbench.capacity`'s arguments: orgs,
        budgets, rates, seeds and every run's other fields."""
        base = {**self.base, **arm.fields()}
        return [base.pop("org")], [base.pop("budget")], list(self.grid_rates), \
            list(self.seeds), base

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
    #: when every organization was level: the same arms on less memory
    #: (`_budget_probe`)
    smaller: dict | None = None


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
    for arm in search.arms():
        for cfg in search.configs(arm):
            search.setup(cfg)


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
    from analysis.advise import POINT_METRIC
    from hbench.capacity import search as capacity_search

    orgs, budgets, rates, seeds, base = search.grid(arm)
    configs = search.configs(arm)
    cells = capacity_search(orgs, budgets, rates, seeds, search.limits, out, base, jobs=jobs,
                            setups=[search.setup(c) for c in configs])
    cfg = configs[0]            # the settings every run of the arm has
    cells["arm"] = arm.label
    cells["cap"] = arm.cap
    cells["d0_attn_fraction"] = arm.d0_attn_fraction if arm.d0_attn_fraction is not None \
        else math.nan
    cells["headroom"] = float(cfg.headroom)
    cells["ckpt"] = f"{cfg.ckpt_publish}/{cfg.ckpt_evict}"
    if search.at_rate is not None:
        from harness.results import read_run

        cells[POINT_METRIC] = [read_run(Path(d)).summary.get(POINT_METRIC)
                               for d in cells["run_dir"]]
    return cells


def _evaluate(search: Search, frames: dict):
    """(cells, arm table, decision, limit) over every arm run so far: capacities
    on a rate grid, or the arms compared at ``search.at_rate``."""
    import pandas as pd

    from analysis import advise as A
    from harness.results import read_run

    def summary_of(run_dir):
        return read_run(Path(run_dir)).summary

    cells = pd.concat(list(frames.values()), ignore_index=True)
    if search.at_rate is not None:
        metric, higher = A.point_metric(cells, search.limits)
        table = A.point_table(cells, metric, higher)
        decision = A.decide_point(cells, table, higher, search.alpha)
        limit = A.limit_at_point(cells, decision.best["arm"], search.limits, summary_of)
        return cells, table, decision, limit
    table = A.arm_table(cells, search.alpha)
    decision = A.decide(cells, table, search.alpha)
    limit = A.limit_found(cells, decision.best["arm"], search.limits, summary_of)
    return cells, table, decision, limit


def best_config(search: Search, arms: Sequence[Arm], decision):
    """The best arm's first run's `RunConfig` among ``arms`` (typed as its runs were)."""
    arm = next(a for a in arms if a.label == decision.best["arm"])
    return search.configs(arm)[0]


def cap_probe_arms(table, done: Sequence[Arm]) -> list[Arm]:
    """The two leading organizations (every one, when all are level: none
    leads) at twice the best arm's cap, each with its best arm's other
    settings (those not run yet)."""
    from analysis.advise import all_level

    cap = int(table.iloc[0]["cap"]) * 2
    by_label = {a.label: a for a in done}
    orgs = list(dict.fromkeys(table["org"]))
    arms = []
    for org in orgs if all_level(table) else orgs[:2]:
        arm = replace(by_label[table[table["org"] == org].iloc[0]["arm"]], cap=cap)
        if arm.label not in by_label:
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

    def run_arms(current: Search, arms: Sequence[Arm], total: int, into: dict | None = None) -> bool:
        """Run ``arms`` on ``current``'s grid into ``into`` (the main frames
        unless given); False once the time budget stops it."""
        nonlocal stopped
        into = frames if into is None else into
        for arm in arms:
            if frames and time_budget_s is not None and time.monotonic() - start >= time_budget_s:
                stopped = f"the time budget was spent after {steps[0]} arm grids of {total}"
                return False
            if on_arm:
                on_arm(steps[0], total, arm)
            into[arm.label] = (arm, _run_arm(current, arm, out, jobs))
            steps[0] += 1
        return True

    def evaluate(current: Search):
        return _evaluate(current, {k: f for k, (_, f) in frames.items()})

    run_arms(search, planned, len(planned))
    cells, table, decision, limit = evaluate(search)
    first, probe = None, {}
    point = search.at_rate is not None      # one rate: no cap probe, no wider grid
    if limit.kind == "cap" and stopped is None and not point:
        arms = cap_probe_arms(table, [a for a, _ in frames.values()])
        first = (table, decision, limit)
        if run_arms(search, arms, len(planned) + len(arms)) and arms:
            cells, table, decision, limit = evaluate(search)
            probe = {"cap": arms[0].cap, "arms": [a.label for a in arms]}
    if not point and decision.at_top and stopped is None:
        top = max(search.rates)
        wider = replace(search, rates=tuple(search.rates) + tuple(top * m for m in EXTEND_RATES))
        arms, saved = [a for a, _ in frames.values()], dict(frames)
        if run_arms(wider, arms, steps[0] + len(arms)):
            search = wider
            cells, table, decision, limit = evaluate(search)
        else:                      # a half-widened grid would compare arms unevenly
            frames.clear()
            frames.update(saved)
    smaller = None
    if not point and stopped is None and level_at_best_cap(table, decision):
        smaller = _budget_probe(search, table, decision, frames, cells,
                                lambda s, arms, into: run_arms(s, arms, steps[0] + len(arms), into))
    cfg = best_config(search, [a for a, _ in frames.values()], decision)
    return Advice(search, cells, table, decision, limit, [a for a, _ in frames.values()],
                  planned, stopped, probe, deployments(cfg), check_commands(cfg), first,
                  smaller)


def _refusal(search: Search, arms: Sequence[Arm]) -> str | None:
    """Why some run of ``arms`` at ``search``'s lowest rate cannot be served
    (the run's own checks, then its longest request alone on an empty
    organization, as an engine checks before its first step), or None."""
    from adapters.sim.engine import SimEngine
    from harness.engine.fits import check_fits
    from harness.run_workload import build_run_workload

    lowest = min(search.grid_rates)
    for arm in arms:
        for cfg in search.configs(arm):
            if cfg.rate != lowest:
                continue
            try:
                setup = search.setup(cfg)
                check_fits(SimEngine().build(setup), build_run_workload(cfg), cfg,
                           setup.budget.label)
            except HbenchError as err:
                return str(err)
    return None


#: When every organization is level, the search tries them again with these
#: shares of the memory for state, in order, until they differ.
SMALLER_BUDGETS = (0.5, 0.25)


def level_at_best_cap(table, decision) -> bool:
    """Every arm at the best arm's cap has its capacity at every seed."""
    from analysis.advise import all_level

    return all_level(table[table["cap"] == decision.best["cap"]])


def _budget_probe(search: Search, table, decision, frames: dict, cells, run) -> dict | None:
    """The level organizations at the best arm's cap run again on a half, then
    a quarter of the bytes for state, until they differ: what would change a
    level answer. Returns {"budget", "share", "table", "decision", "level"} of
    the last budget tried ({"budget", "share", "refused"} when that budget
    cannot serve the workload), or None when the time budget stopped it."""
    from harness.results import read_run

    best_cap = decision.best["cap"]
    arms = [a for a, _ in frames.values()
            if a.cap == best_cap and a.label in set(table["arm"])]
    run_dir = cells[cells["arm"] == decision.best["arm"]]["run_dir"].iloc[0]
    given = float(read_run(Path(run_dir)).manifest["budget"]["allocated_whole_model_bytes"])
    found = None
    for share in SMALLER_BUDGETS:
        label = f"{given * share / 2**30:.2f}GiB"
        smaller = replace(search, base={**search.base, "budget": label})
        refused = _refusal(smaller, arms)
        if refused:
            return {"budget": label, "share": share, "refused": refused}
        into: dict = {}
        if not run(smaller, arms, into):
            return found
        part = _evaluate(smaller, {k: f for k, (_, f) in into.items()})
        _, t, d, _ = part
        found = {"budget": label, "share": share, "table": t, "decision": d,
                 "level": level_at_best_cap(t, d), "top_rate": max(smaller.rates)}
        if not found["level"]:
            break
    return found
