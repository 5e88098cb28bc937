"""``hbench budget``: what one memory budget buys each organization."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from harness.budget import DEFAULT_D0_ATTN_FRACTION, FORMS, OrgBudget, resolve_all
from harness.layout import PAGINGS
from harness.ledger import kib
from harness.model_configs import geometry_from_options
from hbench.commands.geometry import model_options


def budget_report(budgets: dict[str, OrgBudget]) -> dict:
    """Plain data for --json: every organization's pools and rounding loss."""
    out = {}
    for org, b in budgets.items():
        out[org] = {
            "label": b.label, "target_bytes": b.target_bytes, "pool_layers": b.pool_layers,
            "whole_model_bytes": b.whole_model_bytes, "d0_attn_fraction": b.d0_attn_fraction,
            "paging": b.paging,
            "total_pages": b.total_pages, "rounding_loss_bytes": b.rounding_loss_bytes,
            "allocated_bytes": b.allocated_bytes,
            "pools": [{"name": p.name, "page_bytes": p.page_bytes, "pages": p.pages,
                       "target_bytes": p.target_bytes,
                       "rounding_loss_bytes": p.rounding_loss_bytes} for p in b.pools],
        }
    return out


@click.command("budget")
@click.argument("budget")
@model_options
@click.option("--d0-attn-fraction", "d0_attn_fraction", type=str,
              default=str(DEFAULT_D0_ATTN_FRACTION), show_default=True, metavar="F",
              help="Share of D0's bytes given to its attention pool; the rest holds checkpoints.")
@click.option("--paging", type=click.Choice(PAGINGS), default="study", show_default=True,
              help="The study's page sizes, or vLLM's blocks (the label's bytes in whole vLLM "
                   "pages, the same count for every organization, less vLLM's null block): "
                   "its CPU build's (vllm) or a CUDA vLLM's (vllm-gpu).")
@click.option("--json", "as_json", is_flag=True, help="Print the pools as JSON.")
def budget(budget, model, config_path, dtype, ssm_dtype, d0_attn_fraction, paging, as_json):
    """Turn BUDGET into each organization's pools and integer page counts.

    \b
    BUDGET is one of:
      bN      N checkpoints' bytes per pool layer (N coarse S0 pages); b83 for
              Falcon-H1-7B is 83 x 1,594,368 B per layer
      Np      N pages of each organization's own page (S0 page for s0, the
              512-token page for s1/s2; d0 gets the bytes s1/s2 get)
      12GiB   a whole-model size (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)
    \b
    Columns (KiB per pool layer): page = one page of the pool; pages = whole
    pages the target buys; target = bytes the pool was given; rounding loss =
    target bytes no whole page fits in; allocated = what the engine is given,
    the same (within one page) for every organization. D0 splits the bytes into
    an attention pool (16-token blocks) and a checkpoint pool by
    --d0-attn-fraction. With --paging vllm every page is one vLLM block (1,664
    tokens for Falcon-H1-7B), so every organization gets the same block count:
    the pools a vLLM run at BUDGET serves, block 0 (vLLM's null block) as
    rounding loss.

    \b
    Example:  hbench budget b83 --model falcon-h1-7b
    """
    from hbench.commands.ledger import parse_fraction

    geom = geometry_from_options(model, config_path, dtype, ssm_dtype)
    budgets = resolve_all(budget, geom, parse_fraction(d0_attn_fraction), paging)
    rep = budget_report(budgets)
    if as_json:
        click.echo(json.dumps({"model": geom.name, "budget": budget, "paging": paging,
                               "orgs": rep}, indent=2))
        return
    console = Console(width=max(Console().width, 100))
    first = next(iter(budgets.values()))
    console.print(f"[bold]{geom.name}[/], budget {first.label}: {geom.pool_layers} pool layers, "
                  f"{paging} paging; accepted forms: {FORMS}")
    t = Table(title="Pools per organization (KiB per pool layer)")
    for col in ("org", "pool", "page KiB", "pages", "target KiB", "rounding loss KiB",
                "whole model GiB"):
        t.add_column(col, justify="left" if col in ("org", "pool") else "right")
    for org, b in budgets.items():
        for p in b.pools:
            t.add_row(org.upper(), p.name if b.d0_attn_fraction is None
                      else f"{p.name} (f={b.d0_attn_fraction})",
                      f"{kib(p.page_bytes):,}", f"{p.pages:,}", f"{kib(p.target_bytes):,}",
                      f"{kib(p.rounding_loss_bytes):,}",
                      f"{p.target_bytes * b.pool_layers / 2**30:.3f}")
    console.print(t)
    spread = max(b.allocated_bytes for b in budgets.values()) - min(
        b.allocated_bytes for b in budgets.values())
    page = max(b.largest_page_bytes for b in budgets.values())
    console.print("Allocated, what the engine is given (KiB per pool layer): "
                  + ", ".join(f"{o.upper()} {kib(b.allocated_bytes):,}" for o, b in budgets.items())
                  + f"; spread {kib(spread):,} KiB, under one {kib(page):,} KiB page")
