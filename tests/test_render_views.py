"""Row/column selection and unit modes shared by every exporter (modelprof.render.views)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_render_fixture import ADDITIVE, report_frame, report_totals

from modelprof.errors import ModelProfError
from modelprof.render.formats import export
from modelprof.render.views import (
    END_TO_END_LABEL,
    ROOT_LABEL,
    TOTAL_LABEL,
    WHOLE_TOTAL_LABEL,
    column_spec,
    compact_columns,
    default_totals,
    prepare_table,
    select_columns,
    select_rows,
)


def _names(df: pd.DataFrame) -> list[str]:
    return [f"{m}#{c}" for m, c in zip(df["module"], df["call"])]


def test_depth_collapses_to_the_upper_levels() -> None:
    df = report_frame()
    assert _names(select_rows(df, depth=0)) == ["#1"]
    # depth <= 1: root, conv1, bn1, relu#1, layer1, relu#2 (layer1's three children dropped)
    assert _names(select_rows(df, depth=1)) == [
        "#1",
        "conv1#1",
        "bn1#1",
        "relu#1",
        "layer1#1",
        "relu#2",
    ]
    assert len(select_rows(df, depth=5)) == len(df)


def test_leaf_only_rows_add_up_to_the_totals() -> None:
    leaves = select_rows(report_frame(), leaf_only=True)
    assert len(leaves) == 7  # conv1, bn1, relu x2, layer1.0, layer1.1, layer1.(self)
    assert leaves[ADDITIVE].sum().to_dict() == report_totals()


def test_depth_with_leaf_only_keeps_the_frontier_of_the_collapsed_tree() -> None:
    frontier = select_rows(report_frame(), depth=1, leaf_only=True)
    # depth-1 rows (the leaves of the tree cut at depth 1): layer1 stands for its children
    assert _names(frontier) == ["conv1#1", "bn1#1", "relu#1", "layer1#1", "relu#2"]
    assert frontier[ADDITIVE].sum().to_dict() == report_totals()


def test_top_k_ranks_by_latency_by_default() -> None:
    top = select_rows(report_frame(), leaf_only=True, top_k=2)
    assert _names(top) == ["conv1#1", "layer1.0#1"]  # 0.3 ms and 0.2 ms


def test_top_k_ranks_by_flops_without_timing() -> None:
    top = select_rows(report_frame(timed=False), leaf_only=True, top_k=2)
    assert _names(top) == ["conv1#1", "layer1.0#1"]  # 13824 and 1152 FLOPs
    assert top["flops"].tolist() == [13824, 1152]


def test_sort_by_keeps_ties_in_execution_order() -> None:
    rows = select_rows(report_frame(), leaf_only=True, sort_by="params", ascending=True)
    # params 0 for relu#1, layer1.1, layer1.(self), relu#2 (in that order), then 8, 10, 108
    assert _names(rows) == [
        "relu#1",
        "layer1.1#1",
        "layer1.(self)#1",
        "relu#2",
        "bn1#1",
        "layer1.0#1",
        "conv1#1",
    ]


def test_selection_does_not_modify_the_input() -> None:
    df = report_frame()
    before = df.copy()
    select_rows(df, depth=1, leaf_only=True, top_k=2, sort_by="flops")
    pd.testing.assert_frame_equal(df, before)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"depth": -1}, "-1"),
        ({"depth": "1"}, "'1'"),
        ({"depth": True}, "True"),
        ({"top_k": 0}, "0"),
        ({"sort_by": "nope"}, "'nope'"),
        # a string flag is truthy: leaf_only="false" kept the leaves alone, silently
        ({"leaf_only": "false"}, "leaf_only='false' must be True or False"),
        ({"sort_by": "flops", "ascending": "no"}, "ascending='no' must be True or False"),
    ],
)
def test_bad_row_options_name_the_value(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ModelProfError, match=fragment):
        select_rows(report_frame(), **kwargs)


def test_depth_on_a_table_without_depth_is_an_error() -> None:
    with pytest.raises(ModelProfError, match="'depth'"):
        select_rows(pd.DataFrame({"model": ["a"], "flops": [1]}), depth=1)


def test_select_columns_keeps_the_order_given_and_names_unknown_columns() -> None:
    df = report_frame()
    assert list(select_columns(df, ["flops", "module"]).columns) == ["flops", "module"]
    assert select_columns(df, None) is df
    with pytest.raises(ModelProfError, match=r"\['nope', 'latency'\]"):
        select_columns(df, ["module", "nope", "latency"])
    with pytest.raises(ModelProfError, match="'flops'"):
        select_columns(df, ["flops", "flops"])


def test_compact_columns_skip_latency_when_untimed() -> None:
    assert "latency_ms" in compact_columns(report_frame())
    assert compact_columns(report_frame(timed=False)) == [
        "module",
        "type",
        "output_shape",
        "params",
        "macs",
        "flops",
        "output_bytes",
    ]


def test_default_totals_sum_the_leaf_rows() -> None:
    # every additive total but output_bytes: all leaf outputs summed is just write_bytes again
    expected = {k: v for k, v in report_totals().items() if k != "output_bytes"}
    assert default_totals(report_frame()) == expected
    assert default_totals(pd.DataFrame({"flops": [1]})) is None  # no leaf column


def test_footer_has_a_labelled_end_to_end_row_apart_from_the_sums() -> None:
    t = prepare_table(
        report_frame(),
        report_totals(),
        end_to_end={"latency_ms": 1.25},
        columns=["module", "flops", "output_bytes", "latency_ms"],
    )
    # the sums: FLOPs 16640 -> 16.64 K; output_bytes given in the totals -> shown; no latency sum
    assert t.footer[0] == (TOTAL_LABEL, "16.64 K", "5.00 KiB", "")
    # the clean end-to-end median sits in its own row, only in the latency column
    assert t.footer[1] == (END_TO_END_LABEL, "", "", "1.25 ms")
    assert t.totals == t.footer[0]
    # without the latency column the end-to-end row would be a bare label: it is left out
    no_latency = prepare_table(
        report_frame(),
        report_totals(),
        end_to_end={"latency_ms": 1.25},
        columns=["module", "flops"],
    )
    assert len(no_latency.footer) == 1
    assert (
        prepare_table(report_frame(), end_to_end={"latency_ms": 1.0}, show_totals=False).footer
        == ()
    )


def test_human_table_headers_cells_and_totals() -> None:
    totals = {**report_totals(), "latency_ms": 1.0}
    t = prepare_table(
        report_frame(),
        totals,
        columns=["module", "params", "flops", "read_bytes", "latency_ms", "latency_pct", "leaf"],
    )
    assert t.headers == ("module", "params", "FLOPs", "read", "latency", "latency share", "leaf")
    assert t.cells[0] == (ROOT_LABEL, "126", "16.64 K", "6.24 KiB", "1.00 ms", "100.00%", "no")
    # conv1: 13824 -> 13.82 K; 1200 B / 1024 = 1.17 KiB; 0.3 ms -> 300 µs; 0.3 / 1.0 = 30%
    assert t.cells[1] == ("conv1", "108", "13.82 K", "1.17 KiB", "300 µs", "30.00%", "yes")
    assert t.totals == ("total", "126", "16.64 K", "6.24 KiB", "1.00 ms", "", "")
    assert t.numeric == (False, True, True, True, True, True, False)


def test_raw_table_keeps_the_stored_numbers() -> None:
    t = prepare_table(
        report_frame(),
        report_totals(),
        units="raw",
        columns=["module", "flops", "latency_ms", "peak_memory_bytes"],
    )
    assert t.headers == ("module", "flops", "latency_ms", "peak_memory_bytes")
    # NaN is empty; the root is named (root) as in every other view (it showed blank), though
    # its stored name is "" (a CSV keeps that, to read back)
    assert t.cells[0] == ("(root)", "16640", "1.0", "")
    # relu's second call (call 2, no call column shown) is told apart as everywhere: relu #2
    assert t.cells[-1][0] == "relu #2"
    assert t.totals == ("total", "16640", "", "")


def test_fixed_units_put_one_unit_per_column_in_the_header() -> None:
    t = prepare_table(
        report_frame(),
        report_totals(),
        units="fixed",
        columns=["module", "params", "flops", "read_bytes", "latency_ms", "latency_pct"],
    )
    # params max 126 -> no prefix; flops max 16640 -> K; bytes max 6392 -> KiB; latency max 1 ms
    # and min 0.05 ms (a relu): ms would show it with one digit (0.05), µs shows 50.00 and the
    # root as 1000.00 (4 digits before the point at most)
    assert t.headers == (
        "module",
        "params",
        "FLOPs (K)",
        "read (KiB)",
        "latency (µs)",
        "latency share (%)",
    )
    # conv1: 13824/1e3 = 13.82; 1200/1024 = 1.17; 0.3 ms = 300 µs; 30 %
    assert t.cells[1] == ("conv1", "108", "13.82", "1.17", "300.00", "30.00")
    assert t.totals == ("total", "126", "16.64", "6.24", "", "")


def test_fixed_units_never_print_zero_for_a_non_zero_value() -> None:
    df = pd.DataFrame(
        {
            "module": ["net", "conv", "bn", "relu", "fc"],
            "params": [11_689_512, 9_408, 128, 0, 513_000],
            "macs": [1_814_073_344, 118_013_952, 0, 0, 512_000],
        }
    )
    t = prepare_table(df, units="fixed", show_totals=False)
    # params: M keeps 11.69 (K would need 5 digits: 11689.51); 128 / 1e6 rounds to 0.00 -> "<0.01"
    # macs: G would print fc's 512000 as 0.00, M prints it as 0.51 and the top as 1814.07
    assert t.headers == ("module", "params (M)", "MACs (M)")
    assert [c[1] for c in t.cells] == ["11.69", "0.01", "<0.01", "0", "0.51"]
    assert [c[2] for c in t.cells] == ["1814.07", "118.01", "0", "0", "0.51"]


def test_readable_scale_choices() -> None:
    from modelprof.render.units import SI_PREFIXES, TIME_UNITS
    from modelprof.render.views import readable_scale

    assert readable_scale([11_689_512, 128], SI_PREFIXES) == (1e6, "M")  # K: 11689.51 > 4 digits
    assert readable_scale([1_814e6, 512e3], SI_PREFIXES) == (1e6, "M")  # 1814.07 and 0.51
    # K: 10.00 and 0.006 -> 0.01, one digit; whole numbers show both (9999 and 6)
    assert readable_scale([9_999, 6], SI_PREFIXES) == (1.0, "")
    assert readable_scale([9_999, 4], SI_PREFIXES) == (1.0, "")  # 0.004 K would print 0.00
    # two significant digits where a unit gives them: 31.2 ms to 1.089 s in s would read 0.03;
    # in ms 31.20 and 1089.00 (below 4 digits before the point)
    assert readable_scale([31.2, 1089.0], TIME_UNITS) == (1.0, "ms")
    # 12 ms to 20 s: ms would need 20000.00 (5 digits), so s, with 12 ms at one digit (0.01)
    assert readable_scale([12.0, 20_000.0], TIME_UNITS) == (1e3, "s")
    # 30 ms in µs needs 5 digits (30000), so ms stays and 4 µs prints "<0.01"
    assert readable_scale([30.0, 0.004], TIME_UNITS) == (1.0, "ms")
    assert readable_scale([], SI_PREFIXES) == (1.0, "")
    assert readable_scale([0, 0], SI_PREFIXES) == (1.0, "")


def test_unknown_units_mode_is_an_error() -> None:
    with pytest.raises(ModelProfError, match="'pretty'"):
        prepare_table(report_frame(), units="pretty")
    # a format registered by a user names its own default: a bad one is the same error
    with pytest.raises(ModelProfError, match="got None"):
        prepare_table(report_frame(), default_units=None)


def test_totals_row_options() -> None:
    df = report_frame()
    assert prepare_table(df).totals is not None  # derived from the leaf rows
    assert prepare_table(df, report_totals(), show_totals=False).totals is None
    # The totals stay the model's totals when rows are filtered (top_k: labelled so, below).
    t = prepare_table(df, leaf_only=True, top_k=1, columns=["module", "flops"])
    assert t.cells == (("conv1", "13.82 K"),)
    assert t.totals == (WHOLE_TOTAL_LABEL, "16.64 K")


def test_a_top_k_tables_total_says_it_is_the_whole_models() -> None:
    # top_k=1 showed one layer of 13.82 K FLOPs over a "total" of 16.64 K: the whole model's,
    # which the label did not say; rows that add up to it (leaf_only, depth) keep "total"
    df, totals = report_frame(), report_totals()
    for how in ("text", "markdown", "latex", "html"):
        assert "total (whole model)" in str(export(how, df, totals, leaf_only=True, top_k=1))
    top = prepare_table(df, totals, leaf_only=True, top_k=1, columns=["module", "flops"])
    assert top.totals == (WHOLE_TOTAL_LABEL, "16.64 K") == ("total (whole model)", "16.64 K")
    leaves = prepare_table(df, totals, leaf_only=True, columns=["module", "flops"])
    assert leaves.totals == (TOTAL_LABEL, "16.64 K")


def test_torchstat_view_headers_and_no_derived_totals() -> None:
    ts = pd.DataFrame(
        {
            "module name": ["conv1", "total"],
            "input shape": ["3x224x224", ""],
            "output shape": ["64x112x112", ""],
            "params": [9408, 9408],
            "memory(MB)": [3.06, 3.06],
            "MAdd": [235225088, 235225088],
            "Flops": [118013952, 118013952],
            "MemRead(B)": [639744, 639744],
            "MemWrite(B)": [3211264, 3211264],
            "duration[%]": [12.48, 12.48],
            "MemR+W(B)": [3851008, 3851008],
        }
    )
    t = prepare_table(ts)
    assert t.totals is None  # no leaf column: the torchstat view carries its own total row
    assert t.headers[4] == "memory (MiB)" and t.headers[7] == "MemRead"
    # 235225088 -> 235.23 M; 639744 B / 1024 = 624.75 KiB; 3851008 / 2**20 = 3.67 MiB
    assert t.cells[0][5] == "235.23 M" and t.cells[0][7] == "624.75 KiB"
    assert t.cells[0][10] == "3.67 MiB" and t.cells[0][9] == "12.48%"


def test_a_missing_value_reads_n_a_in_every_column() -> None:
    # one run per model (repeat=1) and a failed model: the ratio read "-", its interval "n/a",
    # the latency's interval "~n/a" and the rank "-" in one row (a trial); README: "n/a"
    cmp = pd.DataFrame(
        {
            "latency_median_ms": [0.0571, np.nan],
            "latency_ci_low_ms": [np.nan, np.nan],
            "latency_ci_high_ms": [np.nan, np.nan],
            "latency_x": [np.nan, np.nan],
            "latency_x_ci_low": [np.nan, np.nan],
            "rank": pd.array([pd.NA, pd.NA], dtype="Int64"),
            "latency_rough": [True, None],
        },
        index=pd.Index(["a", "bad"], name="model"),
    )
    t = prepare_table(cmp, columns=[c for c in cmp.columns if c != "latency_rough"])
    assert t.cells[0][1] == "~57.1 µs"  # 0.0571 ms, rough: one run
    assert t.cells[0][2:] == ("n/a",) * 5 and t.cells[1][1:] == ("n/a",) * 6


def test_a_named_index_becomes_the_first_column() -> None:
    cmp = pd.DataFrame(
        {"params": [11_689_512, 5_483_032], "latency_ms": [3.1, np.nan]},
        index=pd.Index(["resnet18", "mobilenet_v3_large"], name="model"),
    )
    t = prepare_table(cmp)
    assert t.columns == ("model", "params", "latency_ms")
    assert t.cells == (("resnet18", "11.69 M", "3.10 ms"), ("mobilenet_v3_large", "5.48 M", "n/a"))
    assert t.totals is None


def test_column_spec_falls_back_on_suffixes_and_dtypes() -> None:
    assert (
        column_spec("median_ms").kind == "time_ms" and column_spec("median_ms").header == "median"
    )
    assert column_spec("weights_bytes").kind == "bytes"
    assert column_spec("share_pct").kind == "percent"
    assert column_spec("n", pd.Series([1, 2])).kind == "int"
    assert column_spec("x", pd.Series([1.5])).kind == "float"
    assert column_spec("name", pd.Series(["a"])).kind == "text"


def test_compare_ratio_and_throughput_columns() -> None:
    cmp = pd.DataFrame(
        {
            "latency_median_ms": [3.1, 1.9],
            "latency_x": [1.0, 0.6129],
            "throughput_samples_per_s": [322.58, 526.3],
        },
        index=pd.Index(["resnet18", "mobilenet_v3_large"], name="model"),
    )
    t = prepare_table(cmp)
    assert t.headers == ("model", "latency median", "latency ratio", "throughput (samples/s)")
    assert t.cells[1] == ("mobilenet_v3_large", "1.90 ms", "0.613×", "526.30")  # 3 significant
    fixed = prepare_table(cmp, units="fixed")
    # fixed units: the × in the header, the cell as the human one reads (0.6129: 3 significant)
    assert fixed.headers[2] == "latency ratio (×)" and fixed.cells[1][2] == "0.613"


def test_an_empty_selection_still_renders() -> None:
    t = prepare_table(report_frame().head(0), report_totals(), columns=["module", "flops"])
    assert t.cells == () and t.totals == ("total", "16.64 K")


def test_a_ratios_interval_is_shown_as_the_ratio_is() -> None:
    # a newcomer saw latency ratio 0.276x beside an interval 0.24 / 0.32: the bounds were plain
    # floats (2 decimals) while the ratio is a multiple (3 significant figures); a generation
    # ratio's bounds (ttft_x_ci_low) are named by pattern, not declared, and read the same way
    df = pd.DataFrame(
        {
            "model": ["a", "b"],
            "latency_x": [1.0, 0.2764],
            "latency_x_ci_low": [1.0, 0.2413],
            "latency_x_ci_high": [1.0, 0.3171],
            "ttft_x_ci_low": [1.0, 0.2413],
        }
    )
    t = prepare_table(df)
    assert t.headers[-1] == "ttft ratio CI low"
    assert t.cells[1] == ("b", "0.276×", "0.241×", "0.317×", "0.241×")
    # fixed units (LaTeX's default): one unit in the header, the same 3 significant figures as
    # the human cells for all (0.2764 -> 0.276, 0.2413 -> 0.241, 0.3171 -> 0.317)
    fixed = prepare_table(df, units="fixed")
    assert fixed.headers[2] == "latency ratio CI low (×)"
    assert fixed.cells[1] == ("b", "0.276", "0.241", "0.317", "0.241")


def test_a_misspelt_view_option_is_named_with_the_nearest_one():
    # ViewOptions(depht=1) raised a bare TypeError from the dataclass's __init__
    from modelprof import ViewOptions

    with pytest.raises(ModelProfError, match=r"\['depht'\] \(depht=: did you mean depth=\?\)"):
        ViewOptions(depht=1)
    with pytest.raises(ModelProfError, match=r"\(colums=: did you mean columns=\?\)"):
        ViewOptions.parse(colums=["module"])
    with pytest.raises(ModelProfError, match=r"unknown view option\(s\) \['zzz'\]; valid"):
        ViewOptions(zzz=1)  # nothing near: no guess
    assert ViewOptions("torchstat", depth=1).depth == 1  # positional fields still pass


def test_a_subclass_of_view_options_takes_its_own_fields():
    import dataclasses

    from modelprof import ViewOptions

    @dataclasses.dataclass(frozen=True)
    class Mine(ViewOptions):
        colour: str = "grey"

    assert Mine(colour="red", depth=1).colour == "red"
    assert ViewOptions.parse(Mine(), colour="red").colour == "red"  # a view's own class
    with pytest.raises(ModelProfError, match=r"\(colur=: did you mean colour=\?\)"):
        Mine(colur="red")


def test_a_median_and_its_interval_share_one_unit() -> None:
    # a comparison's latency: medians 5 ms and 900 ms, upper bounds 6 ms and 12 s. Alone, the
    # medians would read ms (5.00, 900.00) and the bounds s (12 s in ms needs 12000.00, five
    # digits); together all three read s, as 12000 ms does: 0.01 s is the 5 ms median, 0.90
    # the 900 ms one, 12.00 the upper bound
    df = pd.DataFrame(
        {
            "model": ["a", "b"],
            "latency_median_ms": [5.0, 900.0],
            "latency_ci_low_ms": [4.0, 850.0],
            "latency_ci_high_ms": [6.0, 12_000.0],
        }
    )
    t = prepare_table(df, units="fixed", show_totals=False)
    assert [h.rsplit(" ", 1)[-1] for h in t.headers[1:]] == ["(s)", "(s)", "(s)"], t.headers
    assert t.cells[1][1:] == ("0.90", "0.85", "12.00")


def test_a_column_selection_keeps_the_rows_names() -> None:
    # columns= without module: the rows (and the total) would be bare numbers, the total
    # reading as one more row; the names come first, as the table's own first column does
    t = prepare_table(report_frame(), report_totals(), units="raw", columns=["params", "flops"])
    assert t.columns == ("module", "params", "flops")
    assert t.totals == ("total", "126", "16640")
    # a comparison's rows are named by its index, shown as the model column
    df = pd.DataFrame({"params": [72, 288]}, index=pd.Index(["a", "b"], name="model"))
    t = prepare_table(df, units="raw", columns=["params"], show_totals=False)
    assert t.columns == ("model", "params") and [c[0] for c in t.cells] == ["a", "b"]
    # a generation's rows are told apart by phase and context too (three (root) rows); a
    # grouped table's by its type, torchstat's by its module name
    df = pd.DataFrame(
        {"phase": ["prefill", "decode"], "context": [8, 9], "module": ["", ""], "flops": [3, 1]}
    )
    t = prepare_table(df, units="raw", columns=["flops"], show_totals=False)
    assert t.columns == ("phase", "context", "module", "flops")
    for name in ("layer_type", "type", "module name"):
        df = pd.DataFrame({name: ["conv", "relu"], "flops": [3, 1]})
        assert prepare_table(df, units="raw", columns=["flops"]).columns == (name, "flops")
    # names the caller picked stay as picked: phase and module asked, no context added
    df = pd.DataFrame({"phase": ["p", "d"], "context": [8, 9], "module": ["", ""], "flops": [3, 1]})
    t = prepare_table(df, units="raw", columns=["phase", "module", "flops"], show_totals=False)
    assert t.columns == ("phase", "module", "flops")


def test_sorting_an_untimed_table_by_a_time_says_to_time_it() -> None:
    from torch import nn

    from modelprof import profile

    untimed = profile(nn.Linear(4, 4), (4,), timing=False)
    with pytest.raises(ModelProfError) as info:
        untimed.to_text(sort_by="latency_ms")
    assert "sort_by='latency_ms' needs column(s) ['latency_ms'] (a measured column: profile " in (
        str(info.value)
    )
    with pytest.raises(ModelProfError) as info:  # a column no run has: no such hint
        untimed.to_text(sort_by="nonsense")
    assert "timing=True" not in str(info.value)
    assert "did you mean" not in str(info.value)  # near no column


def test_a_misspelt_column_names_the_one_meant() -> None:
    from torch import nn

    from modelprof import profile

    r = profile(nn.Linear(4, 4), (4,), timing=False)
    # difflib's ratio of flop to flops, 2 * 4 / 9 = 0.89, and of mac to macs, 2 * 3 / 7 = 0.86,
    # are over its 0.75 cutoff: each names the column meant
    with pytest.raises(ModelProfError, match=r"\['flop'\] \(flop: did you mean flops\?\)"):
        r.to_text(sort_by="flop", top_k=3)
    with pytest.raises(ModelProfError, match=r"\['mac'\] \(mac: did you mean macs\?\)"):
        r.to_text(columns=["module", "mac"])
