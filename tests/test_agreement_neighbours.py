"""Two checks of issue 37 point 2: a point of a series over a growing amount of work against its
neighbours (the throughput curve, a generation's batch sizes and decode contexts), and a
comparison's ratio of medians against its per-round ratios (``compare``,
``compare_generation``).

No real time: a FAKE clock (``fake_clock``) that only the models' virtual spins advance, so
every sample reads exactly what the model spends and the checks see exactly the figures the
comments derive, on a loaded machine as on an idle one."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from fake_clock import install
from torch import nn

import modelprof
from modelprof.errors import TimingDisagreementWarning
from modelprof.render import to_markdown
from modelprof.render.comparison import (
    compact_compare_columns,
    compare_caption,
    export_comparison,
)
from modelprof.render.views import ROUGH_MARK
from modelprof.timing.agreement import (
    AGREEMENT_TOLERANCE,
    SeriesPoint,
    judge_ratio,
    neighbour_disagreements,
)
from modelprof.timing.measurement import Measurement
from modelprof.timing.peaks import Peaks

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def _disagreements(record) -> list[str]:
    return [str(w.message) for w in record if w.category is TimingDisagreementWarning]


# -- a point against its neighbours ----------------------------------------------------------


class PerBatch(nn.Module):
    """Spends ``ms(batch)`` of virtual time per call."""

    def __init__(self, clock, ms) -> None:
        super().__init__()
        self.clock, self.ms = clock, ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.ms(x.shape[0]))
        return x


def _curve(monkeypatch, ms):
    clock = install(monkeypatch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        curve = modelprof.measure_throughput(
            PerBatch(clock, ms), (4,), max_batch=4, gain=0.0, repeat=12, warmup=2, budget_s=60.0
        )
    return curve, _disagreements(record)


def test_a_batch_slower_than_a_bigger_batch_is_marked_rough(monkeypatch):
    # batch 1 made slow on purpose: 50 ms a call against 1 ms per sample of a batch after it
    curve, said = _curve(monkeypatch, lambda b: 50.0 if b == 1 else 1.0 * b)
    assert [p.batch_size for p in curve.points] == [1, 2, 4]
    # every sample of a point reads the same, so each interval is its median: batch 1's
    # 50 ms lies above batch 2's 2 ms (the bigger batch with the lowest upper bound) by 25x,
    # beyond 1 + AGREEMENT_TOLERANCE; batch 2's 2 ms is below batch 4's 4 ms
    assert [(d.point, d.other) for d in curve.disagreements] == [("batch 1", "batch 2")]
    d = curve.disagreements[0]
    assert (d.point_ms, d.other_ms) == (50.0, 2.0)
    assert (
        len(said) == 1 and "batch 1 read 50.000 ms" in said[0] and "batch 2's 2.000 ms" in said[0]
    )
    df = curve.to_dataframe()
    assert df["latency_rough"].tolist() == [True, False, False]
    text = to_markdown(df)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    # batch 1's latency and its samples/s (1 / 50 ms = 20, a count's two significant digits),
    # both of its runs, marked
    assert f"{ROUGH_MARK}50" in rows["1"] and f"{ROUGH_MARK}20 |" in rows["1"]
    assert ROUGH_MARK not in rows["2"] + rows["4"]
    assert curve.to_dict()["notes"] == [d.note()] and "!! " in repr(curve)


def test_a_curve_that_grows_with_the_batch_is_not_marked(monkeypatch):
    # 1 ms per sample of the batch: 1, 2, 4 ms; and a fixed cost whatever the batch (the same
    # time for more work is no disagreement: it is not less)
    for ms in (lambda b: 1.0 * b, lambda b: 3.0):
        curve, said = _curve(monkeypatch, ms)
        assert [p.batch_size for p in curve.points] == [1, 2, 4]
        assert curve.disagreements == [] and said == []
        assert not curve.to_dataframe()["latency_rough"].any()
        assert curve.to_dict()["notes"] == []


def test_the_neighbour_rule_is_the_tolerance_beyond_both_intervals():
    # batch 1 at 11.2 ms against batch 2 at 10 ms, both exact (12 equal samples: the interval
    # is the median): 11.2 > 10 x (1 + 0.10) disagrees; 10.9 does not
    def point(label, work, ms):
        return SeriesPoint(label, work, Measurement(np.full(12, ms)))

    assert AGREEMENT_TOLERANCE == 0.10
    slow = neighbour_disagreements("s", [point("a", 1, 11.2), point("b", 2, 10.0)])
    assert [(d.point, d.other) for d in slow] == [("a", "b")]
    assert neighbour_disagreements("s", [point("a", 1, 10.9), point("b", 2, 10.0)]) == []
    # the same time for the same work is not compared (only strictly more work is)
    assert neighbour_disagreements("s", [point("a", 2, 50.0), point("b", 2, 10.0)]) == []
    # the intervals, not the medians: 10 samples 1, 12, ..., 100 ms have the median 50.5 and
    # the interval of its 2nd and 9th order statistics, 12-89 ms: 12 is not above 11 x 1.10 =
    # 12.1 (no disagreement, 4.6x apart), and is above 10 x 1.10 = 11
    wide = SeriesPoint("a", 1, Measurement(np.linspace(1.0, 100.0, 10)))
    assert wide.measurement.median_ci_ms == (12.0, 89.0)
    assert neighbour_disagreements("s", [wide, point("b", 2, 11.0)]) == []
    assert len(neighbour_disagreements("s", [wide, point("b", 2, 10.0)])) == 1


def _generation(monkeypatch, ms, **kw):
    """``profile_generation`` of a step function that spends ``ms(batch, context, tokens)`` of
    virtual time per call and counts ``batch x (context + tokens)`` FLOPs (a sum over that
    many ones), so a longer context or a bigger batch is more counted work."""
    clock = install(monkeypatch)
    import modelprof.generation.timing as generation_timing

    monkeypatch.setattr(generation_timing, "time", clock.module())
    logits = torch.zeros(4, 8, 8)

    def step(tokens, cache):
        b, n = tokens.shape
        context = 0 if cache is None else cache
        torch.ones(b, context + n).sum()
        clock.advance(ms(b, context, n))
        return logits[:b, :n], context + n

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        report = modelprof.profile_generation(
            nn.Identity(), step=step, prompt_len=4, new_tokens=4, repeat=12, warmup=2, **kw
        )
    return report, _disagreements(record)


def test_a_batch_size_whose_ttft_lies_above_a_bigger_batch_is_marked(monkeypatch):
    # the case: the prefill at batch 1 made slow on purpose (50 ms), every other call
    # 1 ms per sequence of the batch
    def ms(b, context, n):
        return 50.0 if (b, n) == (1, 4) else 1.0 * b

    report, said = _generation(monkeypatch, ms, batch_size=[1, 4], layer_timing=False)
    # TTFT: batch 1 reads 50 ms against batch 4's 4 ms; end to end (the prefill and 3 steps)
    # 50 + 3 x 1 = 53 ms against 4 + 3 x 4 = 16 ms; TPOT 1 ms against 4 ms holds
    found = {(d.series, d.point, d.other, d.point_ms, d.other_ms) for d in report.disagreements}
    assert found == {
        ("TTFT across batch sizes", "batch 1", "batch 4", 50.0, 4.0),
        ("the end-to-end generation across batch sizes", "batch 1", "batch 4", 53.0, 16.0),
    }
    assert len(said) == 2 and any("batch 1 read 50.000 ms" in s for s in said)
    summary = report.summary().set_index("batch_size")
    assert summary["ttft_rough"].tolist() == [True, False]
    assert summary["end_to_end_rough"].tolist() == [True, False]
    assert not summary["tpot_rough"].any()
    assert report.timing_notes == [d.note() for d in report.disagreements]
    assert repr(report).count("!! ") == 2
    # warn=False: the same marks and notes, no warning
    quiet, said = _generation(monkeypatch, ms, batch_size=[1, 4], layer_timing=False, warn=False)
    assert quiet.timing_notes == report.timing_notes and said == [] and quiet.warn is False
    import dataclasses
    import warnings

    with warnings.catch_warnings(record=True) as again:  # a copy keeps its warn=False
        warnings.simplefilter("always")
        dataclasses.replace(quiet, env=dict(quiet.env))
    assert not [w for w in again if issubclass(w.category, TimingDisagreementWarning)]

    # the same generations without the slow prefill: every figure grows with the batch
    report, said = _generation(
        monkeypatch, lambda b, context, n: 1.0 * b, batch_size=[1, 4], layer_timing=False
    )
    assert report.disagreements == [] and said == []
    summary = report.summary()
    assert not summary[["ttft_rough", "tpot_rough", "end_to_end_rough"]].any().any()


def test_a_decode_step_above_a_longer_context_is_marked_and_a_growing_one_is_not(monkeypatch):
    # the decode step at context 5 made slow on purpose (50 ms) against 1 ms at 6 and 7, which
    # count more FLOPs (a sum over 7 and 8 ones against 6)
    def slow_at_5(b, context, n):
        return 50.0 if (n, context) == (1, 5) else 1.0

    report, said = _generation(monkeypatch, slow_at_5, batch_size=1, contexts=[5, 6, 7])
    table = report.phase_table()
    assert table["flops"].tolist() == [4, 6, 7, 8]  # prefill 4 tokens; decode 1 + context
    assert table["latency_ms"].tolist() == [1.0, 50.0, 1.0, 1.0]
    assert table["latency_rough"].tolist() == [False, True, False, False]
    [d] = report.disagreements
    assert (d.point, d.other) == ("decode@5 at batch 1", "decode@6 at batch 1")
    assert len(said) == 1 and "decode@5 at batch 1 read 50.000 ms" in said[0]
    assert f"{ROUGH_MARK}50" in to_markdown(table)
    rows = report.to_dataframe()  # the per-layer rows of that step's passes: rough as well
    timed = rows["latency_ms"].notna()
    assert (rows["latency_rough"] == (timed & (rows["context"] == 5))).all()
    assert (timed & (rows["context"] == 5)).any()
    # its utilization as well: the step's time and each ratio over it (prefill, decode@5, 6, 7)
    u = report.utilization(peak=Peaks(peak_flops=1e12, peak_bytes=1e11)).phases
    for flag in ("time_rough", "mfu_rough", "mbu_rough"):
        assert u[flag].tolist() == [False, True, False, False], flag
    # every export says why: the whole-report Markdown lists the note, a paper table's caption
    # says what the ~ marks, an HTML page shows the note above the table
    assert f"## Timing notes\n\n- {d.note()}" in report.to_markdown()
    latex = report.export("latex")
    said = "latency marked \\textasciitilde{} is no figure to quote (slower than a phase doing "
    assert said + "more work: decode@5 at batch 1)" in latex
    assert "decode@5 at batch 1 read 50.000 ms" in report.export("html")

    # a step whose time grows with the context (0.1 ms a token of context) is not marked
    def growing(b, context, n):
        return 1.0 + 0.1 * context

    report, said = _generation(monkeypatch, growing, batch_size=1, contexts=[5, 6, 7])
    assert report.disagreements == [] and said == []
    assert not report.phase_table()["latency_rough"].any()
    assert ROUGH_MARK not in to_markdown(report.phase_table())
    assert "Timing notes" not in report.to_markdown()
    assert "no figure to quote" not in report.export("latex")


# -- a ratio against its rounds ----------------------------------------------------------------

ROUND_MS = 200.0  # over BLOCK_S (0.1 s): every round takes one sample of each model


class Rounds(nn.Module):
    """``ROUND_MS`` of virtual time a call, twice that on the calls ``slow(i)`` picks (``i``
    counts every call: the counting pass, the warm-up, the samples)."""

    def __init__(self, clock, slow=lambda i: False) -> None:
        super().__init__()
        self.clock, self.slow, self.calls = clock, slow, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(ROUND_MS * (2.0 if self.slow(self.calls) else 1.0))
        self.calls += 1
        return x


def _compare(monkeypatch, slow, **kw):
    clock = install(monkeypatch)
    models = {"base": Rounds(clock), "cand": Rounds(clock, slow)}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        table = modelprof.compare(
            models, (4,), repeat=60, warmup=2, min_blocks=60, budget_s=600.0, roofline=False, **kw
        )
    return table, _disagreements(record)


def test_a_ratio_of_medians_outside_its_rounds_is_flagged_and_not_ranked(monkeypatch):
    # the candidate is twice as slow on 2 calls in every 5 (load in a share of the rounds): of
    # its 60 samples, one a round, 24 read 400 ms and 36 read 200 ms, the baseline's all
    # 200 ms. The ratio of the medians is 200 / 200 = 1.000. The per-round ratios, 36 x 1 and
    # 24 x 2, trimmed by 12 at each end leave 24 x 1 and 12 x 2: centre 2^(12/36) = 1.260,
    # Yuen's interval 1.084-1.464 (winsorized log variance 0.117, 36 kept, t at 35 degrees of
    # freedom): 1.000 lies outside it, 21 % from its centre (beyond AGREEMENT_TOLERANCE)
    table, said = _compare(monkeypatch, lambda i: i % 5 in (3, 4))
    assert table.loc["cand", "latency_n"] == 60
    assert table.loc["cand", "latency_x"] == 1.0
    assert table["latency_x_rough"].tolist() == [False, True]
    assert table["cpu_work_x_rough"].tolist() == [False, True]  # the same time, read as CPU
    assert table["rank"].isna().all() and "not ranked" in table.attrs["ratios_disagree"]
    # the table's interval is the per-round ratios' own, the warning's 1.084-1.464 below: the
    # ratio 1.000 shows outside it (not one shifted to centre on 1.000, 0.860-1.162)
    lo, hi = table.loc["cand", ["latency_x_ci_low", "latency_x_ci_high"]]
    assert (round(lo, 3), round(hi, 3)) == (1.084, 1.464)
    assert table.attrs["rough_ratios"] == ["latency_x of cand", "cpu_work_x of cand"]
    assert any("latency_x of cand DISAGREES" in n for n in table.attrs["notes"])
    # the paper table says so: the flag column among the compact ones (before the rank), and
    # the caption names the rough ratios and why nothing is ranked
    assert compact_compare_columns(table)[-3:] == ["latency_x_rough", "cpu_work_x_rough", "rank"]
    latex = export_comparison(table, "latex")
    assert "latency\\_x of cand, cpu\\_work\\_x of cand" in latex and "not ranked" in latex
    # and the rough ratio's own cells are marked (~ in Markdown), its interval's too (which
    # the disputed ratio lies outside), the baseline's are not
    md = export_comparison(
        table, "markdown", columns=["latency_x", "latency_x_ci_low"], standalone=False, caption=None
    )
    # (each row named by its model first: columns= leaves the name column in front)
    cells = [[c.strip() for c in line.split("|")[2:4]] for line in md.splitlines()[2:]]
    assert [c[0] for c in cells] == ["1.00×", "~1.00×"] and cells[1][1].startswith("~")
    assert not cells[0][1].startswith("~")
    # the bounds alone, without the ratio's column, are marked all the same
    alone = export_comparison(
        table, "markdown", columns=["latency_x_ci_low"], standalone=False, caption=None
    )
    assert alone.splitlines()[-1].split("|")[2].strip().startswith("~")
    assert len(said) == 2 and "1.000" in said[0] and "(1.260, 95 % interval 1.084-1.464" in said[0]
    # warn=False: the same flags and notes, no warning
    quiet, said = _compare(monkeypatch, lambda i: i % 5 in (3, 4), warn=False)
    assert quiet.attrs["rough_ratios"] == table.attrs["rough_ratios"] and said == []
    check = judge_ratio(
        "latency_x", "cand", "base", *(Measurement(v, blocks=np.arange(60)) for v in (
            np.where(np.arange(60) % 5 < 2, 400.0, 200.0), np.full(60, 200.0)))
    )  # fmt: skip
    assert not check.agree and check.paired == pytest.approx(2 ** (1 / 3))


def test_a_ratio_its_rounds_agree_with_is_ranked(monkeypatch):
    # slow on 1 call in 10: 6 rounds of 60 at 2x. The ratio of the medians is 1.000; the
    # trimmed per-round ratios drop those 6 (12 trimmed at the top): centre 1.000, interval
    # 1.000-1.000, which holds it
    table, said = _compare(monkeypatch, lambda i: i % 10 == 9)
    assert table.loc["cand", "latency_x"] == 1.0
    assert not table["latency_x_rough"].any() and not table["cpu_work_x_rough"].any()
    assert table["rank"].notna().all() and "ratios_disagree" not in table.attrs
    assert "rough_ratios" not in table.attrs and said == []
    assert "latency_x_rough" not in compact_compare_columns(table)
    assert "per-round" not in export_comparison(table, "latex")


class Waits(nn.Module):
    """``ROUND_MS`` of virtual work a call; on the calls ``slow(i)`` picks, as long again
    waiting for a core: the wall clock advances, the CPU time does not."""

    def __init__(self, clock, slow) -> None:
        super().__init__()
        self.clock, self.slow, self.calls = clock, slow, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(ROUND_MS)
        if self.slow(self.calls):
            self.clock.wall_ns += int(ROUND_MS * 1e6)
        self.calls += 1
        return x


def test_a_wall_ratio_that_moved_between_rounds_ranks_by_the_cpu_work_that_did_not(
    monkeypatch, one_thread
):
    # the candidate waits for a core on 2 calls in 5, its work the baseline's: its wall clock
    # reads as in the test above (ratio of medians 1.000 against rounds centred on 1.260,
    # 1.084-1.464: rough), its CPU time 200 ms every time (cpu_work_x 1.000, every round 1:
    # agrees). Median wall over median CPU is 200 / 200 = 1.0, so the machine is not judged
    # loaded; before, the table ranked by latency_x and withheld every rank. The CPU work, which
    # the waits did not move, ranks it, and the notes say why
    clock = install(monkeypatch)
    models = {"base": Rounds(clock), "cand": Waits(clock, lambda i: i % 5 in (3, 4))}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        table = modelprof.compare(
            models, (4,), repeat=60, warmup=2, min_blocks=60, budget_s=600.0, roofline=False
        )
    assert table["latency_x_rough"].tolist() == [False, True]
    assert table["cpu_work_x_rough"].tolist() == [False, False]
    assert table.loc["cand", "wall_over_cpu"] == pytest.approx(1.0)
    assert table.attrs["ranked_by"] == "cpu_work" and "ratios_disagree" not in table.attrs
    assert table["rank"].notna().all()
    assert any("the machine's pace moved between rounds" in n for n in table.attrs["notes"])
    latex = export_comparison(table, "latex")
    assert "not ranked" not in latex and "moved between rounds" in latex


def _compare_generation(monkeypatch, slow, **kw):
    """Two step functions generating 2 tokens after a 4-token prompt: a prefill of
    ``ROUND_MS`` and a decode step of 10 ms; the candidate's prefill twice as long on the
    prefills ``slow(i)`` picks (``i`` counts its prefills, warm-up included)."""
    clock = install(monkeypatch)
    import modelprof.generation.timing as generation_timing

    monkeypatch.setattr(generation_timing, "time", clock.module())
    logits = torch.zeros(1, 8, 8)

    def stepper(slow_prefill):
        prefills = [0]

        def step(tokens, cache):
            n = tokens.shape[1]
            if n > 1:  # the prefill
                clock.advance(ROUND_MS * (2.0 if slow_prefill(prefills[0]) else 1.0))
                prefills[0] += 1
            else:
                clock.advance(10.0)
            return logits[:, :n], (0 if cache is None else cache) + n

        return step

    models = {
        "base": (nn.Identity(), stepper(lambda i: False)),
        "cand": (nn.Identity(), stepper(slow)),
    }
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        table = modelprof.compare_generation(
            models,
            prompt_len=4,
            new_tokens=2,
            repeat=60,
            warmup=2,
            min_blocks=60,
            budget_s=600.0,
            **kw,
        )
    return table, _disagreements(record)


def test_compare_generation_flags_a_ratio_its_rounds_disagree_with(monkeypatch):
    # the candidate's prefill takes 400 ms in 24 of its 60 generations (one a round), 200 ms in
    # 36: TTFT medians 200 / 200 = 1.000 against per-round ratios centred on 2^(1/3) = 1.260
    # (as in compare() above); end to end 210 / 210 = 1.000 against per-round ratios 1 and
    # 410 / 210 = 1.952, centred on 1.952^(1/3) = 1.250, the ratio the rank follows: no rank.
    # TPOT, 10 ms each every round, agrees
    table, said = _compare_generation(monkeypatch, lambda i: i % 5 in (3, 4))
    assert table.loc["cand", "ttft_x"] == 1.0
    assert table["ttft_x_rough"].tolist() == [False, True]
    assert table["tpot_x_rough"].tolist() == [False, False]
    assert table["ttft_cpu_x_rough"].tolist() == [False, True]
    assert table["rank"].isna().all() and "not ranked" in table.attrs["ratios_disagree"]
    assert table.attrs["rough_ratios"] == [
        "ttft_x of cand",
        "ttft_cpu_x of cand",
        "end_to_end_x of cand",
        "end_to_end_cpu_x of cand",
    ]
    assert any(m.startswith("modelprof: ttft_x of cand DISAGREES") for m in said)
    assert any(m.startswith("modelprof: end_to_end_x of cand DISAGREES") for m in said)
    assert not any("tpot_x of cand" in m for m in said)
    quiet, said = _compare_generation(monkeypatch, lambda i: i % 5 in (3, 4), warn=False)
    assert quiet.attrs["rough_ratios"] == table.attrs["rough_ratios"] and said == []  # no warning

    # slowed on 1 generation in 10: the trimmed rounds drop them, every ratio agrees
    table, said = _compare_generation(monkeypatch, lambda i: i % 10 == 9)
    assert not table[["ttft_x_rough", "tpot_x_rough"]].any().any() and said == []
    assert table["rank"].notna().all() and "ratios_disagree" not in table.attrs


def test_compare_flags_a_backward_ratio_its_rounds_disagree_with(monkeypatch):
    # compare(backward=True)'s backward ratio, from the interleaved steps' Measurements (made
    # here: the step timer is tested on its own): the candidate's backward reads 400 ms in 24
    # rounds of 60 and 200 ms in 36, the baseline's 200 ms: 1.000 against rounds centred on
    # 1.260, as latency_x above; a second candidate at 300 ms every round agrees (1.500)
    # the module (the attribute modelprof.compare is the function)
    compare_module = importlib.import_module("modelprof.compare")
    rounds = np.arange(60)

    def step(values):
        m = Measurement(values, blocks=rounds)
        return {"backward": m, "step": m}

    got = [
        step(np.full(60, 200.0)),
        step(np.where(rounds % 5 < 2, 400.0, 200.0)),
        step(np.full(60, 300.0)),
    ]
    ratios = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (1.5, 1.5, 1.5)]  # as compare_steps states them
    monkeypatch.setattr(compare_module, "compare_steps", lambda timers, opts: (got, ratios))
    rows = {name: {} for name in ("base", "cand", "even")}
    attrs = {"notes": []}
    checks = compare_module._step_columns(rows, dict.fromkeys(rows), "base", None, attrs)
    assert [rows[n]["backward_latency_x_rough"] for n in rows] == [False, True, False]
    # no CPU time read: the wall ratios alone, the backward's and the step's (the same
    # Measurement here, so the same verdicts; compare's own ratio of the step: 1.0, 1.5)
    [cand, cand_step], [even, _] = checks["cand"], checks["even"]
    assert not cand.agree and cand.paired == pytest.approx(2 ** (1 / 3))
    assert even.agree and even.ratio == 1.5
    assert cand_step.figure == "step_latency_x" and not cand_step.agree
    assert [rows[n]["step_latency_x"] for n in rows] == [1.0, 1.0, 1.5]
    assert [rows[n]["step_latency_x_rough"] for n in rows] == [False, True, False]
    assert "backward_cpu_work_x" not in rows["cand"]  # not loaded: no note of it
    # the whole step's ratio of cand disagrees with its rounds: no step ranked, said
    assert attrs == {
        "notes": [
            "step_rank: not ranked, step_latency_x of cand disagrees with its per-round ratios"
        ]
    }
    assert not any("step_rank" in row for row in rows.values())


@pytest.mark.parametrize("clock", ["thread_time", "process_time"])
def test_a_loaded_training_comparison_states_the_backward_cpu_work(monkeypatch, clock):
    # the newcomer's case: load hit the candidate's backward harder than the baseline's. Wall:
    # the baseline 200 ms every round; the candidate 600 ms in 24 rounds of 60, 200 ms in 36:
    # backward_latency_x 200 / 200 = 1.0 against rounds centred elsewhere (rough). CPU work:
    # 100 and 50 ms every round, so backward_cpu_work_x = 50 / 100 = 0.5 with its interval
    # [0.5, 0.5], agreeing with its rounds; wall/CPU 2 and up > 1.15: loaded
    compare_module = importlib.import_module("modelprof.compare")
    rounds = np.arange(60)

    def step(wall, cpu):
        m = Measurement(wall, blocks=rounds, cpu_ms=np.full(60, cpu), cpu_clock=clock)
        return {"backward": m, "step": m}

    got = [step(np.full(60, 200.0), 100.0), step(np.where(rounds % 5 < 2, 600.0, 200.0), 50.0)]
    ratios = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0)]
    monkeypatch.setattr(compare_module, "compare_steps", lambda timers, opts: (got, ratios))
    rows, attrs = {"base": {}, "cand": {}}, {"notes": []}
    checks = compare_module._step_columns(rows, dict.fromkeys(rows), "base", None, attrs)
    cand = rows["cand"]
    assert cand["backward_cpu_work_median_ms"] == 50.0
    assert (cand["backward_cpu_work_x"], cand["backward_cpu_work_x_ci_low"]) == pytest.approx(
        (0.5, 0.5)
    )
    assert rows["base"]["backward_cpu_work_x"] == 1.0
    assert cand["backward_latency_x_rough"] and not cand.get("backward_cpu_work_x_rough")
    # the CPU work judged against its rounds where it is one thread's (thread_time) alone
    judged = ["backward_latency_x", "step_latency_x"]
    judged += ["backward_cpu_work_x"] if clock == "thread_time" else []
    assert [c.figure for c in checks["cand"]] == judged
    note, step_note = attrs["notes"]
    assert note.startswith("the training steps ran on a loaded machine (wall/CPU 4.00")
    assert step_note.startswith("step_rank: not ranked, step_latency_x of cand disagrees")
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.attrs.update(attrs)
    shown = compact_compare_columns(frame)
    if clock == "thread_time":  # one thread's CPU work holds under load: read it, shown
        assert attrs["backward_by"] == "cpu_work" and "backward_cpu_work_x, the ratio" in note
        assert "backward_cpu_work_x" in shown
        caption = compare_caption({**attrs, "ranked_by": "latency"})  # and the caption says why
        assert "training steps on a loaded machine: the backward's CPU work beside" in caption
    else:  # several threads' spin while one waits: not a figure to read, not shown
        # no thread count nor other work read: Measurement.threads_hint's generic advice
        assert "backward_by" not in attrs
        assert note.endswith("or with torch.set_num_threads(k) for k cores left idle")
        assert "backward_cpu_work_x" not in shown and "backward_latency_x" in shown


def test_a_training_comparison_says_its_steps_budget_was_extended(monkeypatch):
    # the interleaved steps went 2.5 s past the budget (cap 30 s) to give each model
    # min_samples=10 steps: said, as the forward's extension is
    compare_module = importlib.import_module("modelprof.compare")
    rounds = np.arange(10)

    def step(ms, extended_s):
        m = Measurement(
            np.full(10, ms), blocks=rounds, extended_s=extended_s, floor_cap_s=30.0, min_samples=10
        )
        return {"backward": m, "step": m}

    got = [step(2.0, 2.5), step(3.0, 2.5)]
    monkeypatch.setattr(
        compare_module, "compare_steps", lambda timers, opts: (got, [(1.0,) * 3, (1.5,) * 3])
    )
    rows, attrs = {"base": {}, "cand": {}}, {"notes": []}
    compare_module._step_columns(rows, dict.fromkeys(rows), "base", None, attrs)
    assert attrs["notes"] == [
        "the training steps: the time budget was extended by 2.5 s (at most 30 s) so that "
        "every candidate has min_samples=10 runs"
    ]


def test_the_backward_cpu_work_shows_where_said_and_keeps_its_place_in_latex():
    from modelprof.render.comparison import _latex_priority

    frame = pd.DataFrame(
        {
            "backward_latency_x": [1.0, 0.5],
            "backward_cpu_work_x": [1.0, 0.4],
            "step_latency_median_ms": [3.0, 2.0],
        },
        index=pd.Index(["a", "b"], name="model"),
    )
    # not said to be read (no backward_by): hidden, as the forward's CPU work is
    shown = ["model", "backward_latency_x", "step_latency_median_ms"]
    assert compact_compare_columns(frame) == shown
    frame.attrs["backward_by"] = "cpu_work"
    assert compact_compare_columns(frame) == [*shown[:2], "backward_cpu_work_x", shown[2]]
    # ranked by CPU work too: after params and MACs the page keeps the whole step's median,
    # the backward's, the forward's, then the FLOPs, and the CPU work's medians (the
    # backward's first) before the ranks and ratios, each once
    attrs = {"ranked_by": "cpu_work", "backward_by": "cpu_work"}
    order = _latex_priority(attrs)
    assert order[:10] == (
        "model",
        "params",
        "macs",
        "step_latency_median_ms",
        "backward_latency_median_ms",
        "latency_median_ms",
        "ttft_ms",
        "tpot_ms",
        "end_to_end_ms",
        "flops",
    )
    assert order[11:13] == ("backward_cpu_work_median_ms", "cpu_work_median_ms")
    assert order.index("backward_cpu_work_x") < order.index("backward_latency_x")
    assert len(order) == len(set(order))
    # not said to be read: the CPU work's after every other column
    assert _latex_priority({})[-4:] == (
        "cpu_work_median_ms",
        "cpu_work_x",
        "backward_cpu_work_median_ms",
        "backward_cpu_work_x",
    )


def test_the_command_line_says_which_batch_size_is_rough(monkeypatch, tmp_path, capsys):
    # `modelprof throughput` on the slow-batch-1 model: the line under the curve and the
    # exported table's caption say what the ~ of batch 1 means
    from modelprof import cli

    clock = install(monkeypatch)
    model = PerBatch(clock, lambda b: 50.0 if b == 1 else 1.0 * b)
    monkeypatch.setattr(cli._Context, "load", lambda self, spec: (model, "slow", (4,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TimingDisagreementWarning)
        code = cli.main(
            ["throughput", "slow", "--max-batch", "4", "--out", str(tmp_path), "--format", "tex"]
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("!! ") == 1 and "batch 1 read 50.000 ms" in out
    tex = (tmp_path / "slow_throughput.tex").read_text()
    assert "rough: 1 batch size(s) slower than a bigger one" in tex


def test_a_sweep_marks_a_batch_size_slower_than_a_bigger_one(tmp_path):
    # a grid of batch sizes 1, 2, 4 whose measured rows read (a stand-in measure: no model
    # is built) for alexnet 50, 2 and 4 ms, each with a
    # 5 % interval: batch 1's lower bound 47.5 lies above batch 2's upper bound 2.1 x 1.10;
    # batch 2 (1.9-2.1) lies below batch 4 (3.8-4.2). A second model growing with the batch
    # is a series of its own and is not marked
    from modelprof.distributed.sweep import run_sweep
    from modelprof.distributed.sweep_config import load_sweep
    from modelprof.distributed.sweep_store import ResultStore
    from modelprof.render import read_csv, to_csv, to_json

    ms = {("alexnet", 1): 50.0, ("alexnet", 2): 2.0, ("alexnet", 4): 4.0}

    def measure(config, device):
        median = ms.get((config.model, config.batch_size), 1.0 * config.batch_size)
        return {
            "latency_median_ms": median,
            "latency_ci_low_ms": 0.95 * median,
            "latency_ci_high_ms": 1.05 * median,
            "latency_n": 10,
        }

    grid = {"models": ["alexnet", "resnet18"], "batch_size": [1, 2, 4], "timing": True}
    configs = load_sweep(grid)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        frame = run_sweep(configs, measure, ResultStore(tmp_path, to_csv, to_json))
    said = _disagreements(record)
    marked = frame.set_index(["model", "batch_size"])["latency_rough"]
    assert marked[marked].index.tolist() == [("alexnet", 1)]
    assert len(said) == 1 and "latency of alexnet across batch sizes" in said[0]
    assert "batch 1 read 50.000 ms" in said[0] and frame.attrs["notes"] == [
        s.removeprefix("modelprof: sweep: ") for s in said
    ]
    # the combined table on disk carries the flag
    back = read_csv(tmp_path / "sweep.csv")
    assert back["latency_rough"].tolist() == frame["latency_rough"].tolist()


def test_measure_latencies_flags_a_ratio_its_rounds_disagree_with(monkeypatch):
    # the compare() case above through measure_latencies: the candidate twice as slow on 2
    # calls in every 5, so its ratio of medians 1.000 lies outside its rounds' 1.084-1.464;
    # slow on 1 call in 10, the rounds agree (centre 1.000)
    from modelprof.timing import measure_latencies

    for slow, rough in ((lambda i: i % 5 in (3, 4), True), (lambda i: i % 10 == 9, False)):
        clock = install(monkeypatch)
        models = {"base": Rounds(clock), "cand": Rounds(clock, slow)}
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = measure_latencies(
                models, input_size=(4,), repeat=60, warmup=2, min_blocks=60, budget_s=600.0
            )
        said = _disagreements(record)
        df = result.to_dataframe()
        assert df["latency_x"].tolist() == [1.0, 1.0]
        assert df["latency_x_rough"].tolist() == [False, rough]
        assert df["cpu_work_x_rough"].tolist() == [False, rough]  # the same time, as CPU
        assert len(said) == (2 if rough else 0) and len(result.notes) == len(said)
        assert ("ROUGH" in repr(result)) is rough


def test_a_resumed_sweep_row_without_a_run_count_is_judged_too():
    # rows saved before latency_n was recorded read it back as missing: the check still runs
    # (batch 1's 47.5 ms lower bound above batch 2's 2.1 ms x 1.10), naming n=0 for that row
    from modelprof.distributed.sweep import _mark_neighbours

    frame = pd.DataFrame(
        {
            "model": ["alexnet"] * 3,
            "batch_size": [1, 2, 4],
            "latency_median_ms": [50.0, 2.0, 4.0],
            "latency_ci_low_ms": [47.5, 1.9, 3.8],
            "latency_ci_high_ms": [52.5, 2.1, 4.2],
            "latency_n": [np.nan, 10, 10],
        }
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _mark_neighbours(frame, "latency")
    assert frame["latency_rough"].tolist() == [True, False, False]
    assert len(_disagreements(record)) == 1 and "n=0, above batch 2" in frame.attrs["notes"][0]


def test_a_training_comparisons_step_rank_is_withheld_as_the_forwards_rank_is():
    compare_module = importlib.import_module("modelprof.compare")
    # eight rounds of 3 and 4 ms steps: ranked 1, 2; one of them with a single sample (no
    # interval): no step rank, a note; a step_latency_x flagged rough: none either, named
    blocks = np.arange(8)
    steps = {
        "a": Measurement(np.full(8, 3.0), blocks=blocks),
        "b": Measurement(np.full(8, 4.0), blocks=blocks),
    }
    rows, attrs = {"a": {}, "b": {}}, {"notes": []}
    compare_module._step_ranks(rows, steps, attrs)
    assert [rows[n]["step_rank"] for n in "ab"] == [1, 2] and attrs["notes"] == []
    rows, attrs = {"a": {}, "b": {}}, {"notes": []}
    compare_module._step_ranks(rows, {**steps, "b": Measurement([4.0])}, attrs)
    assert "step_rank" not in rows["b"] and attrs["notes"] == [
        "step_rank: not ranked, too few training steps for an interval"
    ]
    rows, attrs = {"a": {}, "b": {"step_latency_x_rough": True}}, {"notes": []}
    compare_module._step_ranks(rows, steps, attrs)
    assert "step_rank" not in rows["a"] and attrs["notes"] == [
        "step_rank: not ranked, step_latency_x of b disagrees with its per-round ratios"
    ]


def test_a_prefill_phase_slower_than_the_ttft_holding_it_is_marked():
    # a newcomer's batch-4 prefill read 310 ms against a TTFT of 8.39 ms, unmarked: the TTFT
    # holds the prefill (and samples a token more), so its phase can never take longer
    from types import SimpleNamespace

    from modelprof.generation.report import _neighbours

    def reading(ms: float) -> Measurement:
        return Measurement(np.linspace(0.98, 1.02, 10) * ms, blocks=np.repeat(np.arange(5), 2))

    def prefill(ms: float) -> SimpleNamespace:
        report = SimpleNamespace(latency=reading(ms))
        return SimpleNamespace(
            name="prefill", label="prefill", batch_size=4, context=4, report=report,
            totals={"flops": 100},
        )  # fmt: skip

    timing = SimpleNamespace(ttft=reading(8.39), tpot=None, end_to_end=None)
    found = _neighbours({4: [prefill(310.0)]}, {4: timing})
    assert [(d.point, d.other) for d in found] == [("prefill at batch 4", "TTFT at batch 4")]
    # 8.0 ms, a little under the TTFT that holds it: as it should be
    assert _neighbours({4: [prefill(8.0)]}, {4: timing}) == []
