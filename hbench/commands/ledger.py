"""``hbench ledger``: what a state mix costs each organization, and why."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from common.errors import HbenchError
from common.input_files import read_input_text
from common.numbers import parse_float, parse_int
from common.safe_json import loads_json
from harness.budget import DEFAULT_D0_ATTN_FRACTION, applicable_orgs, resolve_all
from harness.layout import grid_for
from harness.ledger import (
    WASTE_KINDS,
    allocation,
    break_even_ratio,
    d0_feasibility,
    delta01_kib,
    kv_budget_bytes,
    kv_tokens_for,
    tail_waste_summary,
)
from harness.model_configs import geometry_from_options
from harness.orgs import check_attn_fraction, layout_for
from hbench.commands.geometry import model_options

#: Largest count accepted: more blocks than any GPU holds is a typo.
MAX_COUNT = 10**9


def parse_count(text: str | None, flag: str) -> int | None:
    """A non-negative integer flag value (ASCII digits, at most `MAX_COUNT`),
    or a one-line HbenchError."""
    if text is None:
        return None
    try:
        value = parse_int(text, flag)
    except HbenchError:
        raise HbenchError(f"{flag} must be a non-negative integer, got {str(text)[:40]!r}") from None
    if value < 0:
        raise HbenchError(f"{flag} must be a non-negative integer, got {value}")
    if value > MAX_COUNT:
        raise HbenchError(f"{flag} {value} is absurd (more than {MAX_COUNT:,})")
    return value


def parse_fraction(text: str) -> float:
    """--d0-attn-fraction: a number strictly between 0 and 1 (`check_attn_fraction`)."""
    return check_attn_fraction(parse_float(text, "--d0-attn-fraction"))


#: Largest lengths file read (64 MiB: millions of lengths).
MAX_LENGTHS_BYTES = 64 * 2**20


def read_lengths(path: str) -> list[int]:
    """Request lengths (tokens): a JSON list, or one integer per line (# comments).
    A file that names no length is refused: a table of 0 requests says nothing."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise HbenchError(f"lengths file not found: {p}")
    text = read_input_text(p, "--lengths-from", MAX_LENGTHS_BYTES)
    if text.lstrip()[:1] in ("[", "{"):
        values = loads_json(text, f"--lengths-from {p}")
        if not isinstance(values, list):
            raise HbenchError(f"{p} is not a valid JSON list of request lengths")
    else:
        values = [ln.split("#")[0].strip() for ln in text.splitlines()]
        values = [v for v in values if v]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            n = -1
        elif isinstance(v, str):
            try:
                n = parse_int(v, "a length", 0)
            except HbenchError:
                n = -1
        else:
            n = int(v) if v >= 0 and float(v).is_integer() else -1
        if n < 0:
            raise HbenchError(f"{p}: request lengths must be non-negative integers, got {v!r}")
        out.append(n)
    if not out:
        raise HbenchError(f"{p} holds no request lengths (a tail-waste table of 0 requests says "
                          "nothing); give a JSON list or one integer per line")
    return out


def ledger_report(geom, x_a: int, x_r: int, x_a16: int, budget_text: str | None,
                  fraction: float, lengths: list[int] | None) -> dict:
    orgs = applicable_orgs(geom)
    rep: dict = {"model": geom.name, "x_a": x_a, "x_r": x_r, "x_a16": x_a16,
                 "grid": grid_for(geom).record(), "orgs": {}}
    for org in orgs:
        lay = layout_for(org, geom)   # d0, u0, e0 count their own blocks, the rest shared pages
        rep["orgs"][org] = allocation(org, lay, x_a16 if lay.dual_pool else x_a, x_r)
    ratio = break_even_ratio(geom)
    rep["break_even_ratio"] = ratio
    rep["delta01_kib"] = delta01_kib(geom, x_a, x_r)
    rep["s1_beats_s0"] = ratio is not None and x_a > ratio * x_r
    if budget_text:
        budgets = resolve_all(budget_text, geom, fraction)
        rep["budget"] = {org: {"label": b.label, "total_pages": b.total_pages}
                         for org, b in budgets.items()}
        if "d0" in budgets:
            rep["d0_feasibility"] = {**d0_feasibility(budgets["d0"], x_a16, x_r),
                                     "d0_attn_fraction": fraction}
        if not geom.slot_checkpoint_bytes:
            whole = next(iter(budgets.values())).whole_model_bytes
            rep["kv_budget"] = {"whole_model_bytes": whole,
                                "retained_tokens": kv_tokens_for(geom, whole)}
    if not geom.slot_checkpoint_bytes:
        tokens = x_a * grid_for(geom).shared_block_tokens
        rep["kv_of_x_a"] = {"tokens": tokens, "whole_model_bytes": kv_budget_bytes(geom, tokens)}
    if lengths is not None:
        rep["tail_waste"] = tail_waste_summary(lengths, geom)
    return rep


def print_ledger(rep: dict, console: Console) -> None:
    grid = rep["grid"]
    console.print(f"[bold]{rep['model']}[/]: x_A = {rep['x_a']} attention blocks of "
                  f"{grid['shared_block_tokens']} tokens (D0: x_A16 = {rep['x_a16']} blocks of "
                  f"{grid['dual_block_tokens']}), x_R = {rep['x_r']} checkpoints; grid from "
                  f"{grid['source']}")
    t = Table(title="Allocation per organization (KiB per pool layer)")
    for col in ("org", "allocated", "logical", *WASTE_KINDS, "slabs"):
        t.add_column(col, justify="left" if col == "org" else "right")
    for org, a in rep["orgs"].items():
        t.add_row(org.upper(), f"{a['allocated_kib']:,}", f"{a['logical_kib']:,}",
                  *(f"{a['waste_kib'][k]:,}" for k in WASTE_KINDS), str(a["slabs"]))
    console.print(t)
    ratio = rep["break_even_ratio"]
    if ratio is not None:
        console.print(f"S1 uses less memory than S0 iff x_A > {ratio:.4f} x x_R; here Delta01 = "
                      f"S0 - S1 = {rep['delta01_kib']:,} KiB "
                      f"({'S1' if rep['s1_beats_s0'] else 'S0'} wins).")
    if "budget" in rep:
        console.print("Budget pages: " + ", ".join(f"{o.upper()} {b['total_pages']:,}"
                                                   for o, b in rep["budget"].items())
                      + f" ({next(iter(rep['budget'].values()))['label']})")
    if "d0_feasibility" in rep:
        d = rep["d0_feasibility"]
        console.print(
            f"D0 (f={d['d0_attn_fraction']}): attention {d['attention_need_kib']:,} of "
            f"{d['attention_capacity_kib']:,} KiB, checkpoints {d['checkpoint_need_kib']:,} of "
            f"{d['checkpoint_capacity_kib']:,} KiB -> "
            + ("feasible" if d["feasible"] else "[bold red]infeasible[/]"))
    if "kv_of_x_a" in rep:
        k = rep["kv_of_x_a"]
        console.print(f"Pure attention: {k['tokens']:,} tokens of KV = "
                      f"{k['whole_model_bytes']:,} B for the whole model.")
    if "kv_budget" in rep:
        k = rep["kv_budget"]
        console.print(f"The budget ({k['whole_model_bytes']:,} B) retains "
                      f"{k['retained_tokens']:,} tokens of KV.")
    if "tail_waste" in rep:
        t = Table(title="Page-tail waste of the request lengths")
        for col in ("org", "block tokens", "requests", "wasted tokens", "max / request",
                    "KiB per pool layer"):
            t.add_column(col, justify="left" if col == "org" else "right")
        for org, w in rep["tail_waste"].items():
            t.add_row(org.upper(), str(w["block_tokens"]), str(w["requests"]),
                      f"{w['tokens']:,}", str(w["max_tokens"]), f"{w['kib']:,}")
        console.print(t)


@click.command("ledger")
@model_options
@click.option("--xa", "xa", default="16", show_default=True, metavar="N",
              help="x_A: S0/S1/S2 attention blocks (the model's shared page: 512 tokens "
                   "for Falcon-H1-7B).")
@click.option("--xr", "xr", default="4", show_default=True, metavar="N",
              help="x_R: checkpoints (SSM + conv state at one position).")
@click.option("--xa16", "xa16", default=None, metavar="N",
              help="x_A16: D0's blocks (default: the same tokens; 32 x x_A for Falcon-H1-7B).")
@click.option("--budget", "budget_text", default=None, metavar="BUDGET",
              help="Also check the mix against a budget (bN, Np or a size; see hbench budget).")
@click.option("--d0-attn-fraction", "d0_attn_fraction", default=str(DEFAULT_D0_ATTN_FRACTION),
              show_default=True, metavar="F", help="Share of D0's bytes for its attention pool.")
@click.option("--lengths-from", "lengths_from", default=None, metavar="FILE",
              help="Request lengths (JSON list or one per line): report page-tail waste.")
@click.option("--json", "as_json", is_flag=True, help="Print the ledger as JSON.")
def ledger(model, config_path, dtype, ssm_dtype, xa, xr, xa16, budget_text, d0_attn_fraction,
           lengths_from, as_json):
    """Allocated memory and its waste for x_A attention blocks and x_R checkpoints.

    \b
    Per pool layer, KiB (Falcon-H1-7B: attention block A = 512, checkpoint C = 1557):
      S0  1557 (x_A + x_R)            every object gets one coarse page
      S1  512 x_A + 2048 x_R          checkpoint = 3 SSM pages + 1 conv page
      S2  512 x_A + 1536 x_R + 512 m  conv in 32 KiB slots, m = ceil(x_R/16) slabs
      D0  16 x_A16 + 1557 x_R         two pools; feasible iff each holds its part
    U0, E0  as D0: one region split between the two kinds while serving
    Waste columns: attention = page bytes beyond a 512-token block (S0);
    checkpoint = page beyond a one-page checkpoint; ssm / conv = member pages or
    slots beyond the state; slab_spare = unused slots of allocated slabs.
    Delta01 = S0 - S1; S1 wins iff x_A > ratio x x_R (0.47 for Falcon-H1-7B).

    \b
    Example:  hbench ledger --model falcon-h1-7b --xa 16 --xr 4 --budget b83
    """
    geom = geometry_from_options(model, config_path, dtype, ssm_dtype)
    x_a, x_r = parse_count(xa, "--xa"), parse_count(xr, "--xr")
    x_a16 = parse_count(xa16, "--xa16")
    if x_a16 is None:
        grid = grid_for(geom)
        x_a16 = -(-x_a * grid.shared_block_tokens // grid.dual_block_tokens)
    fraction = parse_fraction(d0_attn_fraction)
    lengths = read_lengths(lengths_from) if lengths_from else None
    rep = ledger_report(geom, x_a, x_r, x_a16, budget_text, fraction, lengths)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    print_ledger(rep, Console(width=max(Console().width, 110)))
