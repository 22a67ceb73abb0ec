"""Measurement statistics against closed forms on fixed synthetic samples."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from modelprof.timing.measurement import (Measurement, NoisyMeasurementWarning,
                                          median_ci_ranks)

ONE_TO_NINE = np.arange(1.0, 10.0)


def test_statistics_of_one_to_nine():
    m = Measurement(ONE_TO_NINE, batch_size=4)
    assert m.n == 9
    assert m.median_ms == 5.0                           # middle of 1..9
    assert m.mean_ms == 5.0                             # 45 / 9
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
    assert m.outliers == 0                              # fences -3 .. 13


def test_median_ci_of_one_to_nine_is_second_and_eighth():
    # P(B <= 1) = (1 + 9) / 512 = 0.0195 <= 0.025 < P(B <= 2) = 46 / 512, B ~ Bin(9, 1/2)
    # -> j = 2, k = 9 - 2 + 1 = 8, coverage 1 - 2 * 10/512
    assert median_ci_ranks(9) == (2, 8, pytest.approx(1 - 20 / 512))
    m = Measurement(ONE_TO_NINE[::-1].copy())          # order of samples must not matter
    assert m.median_ci_ms == (2.0, 8.0)
    assert m.ci_half_width_ms == 3.0                   # (8 - 2) / 2
    assert m.relative_ci == pytest.approx(0.6)         # 3 / 5


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
    assert m.n == 10 and m.max_ms == 100.0              # kept
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
    m = Measurement([3.0, 3.0, 4.0], device="cuda:0", stop_reason="budget",
                    h2d=part, compute=part, d2h=part, env={"torch_version": "x"})
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


def test_empty_samples_rejected():
    with pytest.raises(ValueError):
        Measurement([])


def test_from_dict_round_trips():
    part = Measurement([1.0, 2.0])
    m = Measurement(ONE_TO_NINE, device="cuda:0", batch_size=2, warmup=5, compile_ms=12.5,
                    h2d=part, env={"a": 1})
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.samples_ms.tolist() == ONE_TO_NINE.tolist()
    assert (back.device, back.batch_size, back.warmup, back.compile_ms) == ("cuda:0", 2, 5, 12.5)
    assert back.h2d is not None and back.h2d.median_ms == 1.5 and back.env == {"a": 1}
    with pytest.raises(ValueError):
        Measurement.from_dict(m.to_dict(samples=False))
