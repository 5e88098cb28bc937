"""The fidelity experiment: the same workloads on a real engine and on the simulator.

For every cell (organization x budget x seed) `run_fidelity` serves one
workload twice, on the real engine and on the simulator with a measured cost
profile (given, or fitted first by `hbench.calibration.calibrate_model`),
writes both runs into ``OUT/runs`` like any other run, and then the ledger
(`analysis.fidelity`): per cell and metric, real, simulated and their
agreement, into ``OUT/ledger.csv``, ``OUT/fidelity.json`` and the figure
``OUT/fidelity.png`` (`write_ledger`, which also rebuilds them from
``OUT/runs`` alone). Every cell is checked before any work, and a repeated
call resumes: a side already in ``OUT/runs`` is not run again.

`run_scheduler_fidelity` holds hbench's scheduler against vLLM's own, run in
process (`adapters.vllm_inprocess`) at the study's scale: both sides are
priced by the same cost model (``--gpu``), so the ledger measures only what
the two schedulers and block pools decide differently.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from adapters.calibration import DRIVERS
from common.errors import HbenchError

ENGINES = tuple(DRIVERS)   # the engines a cost profile can be calibrated on


def write_ledger(out: Path, engine: str, extra: dict | None = None) -> dict:
    """Ledger, summary and figure from ``out/runs``; returns the summary document."""
    from analysis.fidelity import fidelity_figure, read_ledger, summarize
    from analysis.figures import save
    from common.atomic import atomic_path, atomic_write_text

    table = read_ledger(out / "runs", engine)
    with atomic_path(out / "ledger.csv") as tmp:
        table.to_csv(tmp, index=False)
    doc = {"engine": engine, "cells": int(table[["org", "budget", "seed"]].drop_duplicates()
                                          .shape[0]),
           "metrics": summarize(table), **(extra or {})}
    atomic_write_text(out / "fidelity.json", json.dumps(doc, indent=2, default=str) + "\n")
    save(fidelity_figure(table), out, "fidelity")
    return doc


def vllm_cells(cells: list) -> list:
    """The cells as a launched vLLM serves them: on CPU vLLM steps one block per
    step whatever ``--token-budget`` says, so the simulator gets the same step
    (at least the organization's grid). Refused here if vLLM cannot express one."""
    from adapters.registry import make_engine

    vllm = make_engine("vllm")
    out = []
    for cfg in cells:
        vllm.check_config(cfg)
        out.append(vllm.as_served(cfg))
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


def plan_cells(engine: str, model_dir: Path, axes: Mapping[str, str],
               fields: Mapping[str, object], device: str = "cpu") -> dict:
    """Every cell's config mapped to the workload both sides serve. ``axes``
    (org, budget, seed: grid values such as ``"s0,s2"``, ``"0-1"``) expand over
    ``fields`` (further `RunConfig` fields). A cell that cannot run, on the
    real engine or on the simulator, is refused here, before any work."""
    from adapters.sim.engine import SimEngine
    from harness.engine.fits import check_fits
    from harness.grid import expand
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload

    base = {"engine": engine, "model": str(model_dir),
            "config_path": str(model_dir / "config.json"), **fields}
    if engine == "torch":
        base["device"] = device
    else:
        base["launch"] = True
    cells = expand([dict(axes)], base)
    if engine == "vllm":
        cells = vllm_cells(cells)
    workloads = {}
    for cfg in cells:
        setup = validate(cfg)
        workloads[cfg] = token_trace(cfg, model_dir) if engine == "vllm" else build_run_workload(cfg)
        check_fits(SimEngine().build(setup), workloads[cfg], cfg, setup.budget.label)
    return workloads


def run_fidelity(engine: str, model_dir: str | Path, out: str | Path, *,
                 axes: Mapping[str, str], fields: Mapping[str, object],
                 profile: str | Path | None = None, quick: bool = False, device: str = "cpu",
                 note: Callable[[str], None] | None = None,
                 on_calibrated: Callable | None = None,
                 progress: Callable[..., None] | None = None) -> dict:
    """Run every cell (`plan_cells`) on ``engine`` and on the simulator under
    ``out/runs`` and write the ledger (`write_ledger`); returns its summary
    document. Without ``profile``, ``engine`` is calibrated first
    (`hbench.calibration.calibrate_model`, the quick design if ``quick``) into
    ``out/profile.json`` and ``out/samples.csv``; a fit above
    `hbench.calibration.MAX_HELD_OUT_ERROR` is refused. ``note(text)`` hears
    what a reader should know, ``on_calibrated(fit, profile)`` the fresh fit,
    ``progress(description, completed, total)`` each step."""
    from adapters.sim.profile import load_profile, save_profile
    from hbench.calibration import calibrate_model, check_held_out, write_samples

    note = note or (lambda text: None)
    progress = progress or (lambda description, completed=None, total=None: None)
    model_dir, out = Path(model_dir), Path(out)
    if not (model_dir / "config.json").is_file():
        raise HbenchError(f"--model {model_dir}: no config.json there (make one with "
                          "hbench tiny-model)")
    workloads = plan_cells(engine, model_dir, axes, fields, device)
    if profile is None:
        profile = out / "profile.json"
        note(f"no --profile: calibrating {engine} first (hbench calibrate) into {profile}")
        options = {"device": device} if engine == "torch" else {}
        fitted, fit, samples = calibrate_model(
            engine, model_dir, quick=quick, max_model_len=next(iter(workloads)).max_model_len,
            progress=lambda cell: progress(f"calibrating: {cell.name}"), **options)
        write_samples(samples, out / "samples.csv")
        if on_calibrated:
            on_calibrated(fit, fitted)
        check_held_out(fit)
        save_profile(fitted, profile)
    cost = load_profile(profile)
    if cost.engine and cost.engine != engine:
        note(f"note: profile {profile} was measured on {cost.engine}, not {engine}")

    run_pairs(workloads, out / "runs", engine, str(profile), progress)
    return write_ledger(out, engine, {"profile": cost.describe(), "cells_run": cells_run(workloads)})


def cells_run(workloads) -> list[dict]:
    return [{"org": c.org, "budget": c.budget, "seed": c.seed} for c in workloads]


def run_pairs(workloads: Mapping, runs: Path, engine: str, gpu: str,
              progress: Callable[..., None]) -> None:
    """Each cell on ``engine`` and on the simulator (priced by ``gpu``, its
    pages laid out as the engine's), under ``runs``; a side already there stays."""
    from hbench.runner import execute

    done = finished_sides(runs, engine)
    total, finished = 2 * len(workloads), 0
    for cfg, workload in workloads.items():
        # the simulator lays pages out as the real engine does (vLLM: its blocks)
        sim_cfg = dataclasses.replace(cfg, engine="sim", gpu=gpu, launch=False,
                                      device="cpu", paging=cfg.resolved_paging)
        for c in (cfg, sim_cfg):
            side = "sim" if c.engine == "sim" else "real"
            if (c.org, c.budget, c.seed, side) not in done:   # an earlier call's run stays
                progress(f"{c.engine} {c.org} {c.budget} seed {c.seed}", finished, total)
                execute(c, runs, workload=workload)
            finished += 1
            progress(f"{c.engine} {c.org} {c.budget} seed {c.seed}", finished, total)


def run_scheduler_fidelity(model: str, out: str | Path, *, axes: Mapping[str, str],
                           fields: Mapping[str, object],
                           progress: Callable[..., None] | None = None) -> dict:
    """hbench's scheduler against vLLM's, cell by cell: every cell of ``axes``
    over ``fields`` (`RunConfig` fields, ``gpu`` among them) served by vLLM's
    scheduler in process and by the simulator, on the same workload, bytes,
    page layout and cost model; then the ledger. ``model`` is a preset or a
    Falcon-H1 model directory or ``config.json`` path."""
    from adapters.registry import make_engine
    from adapters.sim.engine import SimEngine
    from harness.engine.fits import check_fits
    from harness.grid import expand
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload

    progress = progress or (lambda description, completed=None, total=None: None)
    out = Path(out)
    vllm = make_engine("vllm")
    base = {"engine": "vllm", "model": model, **fields}
    if Path(model).suffix == ".json":
        base["config_path"] = model
    workloads = {}
    for cfg in expand([dict(axes)], base):
        setup = validate(cfg)
        vllm.check_in_process(cfg)
        workloads[cfg] = build_run_workload(cfg)
        check_fits(SimEngine().build(setup), workloads[cfg], cfg, setup.budget.label)
    gpu = next(iter(workloads)).gpu
    run_pairs(workloads, out / "runs", "vllm", gpu, progress)
    return write_ledger(out, "vllm", {"mode": "vLLM's scheduler in process",
                                      "cost_model": gpu, "cells_run": cells_run(workloads)})
