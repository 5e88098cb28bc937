"""``hbench reproduce``: run one of the study's designs (or all) and compare
hbench's numbers with the published ones.

Thin: `analysis.designs` says what to run, `hbench.sweep.run_sweep` runs it
(resumably, into OUT/<design>[-quick]/), `analysis.reproduce.evaluate_design`
evaluates the contrast families, renders figures and writes reproduce.md and
reproduce.csv. With ``all`` the per-design tables are also concatenated into
OUT/reproduce.md and OUT/reproduce.csv.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from analysis.run_validity import INCLUDE_INVALID_HELP
from common.errors import HbenchError, HbenchFailure
from hbench.executors import EXECUTORS
from hbench.flag_types import INT, PATH


def _print_table(console: Console, title: str, table) -> None:
    from analysis.reproduce import display_rows

    if table.empty:
        console.print(f"{title}: the study published no number for this design (see analysis/report.md)")
        return
    t = Table(title=title)
    for h in ("published figure", "study", "study note", "hbench [95% CI]", "n", "direction", "CI covers",
              "ratio", "hbench p Holm", "hbench verdict"):
        t.add_column(h, overflow="fold")
    for r in display_rows(table):
        t.add_row(r[1], r[2], r[3], f"{r[4]} {r[5]}", r[6], r[7], r[8], r[9], r[10], r[11])
    console.print(t)


#: Engines that run a design at the study's scale: the simulator, and vLLM's
#: own scheduler in process (no server: its admission, chunking, preemption,
#: prefix hits and eviction, priced by the same cost model).
REPRODUCE_ENGINES = ("sim", "vllm")


def design_root(out, name: str, engine: str, quick: bool):
    """OUT/<design>[-<engine>][-quick]: each engine's cells apart, so the
    simulator's and vLLM's tables of one design sit side by side."""
    return out / (name + ("" if engine == "sim" else f"-{engine}") + ("-quick" if quick else ""))


#: The designs' names (`analysis.designs.DESIGNS`, which a test keeps equal to
#: this), spelt out so that listing or helping commands imports no analysis.
DESIGN_NAMES = ("q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "beyond")


@click.command("reproduce", context_settings={"max_content_width": 100})
@click.argument("name", type=click.Choice([*DESIGN_NAMES, "all"]))
@click.option("--quick", is_flag=True, help="Fewer seeds and 120 requests per run (minutes, not hours).")
@click.option("--engine", type=click.Choice(REPRODUCE_ENGINES), default="sim", show_default=True,
              help="Whose scheduler decides: hbench's simulator, or vLLM's own V1 scheduler, KV-cache "
                   "manager and block pool in process (needs HBENCH_VLLM_PYTHON, "
                   "scripts/setup_vllm_cpu.sh; S0/D0 in a CUDA vLLM's blocks, S1/S2 at the study's "
                   "pages; retention through hbench's plugin; a design with an organization or "
                   "checkpoint policy vLLM has not is refused before any cell).")
@click.option("--out", default="results/reproduce", show_default=True, type=PATH,
              help="Root; each design runs into OUT/<design>/ (OUT/<design>-quick/ with --quick, "
                   "OUT/<design>-vllm/ with --engine vllm).")
@click.option("--jobs", "-j", type=INT, default=1, show_default=True, help="Parallel worker processes.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True)
@click.option("--no-figures", is_flag=True, help="Skip rendering figures.")
@click.option("--include-invalid", is_flag=True, help=INCLUDE_INVALID_HELP)
def reproduce(name, quick, engine, out, jobs, executor, no_figures, include_invalid):
    """Reproduce design NAME of the study (q1..q9, or all).

    \b
    Examples:
      hbench reproduce q1 --quick --jobs 2
      hbench reproduce q4 --engine vllm     # vLLM's scheduler deciding

    Finished cells are reused, so an interrupted reproduction continues where
    it stopped. Prints, and writes to reproduce.md / reproduce.csv, one row
    per published figure: the study's value, hbench's with its 95% CI,
    whether the direction and the magnitude agree, hbench's Holm p and
    verdict. Contrasts with arms that are not valid are left out of their
    Holm families (verdict "arms not valid") unless --include-invalid; the
    runs that are not valid are counted and named below the table.
    """
    from dataclasses import replace

    import pandas as pd

    from adapters.registry import make_engine
    from analysis.designs import DESIGNS
    from analysis.headlines import served_by
    from analysis.reproduce import evaluate_design, markdown
    from common.atomic import atomic_path, atomic_write_text
    from hbench.paths import check_writable_dir
    from hbench.runner import validate_run
    from hbench.sweep import run_sweep

    if jobs < 1:
        raise HbenchError(f"--jobs must be >= 1, got {jobs}")
    check_writable_dir(out)
    names = list(DESIGNS) if name == "all" else [name]

    def configs(n):
        return [replace(c, engine=engine) for c in DESIGNS[n].configs(quick)]

    # every cell of every design, before any work: the run's own checks and,
    # for vLLM, what its scheduler in process cannot serve (retention, no venv)
    in_process = None if engine == "sim" else make_engine(engine)
    setups = {n: [] for n in names}   # each design's cells as validated, run as they are
    for n in names:
        for cfg in configs(n):
            try:
                setups[n].append(validate_run(cfg))
                if in_process is not None:
                    in_process.check_in_process(cfg)
            except HbenchError as exc:
                raise HbenchError(f"design {n} on --engine {engine}: {exc}") from None
    console = Console(stderr=True)
    tables = []
    for n in names:
        d = DESIGNS[n]
        root = design_root(out, n, engine, quick)
        base, grids = d.axes(quick)
        base = {**base, "engine": engine}
        with Progress(TextColumn(f"[bold]{n}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task(n, total=None)
            result = run_sweep([s.config for s in setups[n]], root, jobs=jobs, executor=executor,
                               setups=setups[n], grids=grids, base=base,
                               on_plan=lambda total, done, t=task: bar.update(t, total=total, completed=done),
                               on_cell=lambda o, t=task: bar.advance(t),
                               on_rerun=lambda cell, why: console.print(f"cell {cell}: {why}; rerunning it",
                                                                        highlight=False))
        if result.failed:
            raise HbenchFailure(f"design {n}: {len(result.failed)} cells failed; first: {result.failed[0].error}")
        rep = evaluate_design(n, root, [c.cell_id for c in result.cells], figures=not no_figures,
                              include_invalid=include_invalid)
        _print_table(Console(width=max(Console().width, 160)),
                     f"{d.title}  ({len(rep.runs)} runs, {served_by(rep.runs)}{', quick' if quick else ''})",
                     rep.table)
        click.echo(rep.validity.sentence("Holm families"))
        click.echo(f"wrote {root}/reproduce.md, reproduce.csv and analysis/")
        tables.append(rep.table)
    if len(names) > 1:
        combined = pd.concat(tables, ignore_index=True)
        with atomic_path(out / "reproduce.csv") as tmp:
            combined.to_csv(tmp, index=False)
        atomic_write_text(out / "reproduce.md", markdown(combined, "Reproduction of the study (all designs)"))
        click.echo(f"wrote {out}/reproduce.md and reproduce.csv")
