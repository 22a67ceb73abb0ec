"""A sampling floor that will run long past the budget is said as it starts, where no progress
bar shows it: a newcomer's profile on a loaded machine ran 52 s past a 1 s budget in silence.
No duration is asserted: the notice's threshold is lowered here, and the spin is a busy-wait
whose samples are never shorter than itself."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import modelprof.timing.runner as runner
from modelprof import SamplingPastBudgetWarning, measure_latency
from modelprof.timing.calibration import Spin
from modelprof.timing.sampler import Sampled


def _sampled(*ms: float) -> Sampled:
    n = len(ms)
    return Sampled(np.array(ms), np.zeros(n, int), np.zeros(n), "budget", 1.0)


def test_the_notice_says_how_long_at_most_and_only_past_its_threshold():
    # 9 runs still wanted at the median 2 s run so far: 18 s, under the 30 s cap
    with pytest.warns(
        SamplingPastBudgetWarning, match=r"ended at 1 of min_samples=10 runs; .* 18 s"
    ):
        runner._say_extension("latency M", _sampled(2000.0), 10, 30.0)
    # the cap bounds what is said: 9 x 2 s, capped at 12 s
    with pytest.warns(SamplingPastBudgetWarning, match=r"up to 12 s more"):
        runner._say_extension("latency M", _sampled(2000.0), 10, 12.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner._say_extension("latency M", _sampled(100.0, 100.0), 10, 30.0)  # 8 x 0.1 s
        runner._say_extension("latency M", _sampled(2000.0), 10, 4.0)  # capped below 5 s
        runner._say_extension("latency M", _sampled(), 10, 30.0)  # no run: nothing to go by


def test_a_timed_call_says_it_once_unless_a_bar_or_warn_false_says_otherwise(monkeypatch):
    monkeypatch.setattr(runner, "EXTENSION_NOTICE_S", 0.05)  # 9 runs x a 20 ms spin: 0.18 s
    quick = dict(input_size=(4,), budget_s=0.01, warmup=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = measure_latency(Spin(20.0), **quick)
    notices = [w for w in seen if w.category is SamplingPastBudgetWarning]
    assert len(notices) == 1 and m.n == 10 and m.extended_s > 0
    for quiet in (dict(warn=False), dict(progress=True)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            measure_latency(Spin(20.0), **quick, **quiet)
        assert not [w for w in seen if w.category is SamplingPastBudgetWarning]
