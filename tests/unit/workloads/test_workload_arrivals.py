"""Arrival processes: exact rate, Poisson dispersion, gamma burstiness, and
stable prefixes (a longer stream extends a shorter one)."""

import numpy as np
import pytest

from common.errors import HbenchError
from workloads.sharegpt.arrivals import arrival_times
from workloads.sharegpt.derive import stream

N = 20_000
RATE = 3.0


def _rng(seed=11):
    return stream(seed, "arrivals")


def poisson_checks(times: np.ndarray, rate: float) -> dict[str, bool]:
    """Each check is a ~5-sigma bound for a Poisson process of `rate`."""
    gaps = np.diff(np.concatenate([[0.0], times]))
    n = len(gaps)
    mean_ok = abs(gaps.mean() * rate - 1) < 5 / np.sqrt(n)
    cv = gaps.std(ddof=1) / gaps.mean()
    cv_ok = abs(cv - 1) < 5 * np.sqrt(2 / n)  # sd of the sample CV ~ sqrt(2/n) for exp gaps
    window = 10 / rate  # ~10 arrivals per window
    counts = np.bincount((times // window).astype(int))[:-1]  # drop the partial last window
    dispersion = counts.var(ddof=1) / counts.mean()
    disp_ok = abs(dispersion - 1) < 5 * np.sqrt(2 / (len(counts) - 1))
    return {"mean": bool(mean_ok), "cv": bool(cv_ok), "dispersion": bool(disp_ok)}


def test_poisson_has_mean_rate_unit_cv_and_unit_dispersion():
    times = arrival_times("poisson", _rng(), RATE, requests=N)
    assert len(times) == N and np.all(np.diff(times) >= 0) and times[0] > 0
    assert poisson_checks(times, RATE) == {"mean": True, "cv": True, "dispersion": True}


def test_constant_process_fails_the_poisson_dispersion_check():
    times = arrival_times("constant", _rng(), RATE, requests=N)
    np.testing.assert_allclose(np.diff(times), 1 / RATE, rtol=1e-9)
    checks = poisson_checks(times, RATE)
    assert checks["mean"] is True
    assert checks["cv"] is False and checks["dispersion"] is False


def test_gamma_gaps_have_mean_one_over_rate_and_cv2_equal_to_burstiness():
    times = arrival_times("gamma", _rng(), RATE, requests=N, burstiness=4.0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert abs(gaps.mean() * RATE - 1) < 0.07  # 5 sigma: sd(gap) = 2/rate
    cv2 = gaps.var(ddof=1) / gaps.mean() ** 2
    assert abs(cv2 / 4.0 - 1) < 0.2  # 5 sigma for shape 1/4 (kurtosis 27)
    assert poisson_checks(times, RATE)["dispersion"] is False


def test_poisson_is_not_rescaled_to_a_fixed_end_time():
    a = arrival_times("poisson", _rng(1), RATE, requests=300)
    b = arrival_times("poisson", _rng(2), RATE, requests=300)
    assert a[-1] != pytest.approx(b[-1], rel=1e-3)  # end time varies with the draw
    assert a[-1] != pytest.approx(300 / RATE, rel=1e-3)


def test_longer_stream_extends_shorter_one_and_duration_matches_requests():
    short = arrival_times("poisson", _rng(), RATE, requests=700)
    long = arrival_times("poisson", _rng(), RATE, requests=2500)
    np.testing.assert_array_equal(long[:700], short)
    until = arrival_times("poisson", _rng(), RATE, duration_s=float(long[1999]))
    np.testing.assert_array_equal(until, long[:1999])  # strictly before the duration


def test_same_rng_seed_gives_identical_arrivals():
    a = arrival_times("gamma", _rng(5), 0.8, requests=100, burstiness=2.0)
    b = arrival_times("gamma", _rng(5), 0.8, requests=100, burstiness=2.0)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kwargs, msg", [
    ({"requests": 0}, "requests must be >= 1"),
    ({"requests": 5, "rate": 0.0}, "rate must be > 0"),
    ({"duration_s": 0.001, "rate": 0.001}, "no arrivals within"),
    ({"requests": 5, "kind": "uniform"}, "unknown arrival process"),
])
def test_bad_arguments_raise_one_line_errors(kwargs, msg):
    kind = kwargs.pop("kind", "poisson")
    rate = kwargs.pop("rate", RATE)
    with pytest.raises(HbenchError, match=msg):
        arrival_times(kind, _rng(), rate, **kwargs)
