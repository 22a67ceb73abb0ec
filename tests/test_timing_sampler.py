"""The timing recipe: adaptive stop, fixed counts, warm-up rules, option checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from modelprof.errors import FewSamplesWarning, ModelProfError
from modelprof.timing.measurement import Measurement
from modelprof.timing.sampler import (
    BLOCK_S,
    FLOOR_EXTEND_S,
    MAX_BLOCK,
    StopRule,
    WarmRegistry,
    WarmupPolicy,
    block_size,
    collect,
    collect_interleaved,
    hold_floor,
    input_signature,
    relative_ci,
    warm_up,
)
from modelprof.timing.stats import t_quantile


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


def test_constant_samples_stop_once_min_samples_and_min_blocks_are_reached():
    # a constant sample has a zero-width interval: it stops at the first check where
    # n >= min_samples and blocks >= min_blocks. The first block is small (ceil(12 / 3) = 4
    # samples: the estimate may miss per-sample costs), then 0.1 s / 2 ms = 50 per block
    chunk, calls = chunker([2.0])
    s = collect(chunk, StopRule(min_samples=12, min_blocks=3), est_ms=2.0)
    assert s.stop_reason == "precision"
    assert calls == [4, 50, 50]
    assert s.samples_ms.size == 104
    assert s.blocks.tolist() == [0] * 4 + [1] * 50 + [2] * 50
    # each sample starts where the one before it ended: 2 ms apart within a block
    assert np.diff(s.timestamps_s[4:54]) == pytest.approx(np.full(49, 0.002))


def test_repeat_takes_exactly_that_many_samples():
    chunk, calls = chunker([1.0, 5.0, 3.0])
    s = collect(chunk, StopRule(repeat=1234), est_ms=0.01)
    assert s.stop_reason == "repeat"
    assert s.samples_ms.size == 1234 and sum(calls) == 1234
    assert max(calls) <= MAX_BLOCK  # blocks: one synchronize per block on CUDA
    # first block from the estimate: 0.1 s / 0.01 ms = 10,000, capped at 1000 and at
    # ceil(1234 / min_blocks 6) = 206 (repeat= still gives six blocks or more, for an interval);
    # then from what the samples read (median 3 ms): 0.1 s / 3 ms = 33 per block;
    # 206 + 31 x 33 + 5 = 1234
    assert calls == [206] + [33] * 31 + [5]


def test_max_samples_bounds_an_imprecise_run():
    # alternating 1 / 2: the median CI always spans [1, 2] -> ±0.5/1.5 = 33 % > 0.1 %
    chunk, _ = chunker([1.0, 2.0])
    s = collect(chunk, StopRule(precision=0.001, max_samples=57, budget_s=1e9), est_ms=1e-3)
    assert s.stop_reason == "max_samples"
    assert s.samples_ms.size == 57


def test_budget_stops_below_min_samples_for_slow_calls_and_says_so():
    # 300 ms per call, 1 s budget: 0.3, 0.6, 0.9 s; a 4th would end at 1.2 s > 1 s -> 3 samples,
    # one per block (a block is at most ~0.1 s, at least one call)
    clock = FakeTime()
    chunk, calls = chunker([300.0], clock)
    s = collect(chunk, StopRule(budget_s=1.0, min_samples=10), est_ms=300.0, now=clock)
    assert s.stop_reason == "budget"
    assert s.samples_ms.size == 3 and calls == [1, 1, 1]
    assert s.wall_s == pytest.approx(0.9)
    from modelprof.errors import FewSamplesWarning
    from modelprof.timing.measurement import Measurement

    m = Measurement(
        s.samples_ms,
        stop_reason=s.stop_reason,
        min_samples=10,
        blocks=s.blocks,
        timestamps_s=s.timestamps_s,
        label="slow",
    )
    assert m.undersampled
    with pytest.warns(FewSamplesWarning, match="n=3 samples"):
        assert m.warn_if_noisy()


def test_budget_stops_an_imprecise_run_without_overshoot():
    # min_blocks=1000: the spread is never judged (it needs min_blocks), so the budget stops it
    clock = FakeTime()
    chunk, _ = chunker([10.0, 20.0], clock)
    rule = StopRule(precision=0.001, budget_s=2.0, min_blocks=1000)
    s = collect(chunk, rule, est_ms=15.0, now=clock)
    assert s.stop_reason == "budget"
    assert s.wall_s <= 2.0 + 0.020  # at most one sample past the budget
    assert s.wall_s + 0.010 > 2.0 - 0.020  # and it did use the budget


def test_a_short_budget_still_takes_min_blocks_blocks():
    # 0.3 s of 1.0/1.3 ms calls (never precise to 0.1 %): blocks of BLOCK_S = 0.1 s would give
    # about 3, and an interval from t(2) = 4.3 (t(1) = 12.7 with 2) spans decades under load;
    # blocks of budget_s / min_blocks = 0.05 s give the 6 the stop rule asks for
    clock = FakeTime()
    chunk, _ = chunker([1.0, 1.3], clock)
    s = collect(chunk, StopRule(precision=0.001, budget_s=0.3), est_ms=1.15, now=clock)
    assert s.stop_reason in ("budget", "spread") and len(np.unique(s.blocks)) >= 6
    assert block_size(1.15, 0.3 / 6) == 43  # 50 ms of 1.15 ms calls


def test_no_estimate_takes_one_sample_first():
    clock = FakeTime()
    chunk, calls = chunker([700.0], clock)
    collect(chunk, StopRule(budget_s=1.0), est_ms=None, now=clock)
    assert calls[0] == 1  # not min_samples calls of unknown length


def test_precision_stop_reaches_the_precision():
    rng = np.random.default_rng(3)
    values = rng.normal(10.0, 1.0, 100_000)
    chunk, _ = chunker(values)
    s = collect(chunk, StopRule(precision=0.01, budget_s=1e9), est_ms=1e-3)
    assert s.stop_reason == "precision"
    assert relative_ci(s.samples_ms, s.blocks) <= 0.01
    # independent samples, std 1 / median 10: about (1.96 * 1.2533 * 0.1 / 0.01)^2 ~ 600
    # samples; the samples claim 10 ms each, so blocks hold 0.1 s / 10 ms = 10 of them, and
    # the between-block part needs sd(median of 10) ~ 0.40 -> (1.98 * 0.40 / 0.1)^2 ~ 63
    # blocks: several hundred samples, far fewer than max_samples
    assert 600 <= s.samples_ms.size <= 5000


def test_exact_warmup_count():
    calls = []
    n, est = warm_up(lambda: calls.append(1), WarmupPolicy(count=7), already_warm=False)
    assert n == 7 and len(calls) == 7 and est is not None


def test_auto_warmup_by_count_and_time():
    clock = FakeTime()

    def step() -> None:
        clock.t += 0.125  # exact in binary

    # >= 3 calls and >= 0.75 s after the first: 0.125 (k - 1) s after k calls -> k = 7
    assert warm_up(step, WarmupPolicy(None, 0.75), False, now=clock)[0] == 7
    # >= 3 calls and >= 0.0 s -> 3
    assert warm_up(step, WarmupPolicy(None, 0.0), False, now=clock)[0] == 3
    # already warm: >= 1 call and >= min(0.5, 0.1) s after the first -> 1 + 1 call of 0.125 s
    assert warm_up(step, WarmupPolicy(None, 0.5), True, now=clock)[0] == 2


def test_a_slow_first_call_is_no_warm_up_time():
    # the first call spins 1.5 s once (measure_latency's one-off set-up in a fresh process), the
    # others 1/64 s (exact in binary). >= 3 calls and >= 0.5 s after the first: 0.5 * 64 = 32
    # plain calls -> 33 in all (the first call counted in time gave 3: 1.5 s >= 0.5 s)
    clock = FakeTime()

    def step() -> None:
        clock.t += 1.5 if clock.t == 0.0 else 1 / 64

    assert warm_up(step, WarmupPolicy(None, 0.5), False, now=clock)[0] == 33


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
    assert reg.seen(s.run, a)  # a fresh bound method, same owner
    assert not reg.seen(s.run, b)
    assert not reg.seen(Session().run, a)
    reg.add(len, a)  # not weak-referenceable: kept by id
    assert reg.seen(len, a)


def test_signature_sees_dtype_layout_and_flags():
    x = torch.zeros(1, 3, 4, 4)
    base = input_signature((x,))
    assert input_signature((x.double(),)) != base
    assert input_signature((x.contiguous(memory_format=torch.channels_last),)) != base
    assert input_signature((x,), amp="bf16") != base
    assert input_signature({"x": x}) == input_signature({"x": x.clone()})


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(repeat=-1), "repeat=-1"),
        (dict(repeat=0), "repeat=0"),
        (dict(repeat=2.5), "repeat=2.5"),
        (dict(precision=0), "precision=0"),
        (dict(precision=1.5), "precision=1.5"),
        (dict(precision="1%"), "precision='1%'"),
        (dict(budget_s=-2), "budget_s=-2"),
        # a string of seconds read as a range error ("must be ... > 0"): it says the type
        (
            dict(budget_s="1"),
            r"budget_s='1' must be a finite number of seconds > 0 \(an int or a float, not str\)",
        ),
        # nan and inf are floats: refused as not finite, not as the wrong type ("not float")
        (dict(budget_s=float("nan")), r"budget_s=nan must be a finite number of seconds > 0$"),
        (dict(budget_s=float("inf")), r"budget_s=inf must be a finite number of seconds > 0$"),
        (
            dict(floor_extend_s=float("-inf")),
            r"floor_extend_s=-inf must be a finite number of seconds >= 0 \(0: never",
        ),
        (dict(min_samples=0), "min_samples=0"),
        (dict(min_samples=50, max_samples=10), "max_samples=10"),
    ],
)
def test_stop_rule_rejects_bad_options_naming_them(kwargs, needle):
    with pytest.raises(ModelProfError, match=needle.replace("%", "%")):
        StopRule.parse(**kwargs)


@pytest.mark.parametrize(
    "warmup,warmup_s,needle", [(-3, 0.5, "warmup=-3"), (None, -1.0, "warmup_s=-1.0")]
)
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

    rule = StopRule(precision=0.001, budget_s=1.0, min_blocks=1000)  # no spread stop
    s = collect(chunk, rule, est_ms=1.0, now=clock)
    assert s.stop_reason == "budget"
    assert 1.0 - 0.011 < s.wall_s <= 1.0 + 0.011
    assert s.samples_ms.size == pytest.approx(s.wall_s / 0.011)


def test_block_size_follows_the_wall_time_of_a_call():
    assert block_size(None) == 1  # unknown duration: one call first
    assert block_size(2.0) == int(BLOCK_S * 1e3 / 2.0) == 50
    assert block_size(500.0) == 1  # slower than a block: one call
    assert block_size(1e-6) == MAX_BLOCK


def test_a_step_between_blocks_widens_the_interval():
    # blocks of 20 samples at 10 ms, then blocks at 12 ms: the pooled order-statistic interval
    # of the 80 values is [10, 12] around the median 11 (±1/11 = 9.1 %); the between-block t
    # interval on the log scale of the medians [10, 10, 12, 12] is
    # 11 * exp(±t(3) sd(log m) / sqrt(4)), t(3) = 3.1824, which is wider
    samples = np.repeat([10.0, 10.0, 12.0, 12.0], 20)
    blocks = np.repeat(np.arange(4), 20)
    assert relative_ci(samples) == pytest.approx(1.0 / 11.0)
    half = 3.1824 * np.std(np.log([10, 10, 12, 12]), ddof=1) / np.sqrt(4)
    expected = (np.exp(half) - np.exp(-half)) / 2.0  # (hi - lo) / 2 / median
    assert expected > 1.0 / 11.0
    assert relative_ci(samples, blocks) == pytest.approx(expected, rel=1e-3)
    # six such blocks: the range of 6 block medians is a 96.9 % interval by itself, and the
    # t interval is cut to the samples' range [10, 12], as Measurement.median_ci_ms cuts it
    six = np.repeat([10.0, 10.0, 10.0, 12.0, 12.0, 12.0], 20)
    assert relative_ci(six, np.repeat(np.arange(6), 20)) == pytest.approx(1.0 / 11.0)


def test_interleaved_rounds_shuffle_and_pair_blocks():
    clock = FakeTime()
    order = []

    def sampler(name, value):
        def take(k):
            order.append(name)
            clock.t += value * k / 1e3
            return np.full(k, value)

        return take

    rule = StopRule(min_samples=4, min_blocks=5, budget_s=100.0)
    got = collect_interleaved(
        [sampler("a", 2.0), sampler("b", 4.0)],
        rule,
        [2.0, 4.0],
        np.random.default_rng(0),
        now=clock,
    )
    # constant values: exact intervals and ratios -> stops after min_blocks = 5 rounds
    assert [s.stop_reason for s in got] == ["precision", "precision"]
    assert got[0].blocks.max() == got[1].blocks.max() == 4
    assert len(order) == 10 and sorted(order) == ["a"] * 5 + ["b"] * 5
    rounds = [tuple(order[i : i + 2]) for i in range(0, 10, 2)]
    assert ("a", "b") in rounds and ("b", "a") in rounds  # the order is shuffled per round
    # round 0: a small first block, ceil(4 / 5) = 1 call each; then blocks of 0.1 s:
    # 50 calls of 2 ms, 25 calls of 4 ms -> 1 + 4 x 50 = 201 and 1 + 4 x 25 = 101
    assert got[0].samples_ms.size == 201 and got[1].samples_ms.size == 101


def _slow_budget_stop(clock: FakeTime):
    """300 ms calls under a 1 s budget: 3 samples, one per block (see the test above)."""
    chunk, calls = chunker([300.0], clock)
    rule = StopRule(budget_s=1.0, min_samples=10)
    return chunk, calls, rule, collect(chunk, rule, est_ms=300.0, now=clock)


def test_the_sample_floor_holds_past_the_budget_and_says_by_how_much():
    # the budget stops at 3 of min_samples=10 (0.9 s); hold_floor takes the 7 missing runs one
    # per block: 7 x 0.3 s = 2.1 s past the budget, well inside its 30 s cap
    clock = FakeTime()
    chunk, calls, rule, s = _slow_budget_stop(clock)
    assert s.n == 3
    held = hold_floor(chunk, s, rule, now=clock)
    assert held.n == 10 and calls == [1] * 10
    assert held.stop_reason == "budget"  # why the adaptive stop ended is kept
    assert held.extended_s == pytest.approx(2.1) and held.floor_cap_s == FLOOR_EXTEND_S
    assert list(held.blocks) == list(range(10))  # each extension run its own block
    m = Measurement(held.samples_ms, **held.fields(rule))
    assert not m.undersampled and m.short_reason is None and m.has_interval
    assert "stop=budget (+2.1 s past the budget for min_samples=10)" in repr(m)
    assert m.to_dict()["extended_s"] == pytest.approx(2.1)


def test_a_floor_the_cap_cannot_reach_quotes_no_median_and_says_why():
    # cap 1 s: 0.3, 0.6, 0.9 s of extension; a 4th run would end at 1.2 s > 1 s -> 6 runs of 10
    clock = FakeTime()
    chunk, _, rule, s = _slow_budget_stop(clock)
    held = hold_floor(chunk, s, rule, cap_s=1.0, now=clock)
    assert held.n == 6 and held.extended_s == pytest.approx(0.9)
    m = Measurement(held.samples_ms, label="slow", **held.fields(rule))
    assert m.undersampled
    assert m.short_reason == (
        "6 runs in the time budget and 0.9 s past it (cap 1 s), fewer than min_samples=10"
    )
    assert "no median to quote: 6 runs" in repr(m) and "  median " not in repr(m)
    with pytest.warns(FewSamplesWarning, match=r"n=6 samples .*at most 1 s\) did not reach"):
        m.warn_if_noisy()


def test_the_floor_leaves_a_count_asked_for_and_a_run_at_its_floor_as_they_are():
    clock = FakeTime()
    chunk, calls = chunker([300.0], clock)
    rule = StopRule(repeat=2)
    s = collect(chunk, rule, est_ms=300.0, now=clock)
    assert hold_floor(chunk, s, rule, now=clock) is s and s.n == 2  # repeat=2 asked for 2
    rule = StopRule(budget_s=1.0, min_samples=3)
    s = collect(chunk, rule, est_ms=300.0, now=clock)
    assert s.n == 3 and hold_floor(chunk, s, rule, now=clock) is s


def _timed(clock: FakeTime, ms: float):
    def take(k: int) -> np.ndarray:
        clock.t += ms * k / 1e3
        return np.full(k, ms)

    return take


def test_interleaved_candidates_are_held_to_the_floor_in_paired_rounds():
    # a 300 ms and a 3 ms candidate, 0.5 s of budget each (1 s in all): the slow one has 2-3
    # runs when the budget ends; floor rounds go on, every candidate in every round (one
    # 300 ms run, and 0.1 s / 3 ms = 33 fast runs, a block), until the slow one has 10
    clock = FakeTime()
    rule = StopRule(budget_s=0.5, min_samples=10)
    got = collect_interleaved(
        [_timed(clock, 300.0), _timed(clock, 3.0)],
        rule,
        [300.0, 3.0],
        np.random.default_rng(0),
        now=clock,
    )
    slow, fast = got
    assert slow.n == 10 and fast.n >= 10
    assert slow.stop_reason == fast.stop_reason == "budget"
    # the rounds stay paired: the same block ids for both
    assert list(np.unique(slow.blocks)) == list(np.unique(fast.blocks))
    assert slow.extended_s > 0 and slow.floor_cap_s == 2 * FLOOR_EXTEND_S
    m = Measurement(slow.samples_ms, **slow.fields(rule))
    assert not m.undersampled and "past the budget for min_samples=10" in repr(m)


def test_interleaved_floor_rounds_stop_at_their_cap(monkeypatch):
    # a cap of 0.2 s per candidate (0.4 s in all) fits one floor round of 0.3 + 0.1 s: the
    # slow candidate stays short, and says so
    import modelprof.timing.sampler as sampler

    monkeypatch.setattr(sampler, "FLOOR_EXTEND_S", 0.2)
    clock = FakeTime()
    rule = StopRule(budget_s=0.5, min_samples=10)
    slow, _ = collect_interleaved(
        [_timed(clock, 300.0), _timed(clock, 3.0)],
        rule,
        [300.0, 3.0],
        np.random.default_rng(0),
        now=clock,
    )
    m = Measurement(slow.samples_ms, **slow.fields(rule))
    assert m.n < 10 and m.undersampled and "(cap 0.4 s)" in m.short_reason


def test_a_spread_the_budget_cannot_beat_stops_early_and_says_how_long_it_would_take():
    # samples alternating 10 / 20 ms: blocks of 2 (the first), then 0.1 s / 15 ms = 6; every
    # block's median is 15, so the blocks agree, but the pooled median's interval is [10, 20]:
    # ±5/15 = 1/3 of it. The spread is judged from the 8th block (SPREAD_MIN_BLOCKS; n = 44,
    # 0.03 + 7 x 0.09 = 0.66 s), projected from the 7 full blocks (the small first one left
    # out, its median is the noisiest): the asked ±0.1 % would take 0.66 s x (1/3 / 0.001)^2 x
    # (t(0.975, 1000) / t(0.975, 6))^2 (the t quantile shrinks with more blocks; capped at
    # 1000 degrees of freedom) = 13.1 h, more than twice the 2 s budget: it stops there, on
    # "spread", not after the whole budget
    clock = FakeTime()
    chunk, calls = chunker([10.0, 20.0], clock)
    rule = StopRule(precision=0.001, budget_s=2.0)
    s = collect(chunk, rule, est_ms=15.0, now=clock)
    assert s.stop_reason == "spread" and calls == [2] + [6] * 7
    assert s.wall_s == pytest.approx(0.66)
    expected = 0.66 * (1000 / 3) ** 2 * (t_quantile(0.975, 1000) / t_quantile(0.975, 6)) ** 2
    assert s.needed_s == pytest.approx(expected, rel=1e-6)
    assert expected / 3600 == pytest.approx(13.1, abs=0.05)
    m = Measurement(s.samples_ms, **s.fields(rule))
    assert "stop=spread (±0.1% would take ~13.1 h of sampling)" in repr(m)
    assert m.to_dict()["needed_s"] == pytest.approx(expected)
    assert not m.undersampled and m.n >= 10  # the floor came first


def test_a_budget_stop_says_no_time_it_cannot_project():
    # 10 ms samples (sd 0.05 ms), every 5th stretch of 9 at 13 ms (a load passing now and then):
    # the stop rule's interval stays near ±2.5 %, the robust one (the MAD of the block medians,
    # which the projection takes where smaller) is within ±1 % already, so there is no time to
    # project. It said "±1.0% would take ~5 s": the time sampled so far, the 5 s budget
    rng = np.random.default_rng(0)
    values = 10.0 + rng.normal(0, 0.05, 9000)
    values[np.arange(values.size) // 9 % 5 == 0] += 3.0
    clock = FakeTime()
    rule = StopRule(precision=0.01, budget_s=5.0)
    s = collect(chunker(values, clock)[0], rule, est_ms=10.0, now=clock)
    assert s.stop_reason == "budget" and relative_ci(s.samples_ms, s.blocks, 0.95) > 0.02
    assert s.needed_s is None
    m = Measurement(s.samples_ms, **s.fields(rule))
    assert m.stop_text == "budget"


def test_the_spread_estimate_is_near_the_time_the_precision_takes():
    # the same stream of N(1, 0.2) ms samples sampled twice: under a 1 s budget the spread
    # stop estimates how long ±0.5 % takes; with no budget to speak of the run reaches it, and
    # the estimate (from 8 blocks) is within a factor of 2 of what it took (0.72x: 9.2 s
    # against 12.8 s; the robust projection errs on the short side, against stopping early)
    values = np.random.default_rng(0).normal(1.0, 0.2, 300_000)
    rule = StopRule(precision=0.005, budget_s=1.0)
    clock = FakeTime()
    early = collect(chunker(values, clock)[0], rule, est_ms=1.0, now=clock)
    clock = FakeTime()
    rule = StopRule(precision=0.005, budget_s=1e9)
    full = collect(chunker(values, clock)[0], rule, est_ms=1.0, now=clock)
    assert early.stop_reason == "spread" and full.stop_reason == "precision"
    assert early.wall_s < 1.0 < 2 * 1.0 < full.wall_s  # it stopped before its budget
    assert 0.5 < early.needed_s / full.wall_s < 2.0


def test_interleaved_rounds_stop_on_spread_and_say_how_long_the_precision_would_take():
    # candidate a alternates 10 / 20 ms (its median's interval stays at ±1/3, see above),
    # b is a constant 5 ms (exact at once): from round 8 (SPREAD_MIN_BLOCKS) on, a's ±0.1 %
    # would take hours, far more than twice the 2 x 2 s budget: both stop there, on "spread"
    clock = FakeTime()
    a, _ = chunker([10.0, 20.0], clock)
    b, _ = chunker([5.0], clock)
    rule = StopRule(precision=0.001, budget_s=2.0)
    got = collect_interleaved([a, b], rule, [15.0, 5.0], np.random.default_rng(0), now=clock)
    assert [s.stop_reason for s in got] == ["spread", "spread"]
    assert got[0].blocks.max() == got[1].blocks.max() == 7  # rounds 0..7
    assert got[0].wall_s < 2.0 and got[0].needed_s > 3600  # stopped early; hours needed
    assert got[1].needed_s is None  # b had its precision
    m = Measurement(got[0].samples_ms, **got[0].fields(rule))
    assert "stop=spread (±0.1% would take ~" in repr(m) and " h of sampling)" in repr(m)


def test_interleaved_precision_is_judged_over_the_rounds_both_candidates_took():
    # a 0.1 ms candidate reaches max_samples=300 in its first two rounds and takes no more;
    # the 10 ms one goes on. Its ratio to the first is judged over rounds 0 and 1, the ones
    # both took (their block medians paired by round, not arrays of 2 and 6 medians)
    clock = [0.0]
    rng = np.random.default_rng(0)

    def sampler(cost_ms: float, noise: float):
        def sample(k: int) -> np.ndarray:
            got = cost_ms * np.exp(rng.normal(0.0, noise, k))
            clock[0] += got.sum() / 1e3
            return got

        return sample

    rule = StopRule.parse(max_samples=300, budget_s=5.0, precision=0.05)
    fast, slow = collect_interleaved(
        [sampler(0.1, 0.01), sampler(10.0, 0.02)],
        rule,
        [0.1, 10.0],
        rng=np.random.default_rng(1),
        now=lambda: clock[0],
    )
    assert fast.n == 300 and np.unique(fast.blocks).tolist() == [0, 1]
    assert slow.stop_reason == "precision" and 2 < len(np.unique(slow.blocks)) and slow.n < 300
