"""Rough per-layer times stay marked in the views that sum or restyle the rows: the per-layer-type
table (``by_layer_type``, ``group_by="layer_type"``) and torchstat's (its ``duration``). A sum with
a rough row in it is rough. Roughness is forced, never waited for: a budget that stops the
per-layer passes short of ``min_samples`` (with no extension), or one row flagged by hand."""

from __future__ import annotations

import pandas as pd
import pytest
from torch import nn

import modelprof.report.report as report_module
from modelprof import profile
from modelprof.render.csvio import read_csv
from modelprof.timing.calibration import Spin, spin_model

pytestmark = [
    pytest.mark.filterwarnings("ignore::modelprof.errors.ModelProfWarning"),
    pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning"),
]


def _row(text: str, key: str) -> str:
    """The table row whose first cell is ``key`` (text, Markdown or LaTeX): a caption or a
    note that says the word (a loaded machine's "other work") is none."""
    (line,) = [line for line in text.splitlines() if line.lstrip("| ").startswith(f"{key} ")]
    return line


@pytest.fixture
def one_rough_relu(monkeypatch):
    """A spin then a ReLU, its per-layer passes taken as whole (no reason for every row to be
    rough) and the ReLU's row alone flagged rough, whatever the machine's load did (for the
    test's time: its views read the flags as they render)."""
    monkeypatch.setattr(report_module.Report, "_rough_reason", lambda self: None)
    monkeypatch.setattr(report_module, "_short_own_rows", lambda df: df["module"].eq("1"))
    return profile(nn.Sequential(Spin(2.0), nn.ReLU()), (4,), warmup=1, repeat=3, roofline=False)


def test_a_layer_type_is_rough_where_a_row_summed_into_it_is(one_rough_relu, tmp_path):
    r = one_rough_relu
    flags = r.to_dataframe().set_index("module")["latency_rough"]
    assert flags.to_dict() == {"": False, "0": False, "1": True}  # as forced above
    kinds = r.by_layer_type()
    # the Spin's row is typed "other", the ReLU's "activation": only the latter holds a rough row
    assert kinds["latency_rough"].to_dict() == {"other": False, "activation": True}
    for fmt in ("text", "markdown"):
        out = r.export(fmt, group_by="layer_type")
        assert "latency rough" not in out  # said by the marks, not by a column
        # the activation row's latency and its share: both "~"; the other row's: neither
        act, other = _row(out, "activation"), _row(out, "other")
        assert act.count("~") == 2 and "~" not in other, out
    tex = r.to_latex(group_by="layer_type", width=None)
    act, other = _row(tex, "activation"), _row(tex, "other")
    assert act.count("\\textcolor{gray}{\\textasciitilde{}") == 2 and "textcolor" not in other
    html = r.to_html(group_by="layer_type")
    assert html.count('class="r rough"') == 2  # the activation row's two cells, greyed
    # on hover they point at the caption, which says why (no cause of its own that may be
    # wrong: it said "few per-layer passes, a busy probe, or above the peak" for any)
    assert html.count('title="rough: no figure to quote (the caption says why)"') == 2
    # the flag goes to a file, and reads back exactly
    back = read_csv(r.to_csv(tmp_path / "types.csv", group_by="layer_type"))
    pd.testing.assert_frame_equal(back, pd.DataFrame(kinds).reset_index(), check_exact=True)


def test_a_printed_layer_type_table_shows_its_flags_as_marks_not_as_a_column(one_rough_relu):
    # print(report.by_layer_type()) showed a "latency rough" column of yes/no beside the marks
    # it drives; the frame keeps the flag (its files read it back: the test above)
    kinds = one_rough_relu.by_layer_type()
    assert kinds["latency_rough"].to_dict() == {"other": False, "activation": True}
    text, html = repr(kinds), kinds._repr_html_()
    assert "latency rough" not in text and "latency rough" not in html
    assert _row(text, "activation").count("~") == 2 and "~" not in _row(text, "other")
    assert html.count('class="r rough"') == 2  # the activation row's latency and its share
    assert str(kinds) == text  # print() shows the same


def test_torchstat_duration_is_marked_like_latency(one_rough_relu):
    r = one_rough_relu
    ts = r.to_dataframe("torchstat").set_index("module name")["latency_rough"]
    # the total's duration sums the rough ReLU's: rough too
    assert ts.to_dict() == {"0": False, "1": True, "total": True}
    text = r.to_text(style="torchstat")
    assert "latency rough" not in text
    assert "~" not in _row(text, "0") and "~" in _row(text, "1") and "~" in _row(text, "total")


def test_rows_short_of_the_stop_rule_are_rough_in_every_grouped_view():
    # a 20 ms spin in a 0.05 s budget with no extension: fewer per-layer passes than
    # min_samples=10, so every row is rough (test_profile_timing's forcing)
    r = profile(
        spin_model((20.0, 5.0)), (4,), warmup=1, budget_s=0.05, layer_extend_s=0, roofline=False
    )
    assert r.layers_rough
    assert _row(repr(r.by_layer_type()), "other").count("~") == 2  # the latency and its share
    tex = r.to_latex(group_by="layer_type", width=None)
    assert "Per-layer times marked \\textasciitilde{} are rough" in tex
    assert _row(tex, "other").count("\\textasciitilde{}") == 2
    text = r.to_text(style="torchstat", depth=1)
    assert all("~" in _row(text, key) for key in ("0", "1", "total"))  # each one's duration
