"""The change cost of a per-layer column: one instrument in one file (this one) reaches the
table, the totals, every export format and the CSV and JSON read-back, with no other change."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from helpers import latex_headers
from torch import nn

import modelprof
from modelprof.columns import Column, column
from modelprof.counting.instruments import Instrument, instrumented
from modelprof.render import read_csv, read_json


class ModuleCalls(Instrument):
    """Counts module calls: each call's own reading is 1."""

    columns = (
        Column(
            "module_calls",
            "module calls",
            "int",
            "calls",
            counted=True,
            additive=True,
            reading="own",
        ),
    )

    def exit(self, token, module, output):
        return {"module_calls": 1}


class OutputElements(Instrument):
    """An inclusive reading: the elements of the call's output, which a parent's includes (its
    (self) row gets what its children's outputs do not account for)."""

    columns = (Column("out_numel", "output elements", "count", "calls", reading="inclusive"),)

    def exit(self, token, module, output):
        return {"out_numel": output.numel()}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_throwaway_instrument_reaches_the_table_totals_and_every_export(tmp_path):
    with instrumented(ModuleCalls):
        report = modelprof.profile(_model(), (8,), batch_size=2, timing=False)
    df = report.to_dataframe()
    # 4 calls: the Sequential and its 3 children. The root's row is its subtree's 4; each child
    # 1; the root's own call goes to its "(self)" row (1), so the leaves add to 4.
    rows = dict(zip(df["module"], df["module_calls"]))
    assert rows == {"": 4, "0": 1, "1": 1, "2": 1, "(self)": 1}
    assert df["module_calls"].dtype == "int64"
    assert report.totals["module_calls"] == 4
    # the counted columns are the ones they were: the (self) row adds no cost
    assert report.totals["params"] == 8 * 16 + 16 + 16 * 4 + 4
    assert df.loc[df["module"] == "(self)", "flops"].item() == 0
    # every export format shows it under its declared header; the human views carry the total
    for fmt in ("markdown", "latex", "html", "text"):
        text = report.export(fmt, columns=["module", "params", "module_calls"])
        shown = " & ".join(latex_headers(text)) if fmt == "latex" else text  # (over 2 lines)
        assert "module calls" in shown, fmt
    csv = report.export("csv")
    assert "module_calls" in csv.splitlines()[0]
    pd.testing.assert_frame_equal(read_csv(csv), df)
    back, totals, _ = read_json(report.export("json"))
    pd.testing.assert_frame_equal(back, df)
    assert totals["module_calls"] == 4
    # the instrument reads only inside its block (its column stays declared, for the reports
    # made there)
    assert column("module_calls").header == "module calls"
    again = modelprof.profile(_model(), (8,), batch_size=2, timing=False).to_dataframe()
    assert "module_calls" not in again.columns and "(self)" not in set(again["module"])


def test_an_inclusive_reading_gives_the_parent_its_subtree_and_the_self_row_the_rest():
    with instrumented(OutputElements):
        df = modelprof.profile(_model(), (8,), batch_size=2, timing=False).to_dataframe()
    rows = dict(zip(df["module"], df["out_numel"]))
    # batch 2: Linear(8,16) -> 32, ReLU -> 32, Linear(16,4) -> 8; the root's output is the last
    # child's (8), so its own part is 8 - (32 + 32 + 8) = -64, read as it is
    assert rows == {"": 8, "0": 32, "1": 32, "2": 8, "(self)": -64}


def test_an_instrument_is_refused_without_a_reading_kind():
    class Bad(Instrument):
        columns = (Column("bad_col", "bad", "int", "calls"),)

    with pytest.raises(ValueError, match="bad_col"), instrumented(Bad):
        pass
    with pytest.raises(TypeError), instrumented(int):  # type: ignore[arg-type]
        pass
