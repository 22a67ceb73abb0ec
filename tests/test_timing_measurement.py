"""Measurement statistics against closed forms on fixed synthetic samples."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from helpers import blocked

from modelprof.errors import DriftWarning, FewSamplesWarning, NoisyMeasurementWarning
from modelprof.timing.measurement import Measurement, median_ci_ranks

ONE_TO_NINE = np.arange(1.0, 10.0)


def test_statistics_of_one_to_nine():
    m = Measurement(ONE_TO_NINE, batch_size=4)
    assert m.n == 9
    assert m.median_ms == 5.0  # middle of 1..9
    assert m.mean_ms == 5.0  # 45 / 9
    # sum((i - 5)^2) = 2*(16+9+4+1) = 60; ddof=1 -> 60 / 8 = 7.5
    assert m.std_ms == pytest.approx(math.sqrt(7.5))
    assert m.cv == pytest.approx(math.sqrt(7.5) / 5.0)
    assert (m.min_ms, m.max_ms) == (1.0, 9.0)
    # linear percentiles at position q*(n-1): p90 -> 7.2 -> 8 + 0.2 = 8.2; p95 -> 7.6; p99 -> 7.92
    assert m.p90_ms == pytest.approx(8.2)
    assert m.p95_ms == pytest.approx(8.6)
    assert m.p99_ms == pytest.approx(8.92)
    # q1 at position 2 -> 3, q3 at position 6 -> 7
    assert m.iqr_ms == pytest.approx(4.0)
    # fps = batch / median seconds = 4 / 0.005
    assert m.fps == pytest.approx(800.0)
    assert m.outliers == 0  # fences -3 .. 13


def test_median_ci_of_one_to_nine_is_second_and_eighth():
    # P(B <= 1) = (1 + 9) / 512 = 0.0195 <= 0.025 < P(B <= 2) = 46 / 512, B ~ Bin(9, 1/2)
    # -> j = 2, k = 9 - 2 + 1 = 8, coverage 1 - 2 * 10/512
    assert median_ci_ranks(9) == (2, 8, pytest.approx(1 - 20 / 512))
    m = Measurement(ONE_TO_NINE[::-1].copy())  # order of samples must not matter
    assert m.median_ci_ms == (2.0, 8.0)
    assert m.ci_half_width_ms == 3.0  # (8 - 2) / 2
    assert m.relative_ci == pytest.approx(0.6)  # 3 / 5


@pytest.mark.parametrize("n,ranks", [(20, (6, 15)), (100, (40, 61))])
def test_median_ci_ranks_match_published_tables(n, ranks):
    # the textbook distribution-free 95 % ranks (e.g. Conover, table A3)
    assert median_ci_ranks(n)[:2] == ranks
    assert median_ci_ranks(n)[2] >= 0.95


def test_median_ci_tiny_n_falls_back_to_min_max():
    # n = 5: even (min, max) covers only 1 - 2/32 = 0.9375 < 0.95
    assert median_ci_ranks(5) == (1, 5, pytest.approx(1 - 2 / 32))
    m = Measurement([3.0, 1.0, 2.0, 5.0, 4.0])
    assert m.median_ci_ms == (1.0, 5.0)


def test_median_ci_is_ordered_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    widths = []
    for n in (10, 100, 1000):
        m = Measurement(rng.normal(10.0, 1.0, n))
        lo, hi = m.median_ci_ms
        assert m.min_ms <= lo <= m.median_ms <= hi <= m.max_ms
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_median_ci_covers_the_true_median_at_least_95_percent():
    # exponential(1): true median ln 2; 4000 replicates of n=25 (exact coverage 0.957)
    rng = np.random.default_rng(1)
    draws = rng.exponential(1.0, size=(4000, 25))
    hits = 0
    for row in draws:
        lo, hi = Measurement(row).median_ci_ms
        hits += lo <= math.log(2) <= hi
    assert hits / 4000 >= 0.94


def test_outlier_is_counted_not_dropped():
    m = Measurement(np.append(ONE_TO_NINE, 100.0))
    # n=10: q1 at position 2.25 -> 3.25, q3 at 6.75 -> 7.75, IQR 4.5; upper fence 7.75 + 6.75 = 14.5
    assert m.iqr_ms == pytest.approx(4.5)
    assert m.outliers == 1
    assert m.n == 10 and m.max_ms == 100.0  # kept
    assert m.median_ms == 5.5


def test_noisy_flag_and_single_warning():
    quiet = Measurement(np.full(50, 2.0))
    assert not quiet.noisy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quiet.warn_if_noisy() is False
    # half 1.0, half 2.0: median 1.5, IQR 1.0 -> IQR/median 0.67 > 0.10
    noisy = Measurement(np.repeat([1.0, 2.0], 25))
    assert noisy.noisy
    with pytest.warns(NoisyMeasurementWarning) as rec:
        noisy.warn_if_noisy()
        noisy.warn_if_noisy()
    assert len(rec) == 1


def test_to_dict_is_json_and_keeps_samples_and_parts():
    part = Measurement([1.0, 1.0, 1.0])
    m = Measurement(
        [3.0, 3.0, 4.0],
        device="cuda:0",
        stop_reason="budget",
        h2d=part,
        compute=part,
        d2h=part,
        env={"torch_version": "x"},
    )
    d = json.loads(json.dumps(m.to_dict()))
    assert d["samples_ms"] == [3.0, 3.0, 4.0]
    assert d["median_ms"] == 3.0 and d["n"] == 3
    assert d["stop_reason"] == "budget"
    assert set(d["parts"]) == {"h2d", "compute", "d2h"}
    assert d["env"] == {"torch_version": "x"}
    assert "samples_ms" not in m.to_dict(samples=False)


def test_repr_is_readable():
    text = repr(Measurement(ONE_TO_NINE, label="net", stop_reason="precision"))
    assert "median 5.000 ms" in text
    assert "n=9" in text and "stop=precision" in text and "net" in text


def test_repr_gives_a_lopsided_intervals_two_sides():
    # 9 samples, one block: the median's 95 % interval is the 2nd..8th order statistics
    # (median_ci_ranks(9)). 1..9: median 5, [2, 8], symmetric: half-width 3 / 5 = ±60 %
    assert "95% CI 2.000 ms..8.000 ms, ±60.00%)" in repr(Measurement(ONE_TO_NINE))
    # a loaded run's tail: median 5, [2, 105]; 3 / 5 = 60 % below, 100 / 5 = 2000 % above,
    # not the half-width (105 - 2) / 2 / 5 = ±1030 %, which fits neither side
    lopsided = Measurement([1.0, 2.0, 4.0, 4.5, 5.0, 5.5, 6.0, 105.0, 200.0])
    assert lopsided.relative_ci == pytest.approx((105 - 2) / 2 / 5)
    assert "95% CI 2.000 ms..105.000 ms, -60.00%/+2000.00%)" in repr(lopsided)


def test_empty_samples_rejected():
    with pytest.raises(ValueError):
        Measurement([])


def test_from_dict_round_trips():
    part = Measurement([1.0, 2.0])
    m = Measurement(
        ONE_TO_NINE,
        device="cuda:0",
        batch_size=2,
        warmup=5,
        compile_ms=12.5,
        h2d=part,
        env={"a": 1},
    )
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.samples_ms.tolist() == ONE_TO_NINE.tolist()
    assert (back.device, back.batch_size, back.warmup, back.compile_ms) == ("cuda:0", 2, 5, 12.5)
    assert back.h2d is not None and back.h2d.median_ms == 1.5 and back.env == {"a": 1}
    with pytest.raises(ValueError):
        Measurement.from_dict(m.to_dict(samples=False))


# -- blocks: the interval widens for what varies between blocks, drift is flagged ------------

T975_5, T975_9 = 2.570582, 2.262157  # Student's t(0.975, 5) and t(0.975, 9), from tables


def _blocked(levels, per_block: int = 20) -> Measurement:
    """helpers.blocked: constant samples at ``levels[b]`` in block b, taken at t = b s."""
    return blocked(levels, per_block, label="drifty", min_samples=10)


def test_a_step_change_gives_the_between_block_interval_cut_to_the_samples():
    # 3 blocks at 10 ms then 3 at 12 ms (120 samples): the pooled median is 11 and its
    # order-statistic interval (ranks 50..71 of 120) is [10, 12]; the log medians have
    # sd (ddof 1) = sqrt(6 (h/2)^2 / 5), h = ln 1.2, so the between-block interval is
    # 11 exp(± t(0.975, 5) sd / sqrt(6)) = [9.2667, 13.0576]. The reported one is their hull
    # cut to the samples' range, [10, 12]: with 6 blocks [min, max] of their medians is a
    # distribution-free 1 - 2 / 2^6 = 96.9 % interval, and the samples' range holds it
    m = _blocked([10, 10, 10, 12, 12, 12])
    assert m.n_blocks == 6 and m.block_medians_ms.tolist() == [10, 10, 10, 12, 12, 12]
    assert m.within_ci_ms == (10.0, 12.0)
    half = T975_5 * math.sqrt(6 * (math.log(1.2) / 2) ** 2 / 5) / math.sqrt(6)
    assert m.between_ci_ms == pytest.approx((11 * math.exp(-half), 11 * math.exp(half)), rel=1e-6)
    assert m.median_ci_ms == (10.0, 12.0) == (m.min_ms, m.max_ms)
    assert m.relative_ci == pytest.approx(1 / 11)  # (12 - 10) / 2 / 11


def test_the_cut_to_the_samples_waits_for_six_blocks_and_keeps_the_coverage():
    # blocks with their own level (log sd 0.1, the load of a shared machine) and 1 % noise
    # inside, 20 samples each, true median 10. With 2 blocks all samples can lie on one side
    # of it (probability 1/2), so the t(1) interval stands uncut: it covers; from 6 blocks the
    # range of the block medians is a 96.9 % interval, and cutting to the samples' range
    # (which holds it) leaves the coverage of 400 seeded runs where it was
    from modelprof.timing.stats import combined_ci

    for b, least in ((2, 0.92), (6, 0.92)):
        covered = uncut_covered = cut = 0
        for seed in range(400):
            rng = np.random.default_rng(seed)
            levels = np.repeat(rng.normal(0.0, 0.1, b), 20)
            blocks = np.repeat(np.arange(b), 20)
            m = Measurement(
                10.0 * np.exp(levels + rng.normal(0.0, 0.01, 20 * b)),
                blocks=blocks,
                timestamps_s=blocks + np.tile(np.arange(20) * 1e-3, b),
            )
            lo, hi = m.median_ci_ms
            ulo, uhi = combined_ci(m.median_ms, m.within_ci_ms, m.between_ci_ms)
            covered += lo <= 10.0 <= hi
            uncut_covered += ulo <= 10.0 <= uhi
            cut += (lo, hi) != (ulo, uhi)
        assert covered / 400 >= least and covered >= uncut_covered - 2
        assert (cut == 0) if b == 2 else (cut > 0)


def test_interval_covers_a_drifting_sample_and_the_drift_is_flagged():
    # levels 10 * 1.02^b in blocks b = 0..9 of 20: the pooled median is the mean of the 100th
    # and 101st values, (L4 + L5) / 2, and the pooled interval (ranks 86..115) is [L4, L5]: it
    # leaves out every level but those two. The log medians rise by ln 1.02 per block, sd
    # ln(1.02) sd(0..9) = 0.0198 * 3.02765; as independent blocks that is a half-width of
    # t(0.975, 9) * 0.0599547 / sqrt(10) = 0.042889, covering L3 .. L6 only. But consecutive
    # blocks of a ramp are correlated: lag-1 r = 0.7 (test_timing_stats), bias-corrected
    # 0.7 + 3.8 / 10 = 1.08, capped at 0.9, widens it by sqrt(1.9 / 0.1) = 4.3589 to
    # h = 0.186949: median * exp(±h) = 9.068 .. 13.180 covers the whole window, L0 .. L9,
    # and past it: cut to the samples' range, the interval is the window itself
    levels = 10.0 * 1.02 ** np.arange(10)
    m = _blocked(levels)
    assert m.median_ms == pytest.approx((levels[4] + levels[5]) / 2)
    assert m.within_ci_ms == (levels[4], levels[5])
    h = T975_9 * math.log(1.02) * np.std(np.arange(10), ddof=1) / math.sqrt(10) * math.sqrt(19)
    assert m.between_ci_ms == pytest.approx(
        (m.median_ms * math.exp(-h), m.median_ms * math.exp(h)), rel=1e-6
    )
    assert m.median_ci_ms == (levels[0], levels[9])  # 10.0 .. 11.951, all of it covered
    # the trend 1.02^9 - 1 = +19.5 % exceeds the interval's ±(L9 - L0) / 2 / median
    # = ±0.97546 / 10.9325 = ±8.9 %: unstable
    assert m.drift_pct == pytest.approx(100 * (1.02**9 - 1), rel=1e-9)
    half = (levels[9] - levels[0]) / 2
    assert m.relative_ci == pytest.approx(half / m.median_ms, rel=1e-9)
    assert m.stable is False
    with pytest.warns(DriftWarning) as rec:
        assert m.warn_if_noisy() is True
        assert m.warn_if_noisy() is False  # once per measurement
    assert len(rec) == 1
    text = str(rec[0].message)
    assert "+19.5 %" in text and "10 blocks" in text and "±8.9%" in text and "drifty" in text
    assert "UNSTABLE" in repr(m)
    d = m.stats()
    assert d["stable"] is False and d["n_blocks"] == 10
    assert d["drift_pct"] == pytest.approx(19.509, abs=1e-3)


def test_stationary_noise_is_not_flagged():
    # 10 blocks of 30 samples of 2 % multiplicative noise, no trend: flagged only when the
    # slope is significant at 99 % (about 1 seed in 100) AND larger than the interval; over
    # 100 seeds at most 2 (Binomial(100, 0.01): P(> 2) = 0.08 even before the second test)
    unstable = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        samples = 10.0 * np.exp(rng.normal(0.0, 0.02, 300))
        blocks = np.repeat(np.arange(10), 30)
        m = Measurement(samples, blocks=blocks, timestamps_s=blocks * 0.1)
        assert abs(m.drift_pct) < 5.0  # the trend estimate is small
        unstable += not m.stable
    assert unstable <= 2


def test_a_trend_in_noise_is_flagged_every_time():
    # the same noise on a 2 %/block trend over 10 blocks (19.5 % over the window)
    for seed in range(50):
        rng = np.random.default_rng(seed)
        blocks = np.repeat(np.arange(10), 30)
        samples = 10.0 * 1.02**blocks * np.exp(rng.normal(0.0, 0.02, 300))
        m = Measurement(samples, blocks=blocks, timestamps_s=blocks * 0.1)
        assert not m.stable, seed
        assert 15.0 < m.drift_pct < 25.0, (seed, m.drift_pct)


def test_no_drift_without_timestamps_or_with_few_blocks():
    levels = 10.0 * 1.02 ** np.arange(10)
    no_times = Measurement(np.repeat(levels, 5), blocks=np.repeat(np.arange(10), 5))
    # without timestamps or with two blocks no trend can be judged: stability is unknown (None),
    # never claimed
    assert (no_times.drift_pct, no_times.stable) == (None, None)
    two = _blocked([10.0, 12.0])
    # a trend needs 3 blocks: with 2 the drift is unknown (None), not a 0 that reads as "none"
    assert (two.drift_pct, two.stable) == (None, None)
    assert two.to_dict()["drift_pct"] is None
    assert "needs 3 timed blocks" in two.stability_unknown_reason
    assert "stability unknown" in repr(two)
    assert ", drift " not in repr(two) and ", drift +" in repr(_blocked([10.0, 11.0, 12.0]))


def test_the_repr_says_when_a_drift_is_within_the_blocks_scatter():
    # a newcomer read "drift +45.2 %" beside no flag and no warning: a trend whose slope the
    # blocks' own scatter cannot tell from 0 now says so. Blocks at t = 0..4 s reading 10, 15,
    # 9, 14, 11 ms: the log medians' least-squares slope is sum(t' ln m) / sum(t'^2) with
    # t' = -2..2: (-2 ln 10 - ln 15 + ln 14 + 2 ln 11) / 10 = 0.012163 per s, over the 4 s
    # window expm1(0.04865) = +4.985 %; the residuals (15 and 14 against 9 and 11) dwarf it
    scatter = _blocked([10.0, 15.0, 9.0, 14.0, 11.0])
    assert scatter.drift_pct == pytest.approx(4.985, abs=1e-3)
    assert ", drift +5.0 % (within the blocks' scatter)" in repr(scatter)
    # a real trend (2 % a block over 10 blocks, as above) is said plainly, and UNSTABLE
    blocks = np.repeat(np.arange(10), 30)
    samples = 10.0 * 1.02**blocks * np.exp(np.random.default_rng(0).normal(0.0, 0.02, 300))
    trend = Measurement(samples, blocks=blocks, timestamps_s=blocks * 0.1)
    assert f", drift {trend.drift_pct:+.1f} %, UNSTABLE" in repr(trend)


def test_a_budget_stop_below_min_samples_warns_once_naming_n():
    m = Measurement([50.0, 51.0, 52.0], stop_reason="budget", min_samples=10, label="slow")
    assert m.undersampled
    with pytest.warns(FewSamplesWarning) as rec:
        assert m.warn_if_noisy() is True
        assert m.warn_if_noisy() is False
    assert len(rec) == 1
    assert "n=3 samples" in str(rec[0].message) and "min_samples=10" in str(rec[0].message)
    assert "UNDERSAMPLED (min 10)" in repr(m)
    # one run of repeat=1 has no interval: undersampled, with no minimum asked to name
    one = Measurement([50.0], stop_reason="repeat")
    assert one.undersampled and "UNDERSAMPLED" in repr(one) and "min None" not in repr(one)
    assert m.stats()["undersampled"] is True


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(stop_reason="repeat", min_samples=None),  # repeat= asked for 3 on purpose
        dict(stop_reason="budget", min_samples=3),  # the budget left enough
        dict(stop_reason="precision", min_samples=10),  # not a budget stop
    ],
)
def test_few_samples_on_purpose_do_not_warn(kwargs):
    m = Measurement([50.0, 50.0, 50.0], **kwargs)
    assert not m.undersampled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert m.warn_if_noisy() is False


def test_block_fields_round_trip_and_are_checked():
    m = _blocked([10.0, 11.0, 12.0], per_block=4)
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.blocks.tolist() == m.blocks.tolist()
    assert back.timestamps_s.tolist() == pytest.approx(m.timestamps_s.tolist())
    assert back.min_samples == 10 and back.drift_pct == pytest.approx(m.drift_pct)
    with pytest.raises(ValueError, match="blocks has 2 entries for 3 samples"):
        Measurement([1.0, 2.0, 3.0], blocks=[0, 1])
    with pytest.raises(ValueError, match="timestamps_s has 1 entries"):
        Measurement([1.0, 2.0], timestamps_s=[0.0])
    one = Measurement([1.0, 2.0, 3.0])  # no blocks given: one block
    assert one.n_blocks == 1 and one.between_ci_ms is None


def test_one_block_states_no_interval_is_undersampled_and_claims_no_stability():
    # three samples, all in block 0: nothing says how far a second block would land
    m = Measurement(
        [10.0, 11.0, 12.0],
        blocks=[0, 0, 0],
        timestamps_s=[0.0, 0.01, 0.02],
        stop_reason="budget",
        min_samples=2,
        label="one-block",
    )
    assert m.n_blocks == 1 and not m.has_interval
    lo, hi = m.median_ci_ms
    assert math.isnan(lo) and math.isnan(hi) and math.isnan(m.relative_ci)
    assert m.undersampled is True  # although n=3 >= min_samples=2
    assert m.stable is None  # unknown, not True
    # no median is quoted beside a missing interval: the text says why instead
    assert "no median to quote: no interval from 3 runs in 1 block" in repr(m)
    # nor a throughput or CV drawn from it (it printed "90.9 fps" and "CV 9.1%"; "CV nan%" for
    # one run)
    assert "CV n/a" in repr(m) and "fps n/a" in repr(m) and repr(m).count("fps") == 1
    assert "stability unknown" in repr(m) and m.short_reason == "no interval from 3 runs in 1 block"
    with pytest.warns(FewSamplesWarning, match="no interval can be stated"):
        m.warn_if_noisy()
    d = json.loads(json.dumps(m.to_dict(), allow_nan=True))
    assert d["stable"] is None and d["undersampled"] is True


def test_a_single_sample_has_no_spread_and_no_interval():
    m = Measurement([0.0956])
    assert math.isnan(m.std_ms) and math.isnan(m.median_ci_ms[0])
    assert m.undersampled and m.stable is None
    assert "± " not in repr(m).splitlines()[1]  # no "± 0 ms" spread from one sample


def test_an_interval_too_wide_to_judge_a_trend_does_not_claim_stability():
    # the precision example: block medians from 349 to 6,386 ms; the median's interval spans
    # several times the median, so even a 125 % drift sits inside it: unknown, not stable
    medians = np.array([349.0, 6386.0, 700.0, 2500.0, 420.0, 5100.0])
    blocks = np.repeat(np.arange(6), 3)
    samples = np.repeat(medians, 3)
    m = Measurement(samples, blocks=blocks, timestamps_s=blocks * 1.0)
    assert m.has_interval and m.relative_ci > 0.5
    assert m.stable is None
    assert "too wide to judge" in m.stability_unknown_reason


def test_repeat_one_gives_nan_interval_and_no_stability(recwarn):
    import torch
    from torch import nn

    from modelprof.timing import measure_latency

    m = measure_latency(nn.Linear(4, 4), inputs=torch.randn(1, 4), repeat=1, warmup=1)
    assert m.n == 1
    assert all(math.isnan(v) for v in m.median_ci_ms)
    assert m.undersampled is True and m.stable is None
    # repeat=2 gives two blocks of one (blocks hold at most ceil(repeat / min_blocks)): an
    # interval from the two samples
    two = measure_latency(nn.Linear(4, 4), inputs=torch.randn(1, 4), repeat=2, warmup=1)
    assert two.n_blocks == 2 and two.has_interval


@pytest.mark.parametrize("samples", [[2947.62], [3.392, 1628.06]])
def test_a_run_of_one_or_two_samples_cannot_tell_its_drift(samples):
    # the case: a budget stopped at n=1 or n=2 (one block each) and printed
    # `m.stable, m.drift_pct` as `None 0.0`; both say "cannot tell" now
    n = len(samples)
    m = Measurement(
        samples,
        blocks=np.arange(n),
        timestamps_s=np.arange(n, dtype=float),
        stop_reason="budget",
        min_samples=10,
    )
    assert (m.stable, m.drift_pct) == (None, None)
    assert m.stats()["drift_pct"] is None


def test_the_stop_and_the_floor_survive_the_json_export():
    # a spread stop that estimated 200 s for ±1 %, after a floor extension of 1.5 s (cap 30 s):
    # the raw samples, their block ids and why sampling stopped all come back from JSON
    m = _blocked([10.0, 11.0, 12.0], per_block=4)
    m = Measurement(
        m.samples_ms,
        blocks=m.blocks,
        timestamps_s=m.timestamps_s,
        stop_reason="spread",
        precision=0.01,
        min_samples=10,
        needed_s=200.0,
        extended_s=1.5,
        floor_cap_s=30.0,
    )
    d = json.loads(json.dumps(m.to_dict()))
    assert d["blocks"] == [0] * 4 + [1] * 4 + [2] * 4 and len(d["samples_ms"]) == 12
    back = Measurement.from_dict(d)
    assert (back.stop_reason, back.needed_s, back.extended_s, back.floor_cap_s) == (
        "spread",
        200.0,
        1.5,
        30.0,
    )
    # 200 s = 3.33 min; 1.5 s past the budget
    assert back.stop_text == (
        "spread (±1.0% would take ~3.33 min of sampling) "
        "(+1.5 s past the budget for min_samples=10)"
    )


def test_a_loaded_run_warns_that_its_wall_figure_moved_and_names_the_cpu_work():
    # issue 37: five profile(resnet18) under load gave clean medians of 25.4, 71.3, 48.6 and
    # 42.8 ms, each claiming +-2-3 %. Here every sample's wall time is 2x its CPU time (10 ms of
    # work that waited for a core as long again): wall/CPU = 20 / 10 = 2.0 > 1.15
    from modelprof.errors import LoadedMachineWarning

    rng = np.random.default_rng(0)
    cpu = 10.0 + rng.normal(0.0, 0.01, 40)
    blocks = np.repeat(np.arange(8), 5)
    m = Measurement(
        2.0 * cpu, blocks=blocks, timestamps_s=blocks * 0.1, cpu_ms=cpu, cpu_clock="thread_time"
    )
    assert m.loaded and m.wall_over_cpu == pytest.approx(2.0)
    with pytest.warns(LoadedMachineWarning) as rec:
        assert m.warn_if_noisy()
    text = str(rec[0].message)
    assert "wall/CPU 2.00" in text and "quote the CPU work, median 9.99" in text  # 10 - noise
    # the same work on a quiet machine (wall = CPU time): nothing to say
    quiet = Measurement(cpu, blocks=blocks, timestamps_s=blocks * 0.1, cpu_ms=cpu)
    assert not quiet.loaded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not quiet.warn_if_noisy()


def test_min_and_max_are_the_extreme_samples_also_when_one_is_not_finite():
    # the sorted samples' ends: an infinite (or NaN, sorted last) sample is the maximum and
    # leaves the minimum as read
    m = Measurement([1.0, math.inf])
    assert (m.min_ms, m.max_ms) == (1.0, math.inf)
    m = Measurement([2.0, math.nan, 1.0])
    assert m.min_ms == 1.0 and math.isnan(m.max_ms)
