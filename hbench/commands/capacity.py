"""``hbench capacity``: the largest arrival rate each arm sustains within an SLO.

Thin: flags -> a grid of `RunConfig`s (org x budget x rate x seed) run by
`hbench.sweep.run_sweep` (content-addressed cells: a rerun, or a sweep that
already ran some of these cells in the same ``--out``, reuses them) ->
`analysis.capacity` -> tables, ``capacity.json`` and the winner map.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from harness.errors import HbenchError


def _list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise HbenchError(f"--{what} names nothing")
    return items


def _rates(text: str) -> list[float]:
    try:
        rates = sorted({float(x) for x in _list(text, "rates")})
    except ValueError:
        raise HbenchError(f"--rates expects a comma list of numbers, got {text!r}") from None
    if rates[0] <= 0:
        raise HbenchError("--rates must all be > 0")
    return rates


def search(orgs, budgets, rates, seeds, limits, out: Path, base: dict, jobs: int = 1,
           on_cell=None):
    """Run (or reuse) every cell of the rate grid; one row per cell with its
    verdict, goodput and run directory."""
    import pandas as pd

    from analysis.capacity import goodput, meets_slo
    from harness.grid import expand
    from harness.results import read_run
    from hbench.sweep import run_sweep

    configs = expand([{"org": orgs, "budget": budgets, "rate": rates, "seed": seeds}], base)
    result = run_sweep(configs, out, jobs=jobs, on_cell=on_cell)
    if result.failed:
        raise HbenchError(f"{len(result.failed)} cells failed; first: {result.failed[0].error}")
    rows = []
    for cell in result.cells:
        run = read_run(out / cell.cell_id)
        cfg = cell.config
        rows.append({"org": cfg.org, "budget": cfg.budget, "rate": cfg.rate, "seed": cfg.seed,
                     "meets": meets_slo(run.summary, limits),
                     "goodput": goodput(run.table("requests"), limits),
                     "valid": bool((run.summary.get("validity") or {}).get("valid", True)),
                     **{lim.key: run.summary.get(lim.key) for lim in limits},
                     "run_dir": str(run.path)})
    return pd.DataFrame(rows)


def _invalid_at_capacity(cells) -> list[str]:
    """``org@budget seed s rate r`` for each seed's run at its found capacity whose
    validity verdict failed."""
    from analysis.capacity import seed_capacity

    out = []
    for (org, budget, seed), g in cells.groupby(["org", "budget", "seed"], sort=False):
        cap, _ = seed_capacity(dict(zip(g["rate"], g["meets"], strict=True)))
        at = g[g["rate"] == cap]
        if not at.empty and not bool(at["valid"].iloc[0]):
            out.append(f"{org}@{budget} seed {seed} rate {cap:g}")
    return out


@click.command("capacity", context_settings={"max_content_width": 100})
@click.option("--org", "orgs", default="s2,d0", show_default=True, help="Organizations, comma list.")
@click.option("--budget", "budgets", default="b63,b83,b108", show_default=True, help="Budgets, comma list.")
@click.option("--slo", default="ttft_p99<=2s,tpot_p99<=100ms", show_default=True,
              help="Run-level limits, comma list of METRIC_pQ<=VALUE(s|ms), metric ttft/tpot/itl/e2e.")
@click.option("--rates", default="0.5,1,1.5,2,3,4", show_default=True,
              help="Rate grid in req/s (the search's steps).")
@click.option("--seeds", default="1-3", show_default=True, help="Paired seeds, e.g. 1-3 or 1,2,5.")
@click.option("--requests", type=int, default=120, show_default=True, help="Requests per run.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Any other RunConfig field for every run (repeatable), e.g. --set cap=63.")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="Significance level of the winner map and the CI level (1 - alpha).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/capacity"), show_default=True,
              help="Sweep directory (cells are reused) and where capacity.json and the figure go.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Parallel worker processes.")
@click.option("--json", "as_json", is_flag=True, help="Print capacity.json instead of tables.")
def capacity(orgs, budgets, slo, rates, seeds, requests, extra, alpha, out, jobs, as_json):
    """Largest arrival rate each organization x budget sustains within --slo.

    \b
    Example:
      hbench capacity --org s2,d0 --budget b63,b83,b108 \\
                      --slo 'ttft_p99<=2s,tpot_p99<=100ms' --rates 1,2,3,4 --seeds 1-3

    Every (org, budget, rate, seed) is one sweep cell under --out. Per seed,
    the capacity is the largest grid rate at which the SLO holds there and at
    every lower rate; the table gives the mean over seeds and its CI. Also
    prints where one organization's goodput (requests per second meeting the
    SLO) overtakes another's, and writes the winner map (budget x rate).
    """
    from rich.console import Console
    from rich.table import Table

    from analysis.answer_figures import winner_map_figure
    from analysis.capacity import capacity_table, crossovers, parse_slo, winner_map
    from harness.grid import parse_values
    from hbench.paths import check_writable_dir

    if not 0 < alpha < 1:
        raise HbenchError(f"--alpha must be in (0, 1), got {alpha}")
    limits = parse_slo(slo)
    grid_rates = _rates(rates)
    seed_list = [int(s) for s in parse_values("seed", seeds)]
    base = {"requests": requests}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise HbenchError(f"--set expects KEY=VALUE, got {item!r}")
        base[key.strip().replace("-", "_")] = value
    check_writable_dir(out)
    cells = search(_list(orgs, "org"), _list(budgets, "budget"), grid_rates, seed_list, limits,
                   out, base, jobs=jobs)
    table = capacity_table(cells, alpha)
    wmap = winner_map(cells, alpha)
    cross = crossovers(cells)
    fig = winner_map_figure(wmap, f"winner by goodput ({', '.join(map(str, limits))})")
    fig.savefig(out / "winner_map.png", dpi=110)
    doc = {"slo": [str(x) for x in limits], "rates": grid_rates, "seeds": seed_list,
           "requests": requests, "capacity": table.to_dict("records"),
           "crossovers": cross, "winner_map": wmap.to_dict("records"),
           "cells": cells.drop(columns=["run_dir"]).to_dict("records")}
    (out / "capacity.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=float))
        return
    console = Console(width=max(Console().width, 120))
    t = Table(title=f"capacity within {', '.join(map(str, limits))} "
                    f"(rates {', '.join(f'{r:g}' for r in grid_rates)} req/s, seeds {seeds})")
    for h in ("org", "budget", "capacity req/s", f"{1 - alpha:.0%} CI", "per seed"):
        t.add_column(h)
    for _, r in table.iterrows():
        t.add_row(r["org"], r["budget"], f"{r['capacity_req_s']:.2f}",
                  f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", r["per_seed"])
    console.print(t)
    for c in cross:
        console.print(f"crossover at {c['budget']}: {c['org']} beats {c['beats']} on goodput "
                      f"from {c['from_rate']:g} req/s")
    if not cross:
        console.print("no crossover: no organization overtakes another within the rate grid")
    shaky = _invalid_at_capacity(cells)
    if shaky:
        console.print(f"note: {len(shaky)} runs at a found capacity are not valid (their SLO held in a "
                      f"transient): {', '.join(shaky)}", highlight=False)
    console.print(f"wrote {out}/capacity.json and {out}/winner_map.png")
