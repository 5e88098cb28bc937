"""``hbench sweep``: run a grid of content-addressed, resumable cells.

Thin: flags and/or a TOML grid -> `harness.grid.expand` -> `hbench.sweep.run_sweep`,
with one progress bar over all cells. Each axis flag takes a comma list
(integer axes also take ranges such as ``1-6``); the cartesian product of all
axes is the grid.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.errors import HbenchError, HbenchFailure
from hbench.commands.grid_flags import GRID_FLAGS
from hbench.executors import EXECUTORS
from hbench.flag_types import INT

# (flag, RunConfig field, help) of the axis flags; each takes a comma list.
AXES = [
    ("--org", "org", "organizations, e.g. s0,s1,s2,d0"),
    ("--budget", "budget", "budget labels, e.g. b63,b83,b108"),
    ("--rate", "rate", "arrival rates in req/s"),
    ("--q", "q", "shared-prefix fractions"),
    ("--headroom", "headroom", "admission headroom fractions f"),
    ("--admission", "admission", "admission rules (first-chunk, whole-input)"),
    ("--retention", "retention", "retention on/off, e.g. off,on"),
    ("--isolate", "isolate", "ISOLATE on/off, e.g. off,on"),
    ("--ckpt-publish", "ckpt_publish", "checkpoint publish policies (every, every-k, marconi)"),
    ("--ckpt-every-k", "ckpt_every_k", "every-k: publish at every k-th grid boundary"),
    ("--ckpt-evict", "ckpt_evict", "checkpoint eviction policies (lru, utility)"),
    ("--utility-alpha", "utility_alpha", "utility eviction: weights alpha"),
    ("--seeds", "seed", "seeds, e.g. 1-6 or 76400-76411"),
    ("--requests", "requests", "requests per run"),
    ("--cap", "cap", "maximum running requests"),
    ("--engine", "engine", "engines (sim, torch, vllm, sglang)"),
    ("--d0-attn-fraction", "d0_attn_fraction", "D0 attention-pool shares"),
    ("--paging", "paging", "page layouts (study, vllm)"),
    ("--model", "model", "model presets"),
    ("--gpu", "gpu", "simulated hardware presets or cost profiles (profile.json)"),
    ("--arrival", "arrival", "arrival processes"),
    ("--warmup", "warmup_requests", "warm-up requests"),
    ("--workload-kind", "workload_kind", "workload generators (sharegpt, multiturn)"),
    ("--think-time", "think_time_s", "multi-turn mean think times in s"),
    ("--max-turns", "max_turns", "multi-turn turns per session at most"),
    # the grid flags (hbench/commands/grid_flags.py), each a comma list here
    *((flag, field, text[0].lower() + text[1:].rstrip(".")) for flag, field, text in GRID_FLAGS),
]


def _given(grid_file, base, subgrids, axes, extra, allow_oversubscribe) -> dict[str, str]:
    """Every field the sweep was given (a grid file's keys, axis flags, ``--set``
    keys, ``--allow-oversubscribe``), each as the user wrote it: what
    `hbench.flag_rules.check_flags` holds against the cells."""
    given = {key: f"{grid_file}: {key}" for g in (base, *subgrids) for key in g}
    flag_of = {field: flag for flag, field, _ in AXES}
    given.update({field: flag_of[field] for field, value in axes.items() if value is not None})
    given.update({item.partition("=")[0].strip().replace("-", "_"): f"--set {item.partition('=')[0].strip()}"
                  for item in extra})
    if allow_oversubscribe:
        given["allow_oversubscribe"] = "--allow-oversubscribe"
    return given


def _axis_options(f):
    for flag, field, text in reversed(AXES):
        f = click.option(flag, field, default=None, metavar="LIST", help=f"Axis: {text}.")(f)
    return f


@click.command("sweep", context_settings={"max_content_width": 100})
@click.option("--grid", "grid_file", type=click.Path(dir_okay=False), default=None,
              help="TOML grid: keys are RunConfig fields, lists expand; [[grid]] tables form a union.")
@_axis_options
@click.option("--set", "extra", multiple=True, metavar="KEY=LIST",
              help="Any other RunConfig field as an axis (repeatable), e.g. --set max_output=512.")
@click.option("--out", default="results/sweep", show_default=True, type=click.Path(),
              help="Output directory; each cell goes into OUT/<cell-id>/, the plan into OUT/sweep.json.")
@click.option("--jobs", "-j", type=INT, default=1, show_default=True, help="Parallel worker processes.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: a process pool on this machine; ray: Ray tasks (needs pip install ray).")
@click.option("--ray-address", envvar="RAY_ADDRESS", show_envvar=True, default=None, metavar="ADDR",
              help="With --executor ray: the Ray cluster to use (host:port, or auto for one started "
                   "with 'ray start'); OUT must be shared by its nodes. Default: a local Ray "
                   "instance with --jobs CPUs, shut down when the sweep ends.")
@click.option("--force", is_flag=True, help="Rerun cells that are already complete (default: skip them).")
@click.option("--allow-oversubscribe", is_flag=True,
              help="Simulate cells even if weights plus state exceed the simulated GPU's memory.")
@click.option("--dry-run", is_flag=True,
              help="List the cells and whether they are done (found by configuration among the done "
                   "cells, without building any workload); run nothing.")
def sweep(grid_file, extra, out, jobs, executor, ray_address, force, allow_oversubscribe, dry_run, **axes):
    """Run every combination of the given axes, resumably.

    \b
    Example (3 orgs x 2 budgets x 2 q x 2 headrooms x 6 seeds = 144 cells):
      hbench sweep --org s0,s1,s2 --budget b63,b83 --rate 3 --q 0,1 \\
                   --headroom 0,0.19 --seeds 1-6 --requests 240 --jobs 2

    A cell's id hashes its resolved config, its workload and the engine
    version; rerunning the same command skips finished cells, so an
    interrupted sweep continues where it stopped.
    """
    from pathlib import Path

    from harness.grid import expand, load_grid_file
    from hbench.flag_once import set_fields
    from hbench.flag_rules import check_flags
    from hbench.paths import check_dir_path, check_writable_dir
    from hbench.runner import validate_run
    from hbench.sweep import load_workload_files, preview, run_sweep

    if jobs < 1:
        raise HbenchError(f"--jobs must be >= 1, got {jobs}")
    if dry_run:
        check_dir_path(out)
    else:
        check_writable_dir(out)
    base, subgrids = load_grid_file(grid_file) if grid_file else ({}, [])
    flags = {field: value for field, value in axes.items() if value is not None}
    flag_of = {field: flag for flag, field, _ in AXES}
    flags.update(set_fields(extra, {field: flag_of[field] for field in flags}, "KEY=LIST"))
    base = {**base, **flags}
    # A flag replaces the same key inside [[grid]] tables too.
    subgrids = [{k: v for k, v in g.items() if k not in flags} for g in subgrids]
    configs = expand(subgrids, base)
    check_flags(_given(grid_file, base, subgrids, axes, extra, allow_oversubscribe), configs)
    if "model" in flags and "config_path" in flags and any(c.engine == "sim" for c in configs):
        raise HbenchError("give --model or --config (--set config_path=...), not both")
    setups = [validate_run(cfg, allow_oversubscribe=allow_oversubscribe) for cfg in configs]
    load_workload_files(configs)
    console = Console(stderr=True)
    if dry_run:
        total = done = 0
        for cfg, cell in preview(configs, Path(out)):
            total += 1
            done += cell is not None
            click.echo(f"{cell or '-' * 16}  {'done' if cell else 'todo'}  {cfg.engine}:{cfg.org}@{cfg.budget} "
                       f"rate={cfg.rate} q={cfg.q} f={cfg.headroom} ret={cfg.retention} iso={cfg.isolate} "
                       f"seed={cfg.seed} n={cfg.requests}")
        click.echo(f"{total} cells, {done} done, {total - done} to run")
        return
    with Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("sweep", total=None, note="planning")

        def on_plan(total, done):
            bar.update(task, total=total, completed=done, note=f"{done} already done" if done else "")

        def on_cell(o):
            bar.advance(task)
            if o.status == "failed":
                console.print(f"[red]cell {o.cell_id} failed:[/red] {o.error}")

        def on_rerun(cell, why):
            console.print(f"cell {cell}: {why}; rerunning it", highlight=False)

        result = run_sweep(configs, out, jobs=jobs, executor=executor, force=force,
                           allow_oversubscribe=allow_oversubscribe, setups=setups,
                           grids=subgrids, base=base, on_plan=on_plan, on_cell=on_cell,
                           ray_address=ray_address, on_rerun=on_rerun)
    click.echo(f"{len(result.cells)} cells: {result.count('ran')} ran, {result.count('skipped')} already done, "
               f"{result.count('failed')} failed; results in {result.out}")
    if result.failed:
        raise HbenchFailure(f"{len(result.failed)} cells failed; first: {result.failed[0].error}")
