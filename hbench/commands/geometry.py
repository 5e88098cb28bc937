"""``hbench geometry``: a model's state sizes, weights and organization layouts.

Also home of the model-selection flags (--model / --config / --dtype /
--ssm-dtype) that ``hbench budget`` and ``hbench ledger`` share, so the three
commands pick a model the same way.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.console import Console
from rich.table import Table

from harness.geometry import DTYPE_BYTES, ModelGeometry
from harness.layout import OrgLayout
from harness.ledger import kib
from harness.model_configs import DEFAULT_MODEL, PRESETS, geometry_from_options
from harness.orgs import layout_for


def model_options(func):
    """Add --model, --config, --dtype and --ssm-dtype to a command."""
    opts = [
        click.option("--model", "model", default=None, metavar="NAME",
                     help=f"Preset model: {', '.join(sorted(PRESETS))} "
                          f"(default {DEFAULT_MODEL})."),
        click.option("--config", "config_path", default=None, metavar="PATH",
                     help="A Hugging Face config.json (or its folder) instead of a preset."),
        click.option("--dtype", default="bf16", metavar="DTYPE", show_default=True,
                     help=f"Weights, attention KV and conv state dtype ({', '.join(DTYPE_BYTES)})."),
        click.option("--ssm-dtype", "ssm_dtype", default="bf16", metavar="DTYPE",
                     show_default=True,
                     help="Recurrent (SSM) state dtype; fp32 doubles the SSM state only."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def describe_members(layout: OrgLayout) -> str:
    """How a checkpoint is laid out, in words."""
    if not layout.checkpoint_bytes:
        return "no recurrent state"
    if layout.checkpoint_is_one_unit:
        return "1 unit" if layout.dual_pool else "1 page"
    if layout.conv_slots:
        return (f"{layout.ssm_pages} SSM + {_fmt(kib(layout.slot_bytes))} KiB conv slot "
                f"({layout.slab_slots}/slab)")
    return f"{layout.ssm_pages} SSM + {layout.conv_pages} conv pages"


def geometry_report(geom: ModelGeometry) -> dict:
    """Everything ``hbench geometry`` shows, as plain data (the --json output)."""
    from harness.budget import applicable_orgs

    per_layer = {
        "attention_bytes_per_token": geom.attn_bytes_per_token,
        "ssm_state_bytes": geom.ssm_state_bytes,
        "conv_state_bytes": geom.conv_state_bytes,
        "checkpoint_bytes": geom.checkpoint_bytes,
    }
    layouts = {}
    for org in applicable_orgs(geom):
        lay = layout_for(org, geom)
        layouts[org] = {**asdict(lay), "ckpt_pages": lay.ckpt_pages,
                        "members": describe_members(lay)}
    return {
        "model": geom.name,
        "model_type": geom.model_type,
        "dtype": geom.dtype,
        "ssm_state_dtype": geom.ssm_state_dtype,
        "per_layer": per_layer,
        "layer_counts": geom.layer_counts,
        "per_pool_layer": {
            "attention_layers": geom.attn_groups,
            "ssm_layers": geom.ssm_groups,
            "attention_bytes_per_token": geom.slot_attn_bytes_per_token,
            "ssm_state_bytes": geom.slot_ssm_bytes,
            "conv_state_bytes": geom.slot_conv_bytes,
            "checkpoint_bytes": geom.slot_checkpoint_bytes,
        },
        "whole_model": {
            "attention_bytes_per_token": geom.model_attn_bytes_per_token,
            "ssm_state_bytes": geom.model_ssm_state_bytes,
            "conv_state_bytes": geom.model_conv_state_bytes,
            "checkpoint_bytes": geom.model_checkpoint_bytes,
        },
        "weights": {"param_count": geom.param_count, "weights_bytes": geom.weights_bytes,
                    "params_by_module": geom.param_breakdown()},
        "layouts": layouts,
        "geometry": geom.to_dict(),
    }


def _fmt(n: int | float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.2f}"


def print_geometry(rep: dict, console: Console) -> None:
    console.print(f"[bold]{rep['model']}[/] ({rep['model_type']}), weights/KV {rep['dtype']}, "
                  f"SSM state {rep['ssm_state_dtype']}")
    counts = rep["layer_counts"]
    t = Table(title="State sizes (per layer of that kind, then whole model)")
    for col in ("state", "bytes / layer", "KiB / layer", "layers", "whole model bytes"):
        t.add_column(col, justify="right" if col != "state" else "left")
    rows = [("attention KV per token", "attention_bytes_per_token", counts["attention"]),
            ("SSM state", "ssm_state_bytes", counts["ssm"]),
            ("conv state", "conv_state_bytes", counts["ssm"]),
            ("checkpoint (SSM + conv)", "checkpoint_bytes", counts["ssm"])]
    for label, key, layers in rows:
        b = rep["per_layer"][key]
        t.add_row(label, _fmt(b), _fmt(kib(b)), str(layers), _fmt(rep["whole_model"][key]))
    console.print(t)
    ppl = rep["per_pool_layer"]
    console.print(
        "Layers: " + ", ".join(f"{k} {v}" for k, v in counts.items() if k != "pool_layers")
        + f". Pools see {counts['pool_layers']} pool layers of {ppl['attention_layers']} "
        f"attention + {ppl['ssm_layers']} SSM layer(s): per pool layer a checkpoint is "
        f"{_fmt(ppl['checkpoint_bytes'])} B and a token {_fmt(ppl['attention_bytes_per_token'])} B.")
    w = rep["weights"]
    console.print(f"Weights: {w['param_count']:,} parameters = {w['weights_bytes']:,} B "
                  f"({w['weights_bytes'] / 2**30:.2f} GiB); by module: "
                  + ", ".join(f"{k} {v / 1e9:.3f}e9" for k, v in w["params_by_module"].items()))
    t = Table(title="Organization layouts (KiB per pool layer)")
    for col in ("org", "attn block", "attn page KiB", "ckpt page KiB",
                "checkpoint members", "grid", "pools"):
        t.add_column(col)
    for org, lay in rep["layouts"].items():
        t.add_row(org.upper(), f"{lay['attn_block_tokens']} tok", _fmt(kib(lay["attn_page_bytes"])),
                  _fmt(kib(lay["ckpt_page_bytes"])), lay["members"], str(lay["grid_tokens"]),
                  "attention + ckpt" if lay["dual_pool"] else "1 shared")
    console.print(t)


@click.command("geometry")
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def geometry(model, config_path, dtype, ssm_dtype, as_json):
    """Show a model's per-request state sizes, weights and memory layouts.

    \b
    attention KV per token  2 x kv_heads x head_dim x dtype bytes, per attention layer
    SSM state               Mamba-2: heads x head_dim x d_state; Mamba-1: d_inner x d_state
    conv state              conv channels x (d_conv - 1) x dtype bytes
    checkpoint              SSM + conv state at one token position: what a cached
                            prefix needs besides its attention KV
    Whole-model columns multiply by the layers of that kind. Layouts give each
    organization's page sizes per pool layer (S0 coarse shared pages, S1 paged
    checkpoints, S2 conv-slot packing, D0 native dual pools).

    \b
    Examples:
      hbench geometry --model falcon-h1-7b
      hbench geometry --config path/to/config.json --ssm-dtype fp32 --json
    """
    geom = geometry_from_options(model, config_path, dtype, ssm_dtype)
    rep = geometry_report(geom)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    print_geometry(rep, Console(width=max(Console().width, 120)))
