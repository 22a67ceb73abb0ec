"""LaTeX tables for papers: fitting a width (columns, scale, both), longtable, two-line headers,
footer labels that span empty cells, and the package comment. A real pdflatex run, when one is
installed, checks that the tables compile without overfull boxes."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from helpers import latex_headers
from test_render_fixture import report_frame, report_totals
from torch import nn

from modelprof import ViewOptions, compare, profile
from modelprof.errors import ModelProfError
from modelprof.render.latex import (
    LONG_ROWS,
    NOMINAL_WIDTH_PT,
    estimate_width_pt,
    latex_table,
    to_latex,
)
from modelprof.render.views import prepare_table

TOTALS = {k: v for k, v in report_totals().items() if k != "output_bytes"}
E2E = {"latency_ms": 1.0}


def _wide_frame(rows: int = 8) -> pd.DataFrame:
    """A table far wider than a page: long names and many numeric columns."""
    data: dict[str, list] = {
        "module": [f"encoder.layers.{i}.self_attention.out_proj" for i in range(rows)]
    }
    for j in range(12):
        data[f"metric_{j}_ms"] = [1.5 + i + j for i in range(rows)]
    return pd.DataFrame(data)


def test_fixed_units_get_a_second_header_line() -> None:
    text = to_latex(
        report_frame(), TOTALS, columns=["module", "params", "flops", "latency_ms"], fit=None
    )
    lines = text.splitlines()
    top = lines.index(r"\toprule")
    # "FLOPs (K)" -> "FLOPs" over "(K)": the unit does not widen a column of short numbers;
    # latency in µs, where the fixture's 0.05 ms relu shows two digits (50.00, not 0.05)
    assert lines[top + 1] == r"module & params & FLOPs & latency \\"
    assert lines[top + 2] == r" &  & (K) & (\textmu{}s) \\"


def test_a_tables_times_share_one_unit_its_bytes_each_their_own() -> None:
    """A paper's table shows all its times in one unit, chosen from every value of them: a
    latency in ms beside its std in µs reads as the same scale. A byte column keeps its own: an
    output of a few KiB beside tens of MiB read printed ``<0.01`` in a shared MiB."""
    df = pd.DataFrame(
        {
            "module": ["", "fc"],
            "latency_ms": [2.5, 0.4],
            "latency_std_ms": [0.05, 0.02],
            "output_bytes": [4 * 2**10, 338 * 2**10],
            "read_bytes": [52 * 2**20, 3.5 * 2**20],
        }
    )
    text = to_latex(df, show_totals=False, fit=None)
    # each time column alone: latency [2.5, 0.4] ms (0.4 >= 0.1 shows two digits), std
    # [0.05, 0.02] in µs. Shared: the times' top 2.5 ms allows ms or µs (2500 < 10**4), and ms
    # shows the least, 0.02, with one digit only, µs with two (20.00): µs for both. The bytes,
    # each alone: output's top 338 KiB = 346112 B has over 4 digits in B, so KiB (4.00, 338.00);
    # read's top 52 MiB: MiB (52.00, 3.50). A unit shared by the bytes: 52 MiB = 53248 KiB has
    # over 4 digits, so MiB, where 4 KiB = 0.0039 MiB printed "<0.01"
    assert latex_headers(text) == [
        "module",
        "latency (\\textmu{}s)",
        "latency std (\\textmu{}s)",
        "output (KiB)",
        "read (MiB)",
    ]
    assert r"(root) & 2500.00 & 50.00 & 4.00 & 52.00 \\" in text
    assert r"fc & 400.00 & 20.00 & 338.00 & 3.50 \\" in text
    # Markdown and HTML in fixed units share the rule (their default is a unit in every cell)
    from modelprof.render.markdown import to_markdown

    fixed = to_markdown(df, show_totals=False, units="fixed").splitlines()[0]
    assert "latency std (µs)" in fixed and "output (KiB)" in fixed and "read (MiB)" in fixed


def test_footer_labels_span_the_empty_cells_to_their_right() -> None:
    text = to_latex(
        report_frame(),
        TOTALS,
        end_to_end=E2E,
        columns=["module", "type", "flops", "output_bytes", "latency_ms"],
        fit=None,
    )
    # total: type is empty -> spans 2; output_bytes has no total (every activation summed
    # again), latency has none either (parents include children)
    assert r"\multicolumn{2}{l}{total} & 16.64 &  &  \\" in text
    # end-to-end: everything left of the latency is empty -> spans 4; 1 ms in the column's µs
    assert r"\multicolumn{4}{l}{end-to-end (clean run)} & 1000.00 \\" in text


def test_fit_columns_drops_the_least_important_first_and_keeps_the_first() -> None:
    df = _wide_frame()
    natural = estimate_width_pt(prepare_table(df, units="fixed"))
    assert natural > NOMINAL_WIDTH_PT["textwidth"]  # the premise: it does not fit as it is
    priority = ("module", "metric_11_ms", "metric_0_ms")
    df["module"] = [f"enc.{i}.attn" for i in range(len(df))]  # short names: a few columns fit
    text = to_latex(df, width="columnwidth", fit="columns", priority=priority)
    kept = [h.partition(" (")[0] for h in latex_headers(text)]
    # the first column and the prioritised ones survive, in the table's own order
    assert kept[0] == "module" and "metric 0" in kept and "metric 11" in kept
    assert kept.index("metric 0") < kept.index("metric 11")
    width = float(re.search(r"estimated natural width (\d+) pt", text).group(1))
    assert width <= NOMINAL_WIDTH_PT["columnwidth"]
    assert 3 <= len(kept) < 13
    # the unprioritised columns went rightmost first: those kept are the leftmost ones
    rest = [c for c in kept[1:] if c not in ("metric 0", "metric 11")]
    assert rest == [f"metric {j}" for j in range(1, len(rest) + 1)]


def test_priority_names_columns_the_table_has() -> None:
    """A name ``priority=`` gives that the table lacks would keep nothing: refused, named, in a
    frame's table and in a report's (whose own defaults name columns an untimed table lacks);
    one name alone is a list of one."""
    df = _wide_frame()
    df["module"] = [f"enc.{i}.attn" for i in range(len(df))]
    with pytest.raises(ModelProfError, match=r"priority: unknown column\(s\) \['metrik_3_ms'\]"):
        to_latex(df, width="columnwidth", priority=["metric_0_ms", "metrik_3_ms"])
    one = to_latex(df, width="columnwidth", priority="metric_11_ms")
    assert one == to_latex(df, width="columnwidth", priority=["metric_11_ms"])
    assert "metric 11" in [h.partition(" (")[0] for h in latex_headers(one)]
    with pytest.raises(ModelProfError, match="must be a list of column names"):
        to_latex(df, priority=[11])
    assert ViewOptions(priority=iter(["macs", "params"])).priority == ("macs", "params")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    report = profile(model, (8,), timing=False)  # no latency_ms, which the defaults name
    assert report.to_latex().startswith("% modelprof table")
    # flopz is near flops (difflib's ratio 2 * 4 / 10 = 0.8, over its 0.75 cutoff)
    with pytest.raises(ModelProfError, match=r"\['flopz'\] \(flopz: did you mean flops\?\)"):
        report.to_latex(priority=["flopz"])
    # only LaTeX reads priority: one view shared by every format is checked there alone
    shared = ViewOptions(priority=["flopz"])
    assert "| module" in report.to_markdown(view=shared)
    with pytest.raises(ModelProfError, match="flopz"):
        report.to_latex(view=shared)


class ConvolutionalFeatureExtractorWithLongName(nn.Conv2d):
    pass


def test_grouped_tables_step_down_a_font_to_keep_the_params() -> None:
    """A module_type table lacks ``output_shape``, where the defaults' "columns a paper keeps"
    end: its long type name leaves no room for params in \\small at column width, and
    \\footnotesize keeps them (the defaults are not cut to the table's names)."""
    layer = ConvolutionalFeatureExtractorWithLongName(3, 8, 3)
    report = profile(nn.Sequential(layer, nn.ReLU()), (3, 16, 16), timing=False)
    text = report.to_latex(group_by="module_type", width="columnwidth")
    assert "\\footnotesize" in text.splitlines()
    assert [h.partition(" (")[0] for h in latex_headers(text)][:2] == ["type", "params"]


def test_comparisons_step_down_a_font_as_reports_do() -> None:
    """A comparison's params, MACs and medians are columns a paper keeps, as a report's
    module, type, params... are: where \\small would drop them and \\footnotesize keeps them,
    it steps down (it never did: the rule ended its columns at a report's output_shape). A
    table still wider than the column once every other column is dropped steps down too."""
    models = {"a_long_model_name_" + "x" * 20: nn.Linear(8, 8), "b": nn.Linear(8, 4)}
    table = compare(models, (8,), timing=False)
    text = table.render.to_latex(width="columnwidth")
    assert "\\footnotesize" in text.splitlines()
    assert [h.partition(" (")[0] for h in latex_headers(text)] == ["model", "params"]
    # 26 x's: the name alone is wider than the column in \small (230 pt > 229.5 pt estimated)
    models = {"a_long_model_name_" + "x" * 26: nn.Linear(8, 8), "b": nn.Linear(8, 4)}
    narrow = compare(models, (8,), timing=False).render.to_latex(width="columnwidth")
    assert "\\footnotesize" in narrow.splitlines() and latex_headers(narrow) == ["model"]
    width = re.search(r"% estimated natural width (\d+) pt in \\footnotesize", narrow)
    assert width is not None and int(width[1]) <= NOMINAL_WIDTH_PT["columnwidth"]


def test_fit_scale_shrinks_only_a_wider_table() -> None:
    text = to_latex(_wide_frame(), fit="scale", width="columnwidth")
    # all 13 columns kept; \resizebox to the column width only when the natural width is larger
    assert r"\begin{tabular}{l" + "r" * 12 + "}" in text
    assert r"\resizebox{\ifdim\width>\columnwidth\columnwidth\else\width\fi}{!}{%" in text
    assert text.startswith(r"% modelprof table: needs \usepackage{booktabs,graphicx}")
    assert r"\begin{table}" in text and r"\begin{table*}" not in text  # one column wide


def test_fit_both_drops_to_a_readable_shrink_then_scales() -> None:
    df = _wide_frame()
    both = to_latex(df, fit="both", width="columnwidth")
    scaled = to_latex(df, fit="scale", width="columnwidth")
    columns = to_latex(df, fit="columns", width="columnwidth")
    n = [t.count("&", 0, t.index(r"\\")) for t in (columns, both, scaled)]
    assert n[0] < n[1] < n[2]  # both keeps more than columns alone, fewer than scale alone
    assert r"\resizebox" in both


def test_long_tables_split_into_continued_floats() -> None:
    """By default a long table is plain floats (they compile in two-column classes, where a
    longtable cannot), each at most LONG_ROWS lines, the header repeated, one table number."""
    df = _wide_frame(rows=2 * LONG_ROWS + 5)
    text = to_latex(
        df, columns=["module", "metric_0_ms"], caption="Long", label="tab:long", width="columnwidth"
    )
    assert r"\begin{longtable}" not in text and "longtable" not in text.splitlines()[0]
    # 2*40+5 = 85 rows, 37 per float (40 lines less toprule, header, midrule): 3 floats
    assert text.count(r"\begin{table}") == text.count(r"\end{table}") == 3
    assert text.count(r"\toprule") == 3  # the header in every part
    assert text.count(r"\caption{Long}") == 1 and text.count(r"\label{tab:long}") == 1
    assert text.count(r"\addtocounter{table}{-1}") == 2  # continued: the same number
    assert text.count(r"\caption{Long (continued)}") == 2
    for part in text.split(r"\begin{table}")[1:]:
        body = part[part.index(r"\midrule") : part.index(r"\bottomrule")]
        assert body.count(r"\\") <= LONG_ROWS
    assert sum(text.count(f"layers.{i}.self") for i in range(len(df))) == len(df)  # each once
    uncaptioned = to_latex(df, columns=["module", "metric_0_ms"])
    assert uncaptioned.count(r"\emph{(continued)}") == 2


def test_longtable_on_request_and_one_float_on_request() -> None:
    df = _wide_frame(rows=LONG_ROWS + 5)
    text = to_latex(
        df, columns=["module", "metric_0_ms"], caption="Long", label="tab:long", long=True
    )
    assert r"\begin{longtable}{lr}" in text and r"\end{longtable}" in text
    assert text.startswith(r"% modelprof table: needs \usepackage{booktabs,longtable}")
    assert r"\caption{Long}\label{tab:long} \\" in text
    for marker in (r"\endfirsthead", r"\endhead", r"\endfoot", r"\endlastfoot"):
        assert text.count(marker) == 1
    assert r"\begin{table" not in text
    short = to_latex(df.head(5), columns=["module", "metric_0_ms"])
    assert r"\begin{longtable}" not in short and short.count(r"\begin{table*}") == 1
    forced = to_latex(df, columns=["module", "metric_0_ms"], long=False)
    assert r"\begin{longtable}" not in forced and forced.count(r"\begin{table*}") == 1


def test_longtable_cannot_be_scaled_and_bad_options_are_named() -> None:
    df = _wide_frame(rows=LONG_ROWS + 5)
    with pytest.raises(ModelProfError, match="longtable cannot be scaled"):
        to_latex(df, fit="scale", long=True)
    with pytest.raises(ModelProfError, match="'squeeze'"):
        to_latex(df, fit="squeeze")
    with pytest.raises(ModelProfError, match="'pagewidth'"):
        to_latex(df, width="pagewidth")
    with pytest.raises(ModelProfError, match="'tiny'"):
        to_latex(df, font_size="tiny")
    # a placement LaTeX refuses ("Unknown float option 'q'") is refused here, by name
    for position in ("q", "", "top", "!", "H", "hH"):
        with pytest.raises(ModelProfError, match=f"position={position!r} is not a LaTeX float"):
            to_latex(df, position=position)
    assert r"\begin{table*}[!ht]" in to_latex(df, position="!ht", long=False)
    # long="false" (a string, so truthy) set a longtable: refused as float_env's strings are
    for given in ("false", "no", "True", 0):
        with pytest.raises(ModelProfError, match=f"long={given!r} must be True or False"):
            to_latex(df, long=given)


def test_tiny_values_never_print_as_zero() -> None:
    df = pd.DataFrame({"module": ["net", "bn"], "params": [11_689_512, 128]})
    text = to_latex(df, fit=None)
    # M keeps the total readable; BN's 128 params would be 0.00 M: printed "<0.01"
    assert r"bn & \textless{}0.01 \\" in text and r"net & 11.69 \\" in text


def test_latex_table_without_a_float() -> None:
    t = prepare_table(report_frame(), TOTALS, columns=["module", "flops"], units="fixed")
    text = latex_table(t, float_env=False, caption="unused")
    assert r"\begin{table" not in text and r"\caption" not in text
    assert "{\\small\n\\begin{tabular}{lr}" in text


PDFLATEX = shutil.which("pdflatex")


@pytest.mark.skipif(PDFLATEX is None, reason="pdflatex is not installed")
def test_tables_compile_without_overfull_boxes(tmp_path: Path) -> None:
    df = _wide_frame()
    tables = {
        "columns": to_latex(df, width="textwidth"),
        "column": to_latex(df, width="columnwidth", fit="both"),
        "long": to_latex(
            _wide_frame(rows=LONG_ROWS + 30), columns=["module", "metric_0_ms", "metric_1_ms"]
        ),
        "fixture": to_latex(report_frame(), TOTALS, end_to_end=E2E),
    }
    body = "\n".join(f"\\input{{{name}}}\n\\clearpage" for name in tables)
    for name, text in tables.items():
        (tmp_path / f"{name}.tex").write_text(text, encoding="utf-8")
    (tmp_path / "doc.tex").write_text(
        "\\documentclass[10pt]{article}\n\\usepackage{booktabs,longtable,graphicx}\n"
        f"\\begin{{document}}\n{body}\n\\end{{document}}\n",
        encoding="utf-8",
    )
    for _ in range(2):  # longtable settles its column widths on the second run
        run = subprocess.run(
            [PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout[-3000:]
    log = (tmp_path / "doc.log").read_text(encoding="latin-1")
    assert "Overfull" not in log and "Float too large" not in log


@pytest.mark.skipif(PDFLATEX is None, reason="pdflatex is not installed")
@pytest.mark.parametrize("options", ["10pt", "10pt,twocolumn"])
def test_default_long_tables_compile_in_one_and_two_columns(tmp_path: Path, options: str) -> None:
    """The default layout of a long table (continued floats) compiles in both classes: a
    longtable would stop a twocolumn document with "longtable not in 1-column mode"."""
    long_df = _wide_frame(rows=2 * LONG_ROWS + 5)
    tables = {
        "wide": to_latex(
            long_df,
            columns=["module", "metric_0_ms", "metric_1_ms"],
            caption="All rows",
            label="tab:all",
        ),
        "narrow": to_latex(long_df, width="columnwidth", fit="both", caption="One column"),
    }
    for name, text in tables.items():
        assert "longtable" not in text
        (tmp_path / f"{name}.tex").write_text(text, encoding="utf-8")
    body = "\n".join(f"\\input{{{name}}}" for name in tables)
    (tmp_path / "doc.tex").write_text(
        f"\\documentclass[{options}]{{article}}\n\\usepackage{{booktabs,graphicx}}\n"
        f"\\begin{{document}}\nText.\n{body}\n\\end{{document}}\n",
        encoding="utf-8",
    )
    run = subprocess.run(
        [PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    log = (tmp_path / "doc.log").read_text(encoding="latin-1")
    assert "Overfull" not in log and "Float too large" not in log
    # 85 rows in 3 floats each for both tables: 6 pages of floats at most, all placed
    assert "Output written on doc.pdf" in run.stdout


def test_a_caption_is_escaped_like_the_cells():
    df = pd.DataFrame({"module": ["a"], "params": [1]})
    text = to_latex(df, caption="vit_b_16 per-layer cost & 50% #1", label="tab:vit_b_16")
    # pdflatex stopped at the bare "_" with "Missing $ inserted"
    assert r"\caption{vit\_b\_16 per-layer cost \& 50\% \#1}" in text
    assert r"\label{tab:vit_b_16}" in text  # a key \ref matches: as given
    long = to_latex(df, caption="a_b", long=True)
    assert r"\caption{a\_b}" in long


@pytest.mark.parametrize("label", ["tab:50%", "a#b", "x{y}", "a\\b"])
def test_a_label_that_would_break_the_document_is_refused(label):
    df = pd.DataFrame({"module": ["a"], "params": [1]})
    with pytest.raises(ModelProfError, match="label="):
        to_latex(df, label=label)


def test_children_are_indented_under_their_parents_and_the_root_is_the_model() -> None:
    # the fixture's tree: Net (depth 0) > conv1, bn1, relu, layer1, relu #2 (depth 1);
    # layer1 > layer1.0, layer1.1, layer1.(self) (depth 2). Parents and children side by side
    # in one column: each child sits 0.8 em further in, so nobody adds them up twice
    text = to_latex(report_frame(), TOTALS, columns=["module", "type", "flops"], fit=None)
    body = text.split(r"\midrule")[1].strip().splitlines()
    assert [line.split(" & ")[0] for line in body] == [
        "Net",  # the model, by its class: not "(root)"
        r"\hspace{0.8em}conv1",
        r"\hspace{0.8em}bn1",
        r"\hspace{0.8em}relu",
        r"\hspace{0.8em}layer1",
        r"\hspace{1.6em}layer1.0",
        r"\hspace{1.6em}layer1.1",
        r"\hspace{1.6em}(self)",  # layer1's own ops, named under it
        r"\hspace{0.8em}relu \#2",
    ]
    assert "(root)" not in text
    # the width estimate counts the indentation: the widest name, layer1.(self), is 1.6 em
    # further in, 1.6 x 9 pt (\small) x 1.05 (the margin) = 15.12 pt wider
    table = prepare_table(report_frame(), TOTALS, columns=["module"])
    # the same cells, rows no longer nested (names m0, m1, ...: none holds another)
    flat = dataclasses.replace(table, frame=table.frame.assign(module=[f"m{i}" for i in range(9)]))
    assert estimate_width_pt(table) - estimate_width_pt(flat) == pytest.approx(1.6 * 9 * 1.05)
    # one level shown (depth=1 keeps depth 0 and 1): the children of the root indented once
    shallow = to_latex(report_frame(), TOTALS, columns=["module", "flops"], depth=1, fit=None)
    assert r"\hspace{1.6em}" not in shallow and r"\hspace{0.8em}layer1 &" in shallow
    # leaves only: one level, nothing to indent
    leaves = to_latex(report_frame(), TOTALS, columns=["module", "flops"], leaf_only=True)
    assert r"\hspace" not in leaves
    # a training step's (loss) and (optimizer) rows sit at the root's depth beside the model,
    # not under it (they were indented as if parts of the forward)
    step = pd.concat(
        [
            report_frame(),
            report_frame().iloc[[0, 0]].assign(module=["(loss)", "(optimizer)"], depth=0),
        ],
        ignore_index=True,
    )
    text = to_latex(step, TOTALS, columns=["module", "flops"], fit=None, long=False)
    body = text.split(r"\midrule")[1].strip().splitlines()
    assert [line.split(" & ")[0] for line in body][-2:] == ["(loss)", "(optimizer)"]


class Recursive(nn.Module):
    """Calls itself twice: its recursive calls are rows "(root) #2", "(root) #3"."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, n: int = 2):
        x = self.lin(x)
        return self(x, n - 1) if n > 0 else x


def test_a_recursive_call_of_the_root_is_labelled_and_nested_as_in_markdown() -> None:
    r = profile(Recursive(), (4,), timing=False)
    # Markdown: (root), lin, (root) #2 at depth 1; LaTeX names the first call by its class
    # but its recursive call "(root) #2" as Markdown does, under the call that made it (it
    # read "Recursive", unindented: a second root)
    assert "| (root) #2 " in r.to_markdown(depth=1)
    body = r.to_latex(depth=1, columns=["module", "flops"]).split(r"\midrule")[1]
    assert [line.split(" & ")[0] for line in body.strip().splitlines()] == [
        "Recursive",
        r"\hspace{0.8em}lin",
        r"\hspace{0.8em}(root) \#2",
    ]


def test_shapes_print_with_a_times_sign_in_cells_and_caption() -> None:
    text = to_latex(
        report_frame(),
        TOTALS,
        columns=["module", "output_shape"],
        caption="resnext50_32x4d, input 1x3x224x224, float32",
        fit=None,
    )
    # a shape token becomes 1 x 3 x 224 x 224 with \times; a name holding 32x4 stays as it is
    assert r"\caption{resnext50\_32x4d, input 1$\times$3$\times$224$\times$224, float32}" in text
    assert r"\hspace{0.8em}conv1 & 1$\times$4$\times$8$\times$8 \\" in text
    assert "1x4x8x8" not in text


def test_a_reports_paper_table_keeps_type_and_names_the_model(tmp_path) -> None:
    import torchvision

    import modelprof
    from modelprof.cli import main

    # resnet50 at depth 2 with its timing columns: type is kept before the derived shares
    # and output bytes; what does not fit is said, with how to keep it
    report = modelprof.profile(torchvision.models.resnet50(), (3, 224, 224), timing=False)
    df = report.to_dataframe()
    df["latency_ms"] = 1.0
    df["latency_pct"] = 100.0 / len(df)
    report.to_dataframe = lambda style="modelprof": df  # the timed frame, without the wait
    cols = ["module", "type", "output_shape", "params", "macs", "flops", "output_bytes"]
    named = [*cols, "latency_ms", "flops_pct", "latency_pct"]
    text = report.to_latex(depth=2, columns=named, fit="columns")
    header = next(line for line in text.splitlines() if line.startswith("module &"))
    assert header.startswith("module & type & ")
    assert "to keep one, name it in priority=, or use fit='scale'" in text
    # named columns and no fit=: every one kept (once, with the two bounds of a CI, half of an
    # interval went), the table scaled to the width instead
    scaled = report.to_latex(depth=2, columns=named)
    assert "dropped to fit" not in scaled and "(10 columns)" in scaled
    assert r"\resizebox{\ifdim\width>\textwidth\textwidth\else\width\fi}" in scaled
    assert "\nResNet & ResNet & " in text  # the root: the model's class, not (root)
    # the command line names the model as asked for: resnet18, not its class ResNet
    assert (
        main(["profile", "resnet18", "--no-timing", "--format", "tex", "--out", str(tmp_path)]) == 0
    )
    tex = (tmp_path / "resnet18.tex").read_text(encoding="utf-8")
    assert r"\caption{resnet18, input 1$\times$3$\times$224$\times$224, float32 on " in tex


def test_an_intervals_bounds_are_dropped_together() -> None:
    # a width that the table misses by less than its CI-high column: dropping that one alone
    # would fit, leaving a lower bound with no upper one; its partner goes with it
    from modelprof.render.latex import _SAFETY, _column_widths_pt, _drop_until_fits, _font_pt

    df = pd.DataFrame(
        {
            "model": ["resnet18", "mobilenet_v3_small"],
            "latency_median_ms": [55.4, 17.8],
            "latency_ci_low_ms": [28.3, 4.67],
            "latency_ci_high_ms": [609.0, 68.2],
            "latency_x": [1.0, 0.322],
        }
    )
    table = prepare_table(df, units="fixed")
    widths = _column_widths_pt(table, _font_pt("small"))
    limit = (sum(widths) - widths[3] / 2) * _SAFETY  # over by half the CI-high column
    priority = ("model", "latency_median_ms", "latency_x", "latency_ci_low_ms")
    fitted = _drop_until_fits(table, limit, "small", priority)
    assert fitted.columns == ("model", "latency_median_ms", "latency_x")


def test_a_caption_of_ones_own_keeps_the_tables_legend():
    # a paper sets its own caption: the default caption's legend (what ~ marks, what the rank
    # follows) went with it, and the marked cells were left unexplained (a newcomer)
    from torch import nn

    import modelprof

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    r = modelprof.profile(model, (4,), repeat=1, warmup=0, roofline=False)
    assert r.layers_rough  # one per-layer pass: fewer than the stop rule promises
    caption = next(ln for ln in r.to_latex(caption="Mine").splitlines() if "caption{" in ln)
    assert caption.startswith(r"\caption{Mine. ")
    assert r"Per-layer times marked \textasciitilde{} are rough" in caption
    # one run: the end-to-end median too is no figure to quote, and is said to be
    assert r"end-to-end latency marked \textasciitilde{} is no figure to quote" in caption
    counted = modelprof.profile(model, (4,), timing=False)  # no marks: the caption as given
    assert r"\caption{Mine}" in counted.to_latex(caption="Mine")
    table = modelprof.compare({"a": nn.Linear(8, 8), "b": nn.Linear(8, 32)}, (8,), repeat=12)
    caption = next(
        ln for ln in table.render.to_latex(caption="Two").splitlines() if "caption{" in ln
    )
    assert caption.startswith(r"\caption{Two. ") and "rank (1 = lowest" in caption
    assert "baseline a" not in caption  # (the run's own words stay the user's to choose)


def test_a_comparison_frame_of_the_users_own_gets_no_empty_caption() -> None:
    from modelprof.render.comparison import export_comparison

    # a frame built by hand: no attrs, so nothing to caption; an empty \caption{} would still
    # number it "Table 1:" with nothing after
    df = pd.DataFrame(
        {"params": [10, 20], "latency_ms": [1.0, 2.0]}, index=pd.Index(["a", "b"], name="model")
    )
    out = export_comparison(df, "latex")
    assert "\\caption" not in out and "\\begin{tabular}" in out


def test_a_bound_named_keeps_its_partner_and_the_median_they_bracket() -> None:
    # priority=["latency_ci_high_ms"] dropped that bound with its unnamed partner, while the
    # unnamed input shape and FLOPs stayed; naming both kept a CI without its median (a trial)
    from modelprof.render.latex import _SAFETY, _column_widths_pt, _drop_until_fits, _font_pt

    df = pd.DataFrame(
        {
            "model": ["resnet18", "mobilenet_v3_small"],
            "input_shape": ["1x3x224x224", "1x3x224x224"],
            "latency_median_ms": [55.4, 17.8],
            "latency_ci_low_ms": [28.3, 4.67],
            "latency_ci_high_ms": [609.0, 68.2],
            "flops": [3.6e9, 1.2e8],
        }
    )
    table = prepare_table(df, units="fixed")
    widths = _column_widths_pt(table, _font_pt("small"))
    # room for the model, the median and its two bounds (columns 0, 2, 3, 4) and no more
    limit = (widths[0] + widths[2] + widths[3] + widths[4]) * _SAFETY
    for priority in (["latency_ci_high_ms"], ["latency_ci_low_ms", "latency_ci_high_ms"]):
        fitted = _drop_until_fits(table, limit, "small", priority)
        assert fitted.columns == (
            "model",
            "latency_median_ms",
            "latency_ci_low_ms",
            "latency_ci_high_ms",
        ), priority
