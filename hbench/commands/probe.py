"""``hbench probe --endpoint URL``: what a live OpenAI-compatible server really reuses, and why.

Thin: `hbench.probe.probe_report` runs the probe (and a workload's replay);
this checks the flags, prints a table or JSON, and writes the HTML section.
"""

from __future__ import annotations

import json

import click

from hbench.flag_types import PATH, Float, Int


@click.command("probe", context_settings={"max_content_width": 100})
@click.option("--endpoint", required=True, metavar="URL",
              help="The server's base address, e.g. http://127.0.0.1:8000.")
@click.option("--model", default=None, help="Served model to address (default: the only one).")
@click.option("--max-requests", type=Int(lo=4, hi=100_000), default=120, show_default=True,
              help="Most probe requests to send (the workload's replay is not counted).")
@click.option("--max-seconds", type=Float(lo=1.0, hi=86_400.0), default=300.0,
              show_default=True, help="Most wall time the probe may take.")
@click.option("--workload", "workload_path", type=PATH, default=None,
              help="A saved hbench workload to replay after the probe: shareable vs reused "
                   "tokens per request, and why each shortfall.")
@click.option("--seed", type=Int(lo=0), default=None,
              help="Seed of the probe's random prefixes (default: a fresh one, shown in the "
                   "report). A seed used before against the same server meets its own "
                   "cached prefixes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-o", "--out", type=PATH, default=None, help="Also write a self-contained HTML file.")
def probe(endpoint, model, max_requests, max_seconds, workload_path, seed, as_json, out):
    """Probe a live server's prefix cache with designed request sequences.

    \b
    Each pair sends a fresh random prefix P as a whole prompt, then P plus
    one token, and reads how many tokens the second reused:
      - is prefix caching on at all;
      - the reuse unit: the smallest reusable prefix, the step between
        reusable lengths, and whether a hit can stop inside a block;
      - whether a prefix inside an earlier, longer prompt is reused;
      - whether a request's own history survives to its next turn;
      - how many filler requests a cached prefix survives.
    Evidence: usage.prompt_tokens_details.cached_tokens when the server
    reports it, else its /metrics prefix-cache hit counter, else time to
    first token against a fitted prefill cost (the report says which, and
    how sure). With --workload, the workload is then replayed and each
    request's shareable prefix is set against what the server reused.
    """
    from adapters.client.http import Endpoint
    from hbench.paths import check_writable_file

    Endpoint.parse(endpoint)            # a malformed URL fails before anything else
    if out is not None:
        check_writable_file(out, "--out")
    workload = None
    if workload_path is not None:
        from workloads.io import load_workload

        workload = load_workload(workload_path)
    from hbench.probe import probe_report

    if seed is None:
        import secrets

        seed = secrets.randbits(62)

    report = probe_report(endpoint, model=model, max_requests=max_requests,
                          max_seconds=max_seconds, workload=workload,
                          workload_path=None if workload_path is None else str(workload_path),
                          seed=seed)
    if out is not None:
        from analysis.probe_verdict import html_page
        from common.atomic import atomic_write_text

        atomic_write_text(out, html_page(report))
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print(report)
    if out is not None and not as_json:
        click.echo(f"wrote {out}")


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from analysis.probe_verdict import PROBE_REASONS, summary_lines

    f = report["findings"]
    console = Console()
    t = Table(title=f"hbench probe: {report['endpoint']} ({f['model']})")
    t.add_column("question")
    t.add_column("answer")
    for q, a in summary_lines(f):
        t.add_row(q, a)
    console.print(t)
    rep = report["replay"]
    if not rep:
        return
    tot = rep["totals"]
    t = Table(title=f"replay of {report['workload']}: {tot['requests']} requests, "
                    f"{tot['shareable']} shareable tokens, {tot['reused']} reused"
                    + (" (estimated)" if tot["estimated"] else "")
                    + ("" if tot["metrics_reused"] is None
                       else f"; the server's hit counter rose by {tot['metrics_reused']}"))
    for col in ("request", "session", "turn", "prompt", "shareable", "reused", "reason"):
        t.add_column(col, justify="left" if col == "reason" else "right")
    for r in rep["requests"]:
        t.add_row(str(r["request_id"]), "-" if r["session"] is None else str(r["session"]),
                  "-" if r["turn"] is None else str(r["turn"]), str(r["prompt_tokens"]),
                  str(r["shareable"]), "-" if r["reused"] is None else str(r["reused"]),
                  PROBE_REASONS.get(r["reason"], ""))
    console.print(t)
    t = Table(title="shortfalls by reason")
    t.add_column("reason")
    t.add_column("requests", justify="right")
    t.add_column("tokens not reused", justify="right")
    for v in rep["by_reason"].values():
        t.add_row(v["words"], str(v["requests"]), str(v["tokens"]))
    console.print(t)
    click.echo(rep["advice"])
