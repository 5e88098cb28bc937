"""``hbench explain RUN_DIR``: why shared prefixes were not reused, per reason.

Thin: reads one run directory, hands its tables and the organization's grid
to `analysis.explain` and prints the counts and a short answer.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from harness.errors import HbenchError


def explain_run(run_dir: Path) -> dict:
    """The diagnosis of one run as a JSON-ready dict (also used by the HTML report)."""
    from analysis.explain import REASONS, answer, diagnose
    from harness.results import read_run

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


@click.command("explain", context_settings={"max_content_width": 100})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
def explain(run_dir, as_json):
    """Why requests that share a prefix did not reuse it, in RUN_DIR.

    For each measured request with a shared context: its target (the deepest
    checkpoint grid position within the shared part) and, when it reused
    less, one reason: ISOLATE salt, prefix shorter than a block, no grid
    position within the prefix, first of its group, producer still
    computing, checkpoint evicted while attention survived (or the reverse),
    evicted before or after first reuse. Prints counts per reason and a short
    answer.
    """
    from rich.console import Console
    from rich.table import Table

    from analysis.explain import REASONS

    doc = explain_run(run_dir)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    console = Console()
    t = Table(title=f"{str(doc['org']).upper()}: shared-prefix reuse ({doc['shared_requests']} "
                    f"requests share a {doc['shared_prefix_tokens']}-token prefix; grid "
                    f"{doc['grid_tokens']}, block {doc['attn_block_tokens']} tokens)")
    t.add_column("reason")
    t.add_column("requests", justify="right")
    t.add_row("reused up to the deepest grid position", str(doc["reused_all"]))
    for k, n in doc["counts"].items():
        t.add_row(REASONS[k], str(n))
    console.print(t)
    click.echo(doc["answer"])
