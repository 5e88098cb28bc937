"""Paired-seed statistics: small pure functions, each checked against an
independent computation in ``tests/test_analysis_stats.py``.

Why paired: every arm of a design runs on the same seeds, so seed ``s`` of
arm A and seed ``s`` of arm B served the same request stream. Dividing
within a seed cancels the stream's difficulty; the seeds then vary only the
noise we want to average over. Definitions (see ``docs/statistics.md``):

* ratio ``r_s = A_s / B_s`` for each seed both arms ran;
* mean ratio ``mean(r_s)`` -- the study's "relative effect computed within a
  seed, then averaged"; effect in % = ``(mean ratio - 1) x 100``;
* p value: one-sample t test of ``log r_s`` against 0 (the ratio is
  multiplicative, its log is the additive scale a t test assumes);
* CIs at 95%: t interval on the mean ratio (the reported CI), t interval on
  the mean log ratio back-transformed (geometric-mean CI), and a percentile
  bootstrap that resamples seeds (so pairs stay together);
* a CI that contains the null value (1 for ratios, 0 for differences) means
  "not significant", whatever the p value says.

Randomness: the bootstrap takes a `numpy.random.Generator`; `bootstrap_rng`
builds one from ``(seed, stream)``; nothing here touches global RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from harness.errors import HbenchError

LEVEL = 0.95
N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20261015
# Below this many non-zero differences the Wilcoxon signed-rank p is not reported.
WILCOXON_MIN_N = 2

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


def log_t_interval(ratios, level: float = LEVEL) -> Interval:
    """t interval on the mean log ratio, back-transformed (CI of the geometric mean)."""
    lo, hi = t_interval(np.log(np.asarray(ratios, dtype=float)), level)
    return (math.exp(lo), math.exp(hi)) if not math.isnan(lo) else NAN_INTERVAL


def bootstrap_interval(
    values,
    rng: np.random.Generator,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """Percentile bootstrap CI that resamples whole rows (seeds) with replacement.

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
    """Holm step-down adjusted p values over one family; NaNs stay NaN and are
    not counted as members of the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = ~np.isnan(p)
    if ok.sum() == 1:
        out[ok] = p[ok]  # a family of one is its own adjustment (and multipletests is slow)
    elif ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


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
    mean_ratio: float
    geo_mean_ratio: float
    effect_pct: float
    t_ci: Interval            # t CI of the mean ratio (the reported CI)
    log_ci: Interval          # back-transformed t CI of the mean log ratio
    boot_ci: Interval         # percentile bootstrap CI of the mean ratio
    p: float                  # t test on log ratios
    p_wilcoxon: float


def summarize_ratios(ratios, rng: np.random.Generator, n_resamples: int = N_RESAMPLES) -> RatioSummary:
    """Point estimate, three CIs and two p values for within-seed ratios."""
    r = np.asarray(ratios, dtype=float)
    m = mean_ratio(r)
    return RatioSummary(
        n=int(r.size),
        mean_ratio=m,
        geo_mean_ratio=geometric_mean_ratio(r),
        effect_pct=effect_pct(m),
        t_ci=t_interval(r),
        log_ci=log_t_interval(r),
        boot_ci=bootstrap_interval(r, rng, n_resamples=n_resamples),
        p=ttest_log_ratios(r),
        p_wilcoxon=wilcoxon_p(np.log(r)) if r.size else math.nan,
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

    The estimate is ``mean(K_s)``, reported as ``(K - 1) x 100`` %; e.g.
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
    est = mean_ratio(k)
    return InteractionSummary(
        "ratio", True, len(seeds), len(seeds), est, effect_pct(est),
        t_interval(k), bootstrap_interval(k, rng, n_resamples=n_resamples), ttest_log_ratios(k),
    )
