"""A roofline plot says once, in words, that its probe was disturbed (issue 38 item 15): on a
loaded run every raised roof repeated "the probe was disturbed and read low" in the title
(21 lines here, 15 on a loaded resnet50). Now the title holds one sentence naming the roofs
drawn at what layers reached, and the per-roof details go to a caption below the plot."""

from __future__ import annotations

import warnings

import pytest
from torch import nn

import modelprof
from modelprof.render.units import format_rate
from modelprof.report.roofline import run_peaks
from modelprof.timing.peaks import MemoryLevel, Peaks

pytest.importorskip("matplotlib")

# a CPU probe on a busy machine (wall/CPU 2) that read every roof far too low, a DRAM roof
# slower than any main memory among them
LOW = Peaks(
    peak_flops=1e6,
    peak_bytes=1e6,
    source="probe",
    device="test CPU",
    conv_peak_flops=2e6,
    levels=(
        MemoryLevel("L1", 48 << 10, 4e6),
        MemoryLevel("L2", 2 << 20, 3e6),
        MemoryLevel("L3", 32 << 20, 2e6),
        MemoryLevel("DRAM", None, 1e6),
    ),
    wall_over_cpu=2.0,
)


@pytest.fixture(scope="module")
def loaded():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 64), nn.Linear(64, 10)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noisy timing under load: not the point
        report = modelprof.profile(
            model, (3, 32, 32), batch_size=8, roofline=LOW, repeat=3, warmup=1, budget_s=0.3
        )
    return report, report.plot_roofline()


def test_the_title_says_once_that_the_probe_was_disturbed_and_what_roofs_are_drawn(loaded):
    report, fig = loaded
    used = run_peaks(report)
    title = fig.axes[0].get_title()
    lines = title.splitlines()
    assert lines[0] == "Roofline: test CPU (float32, roofs probed)"
    # the heading and one sentence of at most three lines (it was 21 lines)
    assert len(lines) <= 4, title
    words = title.replace("\n", " ")
    caption = fig._supxlabel.get_text().replace("\n", " ")
    assert (words + caption).count("disturbed") == 1
    assert "its wall time was 2.00x its CPU time" in caption
    if not used.raised:  # a loaded run's rows all rough or scattered: none proves a roof
        assert (
            "The probe was disturbed (the machine was busy) and read low: its DRAM roof, "
            "1.00 MB/s, is implausibly low" in words
        )
        return
    assert "The probe was disturbed (the machine was busy) and read low, so these roofs" in words
    # every raised roof once, at the rate the plot draws and the MFU uses, in one list
    assert "compute" in used.raised and "L1" in used.raised
    reached = words.split("drawn at what layers of this run reached: ")[1]
    assert f"compute {format_rate(used.peak_flops, 'FLOP/s')}" in reached
    l1 = next(lv for lv in used.memory_levels if lv.name == "L1")
    assert f"L1 {format_rate(l1.bandwidth, 'B/s')}" in reached
    if "conv compute" in used.raised:  # in words, not the abbreviation
        assert f"convolution compute {format_rate(used.conv_peak_flops, 'FLOP/s')}" in reached
    assert "conv compute" not in words and "raised to measured" not in words
    # the details below: the busy machine's figure, each probed value and the layer that beat it
    assert "its wall time was 2.00x its CPU time" in caption
    assert "The probe measured compute 1.00 MFLOP/s (layer " in caption
    assert "L1 4.00 MB/s (layer " in caption
    if "DRAM" not in used.raised:
        assert "The DRAM roof, 1.00 MB/s, is implausibly low" in caption


def test_the_caption_stays_clear_of_the_legends(loaded):
    _, fig = loaded
    renderer = fig._get_renderer()
    fig.draw_without_rendering()
    caption = fig._supxlabel.get_window_extent(renderer)
    assert caption.x1 <= fig.axes[0].get_window_extent(renderer).x1 + 0.5
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert not (box.x0 < caption.x1 and caption.x0 < box.x1 and box.y0 < caption.y1)
