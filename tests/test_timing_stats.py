"""Block statistics of timing samples against closed forms and published tables: Student's t
quantiles, the between-block interval on the log scale, the drift trend and the paired ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelprof.timing.stats import (
    between_block_ci,
    block_medians,
    combined_ci,
    drift,
    lag1_inflation,
    paired_ratio,
    t_quantile,
    within_ci,
)

# Two-sided 95 % (p = 0.975) and 99 % (p = 0.995) critical values of Student's t, to the
# 6 decimals of standard tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
T975 = {
    1: 12.706205,
    2: 4.302653,
    3: 3.182446,
    5: 2.570582,
    9: 2.262157,
    10: 2.228139,
    30: 2.042272,
    120: 1.979930,
}


@pytest.mark.parametrize("df,expected", sorted(T975.items()))
def test_t_quantile_matches_the_published_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=2e-6)


@pytest.mark.parametrize(
    "p,df,expected",
    [(0.995, 5, 4.032143), (0.995, 10, 3.169273), (0.95, 10, 1.812461), (0.9, 1, 3.077684)],
)
def test_t_quantile_at_other_levels(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-6)


def test_t_quantile_tends_to_the_normal_quantile():
    # z(0.975) = 1.959964; t(0.975, 10^5) differs from it by about z (1 + z^2) / (4 df) = 2.4e-5
    assert t_quantile(0.975, 100_000) == pytest.approx(1.959964, abs=5e-5)
    assert t_quantile(0.975, 100_000) > 1.959964


@pytest.mark.parametrize("p,df", [(0.5, 3), (1.0, 3), (0.3, 3), (0.975, 0)])
def test_t_quantile_rejects_what_has_no_quantile(p, df):
    with pytest.raises(ValueError, match=f"p={p}, df={df}"):
        t_quantile(p, df)


def test_block_medians_keep_the_order_blocks_were_taken_in():
    # block 2 ran first, then 0, then 1: medians 5 (of 4, 5, 6), 1.5 (of 1, 2), 10
    samples = np.array([4.0, 6.0, 5.0, 1.0, 2.0, 10.0])
    blocks = np.array([2, 2, 2, 0, 0, 1])
    ids, med = block_medians(samples, blocks)
    assert ids.tolist() == [2, 0, 1]
    assert med.tolist() == [5.0, 1.5, 10.0]


def test_between_block_interval_on_the_log_scale():
    # log block medians log(10) + [-a, 0, a]: sd (ddof 1) = sqrt((a^2 + 0 + a^2) / 2) = a, so
    # the half-width is t(0.975, 2) a / sqrt(3) on the log scale, around the given center
    a = 0.1
    medians = 10.0 * np.exp([-a, 0.0, a])
    half = T975[2] * a / math.sqrt(3)  # 0.248414
    lo, hi = between_block_ci(10.0, medians, 0.95)
    assert lo == pytest.approx(10.0 * math.exp(-half), rel=1e-6)  # 7.8004
    assert hi == pytest.approx(10.0 * math.exp(half), rel=1e-6)  # 12.8199
    # multiplicative: the interval stays positive however wide the spread
    lo, _ = between_block_ci(1.0, np.array([0.01, 1.0, 100.0]), 0.95)
    assert lo > 0


def test_between_block_interval_needs_two_positive_blocks():
    assert between_block_ci(5.0, np.array([5.0]), 0.95) is None
    assert between_block_ci(5.0, np.array([5.0, 0.0, 4.0]), 0.95) is None
    assert between_block_ci(0.0, np.array([1.0, 2.0]), 0.95) is None
    # equal blocks: zero spread, the interval is the point
    assert between_block_ci(5.0, np.full(4, 5.0), 0.95) == (5.0, 5.0)


def test_lag1_inflation_of_hand_made_series():
    # below 10 blocks r is too rough to use: no widening
    assert lag1_inflation(np.arange(9.0)) == 1.0
    # alternating blocks: r < 0, never narrower
    assert lag1_inflation(np.tile([1.0, -1.0], 10)) == 1.0
    # a ramp 0..9: d = i - 4.5, sum d^2 = 82.5, sum d_i d_(i+1) = 57.75 -> r = 0.7; corrected
    # 0.7 + (1 + 2.8) / 10 = 1.08, capped at LAG1_MAX = 0.9 -> sqrt(1.9 / 0.1) = 4.3589
    assert lag1_inflation(np.arange(10.0)) == pytest.approx(math.sqrt(19.0))
    # runs of 4: +1 -1 +1 -1 +1 (20 values, mean 0.2): d = 0.8 (12 values), -1.2 (8);
    # sum d^2 = 12 x 0.64 + 8 x 1.44 = 19.2; neighbour products: 9 x 0.64 + 6 x 1.44 - 4 x 0.96
    # = 10.56 -> r = 0.55; corrected 0.55 + (1 + 2.2) / 20 = 0.71 -> sqrt(1.71 / 0.29)
    runs = np.repeat([1.0, -1.0, 1.0, -1.0, 1.0], 4)
    assert lag1_inflation(runs) == pytest.approx(math.sqrt(1.71 / 0.29))


def test_correlated_blocks_keep_their_interval_honest():
    # 1000 runs of 40 blocks whose log medians are AR(1) at 0.8 around a true 0: the plain t
    # interval covers the truth about half the time (its sd/sqrt(B) assumes independent
    # blocks); widened by lag1_inflation it covers close to its 95 %. Independent blocks are
    # left nearly as they were. Seeded: the counts are fixed (0.458 and 0.890 measured)
    rng = np.random.default_rng(1)
    t, b = t_quantile(0.975, 39), 40
    plain = widened = iid_plain = iid_widened = 0
    for _ in range(1000):
        e = rng.normal(size=b)
        x = np.empty(b)
        x[0] = e[0] / math.sqrt(1 - 0.8**2)
        for i in range(1, b):
            x[i] = 0.8 * x[i - 1] + e[i]
        half = t * x.std(ddof=1) / math.sqrt(b)
        plain += abs(x.mean()) <= half
        widened += abs(x.mean()) <= half * lag1_inflation(x)
        y = rng.normal(size=b)
        half = t * y.std(ddof=1) / math.sqrt(b)
        iid_plain += abs(y.mean()) <= half
        iid_widened += abs(y.mean()) <= half * lag1_inflation(y)
    assert plain < 600 and widened > 850
    assert 930 <= iid_plain <= iid_widened <= 985
    # and between_block_ci applies it: AR(1) medians around 10 ms, 40 blocks
    x = np.log(10.0) + 0.05 * np.sin(np.arange(40) / 4.0)  # smooth: strongly correlated
    lo, hi = between_block_ci(10.0, np.exp(x), 0.95)
    half = t * float(np.std(x, ddof=1)) / math.sqrt(40) * lag1_inflation(x)
    assert lag1_inflation(x) > 2 and math.log(hi / 10.0) == pytest.approx(half)


def test_combined_interval_is_the_hull():
    assert combined_ci(5.0, (4.0, 6.0), (4.5, 7.0)) == (4.0, 7.0)
    assert combined_ci(5.0, (4.0, 6.0), (3.0, 5.5)) == (3.0, 6.0)
    assert combined_ci(5.0, (4.0, 6.0), None) == (4.0, 6.0)


def test_within_interval_is_the_order_statistic_interval():
    # n = 9: ranks (2, 8) (see test_timing_measurement) -> the 2nd and 8th smallest
    assert within_ci(np.arange(1.0, 10.0), 0.95) == (2.0, 8.0)


def test_drift_of_an_exact_trend():
    # medians 10 * 1.02^t at t = 0..9 s: the log medians are a line of slope ln 1.02 with no
    # residual (se = 0: any nonzero slope is significant); over the 9 s window the trend is
    # 1.02^9 - 1 = 19.509 %
    t = np.arange(10.0)
    pct, significant = drift(t, 10.0 * 1.02**t)
    assert pct == pytest.approx(100.0 * (1.02**9 - 1.0), rel=1e-9)
    assert significant
    # a falling trend reads negative: 0.98^9 - 1 = -16.625 %
    pct, significant = drift(t, 10.0 * 0.98**t)
    assert pct == pytest.approx(100.0 * (0.98**9 - 1.0), rel=1e-9) and significant


def test_drift_needs_three_blocks_and_a_time_span():
    assert drift(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == (0.0, False)
    assert drift(np.zeros(4), np.array([1.0, 2.0, 3.0, 4.0])) == (0.0, False)
    assert drift(np.arange(3.0), np.full(3, 7.0)) == (0.0, False)  # flat: no trend


def test_drift_is_not_significant_for_stationary_noise():
    # 10 blocks of multiplicative noise with no trend: a two-sided 99 % t-test on the slope is
    # significant for about 1 % of seeds; 200 seeds -> about 2 (Binomial(200, 0.01): P(> 8) is
    # below 1e-4), while an exact trend above is always significant
    t = np.arange(10.0)
    flagged = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        medians = 10.0 * np.exp(rng.normal(0.0, 0.02, t.size))
        flagged += drift(t, medians)[1]
    assert flagged <= 8


def test_drift_is_significant_for_a_trend_in_noise():
    # the same noise (sd 2 % per block median) on a 2 %/block trend: the slope's standard
    # error is about 0.02 / sqrt(sum (t - 4.5)^2) = 0.02 / 9.08 = 0.0022, the slope
    # ln 1.02 = 0.0198 is 9 standard errors, far past t(0.995, 8) = 3.355: every seed flags
    t = np.arange(10.0)
    for seed in range(200):
        rng = np.random.default_rng(seed)
        medians = 10.0 * 1.02**t * np.exp(rng.normal(0.0, 0.02, t.size))
        pct, significant = drift(t, medians)
        assert significant, seed
        assert 5.0 < pct < 40.0, (seed, pct)  # around 19.5 %


def test_paired_ratio_of_constructed_rounds():
    # per-round log ratios ln 2 + [e, -e, e, -e]: four rounds, 20 % trimming drops none
    # (g = int(0.8) = 0), so the trimmed mean is the mean ln 2 -> ratio exactly 2; sd (ddof 1) =
    # sqrt(4 e^2 / 3) = 2e / sqrt(3); half-width t(0.975, 3) * sd / sqrt(4) on the log scale
    e = 0.05
    den = np.array([3.0, 5.0, 4.0, 6.0])
    num = 2.0 * den * np.exp([e, -e, e, -e])
    ratio, lo, hi = paired_ratio(num, den, 0.95)
    half = T975[3] * (2 * e / math.sqrt(3)) / 2.0  # 0.091870
    assert ratio == pytest.approx(2.0, rel=1e-12)
    assert lo == pytest.approx(2.0 * math.exp(-half), rel=1e-6)  # 1.8245
    assert hi == pytest.approx(2.0 * math.exp(half), rel=1e-6)  # 2.1924


def test_paired_ratio_trims_rounds_hit_by_other_load():
    # ten rounds, sorted log ratios below; two outliers (-0.3, +0.4): a round where another
    # process hit one candidate's block. 20 % trimming drops g = 2 from each end, keeping
    # [-0.01, -0.01, 0, 0, 0.01, 0.01]: mean 0 -> ratio exactly 1 (the plain mean would be
    # 0.1 / 10 = 0.01 -> 1.01005). Yuen: winsorized values [-0.01 x4, 0 x2, 0.01 x4], variance
    # (ddof 1) 8e-4 / 9; h = 6 kept; se = sqrt(9 * (8e-4 / 9) / (6 * 5)) = sqrt(8e-4 / 30);
    # half-width t(0.975, 5) * se = 2.570582 * 0.0051640 = 0.013275 on the log scale
    r = np.array([-0.3, -0.02, -0.01, -0.01, 0.0, 0.0, 0.01, 0.01, 0.02, 0.4])
    den = np.linspace(3.0, 7.0, r.size)
    ratio, lo, hi = paired_ratio(den * np.exp(r), den, 0.95)
    half = T975[5] * math.sqrt(8e-4 / 30)
    assert ratio == pytest.approx(1.0, abs=1e-12)
    assert lo == pytest.approx(math.exp(-half), rel=1e-7)  # 0.98681
    assert hi == pytest.approx(math.exp(half), rel=1e-7)  # 1.01336


def test_paired_ratio_cancels_what_both_candidates_share():
    # a drift that multiplies both candidates alike, round by round, leaves their ratio exact
    # and its interval a point: the reason comparisons are interleaved and paired
    drift_per_round = np.array([1.0, 1.3, 0.8, 1.6, 1.1])
    ratio, lo, hi = paired_ratio(1.5 * drift_per_round, drift_per_round, 0.95)
    assert (ratio, lo, hi) == pytest.approx((1.5, 1.5, 1.5), rel=1e-12)


def test_paired_ratio_of_one_round_has_no_interval():
    ratio, lo, hi = paired_ratio(np.array([6.0]), np.array([3.0]), 0.95)
    assert ratio == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)
