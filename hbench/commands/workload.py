"""``hbench workload build|describe``: derive a ShareGPT workload to a Parquet
file, and summarize one (length percentiles, sharing, offered load, figure).

`summarize` is a pure function of a `Workload` so analysis and tests can use
it without the CLI; the commands only parse flags, call and print.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from common.errors import HbenchError
from harness.config import ORG_NAMES, RunConfig
from hbench.flag_once import OnceGroup
from hbench.flag_types import FLOAT, INT
from workloads.kinds import WORKLOAD_KINDS
from workloads.sharegpt.arrivals import ARRIVALS, THINK_TIMES
from workloads.workload import Workload

PERCENTILES = (50, 90, 99)
_D = RunConfig()


def multiturn_options(f):
    """The multi-turn and corpus flags, shared by ``run`` and ``workload build``."""
    opts = [
        click.option("--workload-kind", type=click.Choice(list(WORKLOAD_KINDS)), default=_D.workload_kind,
                     show_default=True, help="sharegpt: the study's shared contexts; multiturn: "
                     "conversation replay (--requests/--rate then count sessions)."),
        click.option("--max-turns", type=INT, default=_D.max_turns, show_default=True,
                     help="Multi-turn: turns per session at most."),
        click.option("--max-history", type=INT, default=None,
                     help="Multi-turn: prompt + output tokens of a turn at most "
                     "[default: --max-model-len]."),
        click.option("--think", type=click.Choice(list(THINK_TIMES)), default=_D.think,
                     show_default=True, help="Multi-turn: think-time distribution."),
        click.option("--think-time", "think_time_s", type=FLOAT, default=_D.think_time_s,
                     show_default=True, help="Multi-turn: mean seconds between an answer and "
                     "the next turn."),
        click.option("--replay-answers", is_flag=True, help="Multi-turn: the next prompt holds "
                     "the dataset's answer instead of the generated tokens."),
        click.option("--dataset", default=None, metavar="PATH|HUB-ID",
                     help="A chat corpus instead of the packaged ShareGPT V3: a JSON/JSONL/Parquet "
                     "file or folder, a saved `datasets` dataset, or a hub id (needs network)."),
        click.option("--chat-column", default=None,
                     help="The column holding each record's messages [default: detected from "
                     "conversations, messages, conversation]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def summarize(w: Workload, grids: dict[str, int] | None = None) -> dict:
    """Length percentiles, shared fraction, offered load and identity of ``w``;
    with ``grids`` (organization -> checkpoint grid tokens) also its
    prefix-sharing structure against them and, for a multi-turn workload, the
    history growth per turn (`workloads.describe`).

    Offered load divides the requested tokens by the arrival span (the
    process starts at t = 0, so the span is the last arrival time); for a
    multi-turn workload it covers the first turns, the open-loop part.
    """
    if len(w) == 0:
        raise HbenchError("the workload has no requests")
    inputs = np.array([r.prompt_len for r in w.requests], dtype=np.float64)
    outputs = np.array([r.output_len for r in w.requests], dtype=np.float64)
    duration = float(w.requests[-1].arrival_s)

    def dist(x: np.ndarray) -> dict:
        d = {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}
        d["mean"] = float(x.mean())
        return d

    per_s = (lambda total: total / duration) if duration > 0 else (lambda total: float("nan"))
    extra = {}
    if grids:
        from workloads.describe import all_turns, history_growth, sharing_structure

        extra = {"sharing": sharing_structure(w, grids), "history_growth": history_growth(w),
                 "total_requests": w.total_requests, "all_turns": all_turns(w)}
    return {
        "requests": len(w),
        "input_tokens": dist(inputs),
        "output_tokens": dist(outputs),
        "shared_fraction": float(np.mean([r.prefix_group >= 0 for r in w.requests])),
        "duration_s": duration,
        "offered_req_per_s": per_s(len(w)),
        "offered_input_tok_per_s": per_s(float(inputs.sum())),
        "offered_output_tok_per_s": per_s(float(outputs.sum())),
        "content_hash": w.content_hash,
        "meta": w.meta,
        **extra,
    }


def plot_lengths(w: Workload, path: Path) -> Path:
    """Histograms of input and output lengths, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inputs = [r.prompt_len for r in w.requests]
    outputs = [r.output_len for r in w.requests]
    fig, (ax_in, ax_out) = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, data, label in ((ax_in, inputs, "input"), (ax_out, outputs, "output")):
        ax.hist(data, bins=40, color="#4472c4" if label == "input" else "#ed7d31")
        ax.axvline(float(np.mean(data)), color="black", linestyle="--", linewidth=1,
                   label=f"mean {np.mean(data):.0f}")
        ax.set_xlabel(f"{label} tokens per request")
        ax.set_ylabel("requests")
        ax.legend()
    meta = w.meta
    fig.suptitle(f"{len(w)} requests, q={meta.get('q')}, {meta.get('rate')} req/s "
                 f"({meta.get('arrival')}), tokenizer {meta.get('tokenizer')}", fontsize=10)
    fig.tight_layout()
    from common.atomic import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


@click.group(cls=OnceGroup)
def workload():
    """Derive and inspect ShareGPT-derived request streams."""


@workload.command()
@click.option("--q", "q", type=FLOAT, default=1.0, show_default=True,
              help="Shared-prefix fraction: probability a request uses a shared context.")
@click.option("--rate", type=FLOAT, default=3.0, show_default=True, help="Arrival rate, req/s.")
@click.option("--requests", type=INT, default=240, show_default=True, help="Number of requests.")
@click.option("--duration", "duration_s", type=FLOAT, default=None,
              help="Instead of --requests: all arrivals before this many seconds.")
@click.option("--seed", type=INT, default=0, show_default=True)
@click.option("--arrival", type=click.Choice(sorted(ARRIVALS)), default="poisson",
              show_default=True)
@click.option("--burstiness", type=FLOAT, default=1.0, show_default=True,
              help="Gamma arrivals: squared coefficient of variation of the gaps.")
@click.option("--contexts", type=INT, default=8, show_default=True,
              help="Number of shared contexts K.")
@click.option("--mean-input", "mean_input", type=INT, default=3332, show_default=True,
              help="Target mean prompt length in tokens (sets the context length).")
@click.option("--max-model-len", type=INT, default=8192, show_default=True)
@click.option("--max-output", type=INT, default=1024, show_default=True)
@click.option("--isolate", is_flag=True, help="Give every request a unique cache salt.")
@click.option("--revision", default=None, help="Hub datasets: the revision to read.")
@click.option("--tokenizer", type=click.Path(), default=None,
              help="A tokenizer.json (or a folder holding one) for exact token counts.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Parquet file to write.")
@multiturn_options
@click.pass_context
def build(ctx, q, rate, requests, duration_s, seed, arrival, burstiness, contexts, mean_input,
          max_model_len, max_output, isolate, revision, tokenizer, output, **multiturn):
    """Derive a workload and save it as Parquet."""
    from rich.console import Console

    from harness.run_setup import check_memory
    from hbench.flag_rules import check_flags, typed_flags
    from hbench.paths import check_writable_file
    from workloads.build import build_workload
    from workloads.io import save_workload

    recipe = RunConfig(q=q, rate=rate, requests=requests, duration_s=duration_s, seed=seed,
                       arrival=arrival, burstiness=burstiness, contexts=contexts,
                       mean_input=mean_input, max_model_len=max_model_len, max_output=max_output,
                       isolate=isolate, **multiturn)
    check_flags(typed_flags(ctx), [recipe])
    check_writable_file(output, "--output")
    check_memory(recipe.expected_requests, recipe.mean_input, subject="running this workload")
    with Console(stderr=True).status("Loading ShareGPT and deriving the workload..."):
        w = build_workload(
            seed=seed, q=q, rate=rate, arrival=arrival, burstiness=burstiness,
            requests=requests, duration_s=duration_s, contexts=contexts,
            max_model_len=max_model_len, max_output=max_output, isolate=isolate,
            tokenizer=tokenizer, mean_input_tokens=mean_input, **multiturn, revision=revision,
        )
        path = save_workload(w, output)
    m = w.meta
    if w.sessions:
        click.echo(
            f"wrote {path}: {len(w.sessions)} sessions, {w.total_requests} turns (at most "
            f"{m['max_turns']} per session, history <= {m['max_history']} tok), "
            f"{m['rate']:g} sessions/s {m['arrival']}, think {m['think']} mean "
            f"{m['think_time_s']:g} s, {'replayed' if m['replay_answers'] else 'generated'} "
            f"answers; {m['dataset']}: {m['records_read']} records read; "
            f"hash {w.content_hash}")
        return
    cut = ", file truncated" if m["truncated"] else ""
    click.echo(
        f"wrote {path}: {len(w)} requests, q={m['q']:g}, {m['rate']:g} req/s {m['arrival']}, "
        f"mean input {m['mean_input_tokens']:.0f} tok (context {m['context_tokens']}), "
        f"mean output {m['mean_output_tokens']:.0f} tok; {m['dataset']}: "
        f"{m['records_read']} records read{cut}; hash {w.content_hash}"
    )


def org_grids(model: str = "falcon-h1-7b") -> dict[str, int]:
    """Each organization's checkpoint grid for ``model`` (a preset name), from
    its layout: what `workloads.describe.sharing_structure` compares with."""
    from harness.model_configs import geometry_for_run
    from harness.orgs import layout_for

    geom = geometry_for_run(RunConfig(model=model))
    return {org: layout_for(org, geom).grid_tokens for org in ORG_NAMES}


@workload.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Also write a histogram of input and output lengths.")
@click.option("--sharing-png", type=click.Path(dir_okay=False), default=None,
              help="Also write a figure of the prefix-sharing structure against the grids.")
@click.option("--model", default="falcon-h1-7b", show_default=True,
              help="Model preset whose organization grids the sharing is compared with.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def describe(path, png, sharing_png, model, as_json):
    """Summarize a saved workload: lengths, load, and the prefix sharing a
    hybrid cache can use at each organization's checkpoint grid."""
    from hbench.paths import check_writable_file
    from workloads.io import load_workload

    if png:
        check_writable_file(png, "--png")
    if sharing_png:
        check_writable_file(sharing_png, "--sharing-png")
    w = load_workload(path)
    s = summarize(w, org_grids(model))
    if png:
        plot_lengths(w, Path(png))
    if sharing_png:
        from workloads.describe import save_sharing_figure

        save_sharing_figure(s, Path(sharing_png))
    if as_json:
        click.echo(json.dumps(s, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{path}: {s['requests']} requests")
    table.add_column("tokens per request")
    for p in PERCENTILES:
        table.add_column(f"p{p}", justify="right")
    table.add_column("mean", justify="right")
    for label, key in (("input", "input_tokens"), ("output", "output_tokens")):
        d = s[key]
        table.add_row(label, *(f"{d[f'p{p}']:.0f}" for p in PERCENTILES), f"{d['mean']:.1f}")
    console = Console()
    console.print(table)
    m = s["meta"]
    lines = [
        f"shared fraction   {s['shared_fraction']:.3f} (q={m.get('q')}, {m.get('contexts')} contexts"
        f" of {m.get('context_tokens')} tokens, {'ISOLATE' if m.get('isolate') else 'SHARE'})",
        f"duration          {s['duration_s']:.1f} s ({m.get('arrival')}, {m.get('rate')} req/s asked,"
        f" {s['offered_req_per_s']:.2f} offered)",
        f"offered load      {s['offered_input_tok_per_s']:.0f} input tok/s,"
        f" {s['offered_output_tok_per_s']:.0f} output tok/s",
        f"dataset           {m.get('dataset')}: {m.get('records_read')} records read"
        f"{' (file truncated)' if m.get('truncated') else ''}; tokenizer {m.get('tokenizer')}",
        f"content hash      {s['content_hash']}",
    ]
    if w.sessions:
        lines[0] = (f"sessions          {len(w.sessions)} sessions, {w.total_requests} turns "
                        f"(think {m.get('think')} mean {m.get('think_time_s')} s, "
                    f"{'replayed' if m.get('replay_answers') else 'generated'} answers, "
                    f"{'ISOLATE' if m.get('isolate') else 'SHARE'})")
    if s.get("all_turns"):
        a = s["all_turns"]
        lines.insert(3, f"all turns         {a['turns']:,} turns: {a['prompt_tokens']:,} planned "
                        f"prompt tokens ({a['history_tokens']:,} = {a['history_fraction']:.1%} "
                        f"history from earlier turns), {a['output_tokens']:,} output tokens; "
                        "the lengths and load above are the first turns (open loop)")
    if png:
        lines.append(f"histogram         {png}")
    for line in lines:
        click.echo(line)
    sh = s["sharing"]
    click.echo(f"shareable prefix  {sh['shareable_fraction']:.1%} of {sh['prompt_tokens']:,} prompt "
               f"tokens at best ({sh['sharing_requests']} of {sh['requests']} requests share, "
               f"median prefix {sh['shareable_prefix_p50']:.0f} tok)")
    grid_table = Table(title="reusable at each organization's checkpoint grid")
    for col in ("org", "grid", "reusable", "beyond last grid point", "per sharing request",
                "prefix < one grid"):
        grid_table.add_column(col, justify="left" if col == "org" else "right")
    for org, o in sh["orgs"].items():
        grid_table.add_row(org, f"{o['grid_tokens']}", f"{o['reusable_fraction']:.1%}",
                           f"{o['beyond_grid_tokens']:,} tok", f"{o['beyond_grid_mean']:.0f} tok",
                           f"{o['below_one_grid']}")
    console.print(grid_table)
    if s["history_growth"]:
        growth = Table(title="history growth per session")
        for col in ("turn", "sessions", "mean prompt", "max prompt", "mean history"):
            growth.add_column(col, justify="right")
        for g in s["history_growth"]:
            growth.add_row(str(g["turn"]), str(g["sessions"]), f"{g['prompt_mean']:.0f}",
                           str(g["prompt_max"]), f"{g['history_mean']:.0f}")
        console.print(growth)
    if sharing_png:
        click.echo(f"sharing figure    {sharing_png}")
