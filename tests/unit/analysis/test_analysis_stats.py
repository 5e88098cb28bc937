"""The paired-seed statistics against independent computations on fixed data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import stats
from common.errors import HbenchError

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


def test_bounded_t_interval_cuts_only_what_crosses_the_bound():
    spread = [0.0, 1.0, 30.0]                              # a t interval crossing 0
    lo, hi = stats.t_interval(spread)
    assert lo < 0
    assert stats.bounded_t_interval(spread) == (0.0, hi)
    assert stats.bounded_t_interval(RATIOS) == stats.t_interval(RATIOS)   # nothing to cut
    assert all(math.isnan(v) for v in stats.bounded_t_interval([1.0]))


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


@pytest.mark.slow
def test_holm_counts_untestable_members():
    # The NaN member keeps its place in the family as if its p were 1:
    # 0.01 x 3 = 0.03, then max(0.03, 0.04 x 2) = 0.08.
    out = stats.holm([0.01, math.nan, 0.04])
    assert out[0] == pytest.approx(0.03) and out[2] == pytest.approx(0.08) and math.isnan(out[1])
    assert list(stats.holm([0.01, 0.04])) == pytest.approx([0.02, 0.04])


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
    s = stats.summarize_ratios(RATIOS)
    logs = np.log(RATIOS)
    assert s.n == 6 and s.geo_mean_ratio == pytest.approx(math.exp(logs.mean()))
    assert s.effect_pct == pytest.approx((math.exp(logs.mean()) - 1) * 100)
    ref = sps.t.interval(0.95, logs.size - 1, loc=logs.mean(), scale=sps.sem(logs))
    assert s.ci == pytest.approx(tuple(np.exp(ref)), rel=1e-12)   # exp of scipy's t CI on log ratios
    assert s.mean_ratio == pytest.approx(RATIOS.mean()) and s.t_ci == stats.t_interval(RATIOS)
    assert s.p == stats.ttest_log_ratios(RATIOS) and s.p_signflip == stats.sign_flip_p(logs)
    assert s.mde_ratio == stats.min_detectable_effect(RATIOS)


def test_geometric_effect_is_reciprocal_and_never_below_minus_100_percent():
    ab = stats.summarize_ratios(RATIOS)
    ba = stats.summarize_ratios(1 / RATIOS)
    assert ab.geo_mean_ratio * ba.geo_mean_ratio == pytest.approx(1.0, rel=1e-12)
    assert ab.ci == pytest.approx((1 / ba.ci[1], 1 / ba.ci[0]), rel=1e-12)
    assert ab.p == pytest.approx(ba.p) and ab.p_signflip == ba.p_signflip
    assert ab.mean_ratio * ba.mean_ratio != pytest.approx(1.0)  # the arithmetic mean is not
    # Widely spread ratios: the arithmetic t CI reaches below ratio 0 (an
    # impossible "-100% or worse"); the geometric CI stays positive.
    wide = stats.summarize_ratios([0.05, 1.9, 0.5])
    assert wide.t_ci[0] < 0 < wide.ci[0]


def test_sign_flip_p_exact_small_n():
    # n = 3, all positive: only all-plus and all-minus reach the observed |sum|.
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == pytest.approx(2 / 8)
    assert stats.sign_flip_p([0.1, -0.1]) == 1.0
    assert math.isnan(stats.sign_flip_p([]))
    logs = np.log(RATIOS)
    ref = sps.permutation_test((logs,), np.mean, permutation_type="samples", n_resamples=np.inf,
                               alternative="two-sided").pvalue
    assert stats.sign_flip_p(logs) == pytest.approx(ref)


@pytest.mark.slow
def test_sign_flip_p_draws_beyond_exact_size():
    x = np.random.default_rng([4, 0]).normal(0.3, 1.0, stats.SIGN_FLIP_EXACT_MAX + 1)
    ref = sps.permutation_test((x,), np.mean, permutation_type="samples", n_resamples=np.inf,
                               alternative="two-sided").pvalue
    p = stats.sign_flip_p(x, stats.bootstrap_rng(1, 2))
    assert p == pytest.approx(ref, abs=0.01)
    assert p == stats.sign_flip_p(x, stats.bootstrap_rng(1, 2))


@pytest.mark.parametrize("n", [3, 6, 12])
def test_power_effect_size_gives_the_requested_power(n):
    d = stats.power_effect_size(n)
    crit = sps.t.ppf(0.975, n - 1)
    nc = d * math.sqrt(n)
    power = sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.80, abs=1e-6)


def test_min_detectable_effect_scales_with_spread_and_seed_count():
    logs = np.log(RATIOS)
    expected = math.exp(stats.power_effect_size(6) * logs.std(ddof=1))
    assert stats.min_detectable_effect(RATIOS) == pytest.approx(expected)
    assert stats.min_detectable_effect(RATIOS[:3]) > stats.min_detectable_effect(np.tile(RATIOS[:3], 4))
    assert stats.min_detectable_effect([1.1, 1.1, 1.1]) == 1.0   # no spread: any change is detectable
    assert math.isnan(stats.min_detectable_effect([1.1]))


def test_invalid_pairs_name_zero_null_and_negative_values():
    num = {1: 0.0, 2: None, 3: 5.0, 4: float("nan"), 5: 2.0}
    den = {1: 1.0, 2: 1.0, 3: -1.0, 4: 0.0, 5: 1.0, 6: 3.0}
    assert stats.invalid_pairs(num, den) == {
        1: "numerator 0", 2: "numerator null/NaN", 3: "denominator -1",
        4: "numerator null/NaN and denominator 0"}


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
    geo = math.exp(np.log(k).mean())
    assert s.kind == "ratio" and s.null == 1.0
    assert s.estimate == pytest.approx(geo)
    assert s.effect_pct == pytest.approx((geo - 1) * 100)
    assert s.t_ci == pytest.approx(stats.log_t_interval(k))
    assert s.p == pytest.approx(stats.ttest_log_ratios(k))
    with pytest.raises(HbenchError, match="same seeds"):
        stats.ratio_of_ratios(share, {1: 1.0, 2: 1.0}, stats.bootstrap_rng())
