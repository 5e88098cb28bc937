"""The capacity search: the largest arrival rate each arm sustains within an SLO.

`run_capacity` runs a grid of `RunConfig`s (org x budget x rate x seed) with
`hbench.sweep.run_sweep` (content-addressed cells: a rerun, or a sweep that
already ran some of these cells in the same ``out``, reuses them), judges
each run against the SLO and evaluates the grid with `analysis.capacity`
(capacity per arm, crossovers, the winner map), and writes ``capacity.json``
``winner_map.png`` and the HTML report (`analysis.html_report`) into ``out``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.atomic import atomic_path, atomic_write_text
from common.errors import HbenchFailure

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class CapacityResult:
    """What `run_capacity` found and wrote: the cells (one row per run), the
    capacity table, the crossovers, the runs at a found capacity that are not
    valid (`analysis.capacity.invalid_at_capacity`) and the ``capacity.json``
    document."""

    cells: pd.DataFrame
    table: pd.DataFrame
    crossovers: list[dict]
    invalid: list[str]
    doc: dict
    validity: object = None   # analysis.run_validity.RunValidity of the grid's runs


def capacity_configs(orgs, budgets, rates, seeds, base: dict) -> list:
    """The runs of the grid: every organization x budget x rate x seed, each
    with ``base``'s fields (`harness.grid.expand` types and checks them)."""
    from harness.grid import expand

    return expand([{"org": orgs, "budget": budgets, "rate": rates, "seed": seeds}], base)


def search(orgs, budgets, rates, seeds, limits, out: Path, base: dict, jobs: int = 1,
           on_cell=None, on_rerun=None, include_invalid: bool = False,
           setups=None) -> pd.DataFrame:
    """Run (or reuse) every cell of the rate grid; one row per cell with its
    verdict, goodput and run directory. ``meets`` is the SLO verdict of a run
    that may count (`analysis.run_validity.keeps`: a run whose SLO metrics
    are not valid, latency under a growing queue, held its SLO in a transient
    and counts as missing it unless ``include_invalid``); ``valid`` is that
    verdict, ``slo_held`` the SLO verdict alone. A reused cell is verified against its
    manifest's checksums; a damaged one is rerun (``on_rerun(cell, why)``).
    ``setups``: the grid's runs already checked, in `capacity_configs` order
    (`hbench.sweep.run_sweep`)."""
    import pandas as pd

    from analysis.capacity import goodput, meets_slo
    from analysis.run_validity import keeps, reasons
    from harness.results import read_run
    from harness.validity import metric_is_valid
    from hbench.sweep import run_sweep

    configs = capacity_configs(orgs, budgets, rates, seeds, base)
    result = run_sweep(configs, out, jobs=jobs, on_cell=on_cell, on_rerun=on_rerun, setups=setups)
    if result.failed:
        raise HbenchFailure(f"{len(result.failed)} cells failed; first: {result.failed[0].error}")
    rows = []
    for cell in result.cells:
        run = read_run(out / cell.cell_id)
        cfg = cell.config
        # the SLO is a latency: it counts only where the run's latency is valid
        valid = all(metric_is_valid(run.summary, lim.key) for lim in limits)
        held = meets_slo(run.summary, limits)
        rows.append({"org": cfg.org, "budget": cfg.budget, "rate": cfg.rate, "seed": cfg.seed,
                     "meets": held and keeps(valid, include_invalid), "slo_held": held,
                     "goodput": goodput(run.table("requests"), limits),
                     "valid": valid, "invalid_reasons": reasons(run.summary), "run_id": cell.cell_id,
                     **{lim.key: run.summary.get(lim.key) for lim in limits},
                     "run_dir": str(run.path)})
    return pd.DataFrame(rows)


def run_capacity(orgs, budgets, rates, seeds, limits, out: Path, base: dict, *,
                 alpha: float = 0.05, jobs: int = 1, on_cell=None, on_rerun=None,
                 include_invalid: bool = False) -> CapacityResult:
    """`search` the grid, evaluate it at significance level ``alpha`` and write
    ``out/capacity.json``, ``out/winner_map.png`` and ``out/report.html``."""
    from analysis.answer_figures import winner_map_figure
    from analysis.capacity import capacity_table, crossovers, invalid_at_capacity, winner_map
    from analysis.capacity_file import capacity_text
    from analysis.run_validity import RunValidity, kind_counts, validity_of_reasons

    cells = search(orgs, budgets, rates, seeds, limits, out, base, jobs=jobs, on_cell=on_cell,
                   on_rerun=on_rerun, include_invalid=include_invalid)
    table = capacity_table(cells, alpha)
    wmap = winner_map(cells, alpha)
    cross = crossovers(cells, alpha)
    validity = RunValidity(len(cells), tuple(f"{r.run_id} ({r.org}@{r.budget} rate {r.rate:g} seed {r.seed})"
                                             for r in cells.itertuples() if not r.valid), include_invalid,
                           kind_counts(({"validity": validity_of_reasons(r)} for r in cells["invalid_reasons"]),
                                       [lim.key for lim in limits]))
    fig = winner_map_figure(wmap, f"winner by goodput ({', '.join(map(str, limits))})")
    with atomic_path(out / "winner_map.png") as tmp:
        fig.savefig(tmp, dpi=110)
    doc = {"slo": [str(x) for x in limits], "rates": list(rates), "seeds": list(seeds),
           "requests": base.get("requests"), "capacity": table.to_dict("records"),
           "crossovers": cross, "winner_map": wmap.to_dict("records"), "validity": validity.as_dict(),
           "cells": cells.drop(columns=["run_dir"]).to_dict("records")}
    atomic_write_text(out / "capacity.json", capacity_text(doc))
    from analysis.html_report import write_report
    from analysis.load import load_runs

    runs = load_runs(out)
    runs = runs[runs["run_id"].isin(set(cells["run_id"]))].reset_index(drop=True)
    write_report(out, out / "report.html", runs=runs, title=f"hbench capacity: {out}", contrast_answers=False,
                 asked=f"What arrival rate does each organization sustain within {', '.join(map(str, limits))}, "
                       f"and which one serves more goodput at each budget and rate (seeds "
                       f"{', '.join(map(str, seeds))})?")
    return CapacityResult(cells, table, cross, invalid_at_capacity(cells), doc, validity)
