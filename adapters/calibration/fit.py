"""Fit the cost model's rates to measured step times, and say how well they fit.

A *sample* is one measured time and the engine steps it spans: one step for
an engine that times its own steps (``--engine torch``), several for one seen
from outside (a vLLM TTFT spans the request's prefill steps). The simulator's
cost model turns each step into physical work (`adapters.sim.cost.StepWork`);
with additive combination a sample's time is linear in the inverse rates::

    seconds = o x steps + r x requests + bytes / B_mem + state bytes / B_state
              + GEMM FLOPs / F_gemm + attention FLOPs / F_attn + scan FLOPs / F_scan
              (+ nuisance terms, e.g. a client's per-request overhead)

so the coefficients (o, r, 1/B_mem, ...) are found by non-negative least
squares (`scipy.optimize.nnls`), each row divided by its measured time so that
a 2 ms decode step weighs as much as a 300 ms prefill (relative error is what
the simulator's latencies inherit). Rows the first fit misses by more than
five robust standard deviations (a step that shared the CPU with someone
else) are dropped once and the fit repeated. A coefficient the data cannot
separate from the others comes out 0 or with a wide bootstrap interval;
`Fit.coefficients` says which.

Samples marked ``held_out`` never enter the fit: the profile's error on them
(and the datasheet preset's, for comparison) is how well it predicts shapes
it was not fitted to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.sim.cost import CostModel, Rates
from common.errors import HbenchError
from harness.engine.shape import StepShape

#: Coefficients of the additive model, in column order, with the `Rates` field
#: each one sets (a rate is 1 / coefficient; an overhead is the coefficient).
COEFFICIENTS = (
    ("step_overhead_s", "s per step"),
    ("request_overhead_s", "s per request in a step"),
    ("mem_bytes_s", "s per weight/KV byte"),
    ("state_bytes_s", "s per state byte"),
    ("gemm_flops_s", "s per linear FLOP"),
    ("attn_flops_s", "s per attention FLOP"),
    ("scan_flops_s", "s per scan FLOP"),
)
NCOEF = len(COEFFICIENTS)
#: A rate whose coefficient is 0 (its work took no measurable time) is
#: written as this, so that the profile stays a valid set of positive rates.
UNRESOLVED_RATE = 1e18
#: Rows further than this many robust standard deviations from the first fit are dropped.
OUTLIER_SIGMAS = 5.0
#: Bootstrap resamples for the coefficients' intervals.
BOOTSTRAP = 200


@dataclass(frozen=True)
class Sample:
    """One measured time over the steps it spans."""

    shape_class: str                        # prefill, decode, mixed, copy, ttft, itl ...
    steps: tuple[StepShape, ...]
    seconds: float
    held_out: bool = False
    nuisance: Mapping[str, float] = field(default_factory=dict)   # extra per-sample terms
    cell: str = ""                          # the design cell it came from

    def __post_init__(self) -> None:
        if not self.steps:
            raise HbenchError("a calibration sample must span at least one step")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise HbenchError(f"a calibration sample's time must be > 0, got {self.seconds}")


def features(model: CostModel, sample: Sample, nuisance: Sequence[str]) -> np.ndarray:
    """The sample's row: summed work of its steps per coefficient, then nuisance terms."""
    row = np.zeros(NCOEF + len(nuisance))
    for shape in sample.steps:
        w = model.work(shape)
        row[:NCOEF] += (1.0, w.requests, w.weights_bytes + w.kv_bytes, w.state_bytes,
                    w.gemm_flops, w.attn_flops, w.scan_flops)
    for i, name in enumerate(nuisance):
        row[NCOEF + i] = sample.nuisance.get(name, 0.0)
    return row


@dataclass(frozen=True)
class Fit:
    """The fitted rates and everything needed to judge them."""

    rates: Rates
    coefficients: dict          # name -> {"value", "unit", "ci95", "resolved"}
    nuisance: dict              # name -> fitted seconds per unit
    residuals: dict             # "train"/"held_out" -> class -> error summary
    held_out_error: float       # median |relative error| over held-out samples
    train_error: float
    baseline: dict              # the datasheet preset's errors on the same samples
    dropped: int                # outlier rows dropped from the fit
    samples: int

    def to_dict(self) -> dict:
        return {"coefficients": self.coefficients, "nuisance": self.nuisance,
                "residuals": self.residuals, "held_out_median_abs_rel_error": self.held_out_error,
                "train_median_abs_rel_error": self.train_error, "datasheet": self.baseline,
                "dropped_outliers": self.dropped, "samples": self.samples}


def _solve(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of relative error (rows scaled by 1 / y).

    Columns are scaled to unit norm first: their magnitudes span 1 to 1e12
    (steps vs FLOPs), which NNLS's active-set iterations do not like."""
    from scipy.optimize import nnls  # here, so that `hbench calibrate --help` loads no scipy

    w = a / y[:, None]
    norms = np.linalg.norm(w, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(w / norms, np.ones_like(y), maxiter=50 * a.shape[1])
    return coef / norms


def _errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (pred - y) / y


def _summary(err: np.ndarray) -> dict:
    a = np.abs(err)
    return {"n": int(len(err)), "median_abs_rel_error": float(np.median(a)) if len(a) else None,
            "p90_abs_rel_error": float(np.quantile(a, 0.9)) if len(a) else None,
            "mean_rel_error": float(np.mean(err)) if len(err) else None}


def _by_class(samples: Sequence[Sample], err: np.ndarray) -> dict:
    out = {"all": _summary(err)}
    for cls in sorted({s.shape_class for s in samples}):
        idx = [i for i, s in enumerate(samples) if s.shape_class == cls]
        out[cls] = _summary(err[idx])
    return out


def _rates(coef: np.ndarray) -> Rates:
    def rate(c: float) -> float:
        return 1.0 / float(c) if c > 0 else UNRESOLVED_RATE

    return Rates(step_overhead_s=float(coef[0]), request_overhead_s=float(coef[1]),
                 mem_bytes_s=rate(coef[2]), state_bytes_s=rate(coef[3]),
                 gemm_flops_s=rate(coef[4]), attn_flops_s=rate(coef[5]),
                 scan_flops_s=rate(coef[6]), combine="sum")


def fit_rates(geometry, samples: Sequence[Sample], *, datasheet=None, seed: int = 0) -> Fit:
    """Fit `Rates` to ``samples`` (see the module docstring).

    ``datasheet`` (a `adapters.sim.hardware.Hardware`) is scored on the same
    samples for comparison; a fit needs at least twice as many training
    samples as coefficients."""
    train = [s for s in samples if not s.held_out]
    held = [s for s in samples if s.held_out]
    nuisance = sorted({k for s in samples for k in s.nuisance})
    ncoef = NCOEF + len(nuisance)
    if len(train) < 2 * ncoef:
        raise HbenchError(f"calibration needs at least {2 * ncoef} training samples, got "
                          f"{len(train)}: the design measured too little")
    probe = CostModel(geometry, datasheet) if datasheet is not None else None
    unit = CostModel(geometry, _rates(np.ones(NCOEF)))     # any rates: only `work` is read
    a = np.array([features(unit, s, nuisance) for s in train])
    y = np.array([s.seconds for s in train])
    coef = _solve(a, y)
    err = _errors(a @ coef, y)
    mad = np.median(np.abs(err - np.median(err))) * 1.4826
    keep = np.abs(err - np.median(err)) <= OUTLIER_SIGMAS * max(mad, 1e-3)
    dropped = int((~keep).sum())
    if dropped and keep.sum() >= 2 * ncoef:
        coef = _solve(a[keep], y[keep])
    else:
        dropped, keep = 0, np.ones(len(y), bool)

    rng = np.random.default_rng(seed)
    kept = np.flatnonzero(keep)
    boot = np.array([_solve(a[idx], y[idx])
                     for idx in (rng.choice(kept, len(kept)) for _ in range(BOOTSTRAP))])
    coefficients = {}
    for i, (name, unit_label) in enumerate(COEFFICIENTS):
        lo, hi = np.quantile(boot[:, i], [0.025, 0.975])
        v = float(coef[i])
        coefficients[name] = {
            "value": v, "unit": unit_label, "ci95": [float(lo), float(hi)],
            # resolved: positive, and its 95% interval spans less than a factor of four
            "resolved": bool(v > 0 and lo > 0 and hi / max(lo, 1e-300) < 4.0),
        }
    rates = _rates(coef)

    train_err = _errors(a @ coef, y)
    held_err = (_errors(np.array([features(unit, s, nuisance) for s in held]) @ coef,
                        np.array([s.seconds for s in held])) if held else np.array([]))
    residuals = {"train": _by_class(train, train_err)}
    if held:
        residuals["held_out"] = _by_class(held, held_err)
    baseline = {}
    if probe is not None:
        def predicted(group):
            return np.array([sum(probe.step(sh).total_s for sh in s.steps) for s in group])

        for name, group in (("train", train), ("held_out", held)):
            if group:
                e = _errors(predicted(group), np.array([s.seconds for s in group]))
                baseline[name] = _by_class(group, e)
        baseline["name"] = datasheet.name
    held_error = float(np.median(np.abs(held_err))) if held else math.nan
    return Fit(rates=rates, coefficients=coefficients,
               nuisance={n: float(coef[NCOEF + i]) for i, n in enumerate(nuisance)},
               residuals=residuals, held_out_error=held_error,
               train_error=float(np.median(np.abs(train_err[keep]))), baseline=baseline,
               dropped=dropped, samples=len(samples))
