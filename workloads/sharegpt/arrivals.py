"""Request arrival processes: Poisson, constant and gamma (bursty).

Arrival k is the sum of the first k+1 inter-arrival gaps, so the process
starts at t = 0 and its first request arrives one gap later. Gaps are drawn
exactly from the named distribution with mean 1/rate and never rescaled to
hit a fixed end time (rescaling would make a Poisson process sub-Poisson).

Gaps are drawn in fixed blocks of `BLOCK` from one generator, so the first n
arrivals are the same whether n, N > n requests or a duration were asked for:
a longer run extends a shorter one instead of reshuffling it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from common.errors import HbenchError

BLOCK = 1024


def _poisson(rng: np.random.Generator, rate: float, n: int, burstiness: float) -> np.ndarray:
    return rng.exponential(1.0 / rate, size=n)


def _constant(rng: np.random.Generator, rate: float, n: int, burstiness: float) -> np.ndarray:
    return np.full(n, 1.0 / rate)


def _gamma(rng: np.random.Generator, rate: float, n: int, burstiness: float) -> np.ndarray:
    # shape k = 1/burstiness, scale = 1/(rate k): mean 1/rate, CV^2 = burstiness.
    shape = 1.0 / burstiness
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


# name -> gap sampler (rng, rate, n, burstiness) -> n gaps in seconds
ARRIVALS: dict[str, Callable[[np.random.Generator, float, int, float], np.ndarray]] = {
    "poisson": _poisson,
    "constant": _constant,
    "gamma": _gamma,
}
#: think-time distribution name -> the gap sampler it reuses (gaps with mean
#: 1/rate; `workloads.multiturn.derive.think_times`)
THINK_TIMES: dict[str, Callable[[np.random.Generator, float, int, float], np.ndarray]] = {
    "exponential": _poisson,
    "constant": _constant,
    "gamma": _gamma,
}


def arrival_times(
    kind: str,
    rng: np.random.Generator,
    rate: float,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
) -> np.ndarray:
    """Arrival times (s, float64, non-decreasing): ``requests`` of them, or all
    arrivals before ``duration_s`` when that is given (it takes precedence)."""
    if kind not in ARRIVALS:
        raise HbenchError(f"unknown arrival process {kind!r}; choose from {', '.join(ARRIVALS)}")
    if not rate > 0:
        raise HbenchError(f"arrival rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise HbenchError(f"burstiness must be > 0, got {burstiness}")
    if duration_s is None and (requests is None or requests < 1):
        raise HbenchError(f"requests must be >= 1, got {requests}")
    if duration_s is not None and not duration_s > 0:
        raise HbenchError(f"duration must be > 0, got {duration_s}")
    sample = ARRIVALS[kind]
    blocks: list[np.ndarray] = []
    t_end = 0.0
    drawn = 0
    while True:
        gaps = sample(rng, rate, BLOCK, burstiness)
        times = t_end + np.cumsum(gaps)
        blocks.append(times)
        t_end = float(times[-1])
        drawn += BLOCK
        if duration_s is not None and t_end >= duration_s:
            times = np.concatenate(blocks)
            times = times[times < duration_s]
            if len(times) == 0:
                raise HbenchError(
                    f"no arrivals within {duration_s} s at {rate} req/s; lengthen --duration"
                )
            return times
        if duration_s is None and drawn >= requests:
            return np.concatenate(blocks)[:requests]
