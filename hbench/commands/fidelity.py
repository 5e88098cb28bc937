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


@click.command(context_settings={"max_content_width": 100})
@click.option("--engine", type=click.Choice(ENGINES), default="torch", show_default=True,
              help="The real engine to hold the simulator against.")
@click.option("--model", "model_dir", required=True, type=click.Path(),
              help="Model directory (hbench tiny-model --preset proportional).")
@click.option("--org", "orgs", default="s0,s1,s2,d0", show_default=True,
              help="Organizations, comma-separated.")
@click.option("--budget", "budgets", default="b8", show_default=True,
              help="Budgets, comma-separated (bN, Np or a size).")
@click.option("--seeds", default="0-1", show_default=True, help="Workload seeds: 0-2 or 0,3.")
@click.option("--profile", "profile_path", type=click.Path(), default=None,
              help="Cost profile from hbench calibrate; default: calibrate now (into OUT).")
@click.option("--quick", is_flag=True, help="With no --profile: the quick calibration design.")
@click.option("--requests", type=INT, default=60, show_default=True)
@click.option("--rate", type=FLOAT, default=4.0, show_default=True)
@click.option("--q", type=FLOAT, default=1.0, show_default=True)
@click.option("--mean-input", type=INT, default=1000, show_default=True)
@click.option("--max-output", type=INT, default=32, show_default=True)
@click.option("--contexts", type=INT, default=4, show_default=True)
@click.option("--max-model-len", type=INT, default=2048, show_default=True)
@click.option("--cap", type=INT, default=63, show_default=True)
@click.option("--token-budget", type=INT, default=8192, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--out", "out_dir", default="results/fidelity", show_default=True, type=click.Path())
@click.option("--analyze-only", is_flag=True, help="Only rebuild the ledger from OUT/runs.")
@click.pass_context
def fidelity(ctx, engine, model_dir, orgs, budgets, seeds, profile_path, quick, device, out_dir,
             analyze_only, **fields):
    """Run the same cells on ENGINE and on the simulator; write the fidelity ledger.

    \b
    hbench tiny-model --preset proportional -o /tmp/prop
    hbench fidelity --engine torch --model /tmp/prop --budget b8 --seeds 0-1 --out fid
    """
    from harness.config import RunConfig
    from hbench.fidelity import run_fidelity, write_ledger
    from hbench.flag_rules import TOOL_RULES, check_flags, typed_flags

    check_flags(typed_flags(ctx), [RunConfig(engine=engine)], TOOL_RULES)
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

    with progress_bar() as update:
        doc = run_fidelity(
            engine, model_dir, out, axes={"org": orgs, "budget": budgets, "seed": seeds},
            fields=fields, profile=profile_path, quick=quick, device=device,
            note=lambda text: click.echo(text, err=True), on_calibrated=print_fit,
            progress=update)
    print_summary(doc["metrics"])
    click.echo(f"ledger: {out / 'ledger.csv'}  summary: {out / 'fidelity.json'}  "
               f"figure: {out / 'fidelity.png'}")
