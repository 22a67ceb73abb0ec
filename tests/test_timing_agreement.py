"""The per-layer window against the clean end-to-end runs: a disagreement beyond both intervals is
said in the summary, in ``timing_notes`` and in one warning, naming the figure to quote; coverage
is stated against the reported end-to-end figure.

No real load: a FAKE clock (virtual time, advanced only by the model's virtual spins) makes the
clean runs read 5x (or 1/5) of what the per-layer passes read, every sample exactly."""

from __future__ import annotations

import importlib
import json
import math
import warnings

import numpy as np
import pytest
from fake_clock import VirtualSpin, install
from torch import nn

from modelprof import profile
from modelprof.errors import TimingDisagreementWarning
from modelprof.timing.agreement import judge_agreement
from modelprof.timing.measurement import Measurement

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def _virtual(monkeypatch, clean_factor: float) -> nn.Module:
    """Two 1 ms virtual spins; the clean end-to-end runs see the wall clock ``clean_factor`` x
    their CPU time, the per-layer passes 1 x: the two windows disagree by construction."""
    profile_module = importlib.import_module("modelprof.profile")  # the module, not the function

    clock = install(monkeypatch)
    real = profile_module.measure_latency

    def clean(*args, **kwargs):
        clock.factor = clean_factor
        try:
            return real(*args, **kwargs)
        finally:
            clock.factor = 1.0

    monkeypatch.setattr(profile_module, "measure_latency", clean)  # as profile() calls it
    return nn.Sequential(VirtualSpin(clock, 1.0), VirtualSpin(clock, 1.0))


def test_clean_runs_slower_than_the_per_layer_window_are_flagged(monkeypatch, one_thread):
    model = _virtual(monkeypatch, 5.0)
    with pytest.warns(TimingDisagreementWarning) as rec:
        r = profile(model, (4,), repeat=12, warmup=1, roofline=False)
    assert len([w for w in rec if w.category is TimingDisagreementWarning]) == 1
    a = r.timing_agreement
    assert not a.agree
    # clean: 2 ms of spins read 5x -> 10 ms; per-layer passes 2 ms: ratio 0.2, beyond both
    assert r.latency.median_ms == pytest.approx(10.0)
    assert a.passes_ms == pytest.approx(2.0) and a.ratio == pytest.approx(0.2)
    # the figure to quote is the (root) row's as the table shows it (a trial was told to quote
    # 0.318 ms, the corrected passes', beside a (root) row of 0.309 ms, its call's span)
    df = r.to_dataframe()
    assert a.quote == "per-layer" and a.quote_ms == df.loc[0, "latency_ms"]
    assert a.quote_ms == pytest.approx(a.passes_ms)  # here no time outside the root's call
    note = a.note()
    assert "DISAGREE" in note and "quote that figure, the (root) row's" in note
    assert note in r.timing_notes
    summary = r.summary()
    assert "!! the per-layer passes and the clean runs DISAGREE" in summary
    assert summary.count("DISAGREE") == 1  # not repeated as a note
    # coverage against the reported end-to-end figure (the clean median), not the plain passes
    df = r.to_dataframe()
    leaf_sum = df[df["leaf"]]["latency_ms"].sum()
    assert r.coverage == pytest.approx(leaf_sum / r.latency.median_ms, rel=1e-9)
    assert r.coverage == pytest.approx(0.2)  # 2 / 10
    assert "of the end-to-end median" in summary
    # wall (5x) well above the CPU time of the same work (2 ms): the CPU work is named
    assert r.latency.loaded and a.cpu_ms == pytest.approx(2.0)
    assert r.latency.wall_over_cpu == pytest.approx(5.0)
    assert "CPU work" in summary and "CPU work of the clean runs" in note
    env = json.loads(r.to_json())["env"]
    assert env["timing_agreement"]["agree"] is False
    # the clean runs were slowed: the rows are the figures the note says to quote, so none is
    # marked rough for the disagreement (before, the (root) row it named was greyed as no
    # figure to quote); the clean end-to-end median is, in every view
    assert not df.loc[df["latency_ms"].notna(), "latency_rough"].any()
    assert not r.layers_rough and "the clean runs were slowed" in r.latency_unquotable
    table = r.export("markdown", columns=["module", "latency_ms"]).splitlines()
    marked = [line for line in table if line.startswith("|") and "~" in line]
    assert len(marked) == 1 and "end-to-end" in marked[0]


def test_clean_runs_faster_than_the_per_layer_window_quote_the_clean_figure(monkeypatch):
    model = _virtual(monkeypatch, 0.2)
    with pytest.warns(TimingDisagreementWarning, match="quote the clean end-to-end"):
        r = profile(model, (4,), repeat=12, warmup=1, roofline=False)
    a = r.timing_agreement
    assert not a.agree and a.ratio == pytest.approx(5.0)  # 2 ms / 0.4 ms
    assert a.quote == "clean" and a.quote_ms == r.latency.median_ms
    assert r.coverage == pytest.approx(5.0)
    assert "read the per-layer rows by their latency share" in a.note()
    # warn=False: the same disagreement noted, not warned
    with warnings.catch_warnings():
        warnings.simplefilter("error", TimingDisagreementWarning)
        quiet = profile(model, (4,), repeat=12, warmup=1, roofline=False, warn=False)
    assert not quiet.timing_agreement.agree and quiet.timing_agreement.note() in quiet.timing_notes


def _measurement(level: float, spread: float, seed: int) -> Measurement:
    rng = np.random.default_rng(seed)
    blocks = np.repeat(np.arange(8), 10)
    samples = level * np.exp(rng.normal(0.0, spread, blocks.size))
    return Measurement(samples, blocks=blocks, timestamps_s=blocks * 0.1)


def test_agreement_needs_both_disjoint_intervals_and_a_gap_beyond_the_tolerance():
    clean = _measurement(10.0, 0.01, 0)
    # 3 % apart with tight intervals: disjoint, but within the 10 % tolerance -> agree
    near = judge_agreement(clean, _measurement(10.3, 0.01, 1), leaf_sum_ms=10.0)
    assert near.agree
    # 30 % apart with tight intervals -> disagree
    far = judge_agreement(clean, _measurement(13.0, 0.01, 2), leaf_sum_ms=13.0)
    assert not far.agree and far.ratio == pytest.approx(1.3, rel=0.02)
    # apart, but one side's interval (+-30 %) holds the other: no disagreement shown
    held = judge_agreement(clean, _measurement(13.0, 0.8, 3), leaf_sum_ms=11.0)
    lo, hi = held.passes_ci_ms
    assert lo <= 10.0 and (hi - lo) / 2 / held.passes_ms < 0.5 and held.agree
    # 36 % apart inside an interval of +-87 %, which says almost nothing: not agreement but
    # "too noisy to compare" (issue 37: a 270 ms root above a 1,628 ms clean median on n=2,
    # 95 % CI 3.4-781,354, passed as agreeing), said as such; a newcomer read the earlier
    # "cannot be told apart" of a 91x gap as "these may be equal"
    wide = judge_agreement(clean, _measurement(20.0, 2.0, 3), leaf_sum_ms=13.0)
    lo, hi = wide.passes_ci_ms
    assert lo <= 10.0 and (hi - lo) / 2 / wide.passes_ms > 0.5
    assert not wide.agree and wide.verdict == "imprecise"
    assert "TOO NOISY TO COMPARE" in wide.note()
    # the clean runs' interval is tight (+-1 % spread) on an unloaded machine: their median
    # stands on its own, and the verdict says to quote it (it said "neither is a figure to
    # quote" while its quote field named the clean median)
    assert wide.quote == "clean" and wide.quote_ms == clean.median_ms
    assert "stands on its own" in wide.note() and "neither" not in wide.note()
    # what was judged is the clean runs' own load (Measurement.loaded), not the machine's: a
    # run's backward note said "an unloaded machine" beside the forward's LoadedMachineWarning
    assert "its own runs showed no load" in wide.note()
    assert "unloaded machine" not in wide.note()
    # both wide: neither stands, and the quote says so
    noisy = judge_agreement(_measurement(10.0, 2.0, 4), _measurement(20.0, 2.0, 3), 13.0)
    assert noisy.verdict == "imprecise" and noisy.quote == "none"
    assert math.isnan(noisy.quote_ms) and "neither is a figure to quote" in noisy.note()
    # one pass (no interval) is no precise figure: a 6.8x gap is too few runs to judge, not a
    # disagreement "beyond both intervals" (a newcomer's n=1 clean at 4,151 ms and n=1 root at
    # 354 ms read as DISAGREE, quote the root)
    one = Measurement([68.0], blocks=[0])
    assert math.isnan(one.median_ci_ms[0])
    lone = judge_agreement(one, clean, leaf_sum_ms=10.0)
    assert not lone.agree and lone.verdict == "imprecise" and lone.quote == "none"
    assert "(no interval)" in lone.note() and "too few runs" in lone.note()
    assert "beyond both intervals" not in lone.note()


def test_leaf_rows_above_their_root_are_a_disagreement():
    # the resnet18 under load: leaves summing to 178.6 % of the end-to-end median. The
    # leaves are disjoint parts of the (root) pass, so a sum 1.786x the root cannot be (the
    # clean and per-layer medians agree here, 10.0 and 10.05 ms)
    clean = _measurement(10.0, 0.01, 0)
    passes = _measurement(10.05, 0.01, 1)
    over = judge_agreement(clean, passes, leaf_sum_ms=17.86)
    assert not over.agree and over.verdict == "leaves"
    # 17.86 / 10.05 = 1.78
    assert "DO NOT ADD UP" in over.note() and "1.78x" in over.note()
    # 8 % above the root is inside the 10 % the instrument's correction leaves
    assert judge_agreement(clean, passes, leaf_sum_ms=10.05 * 1.08).agree


def test_leaf_rows_far_below_their_root_are_rough(monkeypatch):
    # a newcomer's mobilenet under load: leaves summing to 42 % of the (root) row, unmarked.
    # Here every pass of 5 virtual 1 ms layers has one layer paused 10 ms more of wall time
    # (no CPU work: other work held the core), a different one pass by pass: each layer's
    # median is its 1 ms, every whole pass 15 ms. The leaf rows sum to 5 ms, 33 % of the
    # (root) pass: below LEAVES_SHORT_SHARE (70 %) on a loaded machine (wall/CPU 3), so they
    # do not add up; the clean runs, paused alike, agree with the (root) pass
    clock, calls = install(monkeypatch), [0]

    class Paused(nn.Module):
        def __init__(self, i: int, waits: bool) -> None:
            super().__init__()
            self.i, self.waits = i, waits

        def forward(self, x):
            paused = (calls[0] // 5) % 5 == self.i  # (5 calls a pass: the pass's index)
            calls[0] += 1
            clock.advance(1.0 if self.waits or not paused else 11.0)
            if paused and self.waits:
                clock.wall_ns += 10_000_000  # waiting for a core: wall time, no CPU time
            return x

    model = nn.Sequential(*(Paused(i, waits=True) for i in range(5)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = profile(model, (4,), repeat=20, warmup=1, roofline=False)
    assert r.latency.loaded
    a = r.timing_agreement
    assert a.verdict == "short" and not a.agree and a.alarming
    assert a.leaf_sum_ms == pytest.approx(5.0) and a.passes_ms == pytest.approx(15.0)
    assert "DO NOT ADD UP" in a.note() and "33% of the (root) pass's" in a.note()
    df = r.to_dataframe()
    assert df.loc[df["latency_ms"].notna(), "latency_rough"].all()
    assert [w for w in seen if issubclass(w.category, TimingDisagreementWarning)]
    # the same parts with their pauses as work (a quiet machine: wall = CPU) are no load's
    # doing: a wrapper's own Python, which makes no (self) row, reads so too (review); no
    # disagreement there, whatever the leaves' share
    calls[0] = 0
    quiet = profile(
        nn.Sequential(*(Paused(i, waits=False) for i in range(5))),
        (4,),
        repeat=20,
        warmup=1,
        roofline=False,
    )
    assert not quiet.latency.loaded and quiet.timing_agreement.verdict == "agree"


def test_a_quiet_agreeing_profile_has_no_disagreement_warning(monkeypatch):
    model = _virtual(monkeypatch, 1.0)  # both windows read the same 2 ms
    with warnings.catch_warnings():
        warnings.simplefilter("error", TimingDisagreementWarning)
        r = profile(model, (4,), repeat=12, warmup=1, roofline=False)
    a = r.timing_agreement
    assert a.agree and a.ratio == pytest.approx(1.0) and r.coverage == pytest.approx(1.0)
    assert "DISAGREE" not in r.summary() and not r.latency.loaded


@pytest.mark.parametrize("second_ms, flagged", [(5.0, True), (1.5, False)])
def test_identical_layers_far_apart_are_a_disagreement(monkeypatch, second_ms, flagged):
    # two calls of one module type on the same shapes, no parameters, no FLOPs: identical work
    # as counted. 1 ms against 5 ms is 5x (beyond IDENTICAL_FACTOR = 2) and 4 ms of a 6 ms pass
    # (beyond IDENTICAL_SHARE = 5 %): flagged. 1 ms against 1.5 ms is 1.5x: not flagged.
    clock = install(monkeypatch)
    model = nn.Sequential(VirtualSpin(clock, 1.0), VirtualSpin(clock, second_ms))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        r = profile(model, (4,), repeat=12, warmup=1, roofline=False)
    said = [w for w in rec if w.category is TimingDisagreementWarning]
    a = r.timing_agreement
    if not flagged:
        assert a.agree and not said
        return
    assert not a.agree and a.verdict == "identical" and len(said) == 1
    assert (a.identical.slow, a.identical.fast) == ("1", "0")
    assert a.identical.slow_ms == pytest.approx(5.0) and a.identical.fast_ms == pytest.approx(1.0)
    assert "identical layers" in str(said[0].message) and "5.0x" in a.note()
    df = r.to_dataframe()
    assert df.loc[df["latency_ms"].notna(), "latency_rough"].all()
    # a paper table says so in its caption, beside the marked cells
    latex = r.export("latex", columns=["module", "latency_ms"])
    assert "marked \\textasciitilde{} are rough: identical layers read far apart" in latex


def test_the_backward_check_never_agrees_with_nothing_and_lets_stamps_explain_noise():
    from modelprof.timing.agreement import judge_backward

    passes = Measurement(np.full(12, 2.0))
    # a clean median of n/a: no verdict of agreement (its ratio was NaN, which read "agree")
    nothing = judge_backward(Measurement(np.full(3, np.nan)), passes, 10)
    assert not nothing.agree and nothing.verdict == "imprecise"
    # a noisy clean backward: block medians 0.3-2.8 ms, median 0.9 ms, its interval (about
    # 0.46-1.75) holding the 1.3 ms instrumented (1.44x: "too noisy to compare"); over 200
    # nodes the excess is (1.3 - 0.9) / 200 ms = 2 us a node, within STAMP_BOUND_US: stamps,
    # no alarm; over 20 nodes 20 us a node: still too noisy, said so
    from helpers import blocked

    clean = blocked([0.3, 0.4, 0.6, 0.8, 1.0, 1.6, 2.2, 2.8], per_block=5)
    assert judge_agreement(clean, passes13 := Measurement(np.full(12, 1.3)), np.nan).verdict == (
        "imprecise"
    )
    noisy = judge_backward(clean, passes13, 200)
    assert noisy.verdict == "stamps" and noisy.stamp_us == pytest.approx(2.0)
    # that clean backward's interval (+-72 %) is too wide to stand on its own: the stamps
    # explain the gap, and neither the note nor the quote names it as the figure to quote
    assert clean.relative_ci > 0.5 and noisy.quote == "none"
    assert "quote the clean backward" not in noisy.note()
    assert "itself too noisy or loaded to quote" in noisy.note()
    # a tight clean backward, 1.0 ms, 0.3 ms below: 1.5 us a node of 200, the stamps': quoted,
    # in the note and in the quote (it read "none" where the verdict replaced a too-noisy one)
    tight = judge_backward(Measurement(np.full(12, 1.0)), passes13, 200)
    assert tight.verdict == "stamps" and tight.quote == "clean" and tight.quote_ms == 1.0
    assert "quote the clean backward" in tight.note()
    # one clean run: no interval to quote it by, so no stamps verdict quoting it either
    lone = judge_backward(Measurement([0.9], blocks=[0]), passes13, 200)
    assert lone.verdict == "imprecise" and lone.quote == "none" and "too few runs" in lone.note()
    assert judge_backward(clean, passes13, 20).verdict == "imprecise"
    # where the stamps' measured cost was taken off the passes already, what is left is not
    # theirs: the same difference is said as it is, too noisy to compare
    assert judge_backward(clean, passes13, 200, corrected=True).verdict == "imprecise"


def test_a_corrected_backward_that_disagrees_blames_the_load_not_the_stamps():
    from modelprof.timing.agreement import judge_backward

    a = judge_backward(Measurement(np.full(12, 1.0)), Measurement(np.full(12, 1.3)), 200, True)
    assert a.verdict == "disagree" and a.alarming
    note = a.note()
    assert note.startswith(
        "the per-layer backward passes and the clean backward runs DISAGREE: the instrumented "
        "backward less its stamps' measured cost read 1.300 ms"
    )
    assert "so the machine's load changed between the two" in note and "stamp on each" not in note
    # not taken off (a GPU): the stamps are named as a cause
    assert (
        "stamp on each autograd node"
        in judge_backward(Measurement(np.full(12, 1.0)), Measurement(np.full(12, 1.3)), 20).note()
    )


def test_backward_rows_whose_medians_add_up_to_more_than_the_backward_are_said():
    from modelprof.timing.agreement import judge_backward

    clean, passes = Measurement(np.full(12, 1.0)), Measurement(np.full(12, 1.02))
    # the rows' medians sum to 1.2 ms, 1.18x the corrected instrumented backward's 1.02 ms
    # (the parts of every pass, read while the load moved)
    a = judge_backward(clean, passes, 100, True, rows_ms=1.2)
    assert a.verdict == "leaves" and a.alarming and a.leaf_sum_ms == 1.2
    assert a.note().startswith(
        "the per-layer backward rows DO NOT ADD UP: the rows' medians sum to 1.200 ms, 1.18x "
        "the instrumented backward's, less its stamps, 1.020 ms they are parts of"
    )
    # short of it (a sum of medians of many small right-skewed parts reads short on a quiet
    # machine too), or within the 10 % tolerance: agreement, as the forward's check
    assert judge_backward(clean, passes, 100, True, rows_ms=0.79).agree
    assert judge_backward(clean, passes, 100, True, rows_ms=1.1).agree
    # a disagreement stays one: the rows' sum does not override it
    far = judge_backward(clean, Measurement(np.full(12, 1.5)), 100, True, rows_ms=3.0)
    assert far.verdict == "disagree"


def test_a_corrected_backward_as_slow_as_the_plain_one_beside_it_is_the_windows_pace():
    from modelprof.timing.agreement import judge_backward

    clean, passes = Measurement(np.full(12, 1.0)), Measurement(np.full(12, 1.2))
    # corrected passes 1.2 ms, the plain backward beside them 1.18 ms (within 10 %), the clean
    # backward 1.0 ms: the instrumented window's pace, said in a note, no alarm
    a = judge_backward(clean, passes, 10, True, plain=Measurement(np.full(12, 1.18)))
    assert a.verdict == "window" and not a.agree and not a.alarming
    assert "as did the plain backward run beside them (1.180 ms)" in a.note()
    # a plain backward at the clean one's pace: the rows themselves are slow, an alarm
    slow = judge_backward(clean, passes, 10, True, plain=Measurement(np.full(12, 1.0)))
    assert slow.verdict == "disagree" and slow.alarming


def test_a_loaded_backwards_window_and_stamps_notes_name_the_cpu_work_to_quote():
    # the clean backward on a loaded CPU: 1.0 ms of wall a run, 0.3 ms of CPU work (wall/CPU
    # 3.3, above LOADED_WALL_OVER_CPU), all of it the calling thread's (thread_time, share 1):
    # the loaded-machine warning says to quote the CPU work, so the check's "quote the clean
    # backward" says it too, in the "window" verdict (corrected passes 1.3 ms, 1.3x, and the
    # plain backward beside them 1.25 ms: 1.04x, within the tolerance) and the "stamps" one
    # (not corrected: (1.3 - 1.0) / 200 nodes = 1.5 us a node)
    from modelprof.timing.agreement import judge_backward

    def loaded():
        return Measurement(
            np.full(12, 1.0), cpu_ms=np.full(12, 0.3), cpu_clock="thread_time", cpu_thread_share=1.0
        )

    assert loaded().loaded and loaded().cpu_holds
    passes, plain = Measurement(np.full(12, 1.3)), Measurement(np.full(12, 1.25))
    tail = "; the CPU work of the clean runs, 0.300 ms (thread_time), is what waiting for a core"
    window = judge_backward(loaded(), passes, 200, True, plain=plain)
    stamps = judge_backward(loaded(), passes, 200)
    assert (window.verdict, stamps.verdict) == ("window", "stamps")
    for a in (window, stamps):
        assert "quote the clean backward" in a.note() and tail in a.note()
    # a quiet clean backward (its CPU work the wall's): no CPU work named
    quiet = Measurement(np.full(12, 1.0), cpu_ms=np.full(12, 1.0), cpu_clock="thread_time")
    assert "CPU work" not in judge_backward(quiet, passes, 200, True, plain=plain).note()


def test_an_end_to_end_figure_the_run_will_not_quote_is_marked_rough(monkeypatch):
    # a newcomer's tables printed the clean median plain where the run's own warning said to
    # quote the CPU work (a loaded machine) or that neither figure was one to quote: the
    # end-to-end row's latency is marked ~ then, as the rows' are; on a quiet run it is not
    from modelprof.render.views import END_TO_END_LABEL, ROUGH_MARK

    def footer(r) -> str:
        return next(ln for ln in r.to_markdown().splitlines() if END_TO_END_LABEL in ln)

    loaded = profile(_virtual(monkeypatch, 2.0), (4,), repeat=12, warmup=1, roofline=False)
    assert loaded.latency.loaded  # wall 2x the CPU time: other work took the cores
    # the clean runs: two 1 ms layers read at twice their CPU time, 4.00 ms
    assert f" {ROUGH_MARK}4.00 ms |" in footer(loaded)
    # the caption says why, also after a caption of the user's own (review: it did not)
    why = "The end-to-end latency marked \\textasciitilde{} is no figure to quote: the"
    for given in ({}, {"caption": "Mine."}):
        caption = next(ln for ln in loaded.to_latex(**given).splitlines() if "caption{" in ln)
        assert why in caption
    quiet = profile(_virtual(monkeypatch, 1.0), (4,), repeat=12, warmup=1, roofline=False)
    assert not quiet.latency.loaded and ROUGH_MARK not in footer(quiet)


def test_a_disagreement_reads_the_root_rows_figure_once_and_small_ratios_in_digits():
    # the passes' median 2.000 ms, the (root) row's 1.900 ms (its call's span), the clean
    # median 1,000 ms: apart beyond both intervals, the clean runs slowed, quote the (root)
    # row. Its figure is read once (a trial read "the (root) pass read 0.302 ms" and "quote the
    # (root) row's 0.300 ms"), and the ratio 1.9 / 1000 = 0.0019 in 3 significant digits
    # (it printed "0.00x")
    clean = Measurement(np.full(24, 1000.0), blocks=np.repeat(np.arange(8), 3))
    passes = Measurement(np.full(24, 2.0), blocks=np.repeat(np.arange(8), 3))
    a = judge_agreement(clean, passes, leaf_sum_ms=1.5, root_ms=1.9)
    note = a.note()
    assert a.quote == "per-layer" and a.quote_ms == 1.9 and "DISAGREE" in note
    assert note.count("1.900 ms") == 1 and "2.000 ms" not in note
    assert "0.00190x" in note and "0.00x" not in note
