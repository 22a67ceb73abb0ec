"""Report's exporters, views, notebook display and plots, on a real profiled model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.render.csvio import read_csv
from modelprof.render.jsonio import read_json
from modelprof.render.options import ViewOptions
from modelprof.timing.peaks import Peaks


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x):
        return self.head(self.features(x) + 1)


@pytest.fixture(scope="module")
def timed():
    # fixed peaks keep the roofline columns deterministic: 1 TFLOP/s, 100 GB/s
    return profile(Net(), (3, 16, 16), repeat=5, warmup=1, roofline=Peaks(1e12, 1e11))


@pytest.fixture(scope="module")
def static():
    return profile(Net(), (3, 16, 16), timing=False)


class Sink(nn.Module):
    """Returns None: its Linear's output is no output of the model."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        self.lin(x)


def test_totals_output_bytes_is_the_models_output_as_the_root_row_says(static):
    # a model returning None outputs 0 B (the leaf sum read 1x6 float32 = 24 B)
    assert profile(Sink(), (4,), timing=False).totals["output_bytes"] == 0
    # Net returns 1x4 float32 = 16 B, its (root) row's; the leaf outputs sum to far more
    # (conv, bn, relu: 8x16x16 floats = 8192 B each)
    assert static.totals["output_bytes"] == static.rows[0].output_bytes == 16


@pytest.mark.parametrize("style", ["modelprof", "torchstat"])
def test_csv_and_json_read_back_into_the_same_dataframe(tmp_path, timed, static, style):
    for report in (timed, static):
        df = report.to_dataframe(style)
        back = read_csv(report.to_csv(tmp_path / f"{style}.csv", style=style))
        pd.testing.assert_frame_equal(back, df)
        back_df, totals, env = read_json(report.to_json(tmp_path / f"{style}.json", style=style))
        pd.testing.assert_frame_equal(back_df, df)
        assert totals == report.totals
        assert env["device_name"] == report.env["device_name"]


def test_roofline_columns_follow_the_peaks(timed):
    df = timed.to_dataframe().set_index("module")
    conv = df.loc["features.0"]
    # conv: 8x16x16 outputs x 27 = 55296 MACs -> 110592 flops + 2048 bias = 112640 flops;
    # bytes: input 3x16x16x4 = 3072, weights 224x4 = 896, output 8x16x16x4 = 8192 -> 12160
    assert conv["flops"] == 112640 and conv["read_bytes"] + conv["write_bytes"] == 12160
    # roofline time = max(112640 / 1e12, 12160 / 1e11) s = 1.216e-7 s -> memory bound
    assert conv["roofline_ms"] == pytest.approx(1.216e-4)
    assert conv["bound"] == "memory"
    assert conv["intensity"] == pytest.approx(112640 / 12160)
    assert conv["efficiency"] == pytest.approx(conv["roofline_ms"] / conv["latency_ms"])


def _table_lines(md: str) -> list[str]:
    """The pipe table's lines of a Markdown export (a document has a caption and notes too)."""
    return [line for line in md.splitlines() if line.startswith("|")]


def test_view_options_reach_every_exporter(timed):
    md = timed.to_markdown(depth=1, columns=["module", "params", "macs"])
    header = _table_lines(md)[0]
    assert "features.0" not in md and "| features |" in md
    assert [c.strip() for c in header.split("|")[1:-1]] == ["module", "params", "MACs"]
    top = timed.to_markdown(leaf_only=True, top_k=2, sort_by="flops")
    assert len(_table_lines(top)) < 8
    tex = timed.to_latex(caption="Net", label="tab:net")
    assert "\\toprule" in tex and "\\bottomrule" in tex and "tab:net" in tex
    with pytest.raises(ModelProfError, match="nope"):
        timed.to_markdown(columns=["module", "nope"])


def test_notebook_and_terminal_display(timed, static):
    html = timed._repr_html_()
    assert html.startswith("<div>") and "<table" in html and "features.0" in html
    assert "latency median" in html
    text = repr(static)
    assert "params" in text and "features.0" in text
    assert "latency" not in static.summary()


def test_plots_return_figures_and_save(tmp_path, timed, static):
    fig = timed.plot_latency(save=tmp_path / "lat.png")
    assert (tmp_path / "lat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.axes
    static.plot_flops(save=tmp_path / "flops.svg")
    assert "<svg" in (tmp_path / "flops.svg").read_text()
    timed.plot_roofline(save=tmp_path / "roof.png")
    with pytest.raises(ModelProfError, match="timing=True"):
        static.plot_latency()


def test_json_is_strict_and_carries_the_measurement(tmp_path, timed):
    text = timed.to_json()
    doc = json.loads(text)  # strict JSON: no NaN literals
    assert "NaN" not in text
    assert isinstance(doc, dict)


def test_markdown_is_compact_by_default_and_labels_its_footer(timed):
    md = timed.to_markdown()
    header = [c.strip() for c in _table_lines(md)[0].split("|")[1:-1]]
    assert header == [
        "module",
        "type",
        "output shape",
        "params",
        "MACs",
        "FLOPs",
        "output",
        "latency",
        "FLOPs share",
        "latency share",
    ]
    lines = _table_lines(md)
    assert max(len(line) for line in lines) < 160  # readable, not 24 columns wide
    assert lines[-2].startswith("| total ") and lines[-1].startswith("| end-to-end (clean run) ")
    # the end-to-end cell is the clean median, not the instrumented (root) row above it
    from modelprof.render.units import format_time_ms

    assert format_time_ms(timed.latency.median_ms) in lines[-1]
    every = timed.to_markdown(columns="all")
    assert "MAdd" in every and "achieved FLOP/s" in every and "memory level" in every
    # "compact" (which the view options offer) names these columns, also in a raw format
    assert timed.to_markdown(columns="compact") == md
    compact = timed.to_csv(columns="compact").splitlines()[0].split(",")
    # a file keeps call, which a table shows in its label (diff matches rows by it)
    wanted = "module call type output_shape params macs flops output_bytes latency_ms flops_pct"
    assert compact == [*wanted.split(), "latency_pct"]
    # a grouped or torchstat table has no compact view: whole, its key column kept (review:
    # the compact columns of a grouped table lost the layer types)
    grouped = timed.to_text(group_by="layer_type")
    assert timed.to_text(columns="compact", group_by="layer_type") == grouped
    assert timed.to_csv(columns="compact", style="torchstat") == timed.to_csv(style="torchstat")


def test_group_by_layer_type_in_every_exporter(tmp_path, timed):
    table = timed.by_layer_type()
    assert {"conv", "norm", "activation", "pool", "linear", "elementwise"} <= set(table.index)
    assert int(table["flops"].sum()) == timed.totals["flops"]
    assert "latency_ms" in table.columns
    md = timed.to_markdown(group_by="layer_type")
    assert _table_lines(md)[0].split("|")[1].strip() == "layer type"
    assert "| elementwise " in md  # the residual "+ 1" of Net.forward, its (self) row
    tex = timed.to_latex(group_by="layer_type", width="columnwidth")
    assert "layer type" in tex and r"\begin{table}" in tex
    back = read_csv(timed.to_csv(tmp_path / "types.csv", group_by="layer_type"))
    assert list(back["layer_type"]) == list(table.index)
    with pytest.raises(ModelProfError, match="'kind'"):
        timed.to_markdown(group_by="kind")
    with pytest.raises(ModelProfError, match="depth="):
        timed.to_markdown(group_by="layer_type", depth=1)


def test_a_markdown_export_is_a_document_with_the_caption_and_summary(tmp_path, timed):
    # a newcomer's .md file was the bare table: no model, input, device or timing line
    from modelprof.render.markdown import prose

    md = timed.to_markdown()
    lines = md.splitlines()
    summary = timed.summary().splitlines()
    # (escaped as text: a loaded run's caption says which columns "~" marks rough)
    assert lines[0] == f"**{prose(timed._title())}**" and lines[1] == ""
    table = _table_lines(md)
    assert lines[2 : 2 + len(table)] == table and lines[2 + len(table)] == ""
    # then every summary line, listed
    assert lines[3 + len(table) :] == [f"- {prose(line)}" for line in summary]
    assert md.endswith("\n") and timed.export("md", tmp_path / "n.md").read_text() == md
    # standalone=False: the table under its caption (which says what "~" marks, as LaTeX's
    # and an HTML fragment's keep theirs), without the summary lines, as a cell of a larger
    # document takes it; said in a ViewOptions too (its unset default, None, let a report's
    # page default override a False); caption=None as well: the bare table
    from modelprof import ViewOptions

    captioned = lines[: 2 + len(table)]
    assert timed.to_markdown(standalone=False).splitlines() == captioned
    assert timed.to_markdown(view=ViewOptions(standalone=False)).splitlines() == captioned
    assert timed.to_markdown(standalone=False, caption=None).splitlines() == table
    assert timed.to_html(view=ViewOptions(standalone=False)).startswith("<div")


def test_markdown_prose_is_escaped_as_text():
    # a caption or note is text: markup in a model's name must not render as markup or HTML
    from modelprof.render.markdown import prose

    assert prose("a <img src=x> *b* [l](u) `c` ~~s~~") == (
        "a \\<img src=x\\> \\*b\\* \\[l\\](u) \\`c\\` \\~\\~s\\~\\~"
    )
    # an underscore inside a word is none (GitHub's Markdown), one that opens or closes is,
    # and a run of them (__main__) is escaped whole
    assert prose("latency_x _em_") == "latency_x \\_em\\_"
    assert prose("__main__.Net") == "\\_\\_main\\_\\_.Net"
    # nor does a line open a heading or a nested list, or name an entity; no padding inside **
    assert prose("# h") == "\\# h" and prose("- y") == "\\- y"
    assert prose("1. base failed") == "1\\. base failed" and prose("2) x") == "2\\) x"
    assert prose("a &amp; b") == "a \\&amp; b" and prose(" padded ") == "padded"
    assert prose("a\\b\nc") == "a\\\\b c"


def test_torchstat_style_takes_a_depth(static):
    full = static.to_dataframe("torchstat")
    collapsed = static._torchstat_frame(1)
    names = list(collapsed["module name"])
    # depth 1: the leaves above depth 1 and the depth-1 modules themselves, then the total
    assert names == ["features", "head", "(self)", "total"]
    # the total row is unchanged by collapsing (each row sums its subtree), torchstat's
    # memory(MB) too: it showed the depth-1 rows' own outputs, a total that fell with depth
    keep = ["params", "MAdd", "Flops", "MemRead(B)", "MemWrite(B)", "MemR+W(B)", "memory(MB)"]
    pd.testing.assert_series_equal(collapsed.iloc[-1][keep], full.iloc[-1][keep], check_names=False)
    # features' memory: its three leaves' outputs, 8 x 16 x 16 float32 = 8,192 B each, 3 x 8,192
    # = 24,576 B = 0.0234375 MiB (its own output alone, 8,192 B, was 0.0078125)
    features = collapsed.set_index("module name").loc["features"]
    assert features["memory(MB)"] == 3 * 8 * 16 * 16 * 4 / 2**20
    text = static.to_text(style="torchstat", depth=1)
    assert "features" in text and "features.0" not in text
    # a numpy integer depth (a loop over np.arange) is taken, as by every other style
    assert static.to_text(style="torchstat", depth=np.int64(1)) == text


def test_a_collapsed_torchstat_durations_sum_the_leaves_shares(timed):
    # with depth=1 a parent's duration was its own span's share, its total other than the
    # leaves' (depth=None's): each row now sums the shares of the leaves below it
    full = timed.to_dataframe("torchstat").set_index("module name")["duration[%]"]
    collapsed = timed._torchstat_frame(1).set_index("module name")["duration[%]"]
    # features: the shares of features.0, .1 and .2; the total: of every leaf, as depth=None's
    leaves = [f"features.{i}" for i in range(3)]
    assert collapsed["features"] == pytest.approx(full[leaves].sum(), rel=1e-12)
    assert collapsed["total"] == pytest.approx(full["total"], rel=1e-12)


def test_torchstat_top_k_ranks_the_layers_and_keeps_the_total_last(static):
    csv = static.to_csv(style="torchstat", top_k=2)
    names = [line.split(",")[0] for line in csv.splitlines()[1:]]
    # Net's leaves by torchstat's Flops: the conv 8 x 16 x 16 outputs x 3 x 3 x 3 = 55,296, the
    # affine batch norm 2 x 2,048 elements = 4,096, the Linear 8 x 4 = 32. The two first, then
    # the total, which is no layer to rank (it ranked first and took a place)
    assert names == ["features.0", "features.1", "total"]
    by_params = static.to_csv(style="torchstat", top_k=1, sort_by="params")
    # params: the conv's 8 x 3 x 3 x 3 + 8 = 224, the most of any layer
    assert [r.split(",")[0] for r in by_params.splitlines()[1:]] == ["features.0", "total"]


def test_html_export_is_a_page_and_the_notebook_view_is_not_clipped(tmp_path, timed):
    path = timed.to_html(tmp_path / "r.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page
    # the tab's title is short (it was the whole caption, ~300 characters on a loaded run);
    # the caption stays in the page, above the table
    assert "<title>modelprof: Net</title>" in page and "<h1>modelprof: Net</h1>" in page
    assert "<caption>Net, input 1x3x16x16" in page and "latency median" in page
    assert "max-height" not in page
    fragment = timed._repr_html_()
    assert "max-height" not in fragment and "<!DOCTYPE" not in fragment
    assert "head.2" in fragment  # the last row is there: nothing cut off


def test_latex_defaults_fit_the_page_and_name_the_packages(timed):
    tex = timed.to_latex(label="tab:net")
    # xcolor only for greyed (rough) cells: per-layer times from too few passes or from windows
    # that disagree, which a loaded machine can cause
    packages = "booktabs,xcolor" if timed.layers_rough else "booktabs"
    assert tex.startswith(rf"% modelprof table: needs \usepackage{{{packages}}}")
    # a shape with a times sign, as a paper sets it
    assert r"\caption{Net, input 1$\times$3$\times$16$\times$16, float32 on" in tex
    assert r"\label{tab:net}" in tex
    assert r"\begin{table*}" in tex
    assert "end-to-end (clean run)" in tex
    d1 = timed.to_latex(depth=1)
    assert "features.0" not in d1 and "features &" in d1


def test_group_by_refuses_depth_and_the_torchstat_style(static):
    with pytest.raises(ModelProfError, match="depth= does not apply"):
        static.to_text(group_by="layer_type", depth=1)
    with pytest.raises(ModelProfError, match="sums the modelprof view"):
        static.to_csv(group_by="module_type", style="torchstat")
    # the torchstat view collapses to depth 1 itself: its rows still add up to its total
    assert "total" in static.to_text(style="torchstat", depth=1)


def test_a_view_given_as_viewoptions_keeps_its_style(static):
    view = ViewOptions(style="torchstat")
    # the torchstat table (its "module name" column) with its FLOPs line, as style= gives
    assert static.to_text(view=view) == static.to_text(style="torchstat")
    assert "module name" in static.to_text(view=view)
    assert "module name" not in static.to_text(view=view, style="modelprof")  # a keyword wins


def test_view_options_are_checked_when_made():
    # as profile's keywords are: a bad value is named where it is written, not at first use
    with pytest.raises(ModelProfError, match="depth must be a non-negative integer, got 'two'"):
        ViewOptions(depth="two")
    with pytest.raises(ModelProfError, match="top_k must be a positive integer, got -3"):
        ViewOptions(top_k=-3)
    with pytest.raises(ModelProfError, match=r"units must be one of \['human', 'fixed', 'raw'\]"):
        ViewOptions(units="SI")
    with pytest.raises(ModelProfError, match="depth must be a non-negative integer, got True"):
        ViewOptions().replace(depth=True)
    assert ViewOptions(depth=np.int64(2), top_k=1, units="raw").depth == 2  # numpy ints are ints


def test_by_module_type_sums_the_leaf_calls_per_class():
    r = profile(nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 2)), (4,), timing=False)
    by = r.by_module_type()
    assert by.loc["Linear", "calls"] == 2
    assert by.loc["Linear", "params"] == 16  # (4*2 + 2) + (2*2 + 2)
    assert by.loc["Linear", "macs"] == 12  # 4*2 + 2*2
    assert by["flops"].sum() == r.totals["flops"]  # the leaves are every leaf call
    # shares of the totals: the Linears hold every MAC (ReLU has none)
    assert by.loc["Linear", "macs_pct"] == 100.0 and by.loc["ReLU", "macs_pct"] == 0.0


def test_by_module_type_sums_the_leaves_latency_like_by_layer_type():
    # timed, each class's latency is the sum of its leaf rows' (before, the view had no time
    # at all), with its share and its rough flag as by_layer_type gives them per kind
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    r = profile(model, (8,), repeat=5, warmup=1, roofline=False, warn=False)
    df = r.to_dataframe()
    linears = df[df["leaf"] & (df["type"] == "Linear")]
    by = r.by_module_type()
    assert by.index.name == "type" and by.loc["Linear", "calls"] == 2
    assert by.loc["Linear", "latency_ms"] == pytest.approx(linears["latency_ms"].sum())
    assert by.loc["Linear", "latency_pct"] == pytest.approx(linears["latency_pct"].sum())
    assert by.loc["Linear", "latency_rough"] == bool(linears["latency_rough"].any())
    # the same sums as by_layer_type's, whose kinds here are one class each
    kinds = r.by_layer_type()
    assert by.loc["Linear", "latency_ms"] == pytest.approx(kinds.loc["linear", "latency_ms"])
    assert list(by.columns) == list(kinds.columns)


def test_every_to_format_of_a_report_writes_the_path_it_is_given(tmp_path):
    """``to_<format>(path)`` writes the file for every registered format, ``to_text`` (which
    the report defines itself) included; ``FitReport.to_text(path)`` too."""
    import importlib.util

    from modelprof.fit import fit
    from modelprof.render.formats import table_formats

    report = profile(nn.Linear(4, 3), (4,), timing=False)
    for fmt in table_formats():
        if fmt.needs and importlib.util.find_spec(fmt.needs) is None:
            continue
        path = tmp_path / f"table.{fmt.suffix}"
        assert getattr(report, f"to_{fmt.name}")(path) == path, fmt.name
        assert path.read_text(encoding="utf-8").strip(), fmt.name
    text = report.to_text(tmp_path / "ts.txt", style="torchstat")
    assert text.read_text(encoding="utf-8") == report.to_text(style="torchstat") + "\n"
    plan = fit(nn.Linear(4, 3), training=False)
    assert plan.to_text(tmp_path / "fit.txt").read_text() == plan.to_text() + "\n"
