"""A comparison marks the figures its own run flagged, as a report marks its end-to-end row: a
model's wall-clock latency read on a loaded machine or from too few runs, a throughput whose best
point was loaded. On the fake clock (tests/fake_clock.py) "load" hits one model only, whatever
the machine does: no real load, no spin."""

from __future__ import annotations

import pandas as pd
import pytest
from fake_clock import hit_and_spared, install

from modelprof import compare
from modelprof.render import read_csv

pytestmark = [
    pytest.mark.filterwarnings("ignore::modelprof.errors.ModelProfWarning"),
    pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning"),
]

FLAGS = ["latency_rough", "throughput_samples_per_s_rough", "throughput_x_rough"]


@pytest.fixture
def hit_first(monkeypatch, one_thread):
    """``hit`` (the baseline), its wall clock 3x its CPU work, and ``spared``, 1x: compared with
    their throughput searched (batch 1 and 2, every point of ``hit`` as loaded as its latency)."""
    models = hit_and_spared(install(monkeypatch))
    return compare(
        models,
        (4,),
        repeat=12,
        warmup=1,
        roofline=False,
        throughput=True,
        throughput_options={"max_batch": 2, "repeat": 3},
    )


def _row(text: str, model: str) -> str:
    (line,) = [line for line in text.splitlines() if line.lstrip("| ").startswith(f"{model} ")]
    return line


def test_a_loaded_models_latency_and_throughput_are_marked_in_every_export(hit_first, tmp_path):
    df = hit_first
    # hit: wall/CPU 3 > 1.15, loaded, no figure to quote (as a report's end-to-end row says it);
    # spared: wall = CPU work. Every ratio to the baseline (hit) has a rough side
    assert df["latency_rough"].tolist() == [True, False]
    assert df["throughput_samples_per_s_rough"].tolist() == [True, False]
    assert df["throughput_x_rough"].tolist() == [True, True]
    assert df.attrs["unquotable"] == {"hit": "the machine was loaded"}
    legend = "latency marked ~ is no figure to quote: hit (the machine was loaded)"
    columns = ["model", "latency_median_ms", "latency_p90_ms", "fps", "throughput_samples_per_s"]
    for fmt in ("text", "markdown"):
        out = str(df.render.export(fmt, columns=columns))
        assert legend in out.replace("\\~", "~") and "throughput marked" in out
        # hit's four figures marked, spared's none (its throughput ratio is not shown)
        assert _row(out, "hit").count("~") == 4 and "~" not in _row(out, "spared"), out
    tex = str(df.render.to_latex(columns=columns, width=None))
    assert _row(tex, "hit").count("\\textcolor{gray}{\\textasciitilde{}") == 4
    assert "textcolor" not in _row(tex, "spared") and "no figure to quote: hit" in tex
    html = str(df.render.to_html(columns=columns))
    assert html.count('class="r rough"') == 4  # hit's four cells, greyed
    # the flags go to a file and read back as they were (bool, declared in the registry)
    back = read_csv(df.render.to_csv(tmp_path / "c.csv")).set_index("model")
    pd.testing.assert_frame_equal(back[FLAGS], pd.DataFrame(df)[FLAGS], check_exact=True)


def test_a_caption_says_what_the_marks_mean_only_where_the_table_shows_them(hit_first):
    # columns= that hides every latency and throughput column: the text, Markdown and HTML
    # captions still spoke of "~" on them (LaTeX's, fitted to what it keeps, did not)
    df = hit_first
    for fmt in ("text", "markdown", "html", "latex"):
        counts = str(df.render.export(fmt, columns=["model", "params", "macs"]))
        assert "marked" not in counts and "no figure to quote" not in counts, fmt
        assert "ratio of medians" not in counts, fmt  # no ratio shown: nor how it is estimated
        latency = str(df.render.export(fmt, columns=["model", "latency_median_ms"]))
        assert "no figure to quote: hit" in latency and "throughput marked" not in latency, fmt


def test_a_comparisons_figure_marks_the_loaded_bars(hit_first):
    pytest.importorskip("matplotlib")
    from modelprof.report.plots import plot_compare

    fig = plot_compare(hit_first, ["latency_median_ms", "throughput_samples_per_s"])
    for ax in fig.axes:
        # one value above each bar, hit's first: "~" on hit's alone
        marks = [t.get_text().startswith("~") for t in ax.texts]
        assert marks == [True, False], ax.get_title()
    assert "rough" in fig.get_supxlabel()


def test_a_latency_from_too_few_runs_is_marked_with_its_count(monkeypatch):
    # one run each (repeat=1): no interval, too few runs to quote, as a report's row says it
    clock = install(monkeypatch)
    df = compare(hit_and_spared(clock, factor=1.0), (4,), repeat=1, warmup=1, roofline=False)
    assert df["latency_rough"].tolist() == [True, True]
    assert df.attrs["unquotable"] == dict.fromkeys(["hit", "spared"], "too few runs, n=1")
    md = str(df.render.to_markdown()).replace("\\~", "~")
    assert "no figure to quote: hit, spared (too few runs, n=1)" in md
    assert _row(md, "spared").split("|")[6].strip().startswith("~")  # its latency median


def test_a_figures_median_bounds_and_p90_share_its_flag():
    # one rule for every table: <figure>_rough marks <figure>_ms, its _median_ms, _p90_ms,
    # _std_ms and its interval's bounds (a generation summary's ttft_ms beside ttft_rough was
    # left bare while its bounds were marked); another figure's cells are not its to mark
    from modelprof.render.views import own_flag, prepare_table

    assert {own_flag(c) for c in ("ttft_ms", "ttft_ci_low_ms", "ttft_ci_high_ms")} == {"ttft_rough"}
    assert {own_flag(c) for c in ("latency_median_ms", "latency_p90_ms", "latency_std_ms")} == {
        "latency_rough"
    }
    assert own_flag("latency_x_ci_low") == "latency_x_rough"
    assert own_flag("throughput_samples_per_s") == "throughput_samples_per_s_rough"
    df = pd.DataFrame(
        {"ttft_ms": [5.0, 6.0], "ttft_ci_low_ms": [4.0, 5.0], "tpot_ms": [1.0, 1.0]}
    ).assign(ttft_rough=[True, False], tpot_rough=[False, False])
    cells = prepare_table(df, columns=["ttft_ms", "ttft_ci_low_ms", "tpot_ms"]).cells
    assert [[c.startswith("~") for c in row] for row in cells] == [
        [True, True, False],  # the first row's TTFT flagged: its median and bound
        [False, False, False],
    ]
