"""The timing recipe: adaptive stop, fixed counts, warm-up rules, option checks."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from modelprof.errors import ModelProfError
from modelprof.timing.sampler import (StopRule, WarmRegistry, WarmupPolicy, collect,
                                      input_signature, relative_ci, warm_up)


class FakeTime:
    """A clock that only moves when a fake sample 'runs'."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def chunker(values, clock: FakeTime | None = None):
    """sample_chunk(k) serving ``values`` cyclically; advances ``clock`` by their duration."""
    it = itertools.cycle(values)
    calls = []

    def chunk(k: int) -> np.ndarray:
        calls.append(k)
        got = np.array([next(it) for _ in range(k)], dtype=float)
        if clock is not None:
            clock.t += got.sum() / 1e3
        return got
    return chunk, calls


def test_constant_samples_stop_at_min_samples_for_precision():
    # a constant sample has a zero-width CI, so the first check after min_samples stops
    chunk, _ = chunker([2.0])
    samples, reason, _ = collect(chunk, StopRule(min_samples=12), est_ms=2.0)
    assert reason == "precision"
    assert samples.size == 12


def test_repeat_takes_exactly_that_many_samples():
    chunk, calls = chunker([1.0, 5.0, 3.0])
    samples, reason, _ = collect(chunk, StopRule(repeat=1234), est_ms=0.01)
    assert reason == "repeat"
    assert samples.size == 1234 and sum(calls) == 1234
    assert max(calls) <= 1000                        # chunked: one synchronize per chunk on CUDA


def test_max_samples_bounds_an_imprecise_run():
    # alternating 1 / 2: the median CI always spans [1, 2] -> ±0.5/1.5 = 33 % > 0.1 %
    chunk, _ = chunker([1.0, 2.0])
    samples, reason, _ = collect(chunk, StopRule(precision=0.001, max_samples=57, budget_s=1e9),
                                 est_ms=1e-3)
    assert reason == "max_samples"
    assert samples.size == 57


def test_budget_wins_over_min_samples_for_slow_calls():
    # 300 ms per call, 1 s budget: 0.3, 0.6, 0.9 s; a 4th would end at 1.2 s > 1 s -> 3 samples
    clock = FakeTime()
    chunk, _ = chunker([300.0], clock)
    samples, reason, wall = collect(chunk, StopRule(budget_s=1.0, min_samples=10), est_ms=300.0,
                                    now=clock)
    assert reason == "budget"
    assert samples.size == 3
    assert wall == pytest.approx(0.9)


def test_budget_stops_an_imprecise_run_without_overshoot():
    clock = FakeTime()
    chunk, _ = chunker([10.0, 20.0], clock)
    samples, reason, wall = collect(chunk, StopRule(precision=0.001, budget_s=2.0),
                                    est_ms=15.0, now=clock)
    assert reason == "budget"
    assert wall <= 2.0 + 0.020                       # at most one sample past the budget
    assert wall + 0.010 > 2.0 - 0.020                # and it did use the budget


def test_no_estimate_takes_one_sample_first():
    clock = FakeTime()
    chunk, calls = chunker([700.0], clock)
    collect(chunk, StopRule(budget_s=1.0), est_ms=None, now=clock)
    assert calls[0] == 1                              # not min_samples calls of unknown length


def test_precision_stop_reaches_the_precision():
    rng = np.random.default_rng(3)
    values = rng.normal(10.0, 1.0, 100_000)
    chunk, _ = chunker(values)
    samples, reason, _ = collect(chunk, StopRule(precision=0.01, budget_s=1e9), est_ms=1e-3)
    assert reason == "precision"
    assert relative_ci(samples) <= 0.01
    # std 1 / median 10: about (1.96 * 1.2533 * 0.1 / 0.01)^2 ~ 600 samples; far fewer than max
    assert 200 < samples.size < 5000


def test_exact_warmup_count():
    calls = []
    n, est = warm_up(lambda: calls.append(1), WarmupPolicy(count=7), already_warm=False)
    assert n == 7 and len(calls) == 7 and est is not None


def test_auto_warmup_by_count_and_time():
    clock = FakeTime()

    def step() -> None:
        clock.t += 0.125                              # exact in binary
    # >= 3 calls and >= 0.75 s: after k calls 0.125 k s -> k = 6
    assert warm_up(step, WarmupPolicy(None, 0.75), False, now=clock)[0] == 6
    # >= 3 calls and >= 0.0 s -> 3
    assert warm_up(step, WarmupPolicy(None, 0.0), False, now=clock)[0] == 3
    # already warm: >= 1 call and >= min(0.5, 0.1) s -> 1 call of 0.125 s
    assert warm_up(step, WarmupPolicy(None, 0.5), True, now=clock)[0] == 1


def test_warm_registry_tracks_signatures_per_callable():
    reg = WarmRegistry()

    class Session:
        def run(self, x):
            return x
    s = Session()
    a = input_signature((torch.zeros(2, 3),))
    b = input_signature((torch.zeros(4, 3),))
    assert a != b
    reg.add(s.run, a)
    assert reg.seen(s.run, a)                         # a fresh bound method, same owner
    assert not reg.seen(s.run, b)
    assert not reg.seen(Session().run, a)
    reg.add(len, a)                                   # not weak-referenceable: kept by id
    assert reg.seen(len, a)


def test_signature_sees_dtype_layout_and_flags():
    x = torch.zeros(1, 3, 4, 4)
    base = input_signature((x,))
    assert input_signature((x.double(),)) != base
    assert input_signature((x.contiguous(memory_format=torch.channels_last),)) != base
    assert input_signature((x,), amp="bf16") != base
    assert input_signature({"x": x}) == input_signature({"x": x.clone()})


@pytest.mark.parametrize("kwargs,needle", [
    (dict(repeat=-1), "repeat=-1"),
    (dict(repeat=0), "repeat=0"),
    (dict(repeat=2.5), "repeat=2.5"),
    (dict(precision=0), "precision=0"),
    (dict(precision=1.5), "precision=1.5"),
    (dict(precision="1%"), "precision='1%'"),
    (dict(budget_s=-2), "budget_s=-2"),
    (dict(min_samples=0), "min_samples=0"),
    (dict(min_samples=50, max_samples=10), "max_samples=10"),
])
def test_stop_rule_rejects_bad_options_naming_them(kwargs, needle):
    with pytest.raises(ModelProfError, match=needle.replace("%", "%")):
        StopRule.parse(**kwargs)


@pytest.mark.parametrize("warmup,warmup_s,needle", [(-3, 0.5, "warmup=-3"),
                                                     (None, -1.0, "warmup_s=-1.0")])
def test_warmup_policy_rejects_bad_options(warmup, warmup_s, needle):
    with pytest.raises(ModelProfError, match=needle):
        WarmupPolicy.parse(warmup, warmup_s)


def test_budget_counts_untimed_overhead_between_samples():
    # each sample reads 1-2 ms but costs 11 ms of wall (a cache flush between samples, say):
    # chunk sizes follow the wall time, so the 1 s budget is overshot by at most one sample
    clock = FakeTime()
    values = itertools.cycle([1.0, 2.0])

    def chunk(k: int) -> np.ndarray:
        clock.t += 0.011 * k
        return np.array([next(values) for _ in range(k)])
    samples, reason, wall = collect(chunk, StopRule(precision=0.001, budget_s=1.0),
                                    est_ms=1.0, now=clock)
    assert reason == "budget"
    assert 1.0 - 0.011 < wall <= 1.0 + 0.011
    assert samples.size == pytest.approx(wall / 0.011)
