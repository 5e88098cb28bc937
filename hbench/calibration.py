"""Calibrate one engine: run the design on it, fit the rates, build the profile.

The engines that can be calibrated and where their drivers live (each
driver's ``measure(model_dir, cells, **options) -> (samples, info)`` times the
design its own way; ``adapters/torch/calibrate.py`` and
``adapters/vllm_calibrate.py`` say how, and what they cannot see).
`calibrate_model` is what ``hbench calibrate`` and ``hbench fidelity`` call:
a model directory in, a profile not yet judged out; `check_held_out` judges it.
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import os
import sys
import time
from pathlib import Path

from adapters.calibration import DRIVERS
from adapters.calibration.design import design
from adapters.calibration.fit import Fit, Sample, fit_rates
from adapters.sim.hardware import get_hardware
from adapters.sim.profile import CostProfile
from common.atomic import atomic_write_text
from common.errors import HbenchError, HbenchFailure
from harness import __version__
from harness.config import RunConfig
from harness.model_configs import geometry_for_run
from harness.orgs import layout_for
from harness.provenance import git_commit, host_info, package_versions

#: Refuse a profile whose median error on held-out shapes is above this.
MAX_HELD_OUT_ERROR = 0.25


def device_memory(device: str) -> int | None:
    """Bytes of memory on ``device`` (host RAM for cpu), None if unknown."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def calibrate(engine: str, model_dir: str | Path, geometry, *, quick: bool = False,
              max_model_len: int = 4096, min_chunk: int = 512, datasheet=None, seed: int = 0,
              progress=None, **options) -> tuple[CostProfile, Fit, list[Sample]]:
    """Time the design on ``engine`` and fit a profile (not yet judged: the
    caller compares ``fit.held_out_error`` with its bound)."""
    if engine not in DRIVERS:
        raise HbenchError(f"cannot calibrate engine {engine!r}; choose from "
                          f"{', '.join(sorted(DRIVERS))}")
    driver = importlib.import_module(DRIVERS[engine])
    cells = design(quick=quick, max_context=max_model_len, min_chunk=min_chunk)
    t0 = time.perf_counter()
    samples, info = driver.measure(Path(model_dir), cells, max_model_len=max_model_len,
                                   seed=seed, progress=progress, **options)
    fit = fit_rates(geometry, samples, datasheet=datasheet, seed=seed)
    device = info.get("device", "cpu")
    fitted = {"design": "quick" if quick else "full", "cells": [c.name for c in cells],
              "held_out_cells": [c.name for c in cells if c.held_out],
              "measured": {**info, "host": host_info(), "versions": package_versions(),
                           "git_commit": git_commit(Path(__file__).resolve().parents[1])},
              "measure_s": round(time.perf_counter() - t0, 1), **fit.to_dict()}
    profile = CostProfile(
        name=f"{engine}-{device}-{geometry.name}", rates=fit.rates, engine=engine,
        device=device, model=geometry.name, mem_bytes=device_memory(device), fit=fitted,
        provenance=(f"hbench {__version__}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: "
                    "hbench " + " ".join(sys.argv[1:])))
    return profile, fit, samples


def calibrate_model(engine: str, model_dir: str | Path, *, org: str = "s2",
                    against: str = "a100-pcie-40gb", quick: bool = False,
                    max_model_len: int = 4096, seed: int = 0, progress=None,
                    **options) -> tuple[CostProfile, Fit, list[Sample]]:
    """`calibrate` ``engine`` serving ``org`` on the model in ``model_dir`` (its
    config.json gives the geometry; the design's chunks start at ``org``'s
    grid), with the datasheet preset ``against`` scored beside the fit.
    HbenchError, before any work, if ``model_dir`` has no config.json or
    ``against`` is no preset."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise HbenchError(f"--model {model_dir}: no config.json there (make one with "
                          "hbench tiny-model)")
    datasheet = get_hardware(against)
    geometry = geometry_for_run(RunConfig(engine="sim", model=str(model_dir),
                                          config_path=str(model_dir / "config.json")))
    return calibrate(engine, model_dir, geometry, quick=quick, max_model_len=max_model_len,
                     min_chunk=layout_for(org, geometry).grid_tokens, datasheet=datasheet,
                     seed=seed, progress=progress, org=org, **options)


def check_held_out(fit: Fit, max_error: float = MAX_HELD_OUT_ERROR) -> None:
    """Refuse (HbenchFailure, exit 1) a fit whose median error on held-out cells is above ``max_error``."""
    if not fit.held_out_error <= max_error:
        shown = "-" if math.isnan(fit.held_out_error) else f"{fit.held_out_error:.1%}"
        raise HbenchFailure(f"the fit's median error on held-out cells is "
                          f"{shown}, above --max-error {max_error:.1%}: "
                          "profile not written (rerun on a quieter machine, or use the full "
                          "design without --quick)")


def write_samples(samples: list[Sample], path: str | Path) -> None:
    """The measured samples as CSV, one row each (re-fit or plot them later)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["cell", "class", "held_out", "seconds", "steps", "prefill_tokens",
                "decode_requests", "decode_context_tokens", "checkpoint_copies",
                "checkpoint_loads"])
    for s in samples:
        w.writerow([s.cell, s.shape_class, int(s.held_out), f"{s.seconds:.6g}", len(s.steps),
                    sum(x.prefill_tokens for x in s.steps),
                    sum(x.decode_requests for x in s.steps),
                    sum(x.decode_context_tokens for x in s.steps),
                    sum(x.checkpoint_copies for x in s.steps),
                    sum(x.checkpoint_loads for x in s.steps)])
    atomic_write_text(Path(path), buf.getvalue())
