"""``hbench tiny-model``: write a tiny random-weight hybrid model directory.

The real-engine integration test and local smoke runs serve this model; it is
built locally (no download) by `adapters.tiny_model`.
"""

from __future__ import annotations

import json

import click

from hbench.flag_types import Int


@click.command("tiny-model")
@click.option("--arch", default="falcon_h1", show_default=True,
              type=click.Choice(["falcon_h1"]), help="Architecture to build.")
@click.option("--preset", default="tiny", show_default=True,
              type=click.Choice(["tiny", "proportional"]),
              help="Dimensions: tiny (smallest vLLM-servable model) or proportional "
                   "(Falcon-H1-7B's state proportions: a checkpoint about three 512-token "
                   "attention blocks, conv state a few percent of one).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write config.json, model.safetensors and the tokenizer to.")
@click.option("--seed", default=0, show_default=True, type=Int(0),
              help="Seed of the random weights (same seed, same bytes).")
@click.option("--records", default=300, show_default=True, type=Int(1),
              help="ShareGPT records the tokenizer is trained on.")
def tiny_model(arch, preset, out_dir, seed, records):
    """Build a tiny Falcon-H1 (random weights, locally trained tokenizer)."""
    from adapters.tiny_model import build_tiny_model
    from hbench.paths import check_writable_dir

    check_writable_dir(out_dir)
    click.echo(json.dumps(build_tiny_model(out_dir, arch=arch, seed=seed, records=records,
                                           preset=preset)))
