"""Calibrate one engine: run the design on it, fit the rates, build the profile.

The engines that can be calibrated and where their drivers live (each
driver's ``measure(model_dir, cells, **options) -> (samples, info)`` times the
design its own way; ``adapters/torch/calibrate.py`` and
``adapters/vllm_calibrate.py`` say how, and what they cannot see).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from adapters.calibration.design import design
from adapters.calibration.fit import Fit, Sample, fit_rates
from adapters.sim.profile import CostProfile
from harness import __version__
from harness.errors import HbenchError
from harness.provenance import git_commit, host_info, package_versions

DRIVERS = {"torch": "adapters.torch.calibrate", "vllm": "adapters.vllm_calibrate"}

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
