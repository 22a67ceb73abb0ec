"""JSON and CSV exporters: what is written reads back to an equal DataFrame, dtypes included."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_render_fixture import report_frame, report_totals

from modelprof.errors import ModelProfError
from modelprof.render import read_csv, read_json, to_csv, to_json

ENV = {
    "device": "cpu",
    "device_name": "AMD EPYC",
    "dtype": "float32",
    "batch_size": 1,
    "torch_version": "2.14.1",
    "threads": 2,
}


def _tricky(df: pd.DataFrame) -> pd.DataFrame:
    """Floats that only survive with full precision, a NaN, an infinity, text with CSV quoting."""
    df = df.copy()
    df.loc[1, "latency_ms"] = 0.1 + 0.2  # 0.30000000000000004
    df.loc[2, "latency_ms"] = 1 / 3
    df.loc[3, "latency_std_ms"] = 1e-300
    df.loc[4, "latency_std_ms"] = math.inf
    df.loc[5, "latency_pct"] = math.nan
    df.loc[6, "type"] = 'Weird, "quoted"\ttype'
    return df


# ------------------------------------------------------------------------------------------ JSON


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    df = _tricky(report_frame())
    path = to_json(df, report_totals(), ENV, path=tmp_path / "out" / "report.json")
    assert path == tmp_path / "out" / "report.json"
    back, totals, env = read_json(path)
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    assert back["module"].iloc[0] == ""  # the root's name is not NaN
    assert math.isinf(back["latency_std_ms"].iloc[4]) and math.isnan(back["latency_pct"].iloc[5])
    assert totals == report_totals()
    assert env == ENV


def test_json_is_strict_json_with_dtypes() -> None:
    text = to_json(report_frame(), report_totals(), ENV)
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert doc["format"] == "modelprof" and doc["version"] == 1
    assert doc["columns"][:5] == ["module", "type", "call", "depth", "leaf"]
    assert doc["dtypes"][2:5] == ["int64", "int64", "bool"]
    assert doc["data"][0][-1] is None  # peak_memory_bytes NaN -> null
    assert read_json(text)[0].equals(report_frame())  # the JSON text itself is accepted


def test_json_keeps_a_named_index_and_numpy_values_in_env() -> None:
    cmp = pd.DataFrame(
        {"params": [11_689_512, 5_483_032], "latency_median_ms": [3.1, np.nan]},
        index=pd.Index(["resnet18", "mobilenet_v3_large"], name="model"),
    )
    env = {"threads": np.int64(2), "clock_mhz": np.float64(1980.0), "flags": (True, None)}
    back, totals, env_back = read_json(to_json(cmp, None, env))
    pd.testing.assert_frame_equal(back, cmp, check_exact=True)
    assert totals is None
    assert env_back == {"threads": 2, "clock_mhz": 1980.0, "flags": [True, None]}


def test_json_selection_options() -> None:
    back, _, _ = read_json(to_json(report_frame(), depth=0, columns=["module", "flops"]))
    assert back["flops"].tolist() == [16640] and list(back.columns) == ["module", "flops"]
    # the rows top_k keeps carry their own index, unnamed as it was (it read "<index>")
    top = report_frame().sort_values("flops", ascending=False, kind="stable").head(2)
    back, _, _ = read_json(to_json(report_frame(), top_k=2, sort_by="flops"))
    pd.testing.assert_frame_equal(back, top, check_exact=True)


def test_json_rejects_values_it_cannot_write() -> None:
    with pytest.raises(ModelProfError, match=r"env\['model'\]"):
        to_json(report_frame(), env={"model": object()})


def test_read_json_errors_name_the_source(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ModelProfError, match="not a modelprof JSON"):
        read_json(other)
    newer = tmp_path / "newer.json"
    doc = json.loads(to_json(report_frame()))
    doc["version"] = 99
    newer.write_text(json.dumps(doc))
    with pytest.raises(ModelProfError, match="version 99"):
        read_json(newer)
    with pytest.raises(ModelProfError, match="missing.json"):
        read_json(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------- CSV


def test_csv_round_trip_is_exact(tmp_path: Path) -> None:
    df = _tricky(report_frame())
    path = to_csv(df, path=tmp_path / "a" / "report.csv")
    back = read_csv(path)
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    assert back["module"].iloc[0] == ""  # not NaN
    assert back["leaf"].dtype == bool and back["leaf"].tolist()[:2] == [False, True]
    assert back["peak_memory_bytes"].dtype == np.float64  # an all-NaN column stays float


def test_csv_has_raw_numbers_and_no_totals_row() -> None:
    text = to_csv(report_frame())
    lines = text.splitlines()
    assert lines[0].split(",")[:3] == ["module", "type", "call"]
    assert lines[1].startswith(",Net,1,0,False,")  # root: empty name
    assert len(lines) == 1 + 9  # header + 9 rows, no totals
    assert "total" not in text


def test_csv_says_where_a_reports_end_to_end_latency_is() -> None:
    # the CSV holds rows only: a CSV-only user lost the headline latency Markdown and LaTeX
    # print, silently (a trial); to_csv's doc names where it is
    import modelprof

    for doc in (modelprof.Report.to_csv.__doc__, modelprof.Report.to_dataframe.__doc__):
        assert "end-to-end latency" in doc and "latency`" in doc


def test_read_csv_reads_a_text_buffer() -> None:
    # to_csv()'s text in a buffer was refused ("must be a file path"; a trial)
    import io

    df = _tricky(report_frame())
    back = read_csv(io.StringIO(to_csv(df)))
    pd.testing.assert_frame_equal(back, df, check_exact=True)


def test_csv_round_trip_of_an_untimed_report() -> None:
    df = report_frame(timed=False)
    pd.testing.assert_frame_equal(read_csv(to_csv(df)), df, check_exact=True)


def test_csv_round_trip_of_the_torchstat_view() -> None:
    ts = pd.DataFrame(
        {
            "module name": ["conv1", "avgpool", "total"],
            "input shape": ["3x224x224", "512x7x7", ""],
            "output shape": ["64x112x112", "512x1x1", ""],
            "params": [9408, 0, 9408],
            "memory(MB)": [3.06, 0.0, 3.06],
            "MAdd": [235225088, 0, 235225088],
            "Flops": [118013952, 0, 118013952],
            "MemRead(B)": [639744, 0, 639744],
            "MemWrite(B)": [3211264, 0, 3211264],
            "duration[%]": [12.0, 0.0, 12.0],
            "MemR+W(B)": [3851008, 0, 3851008],
        }
    )
    pd.testing.assert_frame_equal(read_csv(to_csv(ts)), ts, check_exact=True)


def test_csv_infers_unknown_columns_and_honours_overrides() -> None:
    df = pd.DataFrame(
        {"n": [1, 2], "x": [0.5, np.nan], "flag": [True, False], "code": ["007", "8"]}
    )
    back = read_csv(to_csv(df))
    assert back["n"].dtype == np.int64 and back["x"].dtype == np.float64
    assert back["flag"].dtype == bool
    assert back["code"].tolist() == [7, 8]  # digits only: inferred as integers...
    kept = read_csv(to_csv(df), dtypes={"code": "str"})
    pd.testing.assert_frame_equal(kept, df, check_exact=True)  # ...unless told it is text


def test_csv_writes_a_named_index_as_a_column() -> None:
    cmp = pd.DataFrame({"params": [1, 2]}, index=pd.Index(["a", "b"], name="model"))
    back = read_csv(to_csv(cmp))
    assert list(back.columns) == ["model", "params"] and back["model"].tolist() == ["a", "b"]


def test_csv_reads_a_comparisons_failed_row_back_as_it_was() -> None:
    # a failed model's row: its whole numbers <NA> (Int64, not float64 1.0/NaN), its flags
    # None, its text missing; the error of a model that ran missing, not ""
    df = pd.DataFrame(
        {
            "input_shape": ["1x8", None],
            "params": pd.array([72, None], dtype="Int64"),
            "latency_stable": [True, None],  # (object columns)
            "latency_x_rough": [False, None],
            "rank": pd.array([1, None], dtype="Int64"),
            "error": [None, "RuntimeError: boom"],
        },
        index=pd.Index(["a", "bad"], name="model"),
    )
    assert df["latency_x_rough"].dtype == object
    back = read_csv(to_csv(df)).set_index("model")
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    assert back["latency_x_rough"].tolist() == [False, None]


def test_csv_keeps_a_sweeps_empty_error_and_a_gathered_reports_rank() -> None:
    # beside a status column (a sweep's) "" is the error of a row that ran; a gathered report's
    # process rank is int64, no row without one
    sweep = pd.DataFrame(
        {"model": ["a", "b"], "status": ["ok", "error"], "error": ["", "boom"], "host": ["h", ""]}
    )
    pd.testing.assert_frame_equal(read_csv(to_csv(sweep)), sweep, check_exact=True)
    # a column of "" only (every row ran, none warned) read as NaN floats; a failed row has no
    # input shape and no latency (missing), a timed row that ran says "" where its median is
    # quotable
    sweep = pd.DataFrame(
        {
            "model": ["a", "b"],
            "status": ["ok", "error"],
            "error": ["", "boom"],
            "input_shape": ["1x8", None],
            "latency_unquotable": ["", None],
            "warnings": ["", ""],
        }
    )
    pd.testing.assert_frame_equal(read_csv(to_csv(sweep)), sweep, check_exact=True)
    ran = sweep.iloc[:1]
    pd.testing.assert_frame_equal(read_csv(to_csv(ran)), ran, check_exact=True)
    gathered = report_frame()
    gathered.insert(0, "rank", 0)
    assert gathered["rank"].dtype == np.int64
    pd.testing.assert_frame_equal(read_csv(to_csv(gathered)), gathered, check_exact=True)


def test_read_csv_errors() -> None:
    with pytest.raises(ModelProfError, match="no CSV file at 'nowhere.csv'"):
        read_csv("nowhere.csv")
    bad = to_csv(report_frame()).replace(",False,", ",maybe,", 1)
    with pytest.raises(ModelProfError, match="'leaf'.*'maybe'"):
        read_csv(bad)
    with pytest.raises(ModelProfError, match="'nope'"):
        read_csv(to_csv(report_frame()), dtypes={"nope": "str"})


def test_roofline_columns_round_trip_including_a_missing_bound() -> None:
    from modelprof.report.roofline import add_roofline
    from modelprof.timing.peaks import Peaks

    df = add_roofline(report_frame(), Peaks(1e9, 1e9))
    df.loc[3, "bound"] = None  # a row without work has no bound
    assert df["bound"].isna().sum() == 1
    pd.testing.assert_frame_equal(read_json(to_json(df))[0], df, check_exact=True)
    pd.testing.assert_frame_equal(read_csv(to_csv(df)), df, check_exact=True)


def test_empty_tables_round_trip() -> None:
    empty = report_frame().head(0)
    pd.testing.assert_frame_equal(read_json(to_json(empty))[0], empty)
    assert list(read_csv(to_csv(empty)).columns) == list(empty.columns)


def test_json_writes_one_line_per_row() -> None:
    lines = to_json(report_frame()).splitlines()
    rows = [line for line in lines if line.startswith('    ["')]
    assert len(rows) == 9  # one per module call
    assert any(line.startswith('  "columns": ["module", "type"') for line in lines)
    assert to_json(report_frame(), indent=None).count("\n") == 1  # compact: one line


# ------------------------------------------------------------- hostile names, huge counts, bad input


def _named(names: list[str]) -> pd.DataFrame:
    df = report_frame().head(len(names)).copy()
    df["module"] = names
    return df


def test_csv_round_trips_names_with_carriage_returns_and_newlines() -> None:
    names = ["a\rb", "c\nd", "e\r\nf", 'q"x', "", "tab\there", "plain"]
    df = _named(names)
    back = read_csv(to_csv(df))
    pd.testing.assert_frame_equal(back, df, check_exact=True)
    assert back["module"].tolist() == names


def test_text_and_markdown_keep_one_line_per_row() -> None:
    from modelprof.render import to_markdown, to_text

    df = _named(["a\nb", "c\rd", "x|y", "ok", "w", "v", "u"])
    for text in (to_text(df), to_markdown(df)):
        lines = text.rstrip("\n").split("\n")
        assert "\r" not in text
        # header + rule + 7 rows + totals (text: a rule and the totals line)
        assert len(lines) == (11 if text.startswith("module") else 10), text
        assert any("a\\nb" in line for line in lines) and any("c\\rd" in line for line in lines)
    assert "x\\|y" in to_markdown(df)  # the pipe is escaped where it would end the cell


def test_counts_above_int64_make_a_float_column_and_round_trip() -> None:
    import torch
    from torch import nn

    from modelprof import Cost, profile
    from modelprof.counting.formulas import REGISTRY

    registry = REGISTRY.copy()
    huge = 2**64 + 7  # above int64's 2**63 - 1
    registry.add((torch.ops.aten.addmm,), lambda args, kwargs, out: Cost(macs=huge), replace=True)
    report = profile(nn.Linear(2, 2), (2,), registry=registry, timing=False)
    assert report.totals["macs"] == huge  # exact in the totals
    df = report.to_dataframe()
    assert df["macs"].dtype == np.float64 and df["macs"].max() == float(huge)
    assert df["params"].dtype == np.int64  # columns that fit stay int64
    ts = report.to_dataframe(style="torchstat")  # torchstat's Linear formula: small counts
    assert ts["params"].tolist() == [6, 6]  # 2*2 + 2, and the total row
    pd.testing.assert_frame_equal(read_csv(to_csv(df)), df, check_exact=True)
    pd.testing.assert_frame_equal(read_json(to_json(df))[0], df, check_exact=True)


def test_torchstat_total_row_does_not_wrap_around() -> None:
    from modelprof.report.rows import Row, torchstat_frame

    big = 2**62  # two of these overflow int64 if summed in numpy
    rows = [
        Row(module=f"m{i}", type="X", depth=1, madd=big, torchstat_madd=big, record=i)
        for i in range(2)
    ]
    df = torchstat_frame(rows, timed=False)
    assert df["MAdd"].tolist() == [big, big, 2 * big]  # 2**63: float64, not -2**63
    assert df["MAdd"].dtype == np.float64


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("columns"), "has no 'columns' field"),
        (lambda d: d.__setitem__("columns", 3), "'columns' must be a list"),
        (lambda d: d.__setitem__("data", {"a": 1}), "'data' must be a list"),
        (lambda d: d["data"].__setitem__(0, {"a": 1}), "every row of 'data' must be a list"),
        (lambda d: d["data"][0].__setitem__(8, "many"), "column 'macs' cannot be read as 'int64'"),
        (lambda d: d["data"][0].__setitem__(4, "yes"), "column 'leaf' cannot be read as 'bool'"),
        (lambda d: d["data"][0].__setitem__(14, "slow"), "column 'latency_ms' cannot be read"),
        (lambda d: d["data"][0].__setitem__(8, 2**70), "column 'macs' cannot be read as 'int64'"),
        (lambda d: d["dtypes"].__setitem__(0, "no-such-dtype"), "unknown dtype 'no-such-dtype'"),
        (lambda d: d["dtypes"].__setitem__(0, 5), "dtypes must be strings"),
        (lambda d: d.__setitem__("index", [1, 2]), "'index' must be null or an object"),
        (lambda d: d.__setitem__("index", {"dtype": "int64"}), "has no 'values' field"),
        (
            lambda d: d.__setitem__("index", {"dtype": "int64", "values": [1], "name": None}),
            "the index has 1 values for",
        ),
        (
            lambda d: d.__setitem__(
                "index",
                {"dtype": "int64", "values": list(range(len(d["data"]))), "name": ["unhashable"]},
            ),
            "malformed",
        ),
        (lambda d: d.__setitem__("totals", [1]), "'totals' must be null or an object"),
    ],
)
def test_malformed_json_is_a_modelprof_error(mutate, message: str) -> None:
    document = json.loads(to_json(report_frame(), report_totals(), ENV))
    mutate(document)
    with pytest.raises(ModelProfError, match=message.replace("(", r"\(")):
        read_json(json.dumps(document))


def test_json_text_that_is_not_an_object() -> None:
    with pytest.raises(ModelProfError, match="not a modelprof JSON document"):
        read_json("[1, 2]")


def test_a_users_own_error_column_keeps_its_empty_cells() -> None:
    # only a comparison's table (model and error columns) reads an empty error as missing: a
    # frame of one's own with an error column came back with NaN for "" (and a "note" NaN in
    # the failed row only)
    orig = pd.DataFrame({"name": ["r1", "r2"], "error": ["", "timeout"], "note": ["ok", ""]})
    pd.testing.assert_frame_equal(read_csv(to_csv(orig)), orig)
    # a comparison's, typed by dtypes=: the column as asked
    text = "model,error,input_shape\na,,1x4\nb,boom,\n"
    assert read_csv(text)["error"].isna().tolist() == [True, False]
    assert read_csv(text, dtypes={"error": "str"})["error"].tolist() == ["", "boom"]
