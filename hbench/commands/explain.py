"""``hbench explain RUN_DIR``: why shared prefixes were not reused, per reason.

Thin: `analysis.explain.explain_run` reads the run directory and diagnoses
it; this prints the counts and the short answer.
"""

from __future__ import annotations

import json

import click

from hbench.flag_types import PATH


@click.command("explain", context_settings={"max_content_width": 100})
@click.argument("run_dir", type=PATH)
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

    from analysis.explain import REASONS, explain_run

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
