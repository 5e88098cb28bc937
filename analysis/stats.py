"""Paired-seed statistics: small pure functions, each checked against an
independent computation in ``tests/unit/analysis/test_analysis_stats.py``.

Why paired: every arm of a design runs on the same seeds, so seed ``s`` of
arm A and seed ``s`` of arm B served the same request stream. Dividing
within a seed cancels the stream's difficulty; the seeds then vary only the
noise we want to average over. Definitions (see ``docs/statistics.md``):

* ratio ``r_s = A_s / B_s`` for each seed both arms ran; a ratio needs both
  values finite and positive (`invalid_pairs` names the seeds that are not);
* primary effect: the geometric mean ratio ``exp(mean(log r_s))`` with the
  t interval on the mean log ratio, back-transformed. It is the estimate the
  p value tests, it can never fall below -100%, and A/B is exactly the
  reciprocal of B/A (estimate and interval);
* secondary: the arithmetic mean ratio ``mean(r_s)`` -- the study's
  "relative effect computed within a seed, then averaged" -- with its t CI;
* p values: one-sample t test of ``log r_s`` against 0, and the exact
  sign-flip permutation test of the same log ratios (no normality assumed;
  its floor is ``2 / 2**n``);
* the minimum detectable effect: the smallest geometric-mean change the t
  test detects with 80% power at the observed spread and seed count;
* a CI that contains the null value (1 for ratios, 0 for differences) means
  "not significant", whatever the p value says.

The percentile bootstrap remains only for the unpaired interaction
difference and is labelled approximate: with three to six seeds its coverage
is far below nominal (about 75% at n = 3).

Randomness: the bootstrap and the sign-flip test beyond `SIGN_FLIP_EXACT_MAX`
seeds take a `numpy.random.Generator`; `bootstrap_rng` builds one from
``(seed, stream)``; nothing here touches global RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from common.errors import HbenchError

LEVEL = 0.95
N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20261015
# Below this many non-zero differences the Wilcoxon signed-rank p is not reported.
WILCOXON_MIN_N = 2
# Up to this many seeds the sign-flip test enumerates all 2**n sign vectors.
SIGN_FLIP_EXACT_MAX = 16
SIGN_FLIP_DRAWS = 65_536
POWER = 0.80

Interval = tuple[float, float]
NAN_INTERVAL: Interval = (math.nan, math.nan)


def bootstrap_rng(seed: int = BOOTSTRAP_SEED, stream: int = 0) -> np.random.Generator:
    """The bootstrap's generator, derived from ``(seed, stream)`` only."""
    return np.random.default_rng([seed, stream])


def paired_ratios(numerator: Mapping[int, float], denominator: Mapping[int, float]) -> dict[int, float]:
    """Within-seed ratios ``numerator[s] / denominator[s]`` for the seeds both arms ran.

    Seeds present on one side only are left out (the caller reports how many);
    a zero or negative denominator cannot form a ratio and is an error.
    """
    seeds = sorted(set(numerator) & set(denominator))
    out = {}
    for s in seeds:
        den = float(denominator[s])
        if not den > 0:
            raise HbenchError(f"seed {s}: denominator {den!r} is not positive; a ratio needs a positive baseline")
        out[s] = float(numerator[s]) / den
    return out


def invalid_pairs(numerator: Mapping[int, object], denominator: Mapping[int, object]) -> dict[int, str]:
    """Seeds both arms ran whose values cannot form a ratio, with the reason
    (``"numerator 0"``, ``"denominator null"``, ...): each value must be a
    finite positive number, and so must their ratio (1e308 over 1e-300
    overflows)."""
    out = {}
    for s in sorted(set(numerator) & set(denominator)):
        bad = [f"{side} {_describe(v)}" for side, v in (("numerator", numerator[s]), ("denominator", denominator[s]))
               if not _positive(v)]
        if not bad and not _positive(float(numerator[s]) / float(denominator[s])):
            bad = [f"ratio {_describe(numerator[s])} / {_describe(denominator[s])} out of range"]
        if bad:
            out[s] = " and ".join(bad)
    return out


def _positive(v) -> bool:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return False
    return math.isfinite(x) and x > 0


def _describe(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null/NaN"
    return repr(v) if not isinstance(v, (int, float, np.number)) else f"{float(v):g}"


def _exp(x: float) -> float:
    """``math.exp``, infinite past a float's range (a log-scale bound of ratios
    near 1e308 apart) instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def mean_ratio(ratios) -> float:
    """Arithmetic mean of the within-seed ratios (the study's relative effect)."""
    r = np.asarray(ratios, dtype=float)
    return float(r.mean()) if r.size else math.nan


def geometric_mean_ratio(ratios) -> float:
    """Geometric mean of the ratios: ``exp(mean(log r))``."""
    r = np.asarray(ratios, dtype=float)
    return float(np.exp(np.log(r).mean())) if r.size else math.nan


def effect_pct(ratio: float) -> float:
    """Relative effect in percent: ``(ratio - 1) x 100``."""
    return (ratio - 1.0) * 100.0


def t_interval(values, level: float = LEVEL) -> Interval:
    """Student-t interval on the mean of ``values``; NaN when n < 2.

    Zero spread gives the degenerate interval ``(mean, mean)``.
    """
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 2:
        return NAN_INTERVAL
    m = float(x.mean())
    se = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(sps.t.ppf(0.5 + level / 2, n - 1)) * se
    return (m - half, m + half)


def bounded_t_interval(values, lower: float = 0.0, level: float = LEVEL) -> Interval:
    """`t_interval` of a quantity that cannot go below ``lower`` (throughput,
    token and preemption counts): an end past the bound is cut at it, so an
    interval never claims values the quantity cannot take."""
    lo, hi = t_interval(values, level)
    return (lo if math.isnan(lo) else max(lo, lower), hi)


def log_t_interval(ratios, level: float = LEVEL) -> Interval:
    """t interval on the mean log ratio, back-transformed (CI of the geometric mean)."""
    lo, hi = t_interval(np.log(np.asarray(ratios, dtype=float)), level)
    return (_exp(lo), _exp(hi)) if not math.isnan(lo) else NAN_INTERVAL


def bootstrap_interval(
    values,
    rng: np.random.Generator,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """Percentile bootstrap CI that resamples whole rows (seeds) with replacement.

    Approximate only: with the three to six seeds of a design its coverage is
    well below the nominal level (about 75% for a 95% interval at n = 3), so
    reports label it and never base a verdict on it.

    ``values`` may be 1-D (one value per seed) or 2-D (a row per seed, e.g. a
    pair of ratios), so paired quantities are resampled together.
    ``statistic`` maps an array of shape ``(n_resamples, n, ...)`` to
    ``(n_resamples,)``; the default is the mean over seeds.
    """
    x = np.asarray(values, dtype=float)
    n = x.shape[0]
    if n < 2:
        return NAN_INTERVAL
    idx = rng.integers(0, n, size=(n_resamples, n))
    resampled = x[idx]
    stat = statistic(resampled) if statistic is not None else resampled.mean(axis=1)
    alpha = 1.0 - level
    lo, hi = np.quantile(stat, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


def _geo_mean_rows(resampled: np.ndarray) -> np.ndarray:
    return np.exp(np.log(resampled).mean(axis=1))


def ttest_zero(values) -> float:
    """Two-sided one-sample t test of ``mean(values) == 0``; NaN when n < 2.

    With zero spread the t statistic is infinite: p = 0 if the common value
    is non-zero, 1 if it is zero (a deterministic engine produces this).
    """
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return math.nan
    if np.ptp(x) == 0.0:
        return 0.0 if x[0] != 0.0 else 1.0
    return float(sps.ttest_1samp(x, 0.0).pvalue)


def ttest_log_ratios(ratios) -> float:
    """Paired t test on log ratios (``scipy.stats.ttest_1samp`` against 0)."""
    return ttest_zero(np.log(np.asarray(ratios, dtype=float)))


def wilcoxon_p(values) -> float:
    """Two-sided Wilcoxon signed-rank p of ``values`` against 0 (zeros dropped).

    NaN when fewer than `WILCOXON_MIN_N` values are non-zero. Note the exact
    test's floor: with n non-zero values p >= 2 / 2**n, so n <= 5 can never
    reach 0.05.
    """
    x = np.asarray(values, dtype=float)
    if np.count_nonzero(x) < WILCOXON_MIN_N:
        return math.nan
    return float(sps.wilcoxon(x).pvalue)


def holm(pvalues) -> np.ndarray:
    """Holm step-down adjusted p values over one family.

    A NaN p (a member that could not be tested: too few seeds, invalid
    values) stays NaN but still counts as a member, as if its p were 1: a
    family never shrinks because some of its members failed.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = ~np.isnan(p)
    if p.size == 1:
        out[ok] = p[ok]  # a family of one is its own adjustment (and multipletests is slow)
    elif ok.any():
        out[ok] = multipletests(np.where(ok, p, 1.0), method="holm")[1][ok]
    return out


def sign_flip_p(values, rng: np.random.Generator | None = None) -> float:
    """Two-sided sign-flip permutation p of ``mean(values) == 0`` (values:
    log ratios). Under the null each value is as likely positive as negative,
    so the p value is the share of the 2**n sign vectors whose |sum| is at
    least the observed |sum|. Exact up to `SIGN_FLIP_EXACT_MAX` values, else
    `SIGN_FLIP_DRAWS` random sign vectors (plus the observed one) from
    ``rng``. NaN for no values; its floor is 2 / 2**n.
    """
    x = np.asarray(values, dtype=float)
    n = x.size
    if n == 0 or not np.isfinite(x).all():
        return math.nan
    observed = abs(x.sum())
    tol = 1e-12 * max(1.0, np.abs(x).sum())
    if n <= SIGN_FLIP_EXACT_MAX:
        codes = np.arange(2**n)[:, None] >> np.arange(n) & 1
        sums = np.abs((1 - 2 * codes) @ x)
        return float(np.mean(sums >= observed - tol))
    rng = rng if rng is not None else bootstrap_rng()
    signs = rng.choice(np.array([-1.0, 1.0]), size=(SIGN_FLIP_DRAWS, n))
    hits = int(np.sum(np.abs(signs @ x) >= observed - tol))
    return (hits + 1) / (SIGN_FLIP_DRAWS + 1)


def power_effect_size(n: int, alpha: float = 0.05, power: float = POWER) -> float:
    """Standardized effect (mean / sd) a two-sided one-sample t test on ``n``
    values detects with ``power`` at level ``alpha`` (the noncentral-t power
    equation, solved by statsmodels' `TTestPower`). NaN when n < 2."""
    if n < 2:
        return math.nan
    return float(TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="two-sided"))


def min_detectable_effect(ratios, alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest geometric-mean change (a ratio above 1) the paired t test on
    log ratios detects with ``power``, given the observed spread of the log
    ratios and their count: ``exp(d sd)`` with d from `power_effect_size`.
    A change down by the same factor (1 / MDE) is equally detectable. NaN
    when n < 2."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size < 2:
        return math.nan
    return _exp(power_effect_size(logs.size, alpha, power) * float(logs.std(ddof=1)))


def excludes(interval: Interval, null: float) -> bool:
    """True only when the interval is defined and lies entirely off ``null``."""
    lo, hi = interval
    if math.isnan(lo) or math.isnan(hi):
        return False
    return lo > null or hi < null


def is_significant(p_holm: float, interval: Interval, null: float, alpha: float) -> bool:
    """The one significance rule: Holm-adjusted p below alpha AND the CI
    excludes the null value. Anything else is "not significant"."""
    return excludes(interval, null) and not math.isnan(p_holm) and p_holm < alpha


def mean_over_seeds(values) -> float:
    """Absolute numbers (throughput, and latency = mean over seeds of run-level
    p99) are arithmetic means over runs."""
    x = np.asarray(values, dtype=float)
    return float(x.mean()) if x.size else math.nan


@dataclass(frozen=True)
class RatioSummary:
    """Everything reported for one paired ratio (a contrast)."""

    n: int
    geo_mean_ratio: float     # the primary estimate
    effect_pct: float         # (geo_mean_ratio - 1) x 100
    ci: Interval              # back-transformed t CI of the mean log ratio (primary)
    mean_ratio: float         # arithmetic mean ratio (secondary, the study's estimate)
    t_ci: Interval            # t CI of the arithmetic mean ratio (secondary)
    p: float                  # t test on log ratios
    p_signflip: float         # exact sign-flip permutation test on log ratios
    p_wilcoxon: float
    mde_ratio: float          # minimum detectable geometric-mean ratio (80% power)


def summarize_ratios(ratios, alpha: float = 0.05, rng: np.random.Generator | None = None) -> RatioSummary:
    """Point estimates, CIs, p values and the detectable effect for within-seed ratios."""
    r = np.asarray(ratios, dtype=float)
    geo = geometric_mean_ratio(r)
    logs = np.log(r)
    return RatioSummary(
        n=int(r.size),
        geo_mean_ratio=geo,
        effect_pct=effect_pct(geo),
        ci=log_t_interval(r),
        mean_ratio=mean_ratio(r),
        t_ci=t_interval(r),
        p=ttest_log_ratios(r),
        p_signflip=sign_flip_p(logs, rng),
        p_wilcoxon=wilcoxon_p(logs) if r.size else math.nan,
        mde_ratio=min_detectable_effect(r, alpha),
    )


@dataclass(frozen=True)
class InteractionSummary:
    """A contrast of contrasts: an estimate, its CIs and a p value.

    ``kind`` is "difference" (percentage points, null 0) or "ratio" (ratio of
    ratios, null 1; ``effect_pct`` is then ``(estimate - 1) x 100``).
    """

    kind: str
    paired: bool
    n_a: int
    n_b: int
    estimate: float
    effect_pct: float
    t_ci: Interval
    boot_ci: Interval
    p: float

    @property
    def null(self) -> float:
        return 0.0 if self.kind == "difference" else 1.0


def interaction_difference(
    ratios_a: Mapping[int, float], ratios_b: Mapping[int, float], rng: np.random.Generator,
    n_resamples: int = N_RESAMPLES,
) -> InteractionSummary:
    """Difference of two paired ratios in percentage points, ``100 (r_a - r_b)``.

    Paired (per-seed differences ``100 (r_a,s - r_b,s)``; t CI, bootstrap over
    seeds, one-sample t test) when both sets ran exactly the same seeds;
    otherwise unpaired (difference of means, Welch t CI and test, bootstrap
    resampling each set on its own).
    """
    if not ratios_a or not ratios_b:
        raise HbenchError("an interaction needs ratios on both sides")
    if set(ratios_a) == set(ratios_b):
        seeds = sorted(ratios_a)
        d = 100.0 * (np.array([ratios_a[s] for s in seeds]) - np.array([ratios_b[s] for s in seeds]))
        est = float(d.mean())
        return InteractionSummary(
            "difference", True, len(seeds), len(seeds), est, est,
            t_interval(d), bootstrap_interval(d, rng, n_resamples=n_resamples), ttest_zero(d),
        )
    a = 100.0 * np.array(list(ratios_a.values()))
    b = 100.0 * np.array(list(ratios_b.values()))
    est = float(a.mean() - b.mean())
    t_ci, p = NAN_INTERVAL, math.nan
    boot = NAN_INTERVAL
    if a.size >= 2 and b.size >= 2:
        va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        se = math.sqrt(va + vb)
        if se > 0:
            df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
            half = float(sps.t.ppf(0.5 + LEVEL / 2, df)) * se
            t_ci = (est - half, est + half)
            p = float(sps.ttest_ind(a, b, equal_var=False).pvalue)
        else:
            t_ci, p = (est, est), (0.0 if est != 0 else 1.0)
        ma = a[rng.integers(0, a.size, size=(n_resamples, a.size))].mean(axis=1)
        mb = b[rng.integers(0, b.size, size=(n_resamples, b.size))].mean(axis=1)
        lo, hi = np.quantile(ma - mb, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        boot = (float(lo), float(hi))
    return InteractionSummary("difference", False, a.size, b.size, est, est, t_ci, boot, p)


def ratio_of_ratios(
    ratios_a: Mapping[int, float], ratios_b: Mapping[int, float], rng: np.random.Generator,
    n_resamples: int = N_RESAMPLES,
) -> InteractionSummary:
    """K = effect under A over effect under B, per seed: ``K_s = r_a,s / r_b,s``.

    The estimate is the geometric mean of ``K_s`` with the back-transformed t
    CI of the mean log (like a contrast), reported as ``(K - 1) x 100`` %; e.g.
    K_ret = (retention/no-retention under SHARE) / (same under ISOLATE). The
    study's crossover ran all four arms on the same seeds, so this contrast is
    defined only for paired sets: different seed sets are an error.
    """
    if not ratios_a or set(ratios_a) != set(ratios_b):
        raise HbenchError(
            "a ratio of ratios needs both contrasts on the same seeds; got "
            f"{sorted(ratios_a)} vs {sorted(ratios_b)}"
        )
    seeds = sorted(ratios_a)
    k = np.array([ratios_a[s] / ratios_b[s] for s in seeds])
    est = geometric_mean_ratio(k)
    return InteractionSummary(
        "ratio", True, len(seeds), len(seeds), est, effect_pct(est),
        log_t_interval(k), bootstrap_interval(k, rng, _geo_mean_rows, n_resamples=n_resamples),
        ttest_log_ratios(k),
    )
