"""``compare``: one row per model, closed-form totals, ratios to the baseline, rendering."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import latex_headers, ratio_flag_holds
from torch import nn

from modelprof.compare import Comparison, compare
from modelprof.errors import ModelProfError, ModelProfWarning
from modelprof.profile import profile
from modelprof.render.comparison import env_caption


def _pair() -> dict[str, nn.Module]:
    return {"narrow": nn.Linear(10, 20), "wide": nn.Linear(10, 40)}


def test_closed_form_totals_and_ratios() -> None:
    df = compare(_pair(), (10,), timing=False)
    assert isinstance(df, pd.DataFrame)
    assert list(df.index) == ["narrow", "wide"]
    # Linear(10, n) on one sample: n outputs, 10 MACs each -> 10*20 = 200 and 10*40 = 400
    assert df.loc["narrow", "macs"] == 200
    assert df.loc["wide", "macs"] == 400
    # params: 10*n weights + n biases -> 220 and 440
    assert df.loc["narrow", "params"] == 220
    assert df.loc["wide", "params"] == 440
    # output: 1 x n float32 -> 20*4 = 80 B and 40*4 = 160 B
    assert df.loc["narrow", "output_bytes"] == 80
    assert df.loc["wide", "output_bytes"] == 160
    # baseline = first model: macs_x = 400 / 200 = 2.0, params_x = 440 / 220 = 2.0
    assert df.attrs["baseline"] == "narrow"
    assert df.loc["wide", "macs_x"] == 2.0
    assert df.loc["wide", "params_x"] == 2.0
    assert df.loc["narrow", "macs_x"] == 1.0
    assert df.loc["narrow", "input_shape"] == "1x10"
    # no timing asked: no latency columns at all (rather than a column of NaN)
    assert not any(c.startswith("latency") for c in df.columns)


def test_named_baseline() -> None:
    df = compare(_pair(), (10,), baseline="wide", timing=False)
    # 200 / 400 = 0.5
    assert df.loc["narrow", "macs_x"] == 0.5
    assert df.loc["wide", "macs_x"] == 1.0


def test_unknown_baseline_names_the_choices() -> None:
    with pytest.raises(ModelProfError, match=r"baseline='huge'.*narrow"):
        compare(_pair(), (10,), baseline="huge", timing=False)


def test_batch_size_is_shared() -> None:
    df = compare(_pair(), (10,), batch_size=4, timing=False)
    # 4 samples: 4*200 = 800 MACs; output 4*20 floats = 320 B
    assert df.loc["narrow", "macs"] == 800
    assert df.loc["narrow", "output_bytes"] == 320
    assert df.loc["narrow", "input_shape"] == "4x10"
    assert df.attrs["env"]["batch_size"] == 4


def test_list_of_modules_is_named_by_class_without_collisions() -> None:
    df = compare([nn.Linear(10, 20), nn.Linear(10, 30), nn.Identity()], (10,), timing=False)
    assert list(df.index) == ["Linear", "Linear (2)", "Identity"]
    # 10*30 / (10*20) = 1.5
    assert df.loc["Linear (2)", "macs_x"] == 1.5


def test_a_list_names_its_models_as_profile_names_each() -> None:
    # resnet18 and resnet34 share the class ResNet: rows "ResNet", "ResNet (2)" told a paper
    # nothing; profile's rule (the builder whose weights have that many parameters) names them
    import torchvision

    models = [torchvision.models.resnet18(), torchvision.models.resnet34()]
    df = compare(models, (3, 32, 32), timing=False)
    assert list(df.index) == ["resnet18", "resnet34"]
    assert profile(models[0], (3, 32, 32), timing=False).display_name == "resnet18"
    # torch.compile(m) is named by m, not by its wrapper (OptimizedModule)
    compiled = torch.compile(nn.Linear(10, 20))
    assert list(compare([compiled], (10,), timing=False).index) == ["Linear"]
    assert profile(compiled, (10,), timing=False).model_name == "Linear"


def test_inputs_instead_of_input_size() -> None:
    df = compare(_pair(), inputs=torch.randn(3, 10), timing=False)
    # 3 samples: 3*10*40 = 1200 MACs
    assert df.loc["wide", "macs"] == 1200
    assert df.loc["wide", "input_shape"] == "3x10"


def test_tensors_in_the_second_place_are_the_inputs_as_in_profile() -> None:
    # compare(models, x), like profile(model, x): x is the inputs, not a shape (each model
    # failed with "input_size=Tensor[3x10, float32] must be a tuple of ints")
    for given in (torch.randn(3, 10), (torch.randn(3, 10),)):
        df = compare(_pair(), given, timing=False)
        assert "error" not in df.columns
        # 3 samples: 3*10*20 = 600 and 3*10*40 = 1200 MACs
        assert df.loc["narrow", "macs"] == 600 and df.loc["wide", "macs"] == 1200
        assert df.loc["wide", "input_shape"] == "3x10"
    with pytest.raises(ModelProfError, match="not both"):
        compare(_pair(), torch.randn(3, 10), inputs=torch.randn(3, 10), timing=False)
    # a dict keyed by the models' names is their sizes, one each, also where one holds a
    # tensor (the whole dict was taken as keyword inputs: Linear.forward() got 'narrow', and
    # every model failed); the tensor fails its own model's row
    with pytest.warns(ModelProfWarning, match="wide failed"):
        df = compare(_pair(), {"narrow": (10,), "wide": torch.randn(3, 10)}, timing=False)
    assert df.loc["narrow", "macs"] == 200  # 1x10x20
    assert "must be a tuple of ints" in df.loc["wide", "error"]


def test_input_size_per_model() -> None:
    models = {"a": nn.Linear(10, 20), "b": nn.Conv1d(1, 2, 3)}
    df = compare(models, {"a": (10,), "b": (1, 12)}, timing=False)
    # Conv1d(1, 2, 3) on length 12: 10 outputs x 2 channels x 3 taps = 60 MACs
    assert df.loc["b", "macs"] == 60
    # 60 / 200 = 0.3
    assert df.loc["b", "macs_x"] == pytest.approx(0.3)


def test_specs_run_at_their_own_input_size(tmp_path: Path) -> None:
    f = tmp_path / "nets.py"
    f.write_text(
        "from torch import nn\nINPUT_SIZE = (6,)\ndef small():\n    return nn.Linear(6, 5)\n"
    )
    # a file's factory is named by file and factory (nets_small), a module by its class
    sizes = {"nets_small": None, "Linear": (10,)}
    df = compare([f"{f}:small", nn.Linear(10, 20)], sizes, timing=False)
    # the spec's INPUT_SIZE (6,) is used: 6*5 = 30 MACs
    assert df.loc["nets_small", "macs"] == 30
    assert df.loc["nets_small", "input_shape"] == "1x6"
    # a size by a name no model has was dropped without a word (the spec's own size taken)
    with pytest.raises(ModelProfError, match=r"input_size names \['small'\], not among the mod"):
        compare([f"{f}:small", nn.Linear(10, 20)], {"small": (6,), "Linear": (10,)})
    with pytest.raises(ModelProfError, match=r"\(Linaer: did you mean Linear\?\)"):
        compare([f"{f}:small", nn.Linear(10, 20)], {"Linaer": (10,)})


def test_missing_input_size_names_the_model() -> None:
    with pytest.raises(ModelProfError, match="model 'narrow' needs an input size"):
        compare(_pair(), timing=False)


def test_errors_stay_in_the_models_row() -> None:
    # wide takes 11 features, not 10: its row holds the error, narrow's its 10 x 20 = 200 MACs
    df = compare({"narrow": nn.Linear(10, 20), "wide": nn.Linear(11, 40)}, (10,), timing=False)
    assert "cannot be multiplied" in df.loc["wide", "error"] and df.loc["narrow", "macs"] == 200


@pytest.mark.parametrize("models", [[], {}, "resnet18", 3])
def test_bad_models_argument(models: object) -> None:
    with pytest.raises(ModelProfError):
        compare(models, (10,), timing=False)  # type: ignore[arg-type]


def test_rendering_humanises_but_keeps_numbers() -> None:
    from modelprof.render import to_markdown

    df = compare(_pair(), (10,), timing=False)
    text = str(to_markdown(df))
    assert "| wide " in text and "160 B" in text  # output_bytes of wide, with its unit
    assert df.loc["wide", "output_bytes"] == 160  # the frame itself stays numeric
    assert isinstance(df, Comparison)
    html = df._repr_html_()
    # the notebook shows the compact columns: params 440 of wide and its ratio 440 / 220 = 2
    assert "<table" in html and '<td class="r">440</td>' in html and "2.00×" in html
    assert "160 B" not in html  # output bytes: with columns="all"
    assert "160 B" in str(df.render.to_html(columns="all", standalone=False))
    assert env_caption(df.attrs["env"]) in html  # the environment is the caption
    # columns named by an Index or an array, in every format (a fitted LaTeX one scales)
    for named in (pd.Index(["params", "macs"]), np.array(["params", "macs"])):
        for fmt in ("latex", "markdown", "text"):
            assert "MACs" in str(df.render.export(fmt, columns=named))
    # columns inside view= are the keyword's (they were replaced by the compact ones), and
    # "compact", which the options offer, names the compact columns in every format
    from modelprof import ViewOptions

    only = df.render.to_markdown(view=ViewOptions(columns=["macs"]))
    # 10*20, 10*40, each row named by its model (the index) though columns= left it out
    assert "\n| model   |   MACs |\n|:--------|-------:|\n| narrow  |    200 |\n" in only
    assert df.render.to_markdown(columns="compact") == df.render.to_markdown()
    header = df.render.to_csv(columns="compact").splitlines()[0]
    assert header == "model,input_shape,params,macs,flops,params_x,macs_x"  # untimed: no latency
    assert df.render.to_csv().splitlines()[0].count(",") > header.count(",")
    # a per-layer table's views are refused, not dropped (they printed the plain table)
    for option in (dict(group_by="layer_type"), dict(style="torchstat")):
        with pytest.raises(ModelProfError, match="is a per-layer table's view; a comparison's"):
            df.render.to_markdown(**option)
    # derived frames are comparisons that keep attrs
    sub = df[["macs", "macs_x"]]
    assert type(sub) is Comparison and sub.attrs["baseline"] == "narrow"


def test_env_caption() -> None:
    env = {
        "device": "cuda:0",
        "device_name": "NVIDIA H100",
        "dtype": "float16",
        "batch_size": 8,
        "torch_version": "2.14.1",
        "other": 1,
    }
    assert env_caption(env) == "cuda:0 (NVIDIA H100), float16, batch 8, torch 2.14.1"
    assert env_caption({}) == ""


def test_plots_of_a_comparison() -> None:
    pytest.importorskip("matplotlib")
    from modelprof.report.plots import plot_compare

    df = compare(_pair(), (10,), timing=False)
    fig = plot_compare(df)
    # no timing: the params and FLOPs panels, one bar per model
    assert [ax.get_title() for ax in fig.axes] == ["params", "FLOPs"]
    assert len(fig.axes[0].patches) == 2


def test_timing_columns_and_latency_ratio() -> None:
    df = compare(_pair(), (10,), timing=True, budget_s=0.1, warmup_s=0.05)
    for column in ("latency_median_ms", "latency_p90_ms", "latency_std_ms", "fps", "latency_x"):
        assert column in df.columns
    assert (df["latency_median_ms"] > 0).all()
    assert df.loc["narrow", "latency_x"] == 1.0
    # fps = batch / median seconds
    assert df.loc["wide", "fps"] == pytest.approx(1000.0 / df.loc["wide", "latency_median_ms"])
    # latency_x is the quotient of the medians shown beside it (so both rank alike), flagged
    # rough exactly where it lies far outside its per-round ratios' interval beside it (NaN
    # when the budget left a single round); the baseline's is 1.0
    wide = df.loc["wide"]
    assert wide["latency_x"] == pytest.approx(
        wide["latency_median_ms"] / df.loc["narrow", "latency_median_ms"], rel=1e-12
    )
    assert ratio_flag_holds(wide, "latency_x")
    assert df.loc["narrow", "latency_x_ci_low"] == df.loc["narrow", "latency_x_ci_high"] == 1.0
    assert df.attrs["env"]  # recorded once for the whole frame


def test_throughput_columns() -> None:
    df = compare(
        _pair(),
        (10,),
        timing=False,
        throughput=True,
        throughput_options={"max_batch": 2, "budget_s": 0.05},
    )
    assert set(df["throughput_batch_size"]) <= {1, 2}  # the search stops at max_batch=2
    assert (df["throughput_samples_per_s"] > 0).all()
    assert df.loc["narrow", "throughput_x"] == 1.0
    # the readable table shows the batch size the best throughput was found at
    header = df.render.to_markdown(standalone=False, caption=None).splitlines()[0]
    assert "throughput (samples/s)" in header and "throughput batch" in header
    with pytest.raises(ModelProfError, match="needs input_size"):
        compare(_pair(), inputs=torch.randn(1, 10), timing=False, throughput=True)


def test_comparison_render_exporters_match_a_reports(tmp_path) -> None:
    from modelprof.render import read_csv, read_json

    df = compare(_pair(), (10,), timing=False)
    md = df.render.to_markdown()
    lines = md.splitlines()
    # a document: the caption (the baseline) in bold, then the table; untimed, no notes to list
    assert lines[0].startswith("**baseline narrow;") and lines[1] == ""
    assert lines[2].split("|")[1].strip() == "model" and lines[-1].startswith("| wide ")
    # standalone=False, as a keyword or in a ViewOptions: the table under its caption (as
    # LaTeX and an HTML fragment keep theirs), no notes (untimed: the document has none)
    from modelprof import ViewOptions

    bare = lines[2:]
    assert df.render.to_markdown(standalone=False).splitlines() == lines
    assert df.render.to_markdown(view=ViewOptions(standalone=False)).splitlines() == lines
    # a caption in a ViewOptions wins over the baseline caption, as a keyword does; a keyword
    # caption=None (ViewOptions' own default) asks for none
    mine = df.render.to_markdown(view=ViewOptions(caption="Table 2: mine")).splitlines()
    assert mine[0] == "**Table 2: mine**" and "baseline narrow" not in "\n".join(mine)
    assert df.render.to_markdown(caption=None, standalone=False).splitlines() == bare
    assert not df.render.to_markdown(caption=None).startswith("**")
    # wide: params 440, MACs 400, macs ratio 400 / 200 = 2; no pandas float like 2.000000
    assert re.search(r"\| wide +\| 1x10 +\| +440 \| +400 \|", md) and "2.00×" in md
    assert "madd" not in md.lower()  # compact columns unless columns="all"
    assert "MAdd" in df.render.to_markdown(columns="all")
    tex = df.render.to_latex(label="tab:cmp")
    assert tex.startswith("% modelprof table") and r"\label{tab:cmp}" in tex
    assert "baseline narrow" in tex  # the caption names the baseline
    page = df.render.to_html()
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page
    assert "baseline narrow" in df.render.to_text().splitlines()[0]
    back = read_csv(df.render.to_csv(tmp_path / "c.csv"))
    assert list(back["model"]) == ["narrow", "wide"] and list(back["macs"]) == [200, 400]
    table, _, env = read_json(df.render.to_json(tmp_path / "c.json"))
    assert env["baseline"] == "narrow" and list(table["macs_x"]) == [1.0, 2.0]


def test_a_comparisons_pandas_methods_are_pandas(tmp_path) -> None:
    # compare() returns a DataFrame: its own exporters do what pandas documents (raw numbers,
    # the index written, no units); modelprof's humanised ones are under .render
    df = compare(_pair(), (10,), timing=False)
    plain = pd.DataFrame(df)
    assert df.to_csv() == plain.to_csv()
    assert df.to_json() == plain.to_json()
    assert df.to_html() == plain.to_html()
    assert df.to_latex() == plain.to_latex()
    assert "×" not in df.to_csv() and "narrow,1x10" in df.to_csv().replace(" ", "")
    assert df[["macs"]].to_csv() == plain[["macs"]].to_csv()  # a derived one's too


def test_a_sorted_or_filtered_comparison_keeps_its_render() -> None:
    # a paper author sorted and filtered the table, then exported it: 'DataFrame' object has
    # no attribute 'render'. narrow: 200 MACs, wide: 400 (Linear(10, n): 10 x n)
    df = compare(_pair(), (10,), timing=False)
    derived = {
        "sort": df.sort_values("macs", ascending=False),
        "copy": df.copy(),
        "loc": df.loc[["wide"]],
        "head": df.head(1),
        "drop": df.drop(columns=["params"]),
        "round": df.round(2),
    }
    for name, d in derived.items():
        assert type(d) is Comparison and d.attrs["baseline"] == "narrow", name
        assert "baseline narrow" in d.render.to_latex(), name  # its caption, from its attrs
    bare = lambda d: d.render.to_markdown(standalone=False, caption=None)  # noqa: E731
    rows = lambda d: [line.split("|")[1].strip() for line in bare(d).splitlines()[2:]]  # noqa: E731
    assert rows(derived["sort"]) == ["wide", "narrow"] and rows(derived["loc"]) == ["wide"]
    head = bare(derived["drop"]).splitlines()[0]
    assert "params" not in [h.strip() for h in head.split("|")] and "params ratio" in head
    # a selection of columns none of which is a default one shows them all: narrow's MAdd,
    # 10 multiplies and 9 adds per output, (2 x 10 - 1) x 20 = 380
    madd = bare(df[["madd"]])
    assert "MAdd" in madd.splitlines()[0] and "380" in madd.splitlines()[2]
    # a column the call names but the table lost: the error names it
    with pytest.raises(ModelProfError, match=r"unknown column\(s\) \['macs'\]"):
        df.drop(columns=["macs"]).render.to_markdown(columns=["params", "macs"])
    # two tables side by side (a name twice): refused, naming it; a notebook shows pandas' table
    twice = pd.concat([df[["params"]], df[["params"]]], axis=1)
    with pytest.raises(ModelProfError, match=r"\['params'\] appear more than once"):
        twice.render.to_markdown()
    assert "<table" in twice._repr_html_() and "<table" in df.T._repr_html_()
    # columns that are no names (a transposed table without its model index: 0, 1): refused
    # naming them, where they raised a bare KeyError '0', also in a notebook's display
    numbered = df.reset_index(drop=True).T
    with pytest.raises(ModelProfError, match=r"\[0, 1\] are not names"):
        numbered.render.to_text()
    assert "<table" in numbered._repr_html_()


class _SpinBackward(torch.autograd.Function):
    """Identity forward; a backward that spins 3 ms of the calling thread's CPU time (busy-wait,
    no tensor op; autograd runs a CPU backward on the calling thread): in wall time never less,
    however long it waits for a core."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        end = time.thread_time_ns() + 3_000_000
        while time.thread_time_ns() < end:
            pass
        return grad


class _SpinGrad(nn.Module):
    def forward(self, x):
        return _SpinBackward.apply(x)


def test_backward_ratio_is_the_ratio_of_the_backward_medians(one_thread) -> None:
    # backward=True: as latency_x, backward_latency_x is the quotient of the two backward
    # medians in the table (one 3 ms spin against two), with its paired interval around it
    torch.manual_seed(0)
    one = nn.Sequential(nn.Linear(4, 4), _SpinGrad(), nn.Linear(4, 4))
    two = nn.Sequential(nn.Linear(4, 4), _SpinGrad(), _SpinGrad(), nn.Linear(4, 4))
    df = compare({"one": one, "two": two}, (4,), backward=True, repeat=6, warmup=1, roofline=False)
    med = df["backward_latency_median_ms"]
    row = df.loc["two"]
    assert row["backward_latency_x"] == pytest.approx(med["two"] / med["one"], rel=1e-12)
    assert ratio_flag_holds(row, "backward_latency_x")
    # on the CPU the backward's CPU work beside it (one thread's: thread_time), its ratio the
    # quotient of those medians; two spins' work more, (6 + e) / (3 + e) > 1 on any machine
    cpu = df["backward_cpu_work_median_ms"]
    assert row["backward_cpu_work_x"] == pytest.approx(cpu["two"] / cpu["one"], rel=1e-12)
    assert row["backward_cpu_work_x"] > 1.0 and df.loc["one", "backward_cpu_work_x"] == 1.0
    # and the whole step's paired ratio, the quotient of the step medians shown
    step = df["step_latency_median_ms"]
    assert row["step_latency_x"] == pytest.approx(step["two"] / step["one"], rel=1e-12)
    assert ratio_flag_holds(row, "step_latency_x")
    assert df.loc["one", "step_latency_x"] == 1.0
    # Two spins take longer than one on the wall clock too where nothing waited for a core:
    # one's backward then reads at most 1.15 x (3 + e) ms, two's never less than 6 + e ms,
    # above it for any e < 17 ms. A wait of 4-8 ms for a core, longer than the 3 ms between
    # them, can reverse 6 rounds' medians (an audit's run under load 6 read the step at 0.87x);
    # the step, its forward and optimizer 0.1 ms of Linear(4, 4), has no load flag of its own:
    # its backward's and its forward's stand for it
    loaded = df["loaded"].any() or any("ran on a loaded machine" in n for n in df.attrs["notes"])
    if not loaded:
        assert row["backward_latency_x"] > 1.0 and row["step_latency_x"] > 1.0
    # fps and rank come from the forward alone (the spins are in the backward): a note says so
    assert any(
        n.startswith("latency_median_ms, fps, latency_x and rank: the forward")
        for n in df.attrs["notes"]
    )


def _timed_frame(**attrs) -> pd.DataFrame:
    """A two-model comparison as compare() writes it, ranked by latency."""
    df = pd.DataFrame(
        {
            "params": [11_689_512, 2_542_856],
            "macs": [148_560_000, 6_520_000],
            "latency_median_ms": [55.4, 17.8],
            "latency_ci_low_ms": [54.1, 17.2],
            "latency_ci_high_ms": [56.9, 18.3],
            "latency_x": [1.0, 0.322],
            "latency_x_ci_low": [1.0, 0.31],
            "latency_x_ci_high": [1.0, 0.33],
            "rank": [2, 1],
        },
        index=pd.Index(["resnet18", "mobilenet_v3_small"], name="model"),
    )
    df.attrs.update(baseline="resnet18", ranked_by="latency", **attrs)
    return df


def test_a_latex_caption_speaks_of_the_columns_kept_and_of_the_load() -> None:
    from modelprof.render.comparison import compare_caption, export_comparison

    df = _timed_frame()
    # a page's width keeps every column here: the caption names the intervals and the rank
    wide = export_comparison(df, "latex", width=None)
    assert "95 \\% CI paired by round" in wide and "rank (1 = lowest latency)" in wide
    # the text width (345 pt) keeps model, params, MACs, median, ratio and rank (291 pt, a
    # name of two words over two lines): the intervals (both bounds of each) go, and the
    # caption no longer speaks of them (the rank, dropped with them before though it fits,
    # comes back into the room they leave)
    narrow = export_comparison(df, "latex", width="textwidth")
    assert [h.partition(" (")[0] for h in latex_headers(narrow)] == [
        "model",
        "params",
        "MACs",
        "latency median",
        "latency ratio",
        "rank",
    ]
    caption = next(line for line in narrow.splitlines() if line.startswith("\\caption"))
    assert caption == (
        "\\caption{baseline resnet18; ratios: ratio of medians; rank (1 = lowest latency)}"
    )
    # a column's width (229.5 pt) keeps a paper's efficiency table: model, params, MACs and the
    # latency median (218 pt); the ratio and the rank go first (a paper author's comparison
    # kept the ratios and the rank and dropped params and MACs)
    column = export_comparison(df, "latex", width="columnwidth")
    assert [h.partition(" (")[0] for h in latex_headers(column)] == [
        "model",
        "params",
        "MACs",
        "latency median",
    ]
    # what made the timing less sure reaches the caption, so the paper table says it too
    text = compare_caption(
        _timed_frame(
            loaded="other work took 1.00 cores' worth of the cores it needed",
            drifted=["resnet18"],
            tied="tied in rank (the interval of their paired ratio holds 1): a, b",
        ).attrs
    )
    assert "timed on a loaded machine (other work took 1.00 cores' worth" in text
    assert "drifted while timed: resnet18" in text and "tied in rank" in text
    # a tie said in the caption is not listed again among a document's notes; without the
    # rank column (named away) the caption does not speak of ranks
    tied = "tied in rank (the interval of their paired ratio holds 1): resnet18, mobilenet"
    doc = export_comparison(_timed_frame(tied=tied, notes=[tied]), "markdown")
    assert doc.count("tied in rank") == 1
    unranked = ["params", "latency_median_ms", "latency_x"]
    column = export_comparison(_timed_frame(tied=tied), "latex", columns=unranked)
    assert "tied in rank" not in column
    assert "tied in rank" in export_comparison(_timed_frame(tied=tied), "latex")
    # columns="all" asks for every column as a list does (MAdd, bytes, p90...): kept, the
    # table scaled; fit="columns" drops to the width instead
    every = export_comparison(df, "latex", columns="all", width="textwidth")
    assert "\\resizebox" in every and "% dropped to fit" not in every
    assert f"({len(df.columns) + 1} columns)" in every  # and the index, as model
    fitted = export_comparison(df, "latex", columns="all", width="textwidth", fit="columns")
    assert "\\resizebox" not in fitted and "% dropped to fit" in fitted


def test_a_tie_after_the_budget_ended_the_runs_says_a_larger_budget_may_order_them() -> None:
    # two models with the same samples round by round: every paired ratio is 1, so they tie;
    # where the budget (not the precision) ended the runs, more time could tell them apart
    from types import SimpleNamespace

    from modelprof.compare import _timing_attrs
    from modelprof.timing.measurement import Measurement

    blocks = np.repeat(np.arange(8), 5)
    samples = 10.0 + np.random.default_rng(0).normal(0.0, 0.5, 40)

    def attrs(stop: str) -> dict:
        ms = {n: Measurement(samples, blocks=blocks, stop_reason=stop) for n in "ab"}
        return _timing_attrs(
            SimpleNamespace(ranked_by="latency", loaded=False, measurements=ms), {}
        )

    budget, precise = attrs("budget"), attrs("precision")
    assert budget["tied"].endswith(
        "; the time budget ended the runs: a larger budget_s may order them"
    )
    assert precise["tied"].startswith("tied in rank") and "budget" not in precise["tied"]
    assert budget["ranks"] == {"a": 1, "b": 1}


def test_a_paper_table_keeps_what_the_comparison_ranks_by_and_a_training_steps_times() -> None:
    from modelprof.render.comparison import compact_compare_columns, export_comparison

    # ranked by CPU work (a loaded CPU): the notes say to quote the CPU work, so a page keeps
    # its median after the counts and the wall clock's, before the rank and any ratio (a
    # newcomer's generation table kept ttft_x and dropped every CPU column; a paper author's
    # kept the CPU work and the ratios and dropped params, MACs and FLOPs)
    df = _timed_frame().assign(cpu_work_median_ms=[50.1, 16.9], cpu_work_x=[1.0, 0.337])
    df.attrs["ranked_by"] = "cpu_work"
    page = [h.partition(" (")[0] for h in latex_headers(export_comparison(df, "latex"))]
    # 305 pt of 345: the ratios (CPU work's 55 pt, latency's 42 pt with the 5 % margin) do
    # not fit in the 40 pt left
    assert page == ["model", "params", "MACs", "latency median", "CPU work median", "rank"]
    # not ranked at all (too few runs): the CPU work goes after every other column
    df.attrs["unranked"] = "cannot rank the models: too few runs for an interval (a n=1)"
    page = [h.partition(" (")[0] for h in latex_headers(export_comparison(df, "latex"))]
    assert page == ["model", "params", "MACs", "latency median", "latency ratio", "rank"]
    # a training step's comparison shows its backward and whole-step times and the backward's
    # ratio among the compact columns (they were in the frame only)
    step = _timed_frame().assign(
        backward_latency_median_ms=[110.2, 40.3],
        backward_latency_x=[1.0, 0.366],
        step_latency_median_ms=[190.0, 70.1],
    )
    shown = compact_compare_columns(step)
    assert {"backward_latency_median_ms", "backward_latency_x", "step_latency_median_ms"} <= set(
        shown
    )
    assert "backward latency median" in export_comparison(step, "markdown", standalone=False)
    # and a page keeps them before the forward's (a newcomer's training comparison in LaTeX
    # kept the forward's median and ratio alone)
    small = export_comparison(step, "latex", font_size="small")
    page = [h.partition(" (")[0] for h in latex_headers(small)]
    assert page == [
        "model",
        "params",
        "MACs",
        "backward latency median",
        "step latency median",
        "rank",
    ]  # (the forward's median and the ratios went first: 344 pt of 345 kept)
    # by default \small's page lost a median, a column a paper keeps, which \footnotesize
    # keeps (324 pt of 345), giving up the rank instead
    tex = export_comparison(step, "latex")
    page = [h.partition(" (")[0] for h in latex_headers(tex)]
    assert "\\footnotesize\n" in tex and page == [
        "model",
        "params",
        "MACs",
        "latency median",
        "backward latency median",
        "step latency median",
    ]


def test_a_latex_table_ranked_by_cpu_work_keeps_the_headline_figures_before_intervals() -> None:
    # a newcomer's loaded comparison kept the model, the CPU work's median, ratio and its two
    # interval bounds, dropping the latency, the counts and the rank: ranked by CPU work, the
    # page keeps the counts, the wall clock's median and the CPU work's, the rank, and only
    # then any interval
    from modelprof.render.comparison import export_comparison

    df = _timed_frame(ranked_by_why="the machine was loaded")
    df.attrs["ranked_by"] = "cpu_work"
    df["cpu_work_median_ms"], df["cpu_work_x"] = [40.0, 12.0], [1.0, 0.3]
    df["cpu_work_x_ci_low"], df["cpu_work_x_ci_high"] = [1.0, 0.29], [1.0, 0.31]
    kept = [h.partition(" (")[0] for h in latex_headers(export_comparison(df, "latex"))]
    assert {"params", "MACs", "CPU work median", "latency median", "rank"} <= set(kept)
    assert not any("CI" in h for h in kept)


def test_a_paper_table_of_three_models_keeps_params_macs_flops_and_the_latency() -> None:
    # a paper author's loaded comparison of resnet18, mobilenet_v3_small and a 4-layer ViT at
    # 224 (their numbers): LaTeX kept the latency, CPU work, both ratios and the rank (322 pt
    # of 345) and dropped params, MACs and FLOPs, the point of an efficiency table
    from modelprof.render.comparison import export_comparison

    names = ["resnet18", "mobilenet_v3_small", "vit_tiny"]
    counts = pd.DataFrame(
        {
            "input_shape": ["1x3x224x224"] * 3,
            "params": [11_689_512, 2_542_856, 2_158_504],
            "macs": [1_814_073_344, 56_510_400, 437_289_984],
            "flops": [3_642_773_992, 120_601_496, 882_103_024],
            "params_x": [1.0, 0.218, 0.185],
            "macs_x": [1.0, 0.031, 0.241],
        },
        index=pd.Index(names, name="model"),
    )
    counts.attrs["baseline"] = "resnet18"
    timed = counts.assign(
        latency_median_ms=[79.136, 12.918, 27.568],
        latency_ci_low_ms=[72.272, 10.944, 25.363],
        latency_ci_high_ms=[92.781, 15.041, 30.753],
        cpu_work_median_ms=[39.866, 6.211, 14.106],
        latency_x=[1.0, 0.163, 0.348],
        latency_x_ci_low=[1.0, 0.13, 0.321],
        latency_x_ci_high=[1.0, 0.204, 0.378],
        cpu_work_x=[1.0, 0.156, 0.354],
        rank=[3, 1, 2],
    )
    timed.attrs.update(baseline="resnet18", ranked_by="cpu_work")

    def page(df: pd.DataFrame, width: str) -> list[str]:
        return [
            h.partition(" (")[0] for h in latex_headers(export_comparison(df, "latex", width=width))
        ]

    paper = ["model", "params", "MACs", "FLOPs", "latency median", "CPU work median"]
    assert page(timed, "textwidth") == paper  # the ratios and the rank went
    # 229.5 pt: the latency median before the FLOPs
    assert page(timed, "columnwidth") == ["model", "params", "MACs", "latency median"]
    # untimed: the counts, FLOPs before any ratio (the column width kept the MACs ratio)
    assert page(counts, "columnwidth") == ["model", "params", "MACs", "FLOPs"]


@pytest.mark.parametrize("timing", [False, True])
def test_a_comparisons_csv_and_json_read_back_to_the_same_table(tmp_path, timing) -> None:
    # a newcomer's comparison.csv read back with `model` as a column, its JSON with `model` as
    # the index; the README says how: the CSV's column set as the index gives the same table.
    # Timed, its rank (every model ranked: 1 and 2, or 1 and 1 tied) read back Int64 != int64
    from modelprof.render import read_csv, read_json

    quick = {"budget_s": 0.1, "warn": False} if timing else {}
    df = compare({"a": nn.Linear(4, 3), "b": nn.Linear(4, 5)}, (4,), timing=timing, **quick)
    assert ("rank" in df.columns) == timing and df["params"].dtype == np.int64
    df.render.export("csv", tmp_path / "c.csv")
    df.render.export("json", tmp_path / "c.json")
    from_csv = read_csv(tmp_path / "c.csv").set_index("model")
    from_json, _, env = read_json(tmp_path / "c.json")
    pd.testing.assert_frame_equal(from_csv, pd.DataFrame(df))
    # pandas' own to_csv writes the same columns (the index as `model`)
    pd.testing.assert_frame_equal(read_csv(df.to_csv()).set_index("model"), pd.DataFrame(df))
    pd.testing.assert_frame_equal(from_json, pd.DataFrame(df))
    # the JSON's environment keeps what the table's attrs say (its notes were lost)
    assert env["baseline"] == "a" and env["attrs"] == {
        k: v for k, v in df.attrs.items() if k not in ("env", "baseline")
    }


@pytest.mark.parametrize("timing", [False, True])
def test_an_autocast_comparisons_caption_says_the_dtype_as_profiles_does(timing) -> None:
    # under amp the caption read "bfloat16": env["dtype"] is the autocast dtype, where profile's
    # caption says the inputs' dtype under it
    from modelprof import profile

    model = nn.Linear(8, 4)
    quick = {"budget_s": 0.1, "warn": False} if timing else {}
    df = compare({"a": model}, (8,), timing=timing, amp=torch.bfloat16, **quick)
    words = profile(model, (8,), timing=False, amp=torch.bfloat16)._dtype_words()
    assert words == "float32 under bfloat16 autocast"
    assert df.attrs["env"]["dtype"] == "torch.bfloat16"  # the environment record, as ever
    for fmt in ("text", "markdown", "html", "latex"):
        out = str(df.render.export(fmt))
        assert f"{words}, batch 1" in out and "), bfloat16, batch" not in out, fmt
    plain = compare({"a": model}, (8,), timing=False)  # no autocast: the dtype alone
    assert "), float32, batch 1" in str(plain.render.to_text())


def test_a_training_comparisons_flops_are_the_forwards_and_the_steps_each_named() -> None:
    # a paper author copied a training comparison's "FLOPs" (the forward, the loss and AdamW's
    # step, without the backward: no quantity to quote) as the model's cost: the forward columns
    # are now the model's forward alone, and step_flops ("step FLOPs") the whole step
    from modelprof import profile
    from modelprof.render import read_csv

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    kw = dict(backward=True, optimizer="adamw")
    df = compare({"m": model, "m2": model}, (64,), timing=False, **kw)
    # forward: Linear(64, 64) 2*64*64 + 64 bias = 8256, ReLU 64, Linear(64, 8) 2*64*8 + 8 = 1032
    assert df.loc["m", "flops"] == 8256 + 64 + 1032 == 9352
    assert df.loc["m", "macs"] == 64 * 64 + 64 * 8
    # step: forward 9352 + loss (sum of 8) 8 + AdamW 14 x 4,680 params + the backward
    totals = profile(model, (64,), timing=False, **kw).totals
    assert totals["flops"] == 9352 + 8 + 14 * 4680
    assert df.loc["m", "step_flops"] == totals["flops"] + totals["backward_flops"]
    assert df.loc["m2", "flops_x"] == 1.0 and df.loc["m2", "step_flops_x"] == 1.0
    assert "step FLOPs" in str(df.render.to_markdown())
    caption = "MACs, FLOPs and bytes: the model's forward; step FLOPs: forward, loss, backward"
    assert caption + " and optimizer step" in str(df.render.export("latex"))
    # without an optimizer the step has none to name (its step FLOPs: forward, loss, backward)
    bare = compare({"m": model}, (64,), timing=False, backward=True)
    said = str(bare.render.export("latex"))
    assert "step FLOPs: forward, loss and backward" in said and "optimizer step" not in said
    plain = compare({"m": model}, (64,), timing=False)
    assert caption not in str(plain.render.export("latex")) and "step_flops" not in plain
    assert plain.loc["m", "flops"] == 9352  # the same model's forward, either way
    back = read_csv(df.render.to_csv())  # whole numbers, read back as they were
    assert back["step_flops"].dtype == "int64"
    assert list(back["step_flops"]) == list(df["step_flops"])


def test_a_withheld_step_rank_and_an_unjudged_stability_read_back_as_they_were() -> None:
    # step_rank <NA> where a step was not ranked; latency_stable None where it cannot be
    # judged: a newcomer's CSV read back int64 and text for them
    from modelprof.render import read_csv, to_csv

    df = pd.DataFrame(
        {
            "step_rank": pd.array([1, None], dtype="Int64"),
            "latency_stable": pd.Series([True, None], dtype=object),
        }
    )
    back = read_csv(to_csv(df))
    pd.testing.assert_frame_equal(back, df)


def _caption(tex: str) -> str:
    return next(line for line in tex.splitlines() if line.startswith("\\caption"))


def test_a_comparisons_caption_names_the_input_its_counts_depend_on() -> None:
    # a fitted LaTeX table dropped input_shape and its caption never named the resolution,
    # though the MACs depend on it (a report's caption says "input 1x3x64x64")
    df = compare(_pair(), (10,), timing=False)
    kept = ["params", "macs"]  # the input_shape column not among them
    # both models fed one sample of 10 features, batch first: 1x10 (LaTeX writes x as times)
    shared = "input 1$\\times$10"
    assert shared in _caption(df.render.to_latex(columns=kept))
    assert "input 1x10" in df.render.to_markdown(columns=kept).splitlines()[0]
    # models fed different shapes: no one input is claimed; where the column is dropped the
    # caption says each model's (a: 1 sample of 10 -> 1x10; b: 1 sample of 1x12 -> 1x1x12)
    models = {"a": nn.Linear(10, 20), "b": nn.Conv1d(1, 2, 3)}
    mixed = compare(models, {"a": (10,), "b": (1, 12)}, timing=False)
    caption = _caption(mixed.render.to_latex(columns=kept)).replace("$\\times$", "x")
    assert "inputs 1x10 (a), 1x1x12 (b)" in caption and "input 1x" not in caption
    # where the table shows the column, it says them and the caption does not repeat them
    shown = mixed.render.to_latex(columns=["input_shape", *kept])
    assert "inputs" not in _caption(shown).replace("$\\times$", "x")


def test_a_latex_ratio_shows_the_significant_digits_every_other_table_shows() -> None:
    # LaTeX printed a ratio with 2 decimals (0.04 beside Markdown's 0.0439×), though every
    # non-zero value is to show two significant digits
    df = compare({"big": nn.Linear(10, 400), "small": nn.Linear(10, 13)}, (10,), timing=False)
    # MACs 10 x 13 = 130 against 10 x 400 = 4000: 130 / 4000 = 0.0325 (3 significant figures)
    assert df.loc["small", "macs_x"] == pytest.approx(0.0325)
    tex = df.render.to_latex(columns=["macs_x"])
    small = next(line for line in tex.splitlines() if line.startswith("small &"))
    assert small == "small & 0.0325 \\\\"
    # the baseline's own: 1 -> 1.00, as the Markdown cell reads 1.00×
    assert "big & 1.00 \\\\" in tex and "0.0325×" in df.render.to_markdown(columns=["macs_x"])


def _tiny_bert() -> nn.Module:
    """One BERT layer, hidden 32, 2 heads, FFN 64, vocabulary 100 (random weights)."""
    from transformers import BertConfig, BertModel  # a test extra

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config).eval()


def test_a_vision_and_a_text_model_in_one_table_each_at_its_own_input() -> None:
    from modelprof import token_inputs

    bert, mlp = _tiny_bert(), nn.Linear(10, 20)
    # BERT on b*s = 2*16 = 32 tokens: q,k,v,o 4*32*32*32 = 131072, scores and context
    # 2*(2*2*16*16*16) = 32768, FFN 2*32*32*64 = 131072, pooler 2*32*32 = 2048: 296960 MACs
    # (test_cli_tokens' count); the Linear on a batch of 2: 2*10*20 = 400
    by_tokens = compare(
        {"mlp": mlp, "bert": bert}, {"mlp": (10,)}, tokens=16, batch_size=2, timing=False
    )
    ids = token_inputs(bert, 16, 2)
    by_inputs = compare(
        {"mlp": mlp, "bert": bert}, (10,), inputs={"bert": ids}, batch_size=2, timing=False
    )
    for df in (by_tokens, by_inputs):
        assert "error" not in df.columns
        assert df.loc["bert", "macs"] == 296960 and df.loc["bert", "macs_x"] == 296960 / 400
        # each row says its own input: the token ids and their mask as ids, the Linear's floats
        assert df.loc["bert", "input_shape"] == "2x16, 2x16 (int64)"
        assert any("ran different inputs" in n for n in df.attrs["notes"])
    assert by_tokens.loc["mlp", "input_shape"] == "2x10" and by_tokens.loc["mlp", "macs"] == 400
    # a shared size goes to the model that reads no token ids, the tokens to the one that does
    df = compare([mlp, bert], (10,), tokens=16, batch_size=2, timing=False)
    assert df["macs"].tolist() == [400, 296960]
    same = compare({"a": mlp, "b": mlp}, (10,), timing=False)  # one input: nothing to say
    assert not any("ran different inputs" in n for n in same.attrs.get("notes", ()))


class _TakesSrc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.lin(src) + tgt[:, :2]


def test_inputs_and_tokens_by_model_are_refused_naming_the_model() -> None:
    from modelprof import token_inputs

    bert, mlp = _tiny_bert(), nn.Linear(10, 20)
    models = {"mlp": mlp, "bert": bert}
    ids = token_inputs(bert, 8)
    with pytest.raises(ModelProfError, match=r"inputs names \['bret'\].*did you mean bert\?"):
        compare(models, {"mlp": (10,)}, inputs={"bret": ids}, timing=False)
    # keys of which one alone is near a model's name (src beside a model src2, and tgt) are one
    # set of keyword inputs for all, not inputs by model: each Linear(4, 2) reads src, 2x2x4
    pair = {"rnn": _TakesSrc(), "src2": _TakesSrc()}
    shared = {"src": torch.randn(2, 4), "tgt": torch.randn(2, 4)}
    assert compare(pair, inputs=shared, timing=False)["macs"].tolist() == [16, 16]
    with pytest.raises(ModelProfError, match="model 'mlp' needs an input size.*tokens=8 feeds"):
        compare(models, tokens=8, timing=False)  # the Linear reads no token ids
    with pytest.raises(ModelProfError, match="model 'bert' needs an input size"):
        compare(models, {"mlp": (10,)}, timing=False)
    with pytest.raises(ModelProfError, match="model 'bert' is given both an input_size and"):
        compare(models, {"mlp": (10,), "bert": (8,)}, inputs={"bert": ids}, timing=False)
    with pytest.raises(ModelProfError, match="model 'bert': seq_len=65 is past the model's 64"):
        compare(models, {"mlp": (10,)}, tokens=65, timing=False)
    with pytest.raises(ModelProfError, match=r"needs input_size or tokens=.*given to 'bert'"):
        compare(models, {"mlp": (10,)}, inputs={"bert": ids}, timing=False, throughput=True)


def test_throughput_of_a_text_model_searches_its_token_ids() -> None:
    bert, mlp = _tiny_bert(), nn.Linear(10, 20)
    df = compare(
        {"mlp": mlp, "bert": bert},
        (10,),
        tokens=8,
        timing=False,
        throughput=True,
        throughput_options={"max_batch": 2, "budget_s": 0.05, "warn": False},
    )
    assert "error" not in df.columns and (df["throughput_samples_per_s"] > 0).all()


def test_models_of_other_dtypes_or_devices_each_say_theirs(tmp_path: Path) -> None:
    # before: a bfloat16 copy beside its float32 model ran in bfloat16 while the caption said
    # "float32" for both and no column said a row's dtype; now each row's own, the caption
    # naming a dtype (device) only where every model agrees
    from modelprof.render import read_csv, read_json

    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    copy = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    df = compare({"eager": mlp, "bf16": copy.to(torch.bfloat16)}, (8,), timing=False)
    assert df["dtype"].tolist() == ["float32", "bfloat16"]
    # reads: (8 + 64 + 8) + 8 + (8 + 32 + 4) = 132 elements, 4 B each in float32, 2 in bf16
    assert df["read_bytes"].tolist() == [132 * 4, 132 * 2]
    caption, _, table = df.render.export("markdown").partition("\n\n")
    assert "cpu (" in caption and "float" not in caption  # the column says it
    assert "| dtype " in table and "| bfloat16 |" in table
    latex = df.render.export("latex", columns=["params"])  # without it, the caption says it
    assert "dtypes: eager = float32, bf16 = bfloat16;" in latex
    back = read_csv(df.render.to_csv(tmp_path / "c.csv"))
    assert back["dtype"].tolist() == ["float32", "bfloat16"]
    assert read_json(df.render.to_json(tmp_path / "c.json"))[0]["dtype"].tolist() == [
        "float32",
        "bfloat16",
    ]
    same = compare({"a": mlp, "b": copy.float()}, (8,), timing=False)
    assert "dtype" not in same.columns and "), float32, batch 1" in same.render.export("markdown")
    on_meta = compare({"cpu": mlp, "meta": copy.to("meta")}, (8,), timing=False)
    assert on_meta["device"].tolist() == ["cpu", "meta"]
    both = compare({"cpu": mlp, "meta": copy.to("meta", torch.bfloat16)}, (8,), timing=False)
    assert list(both.columns[:3]) == ["input_shape", "device", "dtype"]  # as the registry's
    assert "cpu (" not in on_meta.render.export("markdown").partition("\n\n")[0]
