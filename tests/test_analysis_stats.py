"""The paired-seed statistics against independent computations on fixed data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import stats
from harness.errors import HbenchError

RATIOS = np.array([1.10, 1.20, 0.90, 1.05, 1.15, 1.02])


def test_paired_ratios_use_shared_seeds_only():
    r = stats.paired_ratios({1: 110.0, 2: 120.0, 3: 50.0}, {1: 100.0, 2: 100.0, 4: 7.0})
    assert r == {1: pytest.approx(1.1), 2: pytest.approx(1.2)}


def test_paired_ratios_refuse_non_positive_denominator():
    with pytest.raises(HbenchError, match="seed 1"):
        stats.paired_ratios({1: 1.0}, {1: 0.0})


def test_means_and_effect_on_fixed_ratios():
    r = [1.1, 1.2, 0.9]
    assert stats.mean_ratio(r) == pytest.approx(3.2 / 3)
    assert stats.geometric_mean_ratio(r) == pytest.approx((1.1 * 1.2 * 0.9) ** (1 / 3))
    assert stats.effect_pct(1.0667) == pytest.approx(6.67)
    assert stats.mean_over_seeds([0.5, 0.7, 0.9]) == pytest.approx(0.7)  # latency: mean of run p99s


def test_t_interval_matches_scipy():
    lo, hi = stats.t_interval(RATIOS)
    ref = sps.t.interval(0.95, RATIOS.size - 1, loc=RATIOS.mean(), scale=sps.sem(RATIOS))
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert all(math.isnan(v) for v in stats.t_interval([1.0]))  # n = 1: no interval


def test_log_t_interval_is_back_transformed_log_interval():
    logs = np.log(RATIOS)
    ref = sps.t.interval(0.95, logs.size - 1, loc=logs.mean(), scale=sps.sem(logs))
    assert stats.log_t_interval(RATIOS) == pytest.approx(tuple(np.exp(ref)), rel=1e-12)


def test_ttest_on_log_ratios_matches_hand_formula():
    logs = np.log(RATIOS)
    t = logs.mean() / (logs.std(ddof=1) / math.sqrt(logs.size))
    assert stats.ttest_log_ratios(RATIOS) == pytest.approx(2 * sps.t.sf(abs(t), logs.size - 1), rel=1e-10)


def test_ttest_degenerate_cases():
    assert math.isnan(stats.ttest_log_ratios([1.2]))
    assert stats.ttest_log_ratios([1.2, 1.2, 1.2]) == 0.0   # identical non-null ratios
    assert stats.ttest_log_ratios([1.0, 1.0]) == 1.0        # identical null ratios


def test_wilcoxon_exact_and_small_n():
    # six positive differences: exact two-sided p = 2 / 2**6
    assert stats.wilcoxon_p([0.1, 0.2, 0.05, 0.3, 0.25, 0.15]) == pytest.approx(2 / 64)
    assert stats.wilcoxon_p(np.log(RATIOS)) == pytest.approx(sps.wilcoxon(np.log(RATIOS)).pvalue)
    assert math.isnan(stats.wilcoxon_p([0.1]))
    assert math.isnan(stats.wilcoxon_p([0.0, 0.0, 0.3]))  # one non-zero difference


def test_holm_hand_worked_example():
    # sorted: 0.01*3 = 0.03; 0.03*2 = 0.06; 0.04*1 = 0.04 -> monotone max 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_holm_ignores_nan_members():
    out = stats.holm([0.01, math.nan, 0.04])
    assert out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04) and math.isnan(out[1])


def test_bootstrap_is_seeded_percentile_over_seeds():
    a = stats.bootstrap_interval(RATIOS, stats.bootstrap_rng(7, 1), n_resamples=2000)
    b = stats.bootstrap_interval(RATIOS, stats.bootstrap_rng(7, 1), n_resamples=2000)
    assert a == b
    rng = np.random.default_rng([7, 1])
    means = [RATIOS[rng.integers(0, RATIOS.size, size=RATIOS.size)].mean() for _ in range(2000)]
    assert a == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert a[0] < RATIOS.mean() < a[1]
    assert stats.bootstrap_interval(RATIOS, stats.bootstrap_rng(8, 1), n_resamples=2000) != a


def test_excludes_null():
    assert stats.excludes((1.01, 1.2), 1.0) and stats.excludes((0.8, 0.99), 1.0)
    assert not stats.excludes((0.99, 1.2), 1.0)
    assert not stats.excludes((math.nan, math.nan), 1.0)


def test_summarize_ratios_collects_everything():
    s = stats.summarize_ratios(RATIOS, stats.bootstrap_rng(), n_resamples=500)
    assert s.n == 6 and s.mean_ratio == pytest.approx(RATIOS.mean())
    assert s.effect_pct == pytest.approx((RATIOS.mean() - 1) * 100)
    assert s.t_ci == stats.t_interval(RATIOS) and s.p == stats.ttest_log_ratios(RATIOS)


def test_interaction_difference_paired_per_seed():
    a = {1: 1.30, 2: 1.25, 3: 1.35}
    b = {1: 1.20, 2: 1.20, 3: 1.20}
    s = stats.interaction_difference(a, b, stats.bootstrap_rng(), n_resamples=500)
    d = np.array([10.0, 5.0, 15.0])
    assert s.paired and s.estimate == pytest.approx(10.0) and s.effect_pct == pytest.approx(10.0)
    assert s.t_ci == pytest.approx(stats.t_interval(d))
    assert s.p == pytest.approx(sps.ttest_1samp(d, 0).pvalue)


def test_interaction_difference_unpaired_uses_welch():
    a = {1: 1.30, 2: 1.25, 3: 1.35}
    b = {4: 1.20, 5: 1.10, 6: 1.15, 7: 1.18}
    s = stats.interaction_difference(a, b, stats.bootstrap_rng(), n_resamples=500)
    av, bv = 100 * np.array(list(a.values())), 100 * np.array(list(b.values()))
    assert not s.paired and (s.n_a, s.n_b) == (3, 4)
    assert s.estimate == pytest.approx(av.mean() - bv.mean())
    assert s.p == pytest.approx(sps.ttest_ind(av, bv, equal_var=False).pvalue)
    lo, hi = s.t_ci
    assert lo < s.estimate < hi


def test_ratio_of_ratios_per_seed():
    share = {1: 1.20, 2: 1.10, 3: 1.15}
    iso = {1: 1.00, 2: 1.02, 3: 0.98}
    s = stats.ratio_of_ratios(share, iso, stats.bootstrap_rng(), n_resamples=500)
    k = np.array([1.2 / 1.0, 1.1 / 1.02, 1.15 / 0.98])
    assert s.kind == "ratio" and s.null == 1.0
    assert s.estimate == pytest.approx(k.mean())
    assert s.effect_pct == pytest.approx((k.mean() - 1) * 100)
    assert s.p == pytest.approx(stats.ttest_log_ratios(k))
    with pytest.raises(HbenchError, match="same seeds"):
        stats.ratio_of_ratios(share, {1: 1.0, 2: 1.0}, stats.bootstrap_rng())
