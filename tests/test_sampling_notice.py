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


def _sampled(*ms: float, wall_s: float | None = None) -> Sampled:
    """Samples of ``ms``, taken in ``wall_s`` (default: their sum, as if nothing else ran)."""
    n = len(ms)
    wall = sum(ms) / 1e3 if wall_s is None else wall_s
    return Sampled(np.array(ms), np.zeros(n, int), np.zeros(n), "budget", wall)


def test_the_notice_says_how_long_at_most_and_only_past_its_threshold():
    # 9 runs still wanted at the 2 s a sample has cost: 18 s, under the 30 s cap
    with pytest.warns(
        SamplingPastBudgetWarning, match=r"ended at 1 of min_samples=10 runs; .* 18 s"
    ):
        runner._say_extension("latency M", _sampled(2000.0), 10, 30.0)
    # the cap bounds what is said, and the cap named is the one that applies
    with pytest.warns(SamplingPastBudgetWarning, match=r"about 12 s more \(layer_extend_s= caps"):
        runner._say_extension("layers M", _sampled(2000.0), 10, 12.0, "layer_extend_s")
    # what a sample cost in wall time, not its reading: a per-layer sample runs a plain pass
    # too, a training step's reads its backward alone (2 samples of 1 s in 4 s: 2 s each, 8 more)
    with pytest.warns(SamplingPastBudgetWarning, match=r"about 16 s more"):
        runner._say_extension("layers M", _sampled(1000.0, 1000.0, wall_s=4.0), 10, 30.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner._say_extension("latency M", _sampled(100.0, 100.0), 10, 30.0)  # 8 x 0.1 s
        runner._say_extension("latency M", _sampled(2000.0), 10, 4.0)  # capped below 5 s
        runner._say_extension("latency M", _sampled(), 10, 30.0)  # no run: nothing to go by
        # a run longer than the cap: extend() starts none, so nothing is said (review)
        runner._say_extension("latency M", _sampled(40_000.0), 10, 30.0)


def test_the_notice_names_the_cap_as_the_bound_not_the_estimate():
    # a trial's "up to about 10 s more" went on 17 s: the pace so far is an estimate (a load
    # that grows slows the runs still wanted), the cap is what stops the floor. 9 runs at 2 s
    # a sample: about 18 s at that pace, and at most the 30 s cap
    with pytest.warns(SamplingPastBudgetWarning) as said:
        runner._say_extension("latency M", _sampled(2000.0), 10, 30.0)
    text = str(said[0].message)
    assert "about 18 s more at the pace so far, at most about 30 s more (floor_extend_s=" in text
    assert "up to about 18" not in text
    # an estimate the cap clips (9 x 2 s = 18 s over a 12 s cap): the cap alone is said
    with pytest.warns(SamplingPastBudgetWarning) as said:
        runner._say_extension("layers M", _sampled(2000.0), 10, 12.0, "layer_extend_s")
    assert "sampling on for at most about 12 s more (layer_extend_s=" in str(said[0].message)


def test_a_timed_call_says_it_once_unless_a_bar_or_warn_false_says_otherwise(monkeypatch):
    monkeypatch.setattr(runner, "EXTENSION_NOTICE_S", 0.05)  # 9 runs x a 20 ms spin: 0.18 s
    quick = dict(input_size=(4,), budget_s=0.01, warmup=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = measure_latency(Spin(20.0), **quick)
    notices = [w for w in seen if w.category is SamplingPastBudgetWarning]
    assert len(notices) == 1 and m.n == 10 and m.extended_s > 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measure_latency(Spin(20.0), **quick, warn=False)
    assert not [w for w in seen if w.category is SamplingPastBudgetWarning]


def test_a_bar_replaces_the_notice_only_where_one_is_shown(monkeypatch):
    # progress=True without tqdm shows no bar: the notice is said (review: neither was)
    import modelprof.timing.runner as timing_runner
    from modelprof.runtime.progress import NoProgress

    monkeypatch.setattr(runner, "EXTENSION_NOTICE_S", 0.05)
    quick = dict(input_size=(4,), budget_s=0.01, warmup=1, progress=True)

    class _Bar:  # a bar that shows (tqdm's interface): not the do-nothing one
        n = 0

        def update(self, n: int = 1) -> None:
            self.n += n

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    for bar, said in ((NoProgress, 1), (_Bar, 0)):
        monkeypatch.setattr(timing_runner, "progress_bar", lambda *a, _b=bar, **k: _b())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            measure_latency(Spin(20.0), **quick)
        assert len([w for w in seen if w.category is SamplingPastBudgetWarning]) == said


def test_a_rank_that_does_not_speak_says_nothing(monkeypatch):
    # under torchrun every rank printed it (review): it is a ModelProfWarning, which a rank
    # other than the speaker keeps to itself
    from modelprof.runtime.group import one_voice

    monkeypatch.delenv("MODELPROF_ALL_RANKS", raising=False)
    monkeypatch.setenv("RANK", "1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with one_voice():
            runner._say_extension("latency M", _sampled(2000.0), 10, 30.0)
    assert seen == []
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(SamplingPastBudgetWarning), one_voice():
        runner._say_extension("latency M", _sampled(2000.0), 10, 30.0)


def test_an_interleaved_comparison_says_it_too(monkeypatch):
    # compare(), measure_latencies() and compare_generation() sample in interleaved rounds,
    # whose floor went on without the notice (review); two 20 ms spins with a 0.01 s budget
    # a candidate: the floor's rounds take each to min_samples=10
    from modelprof import measure_latencies

    monkeypatch.setattr(runner, "EXTENSION_NOTICE_S", 0.05)
    spins = {"a": Spin(20.0), "b": Spin(20.0)}
    quick = dict(input_size=(4,), budget_s=0.01, warmup=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = measure_latencies(spins, **quick)
    notices = [str(w.message) for w in seen if w.category is SamplingPastBudgetWarning]
    assert len(notices) == 1 and "for the fewest of the candidates" in notices[0]
    # the bound is the floor's cap, 30 s (floor_extend_s's default) a candidate x 2 candidates
    assert "at most about 60 s more (floor_extend_s= caps it" in notices[0]
    assert all(m.n >= 10 for m in got.measurements.values())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measure_latencies(spins, **quick, warn=False)
    assert not [w for w in seen if w.category is SamplingPastBudgetWarning]
