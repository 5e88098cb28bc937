"""``hbench capacity``: the largest arrival rate each arm sustains within an SLO.

Thin: flags -> `hbench.capacity.run_capacity` (the rate grid as sweep cells,
evaluated by `analysis.capacity`; ``capacity.json`` and the winner map
written) -> tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from analysis.run_validity import INCLUDE_INVALID_HELP
from common.errors import HbenchError
from common.numbers import parse_float
from hbench.commands.grid_flags import grid_fields, grid_options
from hbench.flag_types import FLOAT, INT, PATH

#: Requests per run when neither --requests nor a run length (--set duration_s) is given.
DEFAULT_REQUESTS = 120


def _list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise HbenchError(f"--{what} names nothing")
    return items


def _rates(text: str) -> list[float]:
    rates = sorted({parse_float(x, "--rates", finite=True) for x in _list(text, "rates")})
    if rates[0] <= 0:
        raise HbenchError("--rates must all be > 0")
    return rates


@click.command("capacity", context_settings={"max_content_width": 100})
@click.option("--org", "orgs", default="s2,d0", show_default=True, help="Organizations, comma list.")
@click.option("--budget", "budgets", default="b63,b83,b108", show_default=True, help="Budgets, comma list.")
@click.option("--model", default=None,
              help="Model preset (hbench geometry --help lists them) [default: falcon-h1-7b].")
@click.option("--config", "config_path", type=click.Path(), default=None,
              help="A hybrid model's Hugging Face config.json instead of a preset (model_type "
                   "falcon_h1, bamba, granitemoehybrid, jamba or nemotron_h; an hbench_grid key "
                   "declares its grid).")
@click.option("--gpu", default=None,
              help="Simulated hardware: a preset (hbench hardware) or a cost profile from hbench "
                   "calibrate [default: a100-pcie-40gb].")
@click.option("--workload-kind", type=click.Choice(["sharegpt", "multiturn"]), default=None,
              help="Traffic: ShareGPT prompts with shared contexts (the study's) or multi-turn "
                   "chat sessions (rates then count sessions) [default: sharegpt].")
@grid_options
@click.option("--slo", default="ttft_p99<=2s,tpot_p99<=100ms", show_default=True,
              help="Run-level limits, comma list of METRIC_pQ<=VALUE(s|ms), metric ttft/tpot/itl/e2e.")
@click.option("--rates", default="0.5,1,1.5,2,3,4", show_default=True,
              help="Rate grid in req/s (the search's steps).")
@click.option("--seeds", default="1-3", show_default=True, help="Paired seeds, e.g. 1-3 or 1,2,5.")
@click.option("--requests", type=INT, default=None,
              help=f"Requests per run [default: {DEFAULT_REQUESTS}, or none with --set "
                   "duration_s=S or --set workload_path=FILE].")
@click.option("--ckpt-publish", default="every", show_default=True,
              help="Where checkpoints are published for every run: every, every-k, marconi "
                   "(see hbench run --help).")
@click.option("--ckpt-evict", default="lru", show_default=True,
              help="Which cached checkpoint every run evicts: lru or utility.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Any other RunConfig field for every run (repeatable), e.g. --set cap=63 "
                   "or --set utility_alpha=2.")
@click.option("--alpha", type=FLOAT, default=0.05, show_default=True,
              help="Significance level of the winner map and the CI level (1 - alpha).")
@click.option("--out", type=PATH, default=Path("results/capacity"), show_default=True,
              help="Sweep directory (cells are reused) and where capacity.json and the figure go.")
@click.option("--jobs", "-j", type=INT, default=1, show_default=True, help="Parallel worker processes.")
@click.option("--include-invalid", is_flag=True, help=INCLUDE_INVALID_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print capacity.json instead of tables.")
@click.pass_context
def capacity(ctx, orgs, budgets, slo, rates, seeds, requests, ckpt_publish, ckpt_evict, extra, alpha, out,
             jobs, include_invalid, as_json, model, config_path, gpu, workload_kind, **grid):
    """Largest arrival rate each organization x budget sustains within --slo.

    \b
    Example:
      hbench capacity --org s2,d0 --budget b63,b83,b108 \\
                      --slo 'ttft_p99<=2s,tpot_p99<=100ms' --rates 1,2,3,4 --seeds 1-3

    Every (org, budget, rate, seed) is one sweep cell under --out. Per seed,
    the capacity is the largest grid rate at which the SLO holds there and at
    every lower rate; the table gives the mean over seeds and its percentile
    bootstrap interval (within the per-seed capacities). Also
    prints where one organization's goodput (requests per second meeting the
    SLO) overtakes another's, and writes the winner map (budget x rate) and
    report.html (answers first, then figures and tables).
    """
    from rich.console import Console
    from rich.table import Table

    from analysis.capacity import parse_slo
    from analysis.headlines import capacity_headlines
    from harness.grid import parse_values
    from hbench.capacity import capacity_configs, run_capacity
    from hbench.flag_once import set_fields
    from hbench.flag_rules import check_flags, typed_flags
    from hbench.paths import check_writable_dir

    if not 0 < alpha < 1:
        raise HbenchError(f"--alpha must be in (0, 1), got {alpha}")
    limits = parse_slo(slo)
    grid_rates = _rates(rates)
    seed_list = [int(s) for s in parse_values("seed", seeds)]
    if model is not None and config_path is not None:
        raise HbenchError("give --model or --config, not both")
    base = {"ckpt_publish": ckpt_publish, "ckpt_evict": ckpt_evict}
    chosen = {"model": model, "config_path": config_path, "gpu": gpu,
              "workload_kind": workload_kind, **grid_fields(grid)}
    base.update({k: v for k, v in chosen.items() if v is not None})
    # the grid's axes are always given; the rest where typed
    given = {"org": "--org", "budget": "--budget", "rate": "--rates", "seed": "--seeds",
             **{k: v for k, v in typed_flags(ctx).items() if k in ("requests", *base)}}
    typed = {k: v for k, v in typed_flags(ctx).items() if k != "extra"}
    for field, value in set_fields(extra, {**given, **typed}).items():
        base[field] = value
        given[field] = f"--set {field}"
    if requests is not None:
        base["requests"] = requests
    elif not {"duration_s", "workload_path"} & set(base):
        base["requests"] = DEFAULT_REQUESTS
    org_list, budget_list = _list(orgs, "org"), _list(budgets, "budget")
    check_flags(given, capacity_configs(org_list, budget_list, grid_rates, seed_list, base))
    check_writable_dir(out)
    result = run_capacity(org_list, budget_list, grid_rates, seed_list,
                          limits, out, base, alpha=alpha, jobs=jobs, include_invalid=include_invalid,
                          on_rerun=lambda cell, why: click.echo(f"cell {cell}: {why}; rerunning it", err=True))
    doc, table, cross = result.doc, result.table, result.crossovers
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=float))
        return
    console = Console(width=max(Console().width, 120))
    t = Table(title=f"capacity within {', '.join(map(str, limits))} "
                    f"(rates {', '.join(f'{r:g}' for r in grid_rates)} req/s, seeds {seeds})")
    for h in ("org", "budget", "capacity req/s", f"{1 - alpha:.0%} interval (percentile bootstrap)",
              "per seed"):
        t.add_column(h)
    for _, r in table.iterrows():
        t.add_row(r["org"], r["budget"], f"{r['capacity_req_s']:.2f}",
                  f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", r["per_seed"])
    console.print(t)
    # the winner map's count and the crossovers, worded as in report.html (the one significance rule)
    for line in capacity_headlines(doc)[len(table):]:
        console.print(line, highlight=False, soft_wrap=True)
    if not cross:
        console.print("no crossover: no pair of organizations differs significantly in goodput from "
                      "one grid rate up", highlight=False)
    console.print(result.validity.sentence("the capacity search"), highlight=False)
    shaky = result.invalid
    if shaky:
        console.print(f"note: {len(shaky)} runs at a found capacity are not valid (their SLO held in a "
                      f"transient): {', '.join(shaky)}", highlight=False)
    console.print(f"wrote {out}/capacity.json, {out}/winner_map.png and {out}/report.html")
