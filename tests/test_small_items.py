"""Small items: error bars that cannot cross zero, a roofline title
clear of its legend, the throughput search's stop reason, the two FLOP conventions explained,
the overhead line in words, summaries printed whole, no CPU peak-memory column of NaNs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from torch import nn

from modelprof import profile
from modelprof.timing.peaks import Peaks
from modelprof.timing.throughput import Throughput, ThroughputPoint

pytest.importorskip("matplotlib")
from test_render_fixture import report_frame  # noqa: E402


def _error_segments(fig) -> list[tuple[float, float]]:
    """(left, right) x of every horizontal error bar in the first axes."""
    from matplotlib.collections import LineCollection

    out = []
    for c in fig.axes[0].collections:
        if isinstance(c, LineCollection):
            out += [(float(s[:, 0].min()), float(s[:, 0].max())) for s in c.get_segments()]
    return out


def test_latency_error_bars_are_percentiles_never_below_zero() -> None:
    from modelprof.report.plots import plot_latency

    df = pd.DataFrame(
        {
            "module": ["a", "b"],
            "leaf": [True, True],
            "latency_ms": [1.0, 2.0],
            "latency_std_ms": [3.0, 0.5],  # 1 - 3 = -2: std would cross 0
            "latency_p10_ms": [0.5, 1.5],
            "latency_p90_ms": [5.0, 2.5],
        }
    )
    segments = sorted(_error_segments(plot_latency(df)))
    # the bars are the p10-p90 spans themselves: 0.5-5.0 and 1.5-2.5
    assert segments == [(0.5, 5.0), (1.5, 2.5)]


def test_report_latency_plot_bars_from_the_passes() -> None:
    r = profile(
        nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (8,), repeat=12, warmup=1, roofline=False
    )
    segments = _error_segments(r.plot_latency())
    assert segments and min(lo for lo, _ in segments) >= 0.0


def test_roofline_title_does_not_overlap_the_legends() -> None:
    from modelprof.report.plots import plot_roofline

    peaks = Peaks(
        peak_flops=1e9,
        peak_bytes=1e9,
        source="user",
        device="a device whose "
        "name is long enough to run across the whole figure, as CPUs' names are",
        dtype="float32",
    )
    fig = plot_roofline(report_frame(), peaks)
    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    title = fig.axes[0].title.get_window_extent(renderer)
    assert title.width > 0
    for legend in fig.legends:
        assert not title.overlaps(legend.get_window_extent(renderer))


def test_throughput_says_why_it_stopped() -> None:
    points = [
        ThroughputPoint(b, 1.0, sps) for b, sps in ((1, 100.0), (2, 150.0), (4, 151.0), (8, 149.0))
    ]
    flat = Throughput(points, "no_improvement", env={"gain": 0.05, "patience": 2, "max_batch": 64})
    # batch 4 and 8 both within 5 % of batch 2's 150/s (151 < 157.5, 149 < 158.55): batch 2's
    # is the figure they failed to beat, though batch 4 is the best by a hair
    assert flat.stop_explanation.startswith(
        "stopped at batch 8: 2 batch sizes in a row did "
        "not raise samples/s by at least 5 % over batch 2's"
    )
    # at max_batch with the last point below the best: raising it is not the advice
    ended = Throughput(points, "max_batch", env={"max_batch": 8}).stop_explanation
    assert "max_batch=8" in ended and "batch 8 read fewer samples/s than batch 4's" in ended
    rising = Throughput(points[:3], "max_batch", env={"max_batch": 4}).stop_explanation
    assert rising.endswith("raise max_batch (--max-batch) to search further")
    oom = Throughput(points, "oom", max_fit_batch=8, oom_batch=12)
    assert "batch 12 did not fit" in oom.stop_explanation
    assert flat.to_dict()["stop_explanation"] == flat.stop_explanation
    assert flat.stop_explanation in repr(flat)


def test_torchstat_view_explains_its_flops() -> None:
    r = profile(nn.Sequential(nn.Linear(10, 20), nn.ReLU()), (10,), timing=False)
    text = r.to_text(style="torchstat")
    # torchstat's Linear: 10*20 = 200 Flops, ReLU 20: 220; modelprof: 2*200 + 20 bias + 20 relu
    assert text.splitlines()[-1] == (
        "Flops (torchstat's formulas: one per multiply-add) = 220; "
        "the summary's FLOPs (2 per multiply-add + every other op) "
        "= 440"
    )


def test_overhead_line_in_words() -> None:
    r = profile(nn.Linear(4, 4), (4,), repeat=3, warmup=0, roofline=False)
    r.instrumentation_overhead, r.coverage = 0.747, 0.954
    line = next(x for x in r.summary().splitlines() if "hooked passes" in x)
    assert "x0.747" not in line
    assert (
        "the hooked passes ran 25.3 % faster than the plain passes beside them: the "
        "machine's noise is larger than the hooks' cost"
    ) in line
    r.instrumentation_overhead = 1.05
    assert "ran 5.0 % slower than the plain passes beside them" in r.summary()
    r.instrumentation_overhead = 0.9996  # -0.04 %: rounds to 0.0, no "0.0 % faster"
    assert "ran as fast as the plain passes beside them" in r.summary()
    # a newcomer's summary called 44.7 % "the hooks' cost" where the hooks' own measured cost
    # was 7.6 %: 0.1 ms a call x 1 call (the Linear) over a 1.3 ms plain pass = 7.7 %, far
    # below 44.7 %: the rest is said to be the machine's
    import dataclasses

    from modelprof.timing.layers import HookCost

    r.layer_timing = dataclasses.replace(
        r.layer_timing, hook_cost=HookCost(0.1, 0.0), plain_ms=np.full(5, 1.3)
    )
    r.instrumentation_overhead = 1.447
    assert (
        "ran 44.7 % slower than the plain passes beside them, of which the hooks' measured "
        "cost explains about 7.7 %: the rest is other work on the machine"
    ) in r.summary()
    r.instrumentation_overhead = 1.15  # within twice the hooks' share and 5 %: theirs
    assert "ran 15.0 % slower than the plain passes beside them (the hooks' cost)" in r.summary()


def test_by_layer_type_prints_whole() -> None:
    r = profile(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()), (3, 8, 8), timing=False
    )
    types = r.by_layer_type()
    with pd.option_context("display.width", 40, "display.max_columns", 3):
        text = repr(types)
    assert "..." not in text
    from modelprof.render.views import column_spec

    for column in types.columns:  # every column, under its human header ("layer type")
        assert column_spec(column, types[column]).header in text
    assert type(types.reset_index()) is pd.DataFrame  # derived frames are plain


def test_no_peak_memory_column_of_nans_on_cpu() -> None:
    r = profile(nn.Linear(4, 4), (4,), repeat=3, warmup=1, roofline=False)
    df = r.to_dataframe()
    assert "peak_memory_bytes" not in df.columns  # the CPU allocator keeps no peak
    assert "latency_ms" in df.columns
