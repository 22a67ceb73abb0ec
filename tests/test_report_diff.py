"""Report.diff: two reports layer by layer, rows matched by module and call."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch.nn as nn

from modelprof import ModelProfError, ModelProfWarning, profile
from modelprof.report.diff import diff_frames


class _Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x


def _counted(model: nn.Module):
    return profile(model, (8,), timing=False, roofline=False)


def test_counts_side_by_side_with_their_ratio_and_where_a_row_is_missing():
    before = _counted(nn.Sequential(_Block(8), _Block(8)))
    after = _counted(nn.Sequential(_Block(16), nn.Identity()))
    d = before.diff(after, names=("before", "after")).set_index(["module", "call"])
    # Linear(8, w) at batch 1: 8w MACs, 8w + w parameters; w = 8 -> 64 MACs, 72 params, and
    # w = 16 -> 128 MACs, 144 params; the way down Linear(16, 8): 128 MACs, 128 + 8 params
    up = d.loc[("0.up", 1)]
    assert (up["macs_before"], up["macs_after"], up["macs_ratio"]) == (64, 128, 2.0)
    assert (up["params_before"], up["params_after"]) == (72, 144)
    assert d.loc[("0.down", 1), "params_ratio"] == pytest.approx(136 / 72)
    # the root: 64 + 64 + 64 + 64 = 256 MACs before, 128 + 128 after: the same
    assert d.loc[("", 1), "macs_ratio"] == 1.0
    # ReLU does no MAC on either side: 0 / 0 has no ratio
    assert np.isnan(d.loc[("0.act", 1), "macs_ratio"])
    # the second block became an Identity: its row is in both, its type says the change, and
    # its children exist before only, with nothing after
    second = d.loc[("1", 1)]
    assert second["type"] == "_Block -> Identity" and second["in"] == "both"
    assert second["macs_ratio"] == 0.0  # 0 / 128
    gone = d.loc[("1.up", 1)]
    assert gone["in"] == "before" and pd.isna(gone["macs_after"]) and np.isnan(gone["macs_ratio"])
    # a's rows in a's order, then b's new ones; counts stay whole numbers
    assert list(d.index.get_level_values(0)[:3]) == ["", "0", "0.up"]
    assert str(d["macs_before"].dtype) == "Int64"
    # untimed: no latency column is compared
    assert not [c for c in d.columns if c.startswith("latency")]


def test_rows_only_the_second_report_has_come_last_and_calls_are_matched_one_by_one():
    act = nn.ReLU()
    once = _counted(nn.Sequential(nn.Linear(8, 8), act))
    twice = _counted(nn.Sequential(nn.Linear(8, 8), act, nn.Linear(8, 8), act))
    d = once.diff(twice, columns=["macs"])
    # the second Linear and the ReLU's second call exist in b alone: after a's three rows, in
    # b's order
    assert list(zip(d["module"], d["call"], d["in"])) == [
        ("", 1, "both"),
        ("0", 1, "both"),
        ("1", 1, "both"),
        ("2", 1, "b"),
        ("1", 2, "b"),
    ]
    # the root: 64 MACs, then 128
    assert d.loc[d["module"] == "", "macs_ratio"].item() == 2.0


def test_timed_reports_compare_their_latency_and_either_sides_roughness():
    model = nn.Sequential(_Block(8), _Block(8))
    a = profile(model, (8,), repeat=12, warmup=1, roofline=False, warn=False)
    b = profile(model, (8,), repeat=12, warmup=1, roofline=False, warn=False)
    d = a.diff(b)
    fa, fb = a.to_dataframe(), b.to_dataframe()
    assert d["latency_ms_a"].tolist() == fa["latency_ms"].tolist()
    # b / a, NaN where a is 0 (a (self) row the hooks' correction left no time: a quiet CI run
    # read one, and the test divided by it)
    x, y = fa["latency_ms"].to_numpy(), fb["latency_ms"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(x > 0, y / x, np.nan)
    assert d["latency_ms_ratio"].to_numpy() == pytest.approx(expected, nan_ok=True)
    assert (d["latency_rough"] == (fa["latency_rough"] | fb["latency_rough"])).all()
    # a timed report against a counted one: latency is not among the columns compared
    assert "latency_ms_a" not in a.diff(_counted(model)).columns


def test_a_row_rough_on_either_side_is_rough_forward_and_backward():
    frame = pd.DataFrame(
        {
            "module": ["", "0"],
            "call": [1, 1],
            "type": ["Sequential", "Linear"],
            "latency_ms": [2.0, 1.0],
            "latency_rough": [False, True],
            "backward_latency_ms": [4.0, 2.0],
            "backward_latency_rough": [False, False],
        }
    )
    other = frame.assign(
        latency_ms=[3.0, 1.5], latency_rough=[True, False], backward_latency_rough=[False, True]
    )
    # by default both timing columns are compared, each with its own flag
    d = diff_frames(frame, other)
    assert d["latency_rough"].tolist() == [True, True]
    assert d["latency_ms_ratio"].tolist() == [1.5, 1.5]
    assert d["backward_latency_rough"].tolist() == [False, True]
    assert d["backward_latency_ms_ratio"].tolist() == [1.0, 1.0]


def test_counts_past_2_to_the_53_stay_exact_where_a_row_is_missing():
    big = 2**53 + 1  # a float64 reads it as 2**53
    frame = pd.DataFrame(
        {"module": ["", "0"], "call": [1, 1], "type": ["M", "Linear"], "flops": [big, 1]}
    )
    d = diff_frames(frame, frame.iloc[:1], columns=["flops"])
    assert d["flops_a"].tolist()[0] == big and d["flops_b"].tolist()[0] == big
    assert pd.isna(d["flops_b"].tolist()[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(names=("x", "x")), "names=('x', 'x') must be two different non-empty strings"),
        (dict(names="ab"), "names='ab' must be two different"),
        # "ratio" would write its values over the ratio columns
        (dict(names=("ratio", "b")), "other than 'ratio'"),
        # "both" is the ``in`` column's word for a row on either side
        (dict(names=("a", "both")), "other than 'ratio' and 'both'"),
        (dict(columns="macs"), "columns='macs' must be a non-empty list"),
        (dict(prefixes="module."), "prefixes='module.' must be two strings"),
        (dict(prefixes=("", None)), "prefixes=('', None) must be two strings"),
        # a prefix no name starts with (a typo) would match nothing more: refused, named
        (dict(prefixes=("", "module.")), "prefix 'module.' starts no module name of 'b'"),
        (
            dict(columns=["latency_ms"]),
            "'latency_ms' is not a column of the first and second report's table (a timing "
            "column: was it profiled with timing=False?)",
        ),
        (dict(columns=["type"]), "'type' is not a number to compare"),
        (
            dict(columns=["backward_latency_ms"]),
            "(was it profiled without backward=True, or with timing=False?)",
        ),
    ],
)
def test_bad_options_name_the_value(kwargs, match):
    r = _counted(nn.Linear(8, 8))
    with pytest.raises(ModelProfError, match=re.escape(match)):
        r.diff(r, **kwargs)


def test_only_a_report_or_its_table_is_diffed():
    r = _counted(nn.Linear(8, 8))
    with pytest.raises(ModelProfError, match="takes another Report, its table read back or"):
        r.diff(3)
    # read_json's whole answer: which part to pass is said
    with pytest.raises(ModelProfError, match=r"got tuple; read_json gives .* pass its \[0\]"):
        r.diff((r.to_dataframe(), {}, {}))
    with pytest.raises(ModelProfError, match=r"a \.csv or \.json file written by to_csv"):
        r.diff("before.txt")
    with pytest.raises(
        ModelProfError, match=r"diff\(\) needs column\(s\) \['module', 'call', 'type'\]"
    ):
        r.diff(pd.DataFrame())


def test_a_run_saved_earlier_is_diffed_from_its_csv(tmp_path):
    from modelprof.render import read_csv

    before = _counted(nn.Sequential(_Block(8), _Block(8)))
    before.to_csv(tmp_path / "before.csv")
    after = _counted(nn.Sequential(_Block(16), _Block(8)))
    saved = after.diff(read_csv(tmp_path / "before.csv"), names=("now", "saved"))
    live = after.diff(before, names=("now", "saved"))
    pd.testing.assert_frame_equal(saved, live)
    # 0.up: 128 MACs now, 64 in the saved run
    assert saved.set_index(["module", "call"]).loc[("0.up", 1), "macs_ratio"] == 0.5
    # or from the file itself, CSV or JSON (a newcomer had to read it back first)
    pd.testing.assert_frame_equal(after.diff(tmp_path / "before.csv", names=("now", "saved")), live)
    before.to_json(tmp_path / "before.json")
    from_json = after.diff(str(tmp_path / "before.json"), names=("now", "saved"))
    pd.testing.assert_frame_equal(from_json, live)


def test_a_layer_inserted_in_the_middle_stays_in_the_middle():
    from collections import OrderedDict

    def model(*names):
        return nn.Sequential(OrderedDict((n, nn.Linear(8, 8)) for n in names))

    d = _counted(model("first", "last")).diff(_counted(model("first", "middle", "last")))
    assert list(zip(d["module"], d["in"])) == [
        ("", "both"),
        ("first", "both"),
        ("middle", "b"),
        ("last", "both"),
    ]


def test_training_steps_compare_their_backward_counts_too():
    def step(width: int):
        model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))
        return profile(model, (8,), backward=True, timing=False, roofline=False)

    d = step(8).diff(step(16)).set_index(["module", "call"])
    # Linear(8, w)'s backward: the weight's gradient only (the input needs none), 8w MACs;
    # 64 -> 128
    assert d.loc[("0", 1), ["backward_macs_a", "backward_macs_b"]].tolist() == [64, 128]
    assert "backward_flops_ratio" in d.columns


def test_two_tables_sharing_few_layers_say_so():
    # the same two Linears, once bare and once wrapped: every name gains a prefix ("0" ->
    # "body.0") and the wrapper adds a row ("body"), so no layer but the root matches: 0
    # shared, 2 layers in a and 3 in b
    body = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    bare, wrapped = _counted(body), _counted(_Wrapper(body))
    with pytest.warns(
        ModelProfWarning,
        match=r"besides the root, only 0 layer\(s\) match .* \(2 in 'a', 3 in 'b'\)",
    ):
        d = bare.diff(wrapped)
    assert len(d.attrs["notes"]) == 1 and "a wrapper adds a prefix" in d.attrs["notes"][0]
    # b's names less "body." are a's two: the note names that prefix, and with it the rows
    # match ("body", the wrapped model's own row, stays b's alone)
    assert d.attrs["notes"][0].endswith("With prefixes=('', 'body.'), 2 layer name(s) match.")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        matched = bare.diff(wrapped, prefixes=("", "body."))
    assert list(zip(matched["module"], matched["in"])) == [
        ("", "both"),
        ("body", "b"),
        ("0", "both"),
        ("1", "both"),
    ]
    # Linear(8, 8) at batch 1: 64 MACs on each side
    assert matched.loc[matched["module"] == "0", ["macs_a", "macs_b"]].values.tolist() == [[64, 64]]
    # a list of two is taken as the pair; the other way round, the prefix on the first side
    assert bare.diff(wrapped, prefixes=["", "body."]).equals(matched)
    back = wrapped.diff(bare, prefixes=("body.", ""))
    assert back["in"].tolist() == ["both", "a", "both", "both"]
    # a block replaced by another keeps most names (5 of 8 and 5): no warning, no note
    before = _counted(nn.Sequential(_Block(8), _Block(8)))
    after = _counted(nn.Sequential(_Block(16), nn.Identity()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        d = before.diff(after)
    assert "notes" not in d.attrs


class _Wrapper(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)


def test_a_diff_of_rough_per_layer_times_says_which_side_is_rough():
    from modelprof.timing.calibration import spin_model

    # a 20 ms spin with budget_s=0.05 and no extension: one or two per-layer passes, fewer
    # than the stop rule's 10, so "rough" (a loaded machine only makes them fewer)
    model = spin_model((20.0,))
    rough = profile(model, (4,), warmup=1, budget_s=0.05, layer_extend_s=0, roofline=False)
    assert rough.layers_rough
    with pytest.warns(ModelProfWarning, match=r"the per-layer times of 'after' are rough \("):
        d = rough.diff(rough, names=("before", "after"))
    # each side's, named, with the report's own reason (both are the rough report here)
    why = rough._rough_reason()
    assert d.attrs["notes"] == [
        f"diff(): the per-layer times of '{name}' are rough ({why}): so are their ratios"
        for name in ("before", "after")
    ]
    # counts alone (no latency compared): nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        assert "notes" not in rough.diff(rough, columns=["macs"]).attrs
