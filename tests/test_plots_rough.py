"""A figure marks what the tables mark rough (``~``), as the comparison's figure does: grey bars
and points, and its words under them or in the legend. A newcomer's loaded run drew every
per-layer time rough in the tables, and the latency figure plain blue without a word, its top
bar a 1x1 conv at 78 ms of noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
from matplotlib.colors import to_rgba  # noqa: E402
from test_render_fixture import report_frame  # noqa: E402

from modelprof.generation.plots import HATCHED_WORDS, ROUGH_ALPHA, ROUGH_HATCH  # noqa: E402
from modelprof.report.plots import (  # noqa: E402
    ROUGH_WORDS,
    plot_compare,
    plot_latency,
    plot_roofline,
)
from modelprof.timing.peaks import Peaks  # noqa: E402

GREY, BLUE, ORANGE = to_rgba("tab:gray"), to_rgba("tab:blue"), to_rgba("tab:orange")
PEAKS = Peaks(peak_flops=1e9, peak_bytes=1e9, source="user", device="toy", dtype="float32")


def _bars(fig) -> dict[str, tuple]:
    """Each bar's label (top to bottom) and face colour."""
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    return dict(zip(labels, (tuple(p.get_facecolor()) for p in ax.patches)))


def _rough(frame: pd.DataFrame, flag: str, modules: set[str]) -> pd.DataFrame:
    return frame.assign(**{flag: frame["module"].isin(modules) & frame["latency_ms"].notna()})


def test_the_latency_figure_greys_a_rough_bar_and_says_so() -> None:
    plain = plot_latency(report_frame(), top_k=3)
    assert set(_bars(plain).values()) == {BLUE} and plain.get_supxlabel() == ""
    fig = plot_latency(_rough(report_frame(), "latency_rough", {"conv1"}), top_k=3)
    assert _bars(fig) == {"conv1": GREY, "layer1.0": BLUE, "bn1": BLUE}
    # the comparison figure's words, and its colour
    assert fig.get_supxlabel() == ROUGH_WORDS == "~, grey: rough, no figure to quote"
    compared = plot_compare(
        pd.DataFrame({"latency_median_ms": [3.0, 2.0], "latency_rough": [True, False]}),
        metrics=["latency_median_ms"],
    )
    assert [tuple(p.get_facecolor()) for p in compared.axes[0].patches] == [GREY, BLUE]
    assert compared.get_supxlabel() == fig.get_supxlabel()


def test_the_backward_latency_figure_greys_by_the_backwards_own_flag() -> None:
    df = report_frame().assign(backward_latency_ms=lambda d: d["latency_ms"] * 2)
    df = _rough(_rough(df, "latency_rough", {"conv1"}), "backward_latency_rough", {"layer1.0"})
    fig = plot_latency(df, top_k=3, column="backward_latency_ms")
    assert _bars(fig) == {"conv1": BLUE, "layer1.0": GREY, "bn1": BLUE}
    assert fig.get_supxlabel() == ROUGH_WORDS
    forward_only = _rough(df, "backward_latency_rough", set())
    fig = plot_latency(forward_only, top_k=3, column="backward_latency_ms")
    assert set(_bars(fig).values()) == {BLUE} and fig.get_supxlabel() == ""


def test_a_loaded_reports_latency_figure_is_grey(monkeypatch) -> None:
    # the user's case: every row rough (the per-layer passes stopped short on a loaded machine)
    import torch.nn as nn

    from modelprof import profile
    from modelprof.report.report import Report

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    report = profile(model, (8,), repeat=3, warmup=0, roofline=False)
    monkeypatch.setattr(Report, "layers_rough", property(lambda self: True))
    assert report.to_dataframe()["latency_rough"].dropna().all()
    fig = report.plot_latency()
    assert set(_bars(fig).values()) == {GREY}
    assert fig.get_supxlabel() == ROUGH_WORDS
    names = [name for name, _ in report.figures()]
    assert "latency" in names  # (the figure --format png writes)


def test_the_roofline_greys_a_rough_layer_and_marks_its_time_in_the_key() -> None:
    fig = plot_roofline(_rough(report_frame(), "latency_rough", {"conv1"}), PEAKS)
    ax = fig.axes[0]
    faces = [tuple(f) for c in ax.collections for f in c.get_facecolors()]
    assert faces.count(GREY) == 1  # conv1's point, ringed in its roof's colour
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert ROUGH_WORDS in texts
    key = [t for t in texts if "conv1" in t]
    assert len(key) == 1 and "(~" in key[0]
    assert not any("(~" in t for t in texts if "layer1.0" in t)
    plain = plot_roofline(report_frame(), PEAKS)
    faces = [tuple(f) for c in plain.axes[0].collections for f in c.get_facecolors()]
    texts = [t.get_text() for legend in plain.legends for t in legend.get_texts()]
    assert GREY not in faces and ROUGH_WORDS not in texts and not any("~" in t for t in texts)


@pytest.fixture(scope="module")
def generation():
    from helpers import tiny_llama

    from modelprof import profile_generation

    return profile_generation(tiny_llama(2), prompt_len=8, new_tokens=3, budget_s=0.2)


def test_the_generation_figures_grey_a_rough_phases_times(generation, monkeypatch) -> None:
    report = generation
    # none rough (a loaded run may mark some: cleared here)
    monkeypatch.setattr(report, "_rough", lambda series, point: False)
    frame = type(report).phase_frame
    monkeypatch.setattr(
        report, "phase_frame", lambda p: frame(report, p).assign(latency_rough=False)
    )
    fig = report.plot_phase_share()
    ax = fig.axes[0]
    n = len(ax.get_yticklabels())
    faces = [tuple(p.get_facecolor()) for p in ax.patches]
    assert faces == [BLUE] * n + [ORANGE] * n
    assert not any(p.get_hatch() for p in ax.patches)
    assert ROUGH_WORDS not in [t.get_text() for t in ax.get_legend().get_texts()]
    growth = report.plot_decode_growth().axes[0]
    assert not any(ROUGH_WORDS in ln.get_label() for ln in growth.get_lines())
    # the phases' times rough (slower than a phase doing more work, or loaded)
    monkeypatch.setattr(report, "_rough", lambda series, point: True)
    monkeypatch.delattr(report, "phase_frame")
    assert report.growth()["latency_rough"].all()
    fig = report.plot_phase_share()
    ax = fig.axes[0]
    # every bar keeps its phase's colour (grey ones matched neither swatch of the legend),
    # hatched and faded: rough
    bars = [(to_rgba(p.get_facecolor(), 1.0), p.get_hatch()) for p in ax.patches]
    assert bars == [(BLUE, ROUGH_HATCH)] * n + [(ORANGE, ROUGH_HATCH)] * n
    assert {p.get_alpha() for p in ax.patches} == {ROUGH_ALPHA}
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["prefill", "decode", HATCHED_WORDS]
    swatches = [tuple(h.get_facecolor()) for h in legend.legend_handles[:2]]
    assert swatches == [BLUE, ORANGE] and legend.legend_handles[2].get_hatch() == ROUGH_HATCH
    growth = report.plot_decode_growth().axes[0]
    passes = [ln for ln in growth.get_lines() if "per-layer passes" in ln.get_label()]
    assert len(passes) == 1 and passes[0].get_label().endswith(ROUGH_WORDS)
    assert to_rgba(passes[0].get_markerfacecolor()) == GREY
    assert np.allclose(passes[0].get_ydata(), report.growth()["latency_ms"])
