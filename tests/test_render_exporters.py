"""Markdown, LaTeX, HTML and plain-text exporters: golden files and layout details.

Golden files live in tests/golden/render_*; after a deliberate change of layout, regenerate them
with ``MODELPROF_UPDATE_GOLDEN=1 pytest tests/test_render_exporters.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest
from test_render_fixture import report_frame, report_totals

from modelprof.errors import ModelProfError
from modelprof.render import to_html, to_latex, to_markdown, to_text
from modelprof.render.latex import escape_latex
from modelprof.render.views import compact_columns

GOLDEN = Path(__file__).parent / "golden"
TOTALS = {k: v for k, v in report_totals().items() if k != "output_bytes"}  # as a Report shows
E2E = {"latency_ms": 1.0}  # the clean end-to-end median, in its own footer row


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MODELPROF_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}"
    assert text == path.read_text(encoding="utf-8")


def test_markdown_golden() -> None:
    df = report_frame()
    text = to_markdown(df, TOTALS, end_to_end=E2E, columns=compact_columns(df))
    _check_golden("render_markdown.md", text)


def test_markdown_raw_golden() -> None:
    text = to_markdown(
        report_frame(),
        report_totals(),
        units="raw",
        depth=1,
        columns=["module", "type", "call", "params", "flops", "read_bytes", "latency_ms"],
    )
    _check_golden("render_markdown_raw.md", text)


def test_latex_golden() -> None:
    text = to_latex(
        report_frame(),
        TOTALS,
        end_to_end=E2E,
        units="fixed",
        depth=1,
        columns=[
            "module",
            "type",
            "params",
            "macs",
            "flops",
            "output_bytes",
            "latency_ms",
            "latency_pct",
        ],
        caption="Per-layer cost of the fixture model.",
        label="tab:fixture",
        position="t",
    )
    _check_golden("render_latex.tex", text)


def test_text_golden() -> None:
    df = report_frame()
    text = to_text(
        df, TOTALS, end_to_end=E2E, columns=compact_columns(df), title="Net (1x3x8x8, float32)"
    )
    _check_golden("render_text.txt", text)


def test_markdown_is_a_pipe_table_with_alignment_and_totals() -> None:
    text = to_markdown(report_frame(), TOTALS, columns=["module", "flops"])
    lines = text.splitlines()
    assert text.endswith("\n")
    assert re.fullmatch(r"\| module +\| +FLOPs \|", lines[0])
    assert re.fullmatch(r"\|:-+\|-+:\|", lines[1])  # text left, numbers right
    assert len(lines) == 2 + 9 + 1  # header, rule, 9 rows, totals
    assert re.fullmatch(r"\| total +\| +16\.64 K \|", lines[-1])  # 16640 FLOPs
    # a caption given goes in bold above the table, as LaTeX's and HTML's do (it was dropped)
    captioned = to_markdown(report_frame(), TOTALS, columns=["module", "flops"], caption="T *1*")
    assert captioned == "**T \\*1\\***\n\n" + text


def test_markdown_escapes_pipes_in_names() -> None:
    df = report_frame()
    df.loc[1, "module"] = "a|b"
    text = to_markdown(df, columns=["module"], show_totals=False)
    assert "a\\|b" in text and "a|b" not in text.replace("a\\|b", "")


def test_latex_escapes_specials_and_uses_booktabs() -> None:
    df = report_frame()
    df.loc[1, "module"] = "blocks_1 & 50% #2"
    text = to_latex(df, TOTALS, columns=["module", "flops", "latency_pct"], units="human")
    assert r"blocks\_1 \& 50\% \#2" in text
    assert r"30.00\%" in text  # conv1: 0.3 ms of 1.0 ms
    order = [text.index(k) for k in (r"\toprule", r"\midrule", "total", r"\bottomrule")]
    assert order == sorted(order)
    assert text.count(r"\midrule") == 2  # under the header and above the totals
    assert r"\begin{tabular}{lrr}" in text
    # width="textwidth" (the default) spans both columns of a two-column paper
    assert r"\begin{table*}" in text and r"\caption" not in text
    assert text.startswith(r"% modelprof table: needs \usepackage{booktabs}")


def test_latex_without_float_environment_and_micro_sign() -> None:
    text = to_latex(
        report_frame(),
        columns=["module", "latency_ms"],
        float_env=False,
        caption="ignored without a float",
        units="human",
    )
    assert r"\begin{table}" not in text and r"\caption" not in text
    assert r"300 \textmu{}s" in text  # conv1: 0.3 ms = 300 µs
    assert "µ" not in text


def test_escape_latex_covers_every_special() -> None:
    assert escape_latex(r"a\b{c}~^$") == (
        r"a\textbackslash{}b\{c\}\textasciitilde{}\textasciicircum{}\$"
    )


def test_html_is_escaped_styled_and_has_a_share_bar() -> None:
    df = report_frame()
    df.loc[1, "module"] = "<script>alert(1)</script>"
    text = to_html(df, TOTALS, end_to_end=E2E, caption="A & B")
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<caption>A &amp; B</caption>" in text
    assert "max-height" not in text  # shown in full: no scroll box that clips the rows
    assert "max-height: 20em" in to_html(df, max_height="20em")  # unless asked for
    assert not text.startswith("<!DOCTYPE")  # a fragment unless standalone=True
    # conv1's latency share is 30% of end to end: the bar fills 30% of its cell
    assert "rgba(66, 133, 244, 0.30) 30.00%, transparent 30.00%" in text
    assert re.search(r"<tfoot><tr><td class=\"l\">total</td>", text)
    assert '<tr><td class="l">end-to-end (clean run)</td>' in text
    # depth 2 rows are indented: 0.6 + 1.2 * 2 = 3.0 em
    assert 'style="padding-left: 3.0em;">layer1.0</td>' in text


def test_html_without_timing_has_no_bars_and_no_nan_text() -> None:
    text = to_html(report_frame(timed=False))
    assert "linear-gradient" not in text
    assert "nan" not in text.lower().replace("tabular-nums", "")


def test_html_bar_is_clamped_and_empty_for_missing() -> None:
    df = report_frame()
    df.loc[1, "latency_pct"] = 250.0
    df.loc[2, "latency_pct"] = float("nan")
    text = to_html(df, columns=["module", "latency_pct"], show_totals=False)
    assert "250.00%" in text and "transparent 100.00%" in text  # clamped to the cell
    assert text.count("linear-gradient") == len(df) - 1  # the NaN row gets no bar


def test_text_has_a_totals_line_and_truncates_long_tables() -> None:
    df = report_frame()
    text = to_text(df, TOTALS, columns=["module", "flops"], max_rows=4)
    lines = text.splitlines()
    assert lines[0].split() == ["module", "FLOPs"]
    assert "... 5 more rows ..." in text  # 9 rows, 4 shown
    assert lines[-1].split() == ["total", "16.64", "K"]
    assert sum(1 for line in lines if line.startswith("conv1") or line.startswith("(root)")) == 2
    with pytest.raises(ModelProfError, match="max_rows"):
        to_text(df, max_rows=1)


@pytest.mark.parametrize(
    "writer, suffix",
    [
        (to_markdown, "md"),
        (to_latex, "tex"),
        (to_html, "html"),
        (to_text, "txt"),
    ],
)
def test_path_writes_the_file_and_returns_the_path(tmp_path: Path, writer, suffix: str) -> None:
    df = report_frame()
    target = tmp_path / "deep" / "er" / f"table.{suffix}"
    returned = writer(df, TOTALS, path=target)
    assert returned == target
    text = writer(df, TOTALS)
    expected = text if text.endswith("\n") else text + "\n"
    assert target.read_text(encoding="utf-8") == expected


def test_path_that_is_a_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelProfError, match="directory"):
        to_markdown(report_frame(), path=tmp_path)


def test_exporters_accept_a_compare_frame() -> None:
    cmp = pd.DataFrame(
        {
            "params": [11_689_512, 5_483_032],
            "flops": [3_628_146_688, 438_000_000],
            "latency_ms": [3.1, 1.9],
        },
        index=pd.Index(["resnet18", "mobilenet_v3_large"], name="model"),
    )
    md = to_markdown(cmp)
    assert md.splitlines()[0].split("|")[1].strip() == "model"
    assert "11.69 M" in md and "3.63 G" in md and "total" not in md
    assert "mobilenet\\_v3\\_large" in to_latex(cmp)


def test_html_standalone_page_is_a_complete_document() -> None:
    text = to_html(
        report_frame(), TOTALS, standalone=True, title="Net <1>", summary=["params 126", "a & b"]
    )
    assert text.startswith('<!DOCTYPE html>\n<html lang="en">')
    assert '<meta charset="utf-8">' in text and "<title>Net &lt;1&gt;</title>" in text
    assert "<h1>Net &lt;1&gt;</h1>" in text and "a &amp; b" in text
    assert text.rstrip().endswith("</html>") and text.count("<table>") == 1
    assert "<caption>" not in text  # no caption: the heading is the title


def test_html_standalone_page_keeps_the_callers_caption() -> None:
    # a page's caption= was dropped (only the fragment showed it): a paper's caption was lost
    page = to_html(report_frame(), TOTALS, standalone=True, title="Net", caption="Table 2 & more")
    assert "<h1>Net</h1>" in page and "<caption>Table 2 &amp; more</caption>" in page
    # a caption that is the page's title is its heading once, not twice
    same = to_html(report_frame(), TOTALS, standalone=True, caption="Net")
    assert "<h1>Net</h1>" in same and "<caption>" not in same


def test_text_and_markdown_show_the_end_to_end_row() -> None:
    md = to_markdown(
        report_frame(), TOTALS, end_to_end=E2E, columns=["module", "flops", "latency_ms"]
    )
    lines = md.splitlines()
    # the sum of latencies means nothing (parents include children): the totals cell is empty
    assert re.fullmatch(r"\| total +\| +16\.64 K \| +\|", lines[-2])
    assert re.fullmatch(r"\| end-to-end \(clean run\) +\| +\| +1\.00 ms \|", lines[-1])
    text = to_text(report_frame(), TOTALS, end_to_end=E2E, columns=["module", "latency_ms"])
    # no total of latencies, so only the end-to-end row follows the rule
    assert text.splitlines()[-1].split() == ["end-to-end", "(clean", "run)", "1.00", "ms"]
    assert not any(line.startswith("total") for line in text.splitlines())
