"""Exports that another program interprets: a spreadsheet (CSV formulas), a Markdown renderer
(raw HTML), LaTeX (characters pdflatex cannot set). Module names are the user's text."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import warnings

import pandas as pd
import pytest

from modelprof.errors import ModelProfWarning
from modelprof.render import read_csv, to_csv, to_latex, to_markdown

HOSTILE = [
    '=HYPERLINK("http://x","y")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "\tTAB",
    "\rCR",
    "'=already quoted",
    "'plain",
    "plain",
    "",
    "a=b",
    "-",
]


def _frame(names: list[str]) -> pd.DataFrame:
    n = len(names)
    return pd.DataFrame(
        {
            "module": names,
            "type": ["Linear"] * n,
            "params": range(n),
            "macs": [-5 + i for i in range(n)],  # negative numbers stay numbers
            "latency_ms": [-0.5 * i for i in range(n)],
            "note": names,
        }
    )  # a column read_csv does not know: types inferred


def test_csv_neutralises_formula_cells_owasp():
    text = to_csv(_frame(HOSTILE))
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    assert len(body) == len(HOSTILE)
    for column in ("module", "note"):
        cells = [r[header.index(column)] for r in body]
        # no text cell starts with a character a spreadsheet evaluates (OWASP: prefix a ')
        assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))]
        assert cells[0] == "'" + HOSTILE[0] and cells[3] == "'@SUM(A1:A9)"
        assert cells[6] == "''=already quoted"  # a leading ' is doubled: reading stays exact
        assert cells[8] == "plain" and cells[10] == "a=b"  # harmless cells are unchanged
    assert [r[header.index("macs")] for r in body][:2] == ["-5", "-4"]  # numbers stay numbers


def test_csv_round_trip_is_exact_for_hostile_names():
    df = _frame(HOSTILE)
    back = read_csv(to_csv(df))
    assert list(back["module"]) == HOSTILE
    assert list(back["note"]) == HOSTILE
    assert list(back["macs"]) == list(df["macs"])
    assert list(back["latency_ms"]) == list(df["latency_ms"])


def test_csv_hostile_column_name_round_trips():
    df = pd.DataFrame({"module": ["a"], "=cmd": ["x"]})
    text = to_csv(df)
    assert text.splitlines()[0] == "module,'=cmd"
    assert list(read_csv(text).columns) == ["module", "=cmd"]


def test_markdown_escapes_raw_html():
    df = _frame(["<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "a<b"])
    text = to_markdown(df, show_totals=False)
    assert not re.search(r"(?<!\\)<", text)  # every "<" is escaped
    assert "\\<img src=x onerror=alert(1)\\>" in text  # shown literally by a Markdown renderer


def _latex_document(body: str) -> str:
    return (
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{booktabs}\n"
        "\\begin{document}\n" + body + "\\end{document}\n"
    )


def _pdflatex(tmp_path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "t.tex").write_text(_latex_document(body), encoding="utf-8")
    return subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )


def test_latex_warns_on_characters_pdflatex_cannot_set():
    df = _frame(["encoder.注意力", "layer_1 & 50%"])
    with pytest.warns(ModelProfWarning, match="注意力"):
        text = to_latex(df, show_totals=False, float_env=False, width=None)
    assert "xelatex or lualatex" in text  # said in the table's header comment too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        to_latex(_frame(["layer_1 & 50%", "ümlaut"]), show_totals=False)  # Latin: no warning


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_compiles_or_warns(tmp_path):
    for names in (["layer_1 & 50% $x$ #1 {a} ~^\\", "ümlaut"], ["encoder.注意力"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            body = to_latex(_frame(names), show_totals=False, float_env=False, width=None)
        warned = any(issubclass(w.category, ModelProfWarning) for w in caught)
        compiled = _pdflatex(tmp_path, body).returncode == 0
        assert compiled or warned, names
        assert compiled != warned, names  # warned exactly when pdflatex stops


def test_markdown_renders_hostile_names_as_text():
    markdown_it = pytest.importorskip("markdown_it")
    names = ["<img src=x onerror=alert(1)>", "\\<img src=x onerror=alert(3) x=\\>", "a|b<c"]
    text = to_markdown(_frame(names), show_totals=False)
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    assert "<img" not in html and "<table>" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the name, shown as text


def test_markdown_shows_names_with_markup_characters_as_they_are():
    # only < > | \ were escaped: "*star*" came out in italics, "[link](x)" as a live link
    markdown_it = pytest.importorskip("markdown_it")
    names = ["*star*", "`tick`", "[link](x)", "__init__", "~~s~~", "a&amp;b", "layer_1.conv"]
    text = to_markdown(_frame(names), show_totals=False)
    html = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
    assert not re.search(r"<(em|strong|code|a|s|del)\b", html), html
    for name in ("*star*", "`tick`", "[link](x)", "__init__", "~~s~~", "a&amp;amp;b"):
        # the name itself, as text (& as its entity)
        assert f'<td style="text-align:left">{name}</td>' in html, name
    assert "| layer_1.conv " in text  # an underscore inside a word stays as it is
