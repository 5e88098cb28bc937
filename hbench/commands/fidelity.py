"""``hbench fidelity``: the same workloads on a real engine and on the simulator.

Thin: flags -> `hbench.fidelity.run_fidelity` (every cell on both engines,
calibrating first without ``--profile``, then the ledger) -> the summary.
``--analyze-only`` rebuilds the ledger from ``OUT/runs``
(`hbench.fidelity.write_ledger`).
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from hbench.fidelity import ENGINES
from hbench.flag_types import FLOAT, INT


def _fmt(v, compare: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.2f}" if compare == "diff" else f"{100 * v:.1f}%"


def print_summary(summary: list[dict]) -> None:
    click.echo(f"  {'metric':<26}{'compare':<9}{'band':>7}{'median error':>14}{'within':>9}")
    for s in summary:
        within = f"{s['within']:>5}/{s['cells']:<3}" if s["cells"] else "  not observed"
        click.echo(f"  {s['metric']:<26}{s['compare']:<9}{_fmt(s['band'], s['compare']):>7}"
                   f"{_fmt(s['median_abs_error'], s['compare']):>14}{within}")


#: The workload of a real engine's cells (a tiny model on this machine's CPU);
#: with --in-process the study's (`harness.config.RunConfig`'s defaults).
TINY_WORKLOAD = {"requests": 60, "rate": 4.0, "q": 1.0, "mean_input": 1000, "max_output": 32,
                 "contexts": 4, "max_model_len": 2048, "cap": 63, "token_budget": 8192}
WORKLOAD_HELP = "[default: {}; with --in-process the study's]"


def _workload_option(name: str, kind):
    field = name.lstrip("-").replace("-", "_")
    return click.option(name, field, type=kind, default=None,
                        help=WORKLOAD_HELP.format(TINY_WORKLOAD[field]))


@click.command(context_settings={"max_content_width": 100})
@click.option("--engine", type=click.Choice(ENGINES), default="torch", show_default=True,
              help="The real engine to hold the simulator against.")
@click.option("--in-process", is_flag=True,
              help="--engine vllm: hold hbench's scheduler against vLLM's own, run in process "
                   "at the study's scale (Falcon-H1-7B, the study's workload), both sides priced "
                   "by --gpu's cost model; no server, no calibration.")
@click.option("--model", "model_dir", default=None,
              help="Model directory (hbench tiny-model --preset proportional); with "
                   "--in-process a preset or a Falcon-H1 config.json [default: falcon-h1-7b].")
@click.option("--org", "orgs", default="s0,s1,s2,d0", show_default=True,
              help="Organizations, comma-separated.")
@click.option("--budget", "budgets", default=None,
              help="Budgets, comma-separated (bN, Np or a size) [default: b8; with "
                   "--in-process the study's b63,b83,b108].")
@click.option("--seeds", default="0-1", show_default=True, help="Workload seeds: 0-2 or 0,3.")
@click.option("--profile", "profile_path", type=click.Path(), default=None,
              help="Cost profile from hbench calibrate; default: calibrate now (into OUT).")
@click.option("--quick", is_flag=True, help="With no --profile: the quick calibration design.")
@click.option("--gpu", default=None,
              help="With --in-process: the cost model both sides are priced by (a preset or a "
                   "profile) [default: the run's, a100-pcie-40gb].")
@_workload_option("--requests", INT)
@_workload_option("--rate", FLOAT)
@_workload_option("--q", FLOAT)
@_workload_option("--mean-input", INT)
@_workload_option("--max-output", INT)
@_workload_option("--contexts", INT)
@_workload_option("--max-model-len", INT)
@_workload_option("--cap", INT)
@_workload_option("--token-budget", INT)
@click.option("--headroom", type=FLOAT, default=None,
              help="With --in-process: the admission headroom of every cell (vLLM's watermark).")
@click.option("--retention", is_flag=True, default=None,
              help="With --in-process: every cell holds a running producer's demanded "
                   "checkpoints (DESIGN.md section 4; on vLLM hbench's plugin, S1/S2/D0 only).")
@click.option("--retention-threshold", type=INT, default=None,
              help="With --retention: distinct requests that must demand a prefix "
                   "[default: 2].")
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--out", "out_dir", default="results/fidelity", show_default=True, type=click.Path())
@click.option("--analyze-only", is_flag=True, help="Only rebuild the ledger from OUT/runs.")
@click.pass_context
def fidelity(ctx, engine, in_process, model_dir, orgs, budgets, seeds, profile_path, quick, gpu,
             device, out_dir, analyze_only, **fields):
    """Run the same cells on ENGINE and on the simulator; write the fidelity ledger.

    \b
    hbench tiny-model --preset proportional -o /tmp/prop
    hbench fidelity --engine torch --model /tmp/prop --budget b8 --seeds 0-1 --out fid
    hbench fidelity --engine vllm --in-process --org s0,s2,d0 --budget b63,b83,b108 --out fid
    hbench fidelity --engine vllm --in-process --org s2 --budget 254p --retention --out fid8
    """
    from harness.config import RunConfig
    from hbench.fidelity import run_fidelity, run_scheduler_fidelity, write_ledger
    from hbench.flag_rules import FIDELITY_RULES, check_flags, typed_flags

    check_flags(typed_flags(ctx), [RunConfig(engine=engine)], FIDELITY_RULES)
    out = Path(out_dir)
    if analyze_only:
        doc = write_ledger(out, engine)
        print_summary(doc["metrics"])
        click.echo(f"ledger: {out / 'ledger.csv'}")
        return
    from common.input_files import check_input_file
    from hbench.commands.calibrate import print_fit
    from hbench.paths import check_writable_dir
    from hbench.progress import progress_bar

    check_writable_dir(out, "--out")
    if profile_path is not None:
        check_input_file(profile_path, "--profile cost profile")
    given = {k: v for k, v in fields.items() if v is not None}
    axes = {"org": orgs, "budget": budgets or ("b63,b83,b108" if in_process else "b8"),
            "seed": seeds}
    with progress_bar() as update:
        if in_process:
            doc = run_scheduler_fidelity(
                model_dir or "falcon-h1-7b", out, axes=axes,
                fields={**given, **({"gpu": gpu} if gpu else {})}, progress=update)
        else:
            if model_dir is None:
                raise click.UsageError("--model is required (hbench tiny-model makes one), "
                                       "unless --in-process")
            doc = run_fidelity(
                engine, model_dir, out, axes=axes, fields={**TINY_WORKLOAD, **given},
                profile=profile_path, quick=quick, device=device,
                note=lambda text: click.echo(text, err=True), on_calibrated=print_fit,
                progress=update)
    print_summary(doc["metrics"])
    click.echo(f"ledger: {out / 'ledger.csv'}  summary: {out / 'fidelity.json'}  "
               f"figure: {out / 'fidelity.png'}")
