"""Figures: built without pyplot, saved as PNG/SVG, errors that name the missing piece."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402
from test_render_fixture import report_frame  # noqa: E402

from modelprof.errors import ModelProfError  # noqa: E402
from modelprof.report.plots import (
    plot_compare,
    plot_flops,
    plot_latency,
    plot_roofline,
    plot_throughput,
)
from modelprof.timing.peaks import MemoryLevel, Peaks  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Peaks chosen so the fixture's layers sit on both sides of the ridge (1e9 / 1e9 = 1 FLOP/B):
# conv1 at 13824 / 2224 = 6.2 FLOP/B is compute bound, layer1.0 at 1152 / 1576 = 0.73 memory bound.
PEAKS = Peaks(peak_flops=1e9, peak_bytes=1e9, source="user", device="toy", dtype="float32")


def _compare() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "params": [11_689_512, 5_483_032],
            "flops": [3.63e9, 0.44e9],
            "latency_median_ms": [3.1, 1.9],
            "output_bytes": [2**20, 2**19],
        },
        index=pd.Index(["resnet18", "mobilenet_v3_large"], name="model"),
    )


def _curve() -> pd.DataFrame:
    return pd.DataFrame(
        {"batch_size": [1, 2, 4, 8, 16], "samples_per_s": [100.0, 180, 300, 320, 310]}
    )


def _bar_labels(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_plot_latency_top_k_slowest_leaves_first(tmp_path: Path) -> None:
    fig = plot_latency(report_frame(), top_k=3, save=tmp_path / "lat.png")
    assert isinstance(fig, Figure)
    # leaves by latency: conv1 0.3, layer1.0 0.2, then bn1 / layer1.(self) at 0.1 (bn1 first)
    assert _bar_labels(fig) == ["conv1", "layer1.0", "bn1"]
    assert (tmp_path / "lat.png").read_bytes().startswith(PNG_SIGNATURE)


def test_plot_latency_of_a_training_steps_backward() -> None:
    # the backward's per-layer times, slowest first (a newcomer's backward=True plot showed the
    # forward's alone); the forward's p10-p90 bars are not drawn on the backward's
    df = report_frame().assign(
        backward_latency_ms=[np.nan, 0.1, 0.6, 0.05, np.nan, 0.3, 0.2, 0.2, 0.4]
    )
    df.loc[~df["leaf"], "backward_latency_ms"] = np.nan
    fig = plot_latency(df, top_k=2, column="backward_latency_ms")
    # the leaves' backward: conv1 0.1, bn1 0.6, relu 0.05, layer1.0 0.3, layer1.1 0.2,
    # layer1.(self) 0.2, relu (call 2) 0.4: the two slowest, bn1 and the second relu
    assert _bar_labels(fig) == ["bn1", "relu #2"]
    assert fig.axes[0].get_xlabel() == "backward latency (ms)"
    with pytest.raises(ModelProfError, match="column='flops'"):
        plot_latency(df, column="flops")


def test_plot_flops_svg_and_repeated_calls_are_labelled(tmp_path: Path) -> None:
    fig = plot_flops(report_frame(), top_k=None, save=tmp_path / "sub" / "flops.svg")
    labels = _bar_labels(fig)
    assert labels[0] == "conv1" and "relu #2" in labels and len(labels) == 7  # all 7 leaves
    assert "<svg" in (tmp_path / "sub" / "flops.svg").read_text(encoding="utf-8")


def test_plot_flops_of_another_column() -> None:
    fig = plot_flops(report_frame(), top_k=1, column="params")
    assert _bar_labels(fig) == ["conv1"]  # 108 params
    assert fig.axes[0].get_xlabel() == "params"


def test_plot_roofline_places_timed_leaves(tmp_path: Path) -> None:
    fig = plot_roofline(report_frame(), PEAKS, save=tmp_path / "roof.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    points = sum(len(c.get_offsets()) for c in ax.collections)
    assert points == 7  # every leaf has FLOPs, bytes and a latency
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    # Peaks without levels: main memory is the only roof, and every layer is judged against it
    assert legend == ["DRAM roof: 1.00 GB/s", "compute roof: 1.00 GFLOP/s", "layers judged at DRAM"]
    # the memory roof: flat at 1e9 FLOP/s right of the ridge
    roof = ax.lines[0].get_ydata()
    assert roof.max() == pytest.approx(1e9)
    assert (tmp_path / "roof.png").read_bytes().startswith(PNG_SIGNATURE)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_plot_roofline_draws_a_roof_per_memory_level_and_labels_without_overlap() -> None:
    from modelprof.timing.peaks import MemoryLevel

    levels = (
        MemoryLevel("L1", 64 * 1024, 8e9),
        MemoryLevel("L2", 1 << 20, 8e9),
        MemoryLevel("L3", 8 << 20, 4e9),
        MemoryLevel("DRAM", None, 1e9),
    )
    peaks = Peaks(peak_flops=1e9, peak_bytes=1e9, source="user", device="toy", levels=levels)
    fig = plot_roofline(report_frame(), peaks, annotate=7)
    ax = fig.axes[0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    # L1 and L2 share one bandwidth, so one line: three memory roofs and the compute roof
    assert [t for t in legend if "roof" in t] == [
        "DRAM roof: 1.00 GB/s",
        "L3 roof: 4.00 GB/s, up to 8 MiB",
        "L1-L2 roof: 8.00 GB/s, up to 1 MiB",
        "compute roof: 1.00 GFLOP/s",
    ]
    # the fixture's working sets are all < 64 KiB: judged at L1, named in the legend
    assert "layers judged at L1" in legend
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text()]  # the numbers next to the points
    key = [t.get_text() for t in fig.legends[1].get_texts()]
    # slowest first: conv1 0.3 ms, layer1.0 0.2 ms
    assert fig.legends[1].get_title().get_text() == "slowest layers (#1 slowest)"
    assert key[:2] == ["#1  conv1 (300 µs)", "#2  layer1.0 (200 µs)"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    boxes += [legend.get_window_extent(renderer) for legend in fig.legends]
    # both legends sit outside the axes and inside the figure: nothing covers a point or is cut
    axes_box = ax.get_window_extent(renderer)
    figure_box = fig.bbox
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert box.x0 >= axes_box.x1 and box.x1 <= figure_box.x1 + 0.5
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not _overlaps(boxes[i], boxes[j]), (i, j)


def test_plot_roofline_holds_the_layers_that_beat_the_roof_and_labels_them() -> None:
    # a trial's roof given at 20 GFLOP/s: the axis stopped at 3 x the roof, 20 of 68 layers that
    # beat it (the ones to check) were drawn off the plot and #2-#5 of the key had no label.
    # Here the roof is 1 MFLOP/s and conv1 runs 13824 FLOP / 0.3 ms = 46 MFLOP/s, 46 x over it
    peaks = Peaks(peak_flops=1e6, peak_bytes=1e6, source="user", device="toy", dtype="float32")
    fig = plot_roofline(report_frame(), peaks, annotate=5)
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    points = np.vstack([c.get_offsets() for c in ax.collections])
    assert len(points) == 7 and points[:, 1].max() == pytest.approx(46.08e6)
    assert ((points[:, 0] > x0) & (points[:, 0] < x1)).all()
    assert ((points[:, 1] > y0) & (points[:, 1] < y1)).all()
    # every label the key lists is drawn at a point inside the axes (one outside is clipped)
    key = [t.get_text().split()[0] for t in fig.legends[1].get_texts()]
    labels = [t for t in ax.texts if t.get_text()]
    assert sorted(p for t in labels for p in t.get_text().split(",")) == sorted(key)
    assert len(key) == 5
    for t in labels:
        assert x0 < t.xy[0] < x1 and y0 < t.xy[1] < y1, t.get_text()


def test_bar_titles_say_when_the_top_k_cut_rows() -> None:
    # the fixture's 7 leaves all have a latency and FLOPs; top_k=3 shows 3 of them
    assert plot_latency(report_frame(), top_k=3).axes[0].get_title() == (
        "Latency per layer, top 3 of 7 leaves"
    )
    assert plot_flops(report_frame(), top_k=3).axes[0].get_title() == (
        "FLOPs per layer, top 3 of 7 leaves"
    )
    # all 9 rows (the root and layer1 too) with leaf_only=False
    assert plot_flops(report_frame(), top_k=3, leaf_only=False).axes[0].get_title() == (
        "FLOPs per layer, top 3 of 9 rows"
    )
    # nothing cut: no words
    assert plot_flops(report_frame(), top_k=None).axes[0].get_title() == "FLOPs per layer"
    assert plot_latency(report_frame(), top_k=7).axes[0].get_title() == "Latency per layer"


def test_roofline_labels_of_an_nn_sequential_are_no_module_names() -> None:
    # a trial read the point labelled 1 as the Sequential's module "1"; it was the slowest layer
    from torch import nn

    from modelprof import profile

    model = nn.Sequential(*(nn.Linear(32, 32) if i % 2 == 0 else nn.ReLU() for i in range(7)))
    report = profile(model, (32,), repeat=5, warmup=1, roofline=PEAKS, warn=False)
    fig = report.plot_roofline(annotate=7)
    names = set(report.to_dataframe()["module"])
    assert {str(i) for i in range(7)} <= names  # the modules are named 0..6
    labels = [p for t in fig.axes[0].texts for p in t.get_text().split(",")]
    key = [t.get_text() for t in fig.legends[1].get_texts()]
    assert not names & set(labels)  # no label reads as a module's name
    # one label a numbered point, #1 (the slowest) to #k, k the key's lines, which name them
    numbered = sorted(labels, key=lambda p: int(p.removeprefix("#")))
    assert numbered == [f"#{i}" for i in range(1, len(key) + 1)]
    assert [line.split()[0] for line in key] == numbered


def test_plot_roofline_draws_the_roofs_the_rows_are_judged_against() -> None:
    from dataclasses import replace

    # the fixture's conv1 does 13824 FLOP in 0.3 ms = 46.08 MFLOP/s: above a probed 10 MFLOP/s
    probed = replace(PEAKS, peak_flops=1e7, source="probe")
    fig = plot_roofline(report_frame(), probed)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "compute roof: 46.08 MFLOP/s" in legend
    title = fig.axes[0].get_title().replace("\n", " ")
    # in words, no jargon, once: the probe was disturbed, the roof drawn instead; under the plot
    # what the probe measured and which layer beat it
    assert title == (
        "Roofline: toy (float32, roofs probed) The probe was disturbed and read low, so these "
        "roofs are drawn at what layers of this run reached: compute 46.08 MFLOP/s."
    )
    caption = fig._supxlabel.get_text().replace("\n", " ")
    assert "The probe measured compute 10.00 MFLOP/s (layer conv1 ran at 46.08 MFLOP/s)" in caption
    # the same peaks as given by a user stay as given
    fig = plot_roofline(report_frame(), replace(probed, source="user"))
    assert "compute roof: 10.00 MFLOP/s" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_title() == "Roofline: toy (float32, roofs given)"


def test_plot_roofline_says_in_words_when_the_dram_probe_was_disturbed() -> None:
    from dataclasses import replace

    # a CPU probe's hierarchy with a DRAM roof of 3.04 GB/s, which no layer of the fixture
    # disproves (all fit the caches): slower than one DDR3 channel (10.7 GB/s) moves copies
    levels = (MemoryLevel("L1", 64 << 10, 70e9), MemoryLevel("DRAM", None, 3.04e9))
    cpu = replace(PEAKS, peak_flops=1e9, peak_bytes=3.04e9, source="probe", levels=levels)
    title = plot_roofline(report_frame(), cpu).axes[0].get_title().replace("\n", " ")
    assert title.endswith(
        "The probe was disturbed and read low: its DRAM roof, 3.04 GB/s, is implausibly low."
    )
    # 20 GB/s is a plausible DRAM: the title is the heading alone
    fine = replace(cpu, peak_bytes=20e9, levels=(levels[0], MemoryLevel("DRAM", None, 20e9)))
    assert plot_roofline(report_frame(), fine).axes[0].get_title() == (
        "Roofline: toy (float32, roofs probed)"
    )
    # a probe that waited for a core says so in words
    busy = replace(fine, wall_over_cpu=1.5)
    fig = plot_roofline(report_frame(), busy)
    title = fig.axes[0].get_title().replace("\n", " ")
    assert title.endswith("The probe was disturbed (the machine was busy) and read low.")
    caption = fig._supxlabel.get_text().replace("\n", " ")
    assert "The probe ran on a busy machine: its wall time was 1.50x its CPU time" in caption


def test_a_long_caption_stays_clear_of_the_key_on_the_screen_and_saved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import modelprof.report.plots as plots

    # a newcomer's saved roofline ran its caption under the "slowest layers" key: wrapped to
    # the axes at the screen's 100 dpi, it set 9 % wider at the 150 dpi figures are saved at
    long = (
        "The probe ran on a busy machine: its wall time was 2.84x its CPU time; other work "
        "took 1.65 cores' worth of the cores it needed, and every roof it measured reads low. "
        "The probe measured L1 3.58 GB/s (layer layer2.0.relu #2 moved data at 16.29 GB/s); "
        "L2 3.58 GB/s (layer layer2.0.relu moved data past the caches at 6.15 GB/s)."
    )
    monkeypatch.setattr(plots, "peak_words", lambda df, peaks: ("disturbed", long))
    fig = plot_roofline(report_frame(), PEAKS, save=tmp_path / "roofline.png")
    assert len(fig.legends) == 2  # the roofs' key and the slowest layers'
    for dpi in (100, plots.SAVE_DPI):
        fig.set_dpi(dpi)
        fig.draw_without_rendering()
        renderer = fig._get_renderer()
        caption = fig._supxlabel.get_window_extent(renderer)
        assert caption.x1 <= fig.axes[0].get_window_extent(renderer).x1
        assert not any(caption.overlaps(key.get_window_extent(renderer)) for key in fig.legends)
        title = fig.axes[0].title.get_window_extent(renderer)
        assert title.width <= fig.axes[0].get_window_extent(renderer).width


def test_plot_roofline_needs_timing() -> None:
    with pytest.raises(ModelProfError, match="latency_ms"):
        plot_roofline(report_frame(timed=False), PEAKS)
    df = report_frame()
    df["latency_ms"] = np.nan
    with pytest.raises(ModelProfError, match="no timed row"):
        plot_roofline(df, PEAKS)
    with pytest.raises(ModelProfError, match="Peaks"):
        plot_roofline(report_frame(), None)


def test_plot_throughput_marks_the_best_point(tmp_path: Path) -> None:
    fig = plot_throughput(_curve(), save=tmp_path / "tp.svg")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert "320.0/s at batch size 8" in ax.get_legend().get_texts()[0].get_text()
    assert "<svg" in (tmp_path / "tp.svg").read_text(encoding="utf-8")


def test_plot_throughput_errors() -> None:
    with pytest.raises(ModelProfError, match="samples_per_s"):
        plot_throughput(pd.DataFrame({"batch_size": [1]}))
    with pytest.raises(ModelProfError, match="no points"):
        plot_throughput(pd.DataFrame({"batch_size": [1], "fps": [np.nan]}))


def test_plot_compare_one_panel_per_metric(tmp_path: Path) -> None:
    fig = plot_compare(
        _compare(),
        metrics=["params", "latency_median_ms", "output_bytes"],
        save=tmp_path / "cmp.png",
    )
    assert len(fig.axes) == 3
    assert [a.get_title() for a in fig.axes] == ["params", "latency median", "output"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [
        "resnet18",
        "mobilenet_v3_large",
    ]
    annotations = [t.get_text() for t in fig.axes[1].texts]
    assert annotations == ["3.10 ms", "1.90 ms"]
    assert (tmp_path / "cmp.png").read_bytes().startswith(PNG_SIGNATURE)


def test_plot_compare_names_missing_metrics() -> None:
    with pytest.raises(ModelProfError, match=r"\['latency_ms'\]"):
        plot_compare(_compare(), metrics=["params", "latency_ms"])


def test_save_rejects_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(ModelProfError, match="plot.bmp"):
        plot_latency(report_frame(), save=tmp_path / "plot.bmp")


def test_plot_latency_without_timing_says_so() -> None:
    with pytest.raises(ModelProfError, match="timing=True"):
        plot_latency(report_frame(timed=False))


def test_missing_matplotlib_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    # the hint works for a clone too (modelprof is not on the registry under that name)
    with pytest.raises(
        ModelProfError, match=r"pip install matplotlib .*pip install -e '\.\[all\]'"
    ):
        plot_flops(report_frame())


def test_no_pyplot_state_is_created() -> None:
    before = set(sys.modules)
    plot_flops(report_frame())
    if "matplotlib.pyplot" not in before:
        assert "matplotlib.pyplot" not in sys.modules
    else:
        import matplotlib.pyplot as plt

        n = len(plt.get_fignums())
        plot_flops(report_frame())
        assert len(plt.get_fignums()) == n


def test_plot_compare_default_metrics_are_those_present() -> None:
    fig = plot_compare(_compare())
    # params, flops and latency_median_ms are in the frame; throughput_samples_per_s is not
    assert [a.get_title() for a in fig.axes] == ["params", "FLOPs", "latency median"]


def test_a_reports_roofline_view_never_starts_a_probe(monkeypatch) -> None:
    # a view reads what the report holds: without peaks it says how to get them, and no probe
    # of the hardware runs behind the user's back
    import sys

    import torch.nn as nn

    from modelprof import profile

    def no_probe(*a, **k):
        raise AssertionError("plot_roofline started a probe")

    # wherever a module of the package holds probe_peaks (imported by name at its top)
    holders = [m for n, m in list(sys.modules.items()) if n.startswith("modelprof")]
    holders = [m for m in holders if hasattr(m, "probe_peaks")]
    assert any(m.__name__ == "modelprof.timing.peaks" for m in holders)
    for module in holders:
        monkeypatch.setattr(module, "probe_peaks", no_probe)
    report = profile(nn.Linear(4, 4), (4,), repeat=3, warmup=0, roofline=False)
    assert report.peaks is None
    with pytest.raises(ModelProfError, match=r"no peaks .*probe_peaks\('cpu'\)"):
        report.plot_roofline()
    fig = report.plot_roofline(peaks=PEAKS)  # given peaks: drawn
    assert fig.axes


def test_the_decode_growth_plot_names_its_batch_in_mib_at_whole_contexts():
    # a newcomer's plot said no batch size (of two), ticked contexts at 8.25 and 8.5, and drew
    # bytes in MB beside tables in MiB
    from helpers import tiny_llama

    from modelprof import profile_generation

    report = profile_generation(
        tiny_llama(2), prompt_len=8, new_tokens=4, batch_size=[1, 2], timing=False
    )
    fig = report.plot_decode_growth(batch_size=2)
    (ax_b,) = fig.axes  # nothing timed, no bound: the bytes alone (no empty time panel)
    assert ax_b.get_title() == "Decode step bytes, batch 2" and ax_b.get_ylabel() == "MiB"
    read = ax_b.get_lines()[0]
    growth = report.growth(2)
    assert np.allclose(read.get_ydata(), growth["read_bytes"] / 2**20)  # 1 MiB = 2**20 B
    fig.canvas.draw()  # (the ticks are placed when drawn)
    ticks = ax_b.get_xticks()
    assert np.allclose(ticks, np.round(ticks))
    # with a bound (a target's roofline) the time panel has something to show: both
    bound = profile_generation(
        tiny_llama(2), prompt_len=8, new_tokens=4, timing=False, target="H100 SXM"
    )
    ax_t, _ = bound.plot_decode_growth().axes
    assert ax_t.get_title() == "Decode step time, batch 1"


def test_the_decode_growth_plot_draws_a_fit_only_where_growth_was_measured():
    # a newcomer's plot drew the fitted line of a slope its own label called "not measurable"
    from helpers import tiny_llama

    from modelprof import profile_generation
    from modelprof.generation.timing import GenerationTiming
    from modelprof.timing import Measurement

    report = profile_generation(tiny_llama(2), prompt_len=8, new_tokens=6, timing=False)
    contexts = np.arange(8, 13)  # the 5 decode steps after 8 tokens

    def drawn(step_ms: np.ndarray) -> tuple[list[str], list[str]]:
        whole = Measurement(np.full(4, 10.0))
        report.timings[1] = GenerationTiming(1, 8, 6, whole, whole, whole, step_ms, contexts)
        ax_t, _ = report.plot_decode_growth().axes
        lines = [ln for ln in ax_t.get_lines() if len(ln.get_xdata())]
        labels = [ln.get_label() for ln in ax_t.get_lines()]
        return [ln.get_label() for ln in lines], labels

    # flat noise: 1.0 and 1.2 ms alternating, no growth; the slope's interval reaches zero
    flat = np.tile([1.0, 1.2, 1.0, 1.2, 1.0], (4, 1)) + np.arange(4)[:, None] * 0.01
    with_data, labels = drawn(flat)
    assert not report.timings[1].step_slope.measurable
    assert not any(label.startswith("fit:") for label in with_data)
    assert any(label.startswith("growth not measurable") for label in labels)
    # exact growth, 1 + 0.05 L: measured, its fit drawn
    grows = np.tile(1 + 0.05 * contexts, (4, 1))
    with_data, _ = drawn(grows)
    assert report.timings[1].step_slope.measurable
    assert any(label.startswith("fit: 0.05 ms per token") for label in with_data)


def test_a_torchvision_model_has_one_name_in_summary_caption_and_figure_files(
    tmp_path: Path,
) -> None:
    import torchvision

    from modelprof import profile

    # one model, three names: the summary said "ResNet on input", the caption "resnet18, input"
    # and export("png", folder) wrote ResNet_flops.png where the CLI writes resnet18_flops.png.
    # resnet18's 11,689,512 parameters are its builder's published count: the caption's name
    r = profile(torchvision.models.resnet18(), (3, 64, 64), timing=False)
    assert r.model_name == "ResNet" and r.totals["params"] == 11_689_512
    assert r.summary().splitlines()[0].startswith("resnet18 on input ")
    assert r.export("markdown").startswith("**resnet18, input 1x3x64x64, ")  # the caption
    written = r.export("png", tmp_path)  # a folder: the model's name in it
    assert [p.name for p in written] == ["resnet18_flops.png"]  # untimed: the cost figure alone
    assert r.display_name == "resnet18"


@pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")
@pytest.mark.filterwarnings("ignore::modelprof.errors.TimingDisagreementWarning")
def test_report_export_png_writes_the_figures_the_cli_does(tmp_path: Path) -> None:
    import torch

    from modelprof import profile

    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    # export("png") was refused ("format 'png' is not one of csv, ...") while the command
    # line's --format png wrote name_flops.png, name_latency.png and name_roofline.png
    timed = profile(model, (10,), budget_s=0.05)
    written = timed.export("png", tmp_path / "mlp.png")
    names = ["mlp_flops.png", "mlp_latency.png", "mlp_roofline.png"]
    assert [p.name for p in written] == names and all(p.parent == tmp_path for p in written)
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in written)
    static = profile(model, (10,), timing=False)  # untimed: the cost figure alone, as the CLI
    static.model_name = "mlp"
    assert [p.name for p in static.export(".PNG", tmp_path / "static")] == ["static_flops.png"]
    assert static.export("png", tmp_path)[0] == tmp_path / "mlp_flops.png"  # a folder
    # one file written: its Path (given a str); png's several: their list, as export's
    # docstring says (it said "Returns the text, or writes path", png's list unsaid)
    assert static.export("csv", str(tmp_path / "mlp.csv")) == tmp_path / "mlp.csv"
    assert "as a :class:`~pathlib.Path`" in static.export.__doc__
    assert "returns the ``list`` of their paths" in static.export.__doc__
    with pytest.raises(ModelProfError, match=r"export\('png'\) writes files .*plot_flops\(\)"):
        static.export("png")  # no path: no text to return, the methods that draw a Figure
    with pytest.raises(ModelProfError, match=r"export\('png'\) takes no view options \(top_k\)"):
        static.export("png", tmp_path / "x.png", top_k=3)
    # a result without figures of its own says where its png comes from
    with pytest.raises(ModelProfError, match=r"'png' is a figure, not a table .* plot_compare"):
        from modelprof.render.formats import get_format

        get_format("png")


@pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")
@pytest.mark.filterwarnings("ignore::modelprof.errors.TimingDisagreementWarning")
def test_export_png_of_a_timed_report_without_the_roofline_writes_the_rest(
    tmp_path: Path,
) -> None:
    import torch

    from modelprof import profile
    from modelprof.errors import ModelProfWarning

    # a paper author's timed MLP at roofline=False: export("png") wrote mlp_flops.png and
    # mlp_latency.png, then raised "no peaks ... profile with timing" (it was timed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    r = profile(model, (32,), roofline=False, budget_s=0.05)
    assert r.timed and r.peaks is None
    with pytest.warns(ModelProfWarning, match=r"no roofline figure: .*roofline=False"):
        written = r.export("png", tmp_path / "mlp.png")
    assert [p.name for p in written] == ["mlp_flops.png", "mlp_latency.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp_flops.png", "mlp_latency.png"]
    with pytest.raises(ModelProfError, match=r"no peaks .*: it was timed without .*roofline=False"):
        r.plot_roofline()  # the reason named, not "profile with timing"
    # a figure that fails to draw leaves none written: drawn first, then saved
    r.plot_latency = lambda: (_ for _ in ()).throw(ModelProfError("drawing failed"))
    with pytest.warns(ModelProfWarning), pytest.raises(ModelProfError, match="drawing failed"):
        r.export("png", tmp_path / "again.png")
    assert not list(tmp_path.glob("again*"))
