"""``hbench fidelity``: the same workloads on a real engine and on the simulator.

For every cell (organization x budget x seed) the command serves one
workload twice, on the real engine and on the simulator with a measured cost
profile (``--profile``, or one fitted first by ``hbench calibrate``), writes
both runs into ``OUT/runs`` like any other run, and then the ledger
(`analysis.fidelity`): per cell and metric, real, simulated and their
agreement, into ``OUT/ledger.csv``, ``OUT/fidelity.json`` and the figure
``OUT/fidelity.png``. ``--analyze-only`` rebuilds the ledger from ``OUT/runs``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click

from harness.errors import HbenchError

ENGINES = ("torch", "vllm")


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


def write_ledger(out: Path, engine: str, extra: dict | None = None) -> dict:
    """Ledger, summary and figure from ``out/runs``; returns the summary document."""
    from analysis.fidelity import fidelity_figure, read_ledger, summarize
    from analysis.figures import save

    table = read_ledger(out / "runs", engine)
    table.to_csv(out / "ledger.csv", index=False)
    doc = {"engine": engine, "cells": int(table[["org", "budget", "seed"]].drop_duplicates()
                                          .shape[0]),
           "metrics": summarize(table), **(extra or {})}
    (out / "fidelity.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    save(fidelity_figure(table), out, "fidelity")
    return doc


def vllm_cells(cells: list) -> list:
    """The cells as a launched vLLM serves them: on CPU vLLM steps one block per
    step whatever ``--token-budget`` says, so the simulator gets the same step
    (at least the organization's grid). Refused here if vLLM cannot express one."""
    from adapters.registry import make_engine
    from harness.model_configs import geometry_for_run
    from harness.orgs import layout_for

    vllm = make_engine("vllm")
    out = []
    for cfg in cells:
        vllm.check_config(cfg)
        if vllm.cpu:
            grid = layout_for(cfg.org, geometry_for_run(cfg), cfg.resolved_paging).grid_tokens
            cfg = dataclasses.replace(cfg, token_budget=max(vllm.step_tokens(cfg), grid))
        out.append(cfg)
    return out


def token_trace(cfg, model_dir: Path):
    """The cell's workload for a served engine, as token ids of the model's own
    tokenizer. vLLM tokenizes prompt text with the model's tokenizer, while a
    workload is derived with hbench's (`workloads.sharegpt.tokenizer`): sent as
    text, the server would see other lengths and other block edges than the
    simulator. Derived with the model's tokenizer and sent as ids (a request
    without text goes as its ids), both sides serve the same tokens."""
    from workloads.build import workload_for
    from workloads.spec import WorkloadSpec

    w = workload_for(WorkloadSpec.from_config(cfg), tokenizer=model_dir)
    return dataclasses.replace(w, requests=tuple(dataclasses.replace(r, prompt_text="")
                                                 for r in w.requests))


def finished_sides(runs: Path, engine: str) -> set[tuple]:
    """(org, budget, seed, "real" | "sim") of every complete run already in
    ``runs``: a repeated call resumes instead of running a cell twice."""
    from analysis.fidelity import cell_of
    from harness.results import iter_runs

    if not runs.is_dir():
        return set()
    return {(*cell_of(r), "sim" if r.engine == "sim" else "real") for r in iter_runs(runs)
            if r.engine in ("sim", engine)}


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
@click.option("--requests", type=int, default=60, show_default=True)
@click.option("--rate", type=float, default=4.0, show_default=True)
@click.option("--q", type=float, default=1.0, show_default=True)
@click.option("--mean-input", type=int, default=1000, show_default=True)
@click.option("--max-output", type=int, default=32, show_default=True)
@click.option("--contexts", type=int, default=4, show_default=True)
@click.option("--max-model-len", type=int, default=2048, show_default=True)
@click.option("--cap", type=int, default=63, show_default=True)
@click.option("--token-budget", type=int, default=8192, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--out", "out_dir", default="results/fidelity", show_default=True, type=click.Path())
@click.option("--analyze-only", is_flag=True, help="Only rebuild the ledger from OUT/runs.")
def fidelity(engine, model_dir, orgs, budgets, seeds, profile_path, quick, requests, rate, q,
             mean_input, max_output, contexts, max_model_len, cap, token_budget, device,
             out_dir, analyze_only):
    """Run the same cells on ENGINE and on the simulator; write the fidelity ledger.

    \b
    hbench tiny-model --preset proportional -o /tmp/prop
    hbench fidelity --engine torch --model /tmp/prop --budget b8 --seeds 0-1 --out fid
    """
    out = Path(out_dir)
    if analyze_only:
        doc = write_ledger(out, engine)
        print_summary(doc["metrics"])
        click.echo(f"ledger: {out / 'ledger.csv'}")
        return

    from adapters.sim.engine import SimEngine
    from adapters.sim.profile import load_profile
    from harness.engine.fits import check_fits
    from harness.grid import expand
    from harness.run_setup import validate
    from harness.runner import build_run_workload, execute

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise HbenchError(f"--model {model_dir}: no config.json there (make one with "
                          "hbench tiny-model)")
    base = {"engine": engine, "model": str(model_dir), "config_path": str(model_dir / "config.json"),
            "requests": requests, "rate": rate, "q": q, "mean_input": mean_input,
            "max_output": max_output, "contexts": contexts, "max_model_len": max_model_len,
            "cap": cap, "token_budget": token_budget}
    if engine == "torch":
        base["device"] = device
    else:
        base["launch"] = True
    cells = expand([{"org": orgs, "budget": budgets, "seed": seeds}], base)
    if engine == "vllm":
        cells = vllm_cells(cells)
    workloads = {}
    for cfg in cells:                       # refuse a bad cell before any work
        setup = validate(cfg)
        workloads[cfg] = token_trace(cfg, model_dir) if engine == "vllm" else build_run_workload(cfg)
        check_fits(SimEngine().build(setup), workloads[cfg], cfg, setup.budget.label)
    if profile_path is None:
        profile_path = str(out / "profile.json")
        click.echo(f"no --profile: calibrating {engine} first (hbench calibrate) into "
                   f"{profile_path}")
        from harness.commands.calibrate import calibrate as calibrate_cmd

        args = ["--engine", engine, "--model", str(model_dir), "-o", profile_path,
                "--max-model-len", str(max_model_len), "--samples", str(out / "samples.csv")]
        if engine == "torch":
            args += ["--device", device]
        if quick:
            args.append("--quick")
        calibrate_cmd.main(args, standalone_mode=False)
    profile = load_profile(profile_path)
    if profile.engine and profile.engine != engine:
        click.echo(f"note: profile {profile_path} was measured on {profile.engine}, "
                   f"not {engine}", err=True)

    from rich.progress import Progress

    runs = out / "runs"
    done = finished_sides(runs, engine)
    with Progress(transient=True) as bar:
        task = bar.add_task("cells", total=2 * len(cells))
        for cfg in cells:
            workload = workloads[cfg]
            # the simulator lays pages out as the real engine does (vLLM: its blocks)
            sim_cfg = dataclasses.replace(cfg, engine="sim", gpu=profile_path, launch=False,
                                          device="cpu", paging=cfg.resolved_paging)
            for c in (cfg, sim_cfg):
                side = "sim" if c.engine == "sim" else "real"
                if (c.org, c.budget, c.seed, side) not in done:   # an earlier call's run stays
                    bar.update(task, description=f"{c.engine} {c.org} {c.budget} seed {c.seed}")
                    execute(c, runs, workload=workload)
                bar.advance(task)
    doc = write_ledger(out, engine, {"profile": profile.describe(),
                                     "cells_run": [{"org": c.org, "budget": c.budget,
                                                    "seed": c.seed} for c in cells]})
    print_summary(doc["metrics"])
    click.echo(f"ledger: {out / 'ledger.csv'}  summary: {out / 'fidelity.json'}  "
               f"figure: {out / 'fidelity.png'}")
